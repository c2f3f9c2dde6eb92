//! Chunk layout and zero-copy reads on every boundary shape, for every dtype: round trips,
//! metadata, chunk slices, row blocks, materialization, copy-out (full and delta), content
//! hashes and observable sharing.

use crate::common;

use crate::common::{ramp, small_store, BOUNDARY_SHAPES, CHUNK_BYTES, CHUNK_F32};
use half::{bf16, f16};
use ndarray::{ArrayD, Axis, Dimension, IxDyn, Slice};
use tensor_history::{ContentHash, DType, Element, Error, Store, Tensor};

/// Expected layout of an `f32` tensor of a boundary shape in 64-byte chunks, written out by
/// hand: (shape, elements per chunk, number of chunks, rows per chunk).
const EXPECTED_LAYOUT: &[(&[usize], usize, usize, Option<usize>)] = &[
    (&[0], 16, 0, Some(16)),
    (&[1], 16, 1, Some(16)),
    (&[15], 16, 1, Some(16)),
    (&[16], 16, 1, Some(16)),
    (&[17], 16, 2, Some(16)),
    (&[33], 16, 3, Some(16)),
    (&[], 16, 1, None),
    (&[0, 5], 15, 0, Some(3)),
    (&[5, 0], 16, 0, None),
    (&[4, 4], 16, 1, Some(4)),
    (&[5, 3], 15, 1, Some(5)),
    (&[3, 20], 16, 4, None),
    (&[2, 17], 16, 3, None),
    (&[2, 3, 4], 12, 2, Some(1)),
    (&[7, 2, 3], 12, 4, Some(2)),
];

fn expected_layout(shape: &[usize]) -> (usize, usize, Option<usize>) {
    let (_, ce, n, rpc) = EXPECTED_LAYOUT
        .iter()
        .find(|(s, ..)| *s == shape)
        .unwrap_or_else(|| panic!("no expected layout written down for shape {shape:?}"));
    (*ce, *n, *rpc)
}

fn flat(a: &ArrayD<f32>) -> Vec<f32> {
    a.iter().copied().collect()
}

fn store_with(shape: &[usize], seed: f32) -> (Store, ArrayD<f32>) {
    let mut store = small_store();
    let a = ramp(shape, seed);
    store.insert("x", &a).unwrap();
    (store, a)
}

/// An output buffer of `shape` in a non-standard layout: the transpose of an array of the
/// reversed shape, filled with `fill`.
fn transposed_buffer(shape: &[usize], fill: f32) -> ArrayD<f32> {
    let rev: Vec<usize> = shape.iter().rev().copied().collect();
    let buf = ArrayD::from_elem(IxDyn(&rev), fill);
    let out = buf.reversed_axes();
    assert_eq!(out.shape(), shape);
    out
}

#[test]
fn every_boundary_shape_has_a_hand_written_layout() {
    assert_eq!(CHUNK_BYTES, 64, "the layout table assumes 64-byte chunks");
    assert_eq!(EXPECTED_LAYOUT.len(), BOUNDARY_SHAPES.len());
    for shape in BOUNDARY_SHAPES {
        expected_layout(shape);
    }
}

#[test]
fn insert_then_get_round_trips_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (store, a) = store_with(shape, 1.0);
        let got = store.get::<f32>("x").unwrap();
        assert_eq!(got, a, "shape {shape:?}");
        assert_eq!(got.shape(), *shape);
        assert_eq!(store.tensor("x").unwrap().to_array::<f32>().unwrap(), a);
        store.verify().unwrap();
    }
}

#[test]
fn tensor_metadata_matches_the_chunk_layout_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (store, _) = store_with(shape, 0.0);
        let t = store.tensor("x").unwrap();
        let (ce, n, rpc) = expected_layout(shape);
        let len: usize = shape.iter().product();
        assert_eq!(t.dtype(), DType::F32, "shape {shape:?}");
        assert_eq!(t.shape(), *shape);
        assert_eq!(t.len(), len);
        assert_eq!(t.is_empty(), len == 0);
        assert_eq!(t.nbytes(), len * 4);
        assert_eq!(t.chunk_elems(), ce, "shape {shape:?}");
        assert_eq!(t.num_chunks(), n, "shape {shape:?}");
        assert_eq!(t.chunks().count(), n);
        assert_eq!(t.rows_per_chunk(), rpc, "shape {shape:?}");
        assert!(t.chunk(n).is_none(), "shape {shape:?}: chunk past the end");
        let mut next = 0;
        for i in 0..n {
            let r = t.chunk_range(i);
            assert_eq!(
                r.start, next,
                "shape {shape:?} chunk {i} starts where the last ended"
            );
            assert!(!r.is_empty() && r.len() <= ce);
            if i + 1 < n {
                assert_eq!(
                    r.len(),
                    ce,
                    "shape {shape:?}: only the last chunk may be short"
                );
            }
            let c = t.chunk(i).unwrap();
            assert_eq!(c.len_bytes(), r.len() * 4);
            assert!(c.len_bytes() <= CHUNK_BYTES);
            if let Some(k) = rpc {
                let row = len / shape[0];
                assert_eq!(
                    r.start % row,
                    0,
                    "shape {shape:?}: chunk {i} starts mid-row"
                );
                assert_eq!(ce, k * row);
            }
            next = r.end;
        }
        assert_eq!(next, len, "shape {shape:?}: chunks cover every element");
    }
}

#[test]
fn chunk_slices_concatenate_to_the_row_major_data_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (store, a) = store_with(shape, 2.0);
        let t = store.tensor("x").unwrap();
        let slices: Vec<&[f32]> = t.chunk_slices::<f32>().unwrap().collect();
        assert_eq!(slices.len(), t.num_chunks());
        for (i, s) in slices.iter().enumerate() {
            assert_eq!(s.len(), t.chunk_range(i).len(), "shape {shape:?} chunk {i}");
        }
        assert_eq!(slices.concat(), flat(&a), "shape {shape:?}");
    }
}

#[test]
fn row_blocks_cover_whole_rows_or_report_split_rows_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (store, a) = store_with(shape, 3.0);
        let t = store.tensor("x").unwrap();
        let (_, n, rpc) = expected_layout(shape);
        match (rpc, t.row_blocks::<f32>()) {
            (Some(k), Ok(blocks)) => {
                let blocks: Vec<_> = blocks.collect();
                assert_eq!(blocks.len(), n, "shape {shape:?}");
                let mut next = 0;
                for (rows, view) in &blocks {
                    assert_eq!(rows.start, next, "shape {shape:?}");
                    assert!(rows.len() <= k && !rows.is_empty());
                    assert_eq!(view.shape()[0], rows.len());
                    assert_eq!(&view.shape()[1..], &shape[1..]);
                    let want = a.slice_axis(Axis(0), Slice::from(rows.clone()));
                    assert_eq!(*view, want, "shape {shape:?} rows {rows:?}");
                    next = rows.end;
                }
                if n > 0 {
                    assert_eq!(
                        next, shape[0],
                        "shape {shape:?}: row blocks cover every row"
                    );
                }
            }
            (None, Err(e)) => {
                let row_elems: usize = shape.iter().skip(1).product();
                assert!(
                    matches!(e, Error::NotRowAligned { row_bytes } if row_bytes == row_elems * 4),
                    "shape {shape:?}: {e:?}"
                );
            }
            (rpc, Ok(_)) => panic!("shape {shape:?}: row blocks given, expected {rpc:?}"),
            (rpc, Err(e)) => panic!("shape {shape:?}: {e:?}, expected {rpc:?} rows per chunk"),
        };
    }
}

#[test]
fn row_blocks_are_refused_for_split_rows_and_scalars() {
    for shape in [&[3usize, 20][..], &[2, 17], &[]] {
        let (store, _) = store_with(shape, 0.0);
        let err = store.tensor("x").unwrap().row_blocks::<f32>().err();
        assert!(
            matches!(err, Some(Error::NotRowAligned { .. })),
            "shape {shape:?}: {err:?}"
        );
    }
}

#[test]
fn row_blocks_are_zero_copy_views_of_the_chunks() {
    let (store, _) = store_with(&[7, 2, 3], 0.0);
    let t = store.tensor("x").unwrap();
    for ((_, view), chunk) in t.row_blocks::<f32>().unwrap().zip(t.chunks()) {
        assert_eq!(view.as_ptr() as *const u8, chunk.bytes().unwrap().as_ptr());
    }
}

#[test]
fn copy_into_fills_standard_and_non_standard_outputs_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (store, a) = store_with(shape, 4.0);
        let t = store.tensor("x").unwrap();
        let n = t.num_chunks();

        let mut out = ArrayD::from_elem(IxDyn(shape), -1.0f32);
        let stats = t.copy_into(&mut out).unwrap();
        assert_eq!(out, a, "shape {shape:?}: standard layout");
        assert_eq!((stats.chunks_changed, stats.chunks_total), (n, n));
        assert_eq!(stats.bytes_copied, a.len() * 4);

        let mut out = transposed_buffer(shape, -1.0);
        t.copy_into(&mut out).unwrap();
        assert_eq!(out, a, "shape {shape:?}: transposed output");

        // A strided view: every other element of a buffer twice as long on each axis.
        let big: Vec<usize> = shape.iter().map(|d| 2 * d).collect();
        let mut buf = ArrayD::from_elem(IxDyn(&big), -1.0f32);
        let mut view = buf.slice_each_axis_mut(|_| Slice::new(0, None, 2));
        assert_eq!(view.shape(), *shape);
        t.copy_into(&mut view).unwrap();
        assert_eq!(view, a, "shape {shape:?}: strided output");
        let untouched = buf.indexed_iter().filter(|(ix, _)| {
            (0..ix.ndim()).any(|k| ix[k] % 2 == 1) // not part of the view
        });
        for (ix, v) in untouched {
            assert_eq!(
                *v, -1.0,
                "shape {shape:?}: wrote outside the view at {ix:?}"
            );
        }
    }
}

/// Build `committed` and `current` versions of a tensor where only `changed` elements (flat
/// indices) were modified, the second through `update` after a commit.
fn committed_and_changed(shape: &[usize], changed: &[usize]) -> (Tensor, Tensor, ArrayD<f32>) {
    let (mut store, _) = store_with(shape, 5.0);
    store.commit("base").unwrap();
    let known = store.tensor("x").unwrap().clone();
    store
        .update::<f32>("x", |off, xs| {
            for (j, x) in xs.iter_mut().enumerate() {
                if changed.contains(&(off + j)) {
                    *x = 1000.0 + (off + j) as f32;
                }
            }
        })
        .unwrap();
    store.verify().unwrap();
    let current = store.tensor("x").unwrap().clone();
    let want = store.get::<f32>("x").unwrap();
    (known, current, want)
}

#[test]
fn copy_changed_into_writes_only_changed_chunks_on_every_boundary_shape() {
    const SENTINEL: f32 = -12345.0;
    for shape in BOUNDARY_SHAPES {
        let len: usize = shape.iter().product();
        let changed: Vec<usize> = if len == 0 { vec![] } else { vec![0, len - 1] };
        let (known, current, want) = committed_and_changed(shape, &changed);
        let ce = current.chunk_elems();
        let dirty_chunks: Vec<usize> = {
            let mut v: Vec<usize> = changed.iter().map(|i| i / ce).collect();
            v.dedup();
            v
        };
        let in_dirty = |flat_ix: usize| dirty_chunks.contains(&(flat_ix / ce));

        for layout in ["standard", "transposed"] {
            let mut out = match layout {
                "standard" => ArrayD::from_elem(IxDyn(shape), SENTINEL),
                _ => transposed_buffer(shape, SENTINEL),
            };
            let stats = current.copy_changed_into(&mut out, &known).unwrap();
            assert_eq!(
                stats.chunks_changed,
                dirty_chunks.len(),
                "shape {shape:?} {layout}"
            );
            assert_eq!(stats.chunks_total, current.num_chunks());
            let bytes: usize = dirty_chunks
                .iter()
                .map(|&i| current.chunk_range(i).len() * 4)
                .sum();
            assert_eq!(stats.bytes_copied, bytes, "shape {shape:?} {layout}");
            for (k, (got, w)) in out.iter().zip(want.iter()).enumerate() {
                if in_dirty(k) {
                    assert_eq!(got, w, "shape {shape:?} {layout}: element {k} not written");
                } else {
                    assert_eq!(
                        *got, SENTINEL,
                        "shape {shape:?} {layout}: element {k} written"
                    );
                }
            }
        }
    }
}

#[test]
fn copy_changed_into_from_an_identical_tensor_writes_nothing() {
    for shape in BOUNDARY_SHAPES {
        let (store, _) = store_with(shape, 0.0);
        let t = store.tensor("x").unwrap();
        let mut out = ArrayD::from_elem(IxDyn(shape), 7.0f32);
        let stats = t.copy_changed_into(&mut out, &t.clone()).unwrap();
        assert_eq!(stats.chunks_changed, 0, "shape {shape:?}");
        assert_eq!(stats.bytes_copied, 0);
        assert!(out.iter().all(|&v| v == 7.0), "shape {shape:?}");
    }
}

#[test]
fn copy_changed_into_skips_equal_chunks_with_cached_hashes() {
    // Two independently built tensors with equal bytes: no chunk is shared, but once
    // both sides' hashes are cached the delta copy knows they are equal.
    let a = ramp(&[3, 20], 1.0);
    let t1 = Tensor::from_array(&a, CHUNK_BYTES).unwrap();
    let t2 = Tensor::from_array(&a, CHUNK_BYTES).unwrap();
    assert_eq!(t1.shared_chunks(&t2), 0);
    assert_eq!(t1.content_hash(), t2.content_hash());
    let mut out = ArrayD::from_elem(IxDyn(&[3, 20]), 0.0f32);
    let stats = t1.copy_changed_into(&mut out, &t2).unwrap();
    assert_eq!(stats.chunks_changed, 0);
    assert!(out.iter().all(|&v| v == 0.0));
}

#[test]
fn copy_changed_into_copies_everything_when_the_known_layout_differs() {
    let a = ramp(&[3, 20], 1.0);
    let known = Tensor::from_array(&a, 32).unwrap();
    let t = Tensor::from_array(&a, CHUNK_BYTES).unwrap();
    let mut out = ArrayD::from_elem(IxDyn(&[3, 20]), 0.0f32);
    let stats = t.copy_changed_into(&mut out, &known).unwrap();
    assert_eq!(stats.chunks_changed, t.num_chunks());
    assert_eq!(out, a);
}

#[test]
fn to_array_of_a_free_tensor_matches_the_store_layout_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let a = ramp(shape, 6.0);
        let t = Tensor::from_array(&a, CHUNK_BYTES).unwrap();
        let (store, _) = store_with(shape, 6.0);
        let s = store.tensor("x").unwrap();
        assert_eq!(t.to_array::<f32>().unwrap(), a, "shape {shape:?}");
        assert_eq!(t.chunk_elems(), s.chunk_elems());
        assert_eq!(t.num_chunks(), s.num_chunks());
        assert_eq!(t.content_hash(), s.content_hash(), "shape {shape:?}");
    }
}

#[test]
fn from_array_of_a_transposed_view_stores_logical_row_major_order() {
    for shape in BOUNDARY_SHAPES {
        let a = ramp(shape, 0.0);
        // The same logical values held in a transposed (column-major) buffer.
        let rev = a.t().to_owned();
        let view = rev.t();
        assert_eq!(view, a);
        let t = Tensor::from_array(&view, CHUNK_BYTES).unwrap();
        let bytes: Vec<f32> = t
            .chunk_slices::<f32>()
            .unwrap()
            .flatten()
            .copied()
            .collect();
        assert_eq!(bytes, flat(&a), "shape {shape:?}");
    }
}

#[test]
fn content_hash_depends_on_bytes_not_history_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (mut a_store, a) = store_with(shape, 1.0);
        let h0 = a_store.tensor("x").unwrap().content_hash();

        // The same bytes reached through writes, a commit and an update back.
        let (mut b_store, _) = store_with(shape, 9.0);
        b_store.commit("other").unwrap();
        b_store.write("x", &a).unwrap();
        assert_eq!(
            b_store.tensor("x").unwrap().content_hash(),
            h0,
            "shape {shape:?}"
        );
        b_store.update_map::<f32>("x", |v| v + 1.0).unwrap();
        b_store.update_map::<f32>("x", |v| v - 1.0).unwrap();
        assert_eq!(
            b_store.tensor("x").unwrap().content_hash(),
            h0,
            "shape {shape:?}"
        );
        b_store.verify().unwrap();

        // Different bytes, different hash.
        let len: usize = shape.iter().product();
        if len > 0 {
            a_store
                .update_range::<f32>("x", len - 1..len, |_, xs| xs[0] = -xs[0] - 1.0)
                .unwrap();
            assert_ne!(
                a_store.tensor("x").unwrap().content_hash(),
                h0,
                "shape {shape:?}"
            );
        }
        a_store.verify().unwrap();
    }
}

#[test]
fn content_hash_covers_shape_and_dtype() {
    let flat16 = Tensor::from_array(&ramp(&[16], 0.0), CHUNK_BYTES).unwrap();
    let square = Tensor::from_array(&ramp(&[4, 4], 0.0), CHUNK_BYTES).unwrap();
    assert_eq!(
        flat16.chunk(0).unwrap().bytes().unwrap(),
        square.chunk(0).unwrap().bytes().unwrap()
    );
    assert_ne!(flat16.content_hash(), square.content_hash());

    let empty_a = Tensor::from_array(&ramp(&[0, 5], 0.0), CHUNK_BYTES).unwrap();
    let empty_b = Tensor::from_array(&ramp(&[5, 0], 0.0), CHUNK_BYTES).unwrap();
    assert_ne!(empty_a.content_hash(), empty_b.content_hash());

    let as_u32 = ramp(&[16], 0.0).mapv(f32::to_bits);
    let bits = Tensor::from_array(&as_u32, CHUNK_BYTES).unwrap();
    assert_eq!(
        bits.chunk(0).unwrap().bytes().unwrap(),
        flat16.chunk(0).unwrap().bytes().unwrap()
    );
    assert_ne!(bits.content_hash(), flat16.content_hash());
}

#[test]
fn chunk_hash_is_the_blake3_hash_of_its_bytes() {
    let t = Tensor::from_array(&ramp(&[2, 17], 0.0), CHUNK_BYTES).unwrap();
    for c in t.chunks() {
        assert_eq!(c.cached_hash(), None, "hashes are lazy");
        let h = c.hash();
        assert_eq!(h, ContentHash::of_bytes(c.bytes().unwrap()));
        assert_eq!(c.cached_hash(), Some(h));
    }
}

#[test]
fn clones_share_every_chunk_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (store, a) = store_with(shape, 0.0);
        let t = store.tensor("x").unwrap();
        let c = t.clone();
        assert!(t.ptr_eq(&c), "shape {shape:?}");
        assert_eq!(t.shared_chunks(&c), t.num_chunks());
        for i in 0..t.num_chunks() {
            assert!(t.chunk(i).unwrap().ptr_eq(c.chunk(i).unwrap()));
        }

        // Equal bytes built separately: equal content, nothing shared.
        let other = Tensor::from_array(&a, CHUNK_BYTES).unwrap();
        assert_eq!(t.shared_chunks(&other), 0, "shape {shape:?}");
        assert_eq!(t.ptr_eq(&other), t.num_chunks() == 0, "shape {shape:?}");
    }
}

#[test]
fn ptr_eq_is_false_for_tensors_of_another_shape() {
    let t = Tensor::from_array(&ramp(&[0, 5], 0.0), CHUNK_BYTES).unwrap();
    let u = Tensor::from_array(&ramp(&[5, 0], 0.0), CHUNK_BYTES).unwrap();
    assert!(!t.ptr_eq(&u));
}

#[test]
fn chunks_of_a_committed_tensor_are_shared_with_its_snapshot() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, _) = store_with(shape, 0.0);
        let v = store.commit("c").unwrap();
        let snap = store.snapshot(v).unwrap();
        let t = store.tensor("x").unwrap();
        assert!(t.ptr_eq(snap.tensor("x").unwrap()), "shape {shape:?}");
        assert_eq!(t.shared_chunks(snap.tensor("x").unwrap()), t.num_chunks());
        store.verify().unwrap();
    }
}

// ---- every dtype ---------------------------------------------------------------------

/// Round trip, little-endian row-major chunk bytes, write and update for one dtype, on
/// every boundary shape.
fn check_dtype<T, const N: usize>(val: impl Fn(usize) -> T, le: impl Fn(T) -> [u8; N])
where
    T: Element + Copy,
{
    assert_eq!(T::DTYPE.size(), N);
    assert_eq!(T::DTYPE.size(), std::mem::size_of::<T>());
    for shape in BOUNDARY_SHAPES {
        let len: usize = shape.iter().product();
        let a = ArrayD::from_shape_vec(IxDyn(shape), (0..len).map(&val).collect()).unwrap();
        let mut store = small_store();
        store.insert("x", &a).unwrap();
        assert_eq!(store.get::<T>("x").unwrap(), a, "{} {shape:?}", T::DTYPE);
        let t = store.tensor("x").unwrap();
        assert_eq!(t.dtype(), T::DTYPE);
        assert_eq!(t.nbytes(), len * N);

        // Chunk bytes: little-endian elements in row-major order.
        let mut next = 0;
        for (i, c) in t.chunks().enumerate() {
            assert!(c.len_bytes() <= CHUNK_BYTES);
            let r = t.chunk_range(i);
            assert_eq!(r.start, next);
            let want: Vec<u8> = a
                .iter()
                .skip(r.start)
                .take(r.len())
                .flat_map(|&v| le(v))
                .collect();
            assert_eq!(
                c.bytes().unwrap(),
                &want[..],
                "{} {shape:?} chunk {i}",
                T::DTYPE
            );
            next = r.end;
        }
        assert_eq!(next, len);
        let slices: Vec<T> = t.chunk_slices::<T>().unwrap().flatten().copied().collect();
        assert_eq!(slices, a.iter().copied().collect::<Vec<_>>());

        // Write from a transposed view of new values.
        store.commit("c").unwrap();
        let b =
            ArrayD::from_shape_vec(IxDyn(shape), (0..len).map(|i| val(i + 3)).collect()).unwrap();
        let bt = b.t().to_owned();
        store.write("x", &bt.t()).unwrap();
        assert_eq!(store.get::<T>("x").unwrap(), b, "{} {shape:?}", T::DTYPE);
        store.verify().unwrap();

        // Update of the last element after a commit changes exactly its chunk.
        let v = store.commit("d").unwrap();
        if len > 0 {
            let new = val(len + 100);
            let stats = store
                .update::<T>("x", |off, xs| {
                    if off + xs.len() == len {
                        *xs.last_mut().unwrap() = new;
                    }
                })
                .unwrap();
            let t = store.tensor("x").unwrap();
            let old = store.snapshot(v).unwrap();
            let old = old.tensor("x").unwrap();
            let n = t.num_chunks();
            assert_eq!(
                stats.chunks_changed,
                usize::from(b.iter().last() != Some(&new))
            );
            assert_eq!(t.shared_chunks(old), n - stats.chunks_changed);
            let got = store.get::<T>("x").unwrap();
            assert_eq!(*got.iter().last().unwrap(), new);
            assert!(got.iter().take(len - 1).eq(b.iter().take(len - 1)));
            let last = t.chunk(n - 1).unwrap().bytes().unwrap();
            assert_eq!(&last[last.len() - N..], &le(new)[..]);
        }
        store.verify().unwrap();
    }
}

#[test]
fn f32_round_trips_with_little_endian_bytes() {
    check_dtype(|i| i as f32 * 1.25 - 3.0, f32::to_le_bytes);
}

#[test]
fn f64_round_trips_with_little_endian_bytes() {
    check_dtype(|i| i as f64 * -0.375 + 1e-300, f64::to_le_bytes);
}

#[test]
fn f16_round_trips_with_little_endian_bytes() {
    check_dtype(|i| f16::from_f32(i as f32 * 0.5 - 7.0), f16::to_le_bytes);
}

#[test]
fn bf16_round_trips_with_little_endian_bytes() {
    check_dtype(|i| bf16::from_f32(i as f32 * -2.5 + 1.0), bf16::to_le_bytes);
}

#[test]
fn i8_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| (i as i8).wrapping_mul(37).wrapping_sub(100),
        i8::to_le_bytes,
    );
}

#[test]
fn i16_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| (i as i16).wrapping_mul(1031).wrapping_sub(30000),
        i16::to_le_bytes,
    );
}

#[test]
fn i32_round_trips_with_little_endian_bytes() {
    check_dtype(|i| (i as i32).wrapping_mul(-16_777_259), i32::to_le_bytes);
}

#[test]
fn i64_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| (i as i64).wrapping_mul(-0x0123_4567_89ab_cdef),
        i64::to_le_bytes,
    );
}

#[test]
fn u8_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| (i as u8).wrapping_mul(97).wrapping_add(200),
        u8::to_le_bytes,
    );
}

#[test]
fn u16_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| (i as u16).wrapping_mul(4099).wrapping_add(65000),
        u16::to_le_bytes,
    );
}

#[test]
fn u32_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| {
            (i as u32)
                .wrapping_mul(0x0102_0304)
                .wrapping_add(0xfff0_0000)
        },
        u32::to_le_bytes,
    );
}

#[test]
fn u64_round_trips_with_little_endian_bytes() {
    check_dtype(
        |i| {
            (i as u64)
                .wrapping_mul(0x0102_0304_0506_0708)
                .wrapping_add(u64::MAX - 5)
        },
        u64::to_le_bytes,
    );
}

#[test]
fn narrow_dtypes_fit_more_elements_per_chunk() {
    let mut store = small_store();
    let a = ArrayD::from_shape_vec(IxDyn(&[200]), (0..200u32).map(|i| i as u8).collect()).unwrap();
    store.insert("bytes", &a).unwrap();
    let t = store.tensor("bytes").unwrap();
    assert_eq!(t.chunk_elems(), CHUNK_BYTES);
    assert_eq!(t.num_chunks(), 200usize.div_ceil(CHUNK_BYTES));
    let wide = ArrayD::from_shape_vec(IxDyn(&[200]), (0..200u64).collect()).unwrap();
    store.insert("wide", &wide).unwrap();
    assert_eq!(store.tensor("wide").unwrap().chunk_elems(), CHUNK_BYTES / 8);
    assert_eq!(CHUNK_F32 * 4, CHUNK_BYTES);
}

#[test]
fn insert_chunked_uses_its_own_chunk_size_and_shares_like_any_variable() {
    let mut store = common::small_store();
    let table = common::ramp(&[40, 8], 1.0); // rows of 32 bytes
    store.insert_chunked("emb", &table, 96).unwrap(); // 3 rows per chunk
    store.insert("w", &table).unwrap(); // the store's 64 bytes: 2 rows per chunk
    assert_eq!(store.tensor("emb").unwrap().rows_per_chunk(), Some(3));
    assert_eq!(store.tensor("emb").unwrap().num_chunks(), 14);
    assert_eq!(store.tensor("w").unwrap().rows_per_chunk(), Some(2));
    let v = store.commit("init").unwrap();
    store
        .update_range::<f32>("emb", 8 * 7..8 * 8, |_, xs| xs.fill(0.0))
        .unwrap();
    let before = store.snapshot(v).unwrap();
    let now = store.tensor("emb").unwrap();
    assert_eq!(now.shared_chunks(before.tensor("emb").unwrap()), 13);
    assert_eq!(store.get::<f32>("emb").unwrap()[[7, 3]], 0.0);
    store.verify().unwrap();
}

#[test]
fn insert_chunked_with_a_chunk_smaller_than_an_element_is_an_error_that_changes_nothing() {
    let mut store = common::small_store();
    let err = store
        .insert_chunked("x", &ndarray::array![1.0f64, 2.0], 4)
        .unwrap_err();
    assert!(matches!(err, tensor_history::Error::InvalidConfig { .. }));
    assert!(!store.contains("x"));
    assert!(!store.is_dirty());
}
