//! Copy-on-write writes on every boundary shape (`update`, `update_range`, `update_map`,
//! `zip_update`, `write`), checking values, sharing and `verify()`. The model-based
//! property tests of random write sequences are in `tensor_writes_model.rs`.

use std::ops::Range;

use crate::common::{chunks_of, flat, len_of, ramp, small_store, unshared, BOUNDARY_SHAPES};
use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn, Slice};
use tensor_history::{Store, Tensor, VersionId};

/// A store holding `x = ramp(shape, 0.5)`, committed.
fn committed(shape: &[usize]) -> (Store, ArrayD<f32>, VersionId, Tensor) {
    let mut store = small_store();
    let a = ramp(shape, 0.5);
    store.insert("x", &a).unwrap();
    let v = store.commit("base").unwrap();
    let t = store.tensor("x").unwrap().clone();
    (store, a, v, t)
}

/// The same logical values as `a`, held in a transposed (non-standard) buffer.
fn transposed_copy(a: &ArrayD<f32>) -> ArrayD<f32> {
    let t = a.t().to_owned();
    let back = t.reversed_axes();
    assert_eq!(&back, a);
    back
}

/// A buffer twice as large on every axis whose even positions hold `a`: slicing it with
/// step 2 gives a strided view equal to `a`.
fn strided_source(a: &ArrayD<f32>) -> ArrayD<f32> {
    let big: Vec<usize> = a.shape().iter().map(|d| 2 * d).collect();
    let mut buf = ArrayD::from_elem(IxDyn(&big), f32::NAN);
    buf.slice_each_axis_mut(|_| Slice::new(0, None, 2))
        .assign(a);
    buf
}

#[test]
fn update_visits_every_chunk_once_with_its_flat_offset_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let mut store = small_store();
        store.insert("x", &ramp(shape, 0.0)).unwrap();
        let mut seen: Vec<Range<usize>> = Vec::new();
        store
            .update::<f32>("x", |off, xs| {
                seen.push(off..off + xs.len());
                for (j, x) in xs.iter_mut().enumerate() {
                    *x = -((off + j) as f32);
                }
            })
            .unwrap();
        let t = store.tensor("x").unwrap();
        let want: Vec<Range<usize>> = (0..t.num_chunks()).map(|i| t.chunk_range(i)).collect();
        assert_eq!(seen, want, "shape {shape:?}");
        let got = flat(&store.get::<f32>("x").unwrap());
        let expect: Vec<f32> = (0..len_of(shape)).map(|i| -(i as f32)).collect();
        assert_eq!(got, expect, "shape {shape:?}");
        store.verify().unwrap();
    }
}

#[test]
fn update_of_an_uncommitted_tensor_writes_in_place() {
    for shape in BOUNDARY_SHAPES {
        let mut store = small_store();
        store.insert("x", &ramp(shape, 0.0)).unwrap();
        let addrs = |s: &Store| -> Vec<usize> {
            let t = s.tensor("x").unwrap();
            t.chunks()
                .map(|c| c.bytes().unwrap().as_ptr() as usize)
                .collect()
        };
        let before = addrs(&store);
        let stats = store
            .update::<f32>("x", |_, xs| xs.iter_mut().for_each(|x| *x += 1.0))
            .unwrap();
        assert_eq!(
            addrs(&store),
            before,
            "shape {shape:?}: chunks were reallocated"
        );
        assert_eq!(stats.bytes_copied, 0, "shape {shape:?}");
        assert_eq!(store.get::<f32>("x").unwrap(), ramp(shape, 1.0));
        store.verify().unwrap();
    }
}

#[test]
fn update_of_one_element_after_commit_copies_only_its_chunk_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, v, base) = committed(shape);
        let ce = base.chunk_elems();
        for k in 0..len_of(shape) {
            let stats = store
                .update::<f32>("x", |off, xs| {
                    if (off..off + xs.len()).contains(&k) {
                        xs[k - off] = -100.0;
                    }
                })
                .unwrap();
            let t = store.tensor("x").unwrap();
            assert_eq!(
                unshared(t, &base),
                vec![k / ce],
                "shape {shape:?} element {k}"
            );
            assert_eq!(t.shared_chunks(&base), base.num_chunks() - 1);
            assert_eq!(stats.chunks_changed, 1);
            assert_eq!(stats.bytes_copied, t.chunk_range(k / ce).len() * 4);
            let mut want = flat(&a);
            want[k] = -100.0;
            assert_eq!(flat(&store.get::<f32>("x").unwrap()), want);
            assert!(store.is_dirty());
            store.verify().unwrap();
            store.discard().unwrap();
            assert!(!store.is_dirty());
            assert!(store.tensor("x").unwrap().ptr_eq(&base));
            assert_eq!(store.head(), Some(v));
        }
    }
}

#[test]
fn update_that_rewrites_equal_values_keeps_every_chunk_shared() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, _, base) = committed(shape);
        let stats = store
            .update::<f32>("x", |_, xs| {
                for x in xs.iter_mut() {
                    *x = (*x * 2.0) / 2.0;
                }
            })
            .unwrap();
        assert_eq!(stats.chunks_changed, 0, "shape {shape:?}");
        assert_eq!(stats.bytes_copied, 0);
        assert!(store.tensor("x").unwrap().ptr_eq(&base), "shape {shape:?}");
        assert!(!store.is_dirty());
        assert_eq!(store.get::<f32>("x").unwrap(), a);
        store.verify().unwrap();
    }
}

fn interesting_ranges(len: usize, ce: usize) -> Vec<Range<usize>> {
    let mut r = vec![0..0, 0..len, len..len];
    if len > 0 {
        r.extend([0..1, len - 1..len, len / 3..(2 * len).div_ceil(3)]);
    }
    for b in [ce, 2 * ce] {
        if b <= len {
            r.extend([
                b.saturating_sub(1)..b,
                b..(b + 1).min(len),
                b.saturating_sub(1)..(b + 1).min(len),
            ]);
            r.push(b.saturating_sub(ce)..b);
        }
    }
    r
}

#[test]
fn update_range_visits_only_the_range_and_touches_no_chunk_outside_it() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, _, base) = committed(shape);
        let len = len_of(shape);
        let ce = base.chunk_elems();
        for range in interesting_ranges(len, ce) {
            let mut seen: Vec<Range<usize>> = Vec::new();
            let stats = store
                .update_range::<f32>("x", range.clone(), |off, xs| {
                    seen.push(off..off + xs.len());
                    xs.iter_mut().for_each(|x| *x = -*x - 1000.0);
                })
                .unwrap();
            // The visited pieces tile the range, one per chunk, in order.
            let mut next = range.start;
            for s in &seen {
                assert_eq!(s.start, next, "shape {shape:?} range {range:?}");
                assert!(!s.is_empty());
                assert_eq!(s.start / ce, (s.end - 1) / ce, "a piece spans two chunks");
                next = s.end;
            }
            assert_eq!(next, range.end, "shape {shape:?} range {range:?}");
            let touched = chunks_of(range.clone(), ce);
            assert_eq!(seen.len(), touched.len());
            let t = store.tensor("x").unwrap();
            assert_eq!(
                unshared(t, &base),
                touched,
                "shape {shape:?} range {range:?}"
            );
            assert_eq!(stats.chunks_changed, touched.len());
            let want: Vec<f32> = flat(&a)
                .into_iter()
                .enumerate()
                .map(|(i, x)| if range.contains(&i) { -x - 1000.0 } else { x })
                .collect();
            assert_eq!(flat(&store.get::<f32>("x").unwrap()), want);
            store.verify().unwrap();
            store.discard().unwrap();
        }
    }
}

#[test]
fn update_map_changes_every_element_and_an_identity_map_keeps_sharing() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, _, base) = committed(shape);
        let stats = store.update_map::<f32>("x", |x| x).unwrap();
        assert_eq!(stats.chunks_changed, 0, "shape {shape:?}");
        assert!(store.tensor("x").unwrap().ptr_eq(&base));
        assert!(!store.is_dirty());

        let stats = store.update_map::<f32>("x", |x| x * 2.0 + 1.0).unwrap();
        let t = store.tensor("x").unwrap();
        assert_eq!(stats.chunks_changed, t.num_chunks(), "shape {shape:?}");
        assert_eq!(stats.bytes_copied, t.nbytes());
        assert_eq!(t.shared_chunks(&base), 0);
        assert_eq!(store.get::<f32>("x").unwrap(), a.mapv(|x| x * 2.0 + 1.0));
        store.verify().unwrap();

        // Now uniquely owned: a second map runs in place.
        let stats = store.update_map::<f32>("x", |x| x - 1.0).unwrap();
        assert_eq!(stats.bytes_copied, 0);
        assert_eq!(store.get::<f32>("x").unwrap(), a.mapv(|x| x * 2.0));
        store.verify().unwrap();
    }
}

#[test]
fn update_map_that_changes_one_element_keeps_the_other_chunks_shared() {
    for shape in BOUNDARY_SHAPES {
        let len = len_of(shape);
        if len == 0 {
            continue;
        }
        let (mut store, a, _, base) = committed(shape);
        let k = len / 2;
        let target = flat(&a)[k];
        let stats = store
            .update_map::<f32>("x", move |x| if x == target { -x } else { x })
            .unwrap();
        let t = store.tensor("x").unwrap();
        assert_eq!(
            unshared(t, &base),
            vec![k / t.chunk_elems()],
            "shape {shape:?}"
        );
        assert_eq!(stats.chunks_changed, 1);
        let mut want = flat(&a);
        want[k] = -want[k];
        assert_eq!(flat(&store.get::<f32>("x").unwrap()), want);
        store.verify().unwrap();
    }
}

#[test]
fn zip_update_with_contiguous_transposed_and_strided_operands_on_every_boundary_shape() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, _, base) = committed(shape);
        let g = ramp(shape, 3.0);
        store.zip_update("x", &g, |w, g| w - 0.5 * g).unwrap();
        let mut want = &a - &(0.5 * &g);
        assert_eq!(store.get::<f32>("x").unwrap(), want, "shape {shape:?}");
        assert_eq!(store.tensor("x").unwrap().shared_chunks(&base), 0);
        store.verify().unwrap();

        let gt = transposed_copy(&g);
        store.zip_update("x", &gt, |w, g| w + g).unwrap();
        want = &want + &g;
        assert_eq!(
            store.get::<f32>("x").unwrap(),
            want,
            "shape {shape:?} transposed"
        );
        store.verify().unwrap();

        let buf = strided_source(&g);
        let view = buf.slice_each_axis(|_| Slice::new(0, None, 2));
        store.zip_update("x", &view, |w, g| w * g).unwrap();
        want = &want * &g;
        assert_eq!(
            store.get::<f32>("x").unwrap(),
            want,
            "shape {shape:?} strided"
        );
        store.verify().unwrap();

        // An operand that leaves every value as it is keeps everything shared.
        store.commit("z").unwrap();
        let now = store.tensor("x").unwrap().clone();
        let stats = store.zip_update("x", &g, |w, _| w).unwrap();
        assert_eq!(stats.chunks_changed, 0);
        assert!(store.tensor("x").unwrap().ptr_eq(&now));
        assert!(!store.is_dirty());
    }
}

#[test]
fn write_from_contiguous_transposed_and_strided_arrays_stores_logical_values() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, _, _, _) = committed(shape);
        let n = store.tensor("x").unwrap().num_chunks();
        for (seed, how) in [(1.0, "contiguous"), (2.0, "transposed"), (3.0, "strided")] {
            let b = ramp(shape, seed * 100.0);
            let owner;
            let stats = match how {
                "contiguous" => store.write("x", &b).unwrap(),
                "transposed" => store.write("x", &transposed_copy(&b)).unwrap(),
                _ => {
                    owner = strided_source(&b);
                    let view = owner.slice_each_axis(|_| Slice::new(0, None, 2));
                    store.write("x", &view).unwrap()
                }
            };
            assert_eq!(store.get::<f32>("x").unwrap(), b, "shape {shape:?} {how}");
            assert_eq!(stats.chunks_total, n);
            assert_eq!(
                stats.chunks_changed, n,
                "shape {shape:?} {how}: every value changed"
            );
            assert_eq!(stats.bytes_copied, len_of(shape) * 4);
            let t = store.tensor("x").unwrap();
            let bytes: Vec<f32> = t
                .chunk_slices::<f32>()
                .unwrap()
                .flatten()
                .copied()
                .collect();
            assert_eq!(
                bytes,
                flat(&b),
                "shape {shape:?} {how}: row-major chunk bytes"
            );
            store.verify().unwrap();
        }
    }
}

#[test]
fn write_of_equal_array_keeps_every_chunk_shared() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, v, base) = committed(shape);
        for src in [a.clone(), transposed_copy(&a)] {
            let stats = store.write("x", &src).unwrap();
            assert_eq!(stats.chunks_changed, 0, "shape {shape:?}");
            assert_eq!(stats.bytes_copied, 0);
            assert!(store.tensor("x").unwrap().ptr_eq(&base), "shape {shape:?}");
            assert!(!store.is_dirty());
            assert_eq!(store.head(), Some(v));
        }
        let buf = strided_source(&a);
        let view = buf.slice_each_axis(|_| Slice::new(0, None, 2));
        store.write("x", &view).unwrap();
        assert!(
            store.tensor("x").unwrap().ptr_eq(&base),
            "shape {shape:?} strided"
        );
        store.verify().unwrap();
    }
}

#[test]
fn write_copies_exactly_the_chunks_whose_bytes_differ() {
    for shape in BOUNDARY_SHAPES {
        let len = len_of(shape);
        let (mut store, a, _, base) = committed(shape);
        let ce = base.chunk_elems();
        for k in 0..len {
            let mut b = a.clone();
            *b.iter_mut().nth(k).unwrap() = 1e6;
            let stats = store.write("x", &transposed_copy(&b)).unwrap();
            let t = store.tensor("x").unwrap();
            assert_eq!(
                unshared(t, &base),
                vec![k / ce],
                "shape {shape:?} element {k}"
            );
            assert_eq!(stats.chunks_changed, 1);
            assert_eq!(stats.bytes_copied, t.chunk_range(k / ce).len() * 4);
            assert_eq!(store.get::<f32>("x").unwrap(), b);
            store.verify().unwrap();
            store.discard().unwrap();
        }
    }
}

#[test]
fn write_of_negative_zero_over_zero_is_a_change_of_bytes() {
    let mut store = small_store();
    store
        .insert("x", &ArrayD::<f32>::zeros(IxDyn(&[40])))
        .unwrap();
    store.commit("zeros").unwrap();
    let base = store.tensor("x").unwrap().clone();
    let mut b = ArrayD::<f32>::zeros(IxDyn(&[40]));
    b[[20]] = -0.0;
    let stats = store.write("x", &b).unwrap();
    assert_eq!(stats.chunks_changed, 1);
    assert_eq!(unshared(store.tensor("x").unwrap(), &base), vec![1]);
    assert!(store.is_dirty());
    assert_eq!(
        store.get::<f32>("x").unwrap()[[20]].to_bits(),
        (-0.0f32).to_bits()
    );
}

#[test]
fn writes_after_a_commit_leave_the_committed_version_intact() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, a, v, base) = committed(shape);
        store.update_map::<f32>("x", |x| x + 7.0).unwrap();
        store
            .update::<f32>("x", |_, xs| xs.iter_mut().for_each(|x| *x *= 3.0))
            .unwrap();
        store.write("x", &ramp(shape, -4.0)).unwrap();
        store.zip_update("x", &a, |w, g| w - g).unwrap();
        let snap = store.snapshot(v).unwrap();
        assert_eq!(snap.get::<f32>("x").unwrap(), a, "shape {shape:?}");
        assert_eq!(base.to_array::<f32>().unwrap(), a);
        assert_eq!(
            snap.tensor("x").unwrap().content_hash(),
            base.content_hash()
        );
        store.verify().unwrap();
        let v2 = store.commit("after").unwrap();
        store.restore(v).unwrap();
        assert!(store.tensor("x").unwrap().ptr_eq(&base));
        store.restore(v2).unwrap();
        assert_eq!(
            store.get::<f32>("x").unwrap(),
            ramp(shape, -4.0) - &a,
            "shape {shape:?}"
        );
        store.verify().unwrap();
    }
}

#[test]
fn writes_from_reversed_axes_with_negative_strides_store_logical_values() {
    for shape in BOUNDARY_SHAPES {
        let (mut store, _, _, _) = committed(shape);
        let b = ramp(shape, 40.0);
        // Hold `b` reversed along every axis, then view it reversed again: negative strides.
        let mut held = b.clone();
        for ax in 0..held.ndim() {
            held.invert_axis(Axis(ax));
        }
        let mut view = held.view();
        for ax in 0..view.ndim() {
            view.invert_axis(Axis(ax));
        }
        assert_eq!(view, b);
        store.write("x", &view).unwrap();
        assert_eq!(store.get::<f32>("x").unwrap(), b, "shape {shape:?}");
        store.zip_update("x", &view, |w, g| w - g).unwrap();
        assert!(store.get::<f32>("x").unwrap().iter().all(|&v| v == 0.0));
        store.verify().unwrap();
    }
}

#[test]
fn fixed_dimension_arrays_are_accepted_by_every_write() {
    let mut store = small_store();
    let a: Array2<f32> = Array2::from_shape_fn((6, 5), |(i, j)| (i * 5 + j) as f32);
    store.insert("m", &a).unwrap();
    store.commit("c").unwrap();
    let t = a.t().to_owned();
    store.write("m", &t.t()).unwrap();
    assert!(!store.is_dirty());
    store.zip_update("m", &a.view(), |w, g| w + g).unwrap();
    assert_eq!(store.get::<f32>("m").unwrap(), (&a * 2.0).into_dyn());
    let row: Array1<f32> = Array1::zeros(5);
    let err = store.write("m", &row).unwrap_err();
    assert!(matches!(err, tensor_history::Error::ShapeMismatch { .. }));
    let mut out = Array2::<f32>::zeros((5, 6));
    let mut out_t = out.view_mut().reversed_axes();
    store.tensor("m").unwrap().copy_into(&mut out_t).unwrap();
    assert_eq!(out.t(), &a * 2.0);
}

#[test]
fn large_tensors_with_many_chunks_match_the_model_through_parallel_paths() {
    // Hundreds of chunks, so the parallel compare, copy and fused paths split work.
    for shape in [&[4000usize][..], &[300, 37], &[500, 7], &[20, 10, 9]] {
        let (mut store, a, v, base) = committed(shape);
        let len = len_of(shape);
        let ce = base.chunk_elems();
        let mut want = flat(&a);
        let picks = [0, 1, ce, len / 2, len - ce, len - 1];
        for &k in &picks {
            want[k] = -1.0;
        }
        let b = ArrayD::from_shape_vec(IxDyn(shape), want.clone()).unwrap();
        let stats = store.write("x", &transposed_copy(&b)).unwrap();
        let dirty = chunks_of(picks, ce);
        assert_eq!(stats.chunks_changed, dirty.len(), "shape {shape:?}");
        assert_eq!(unshared(store.tensor("x").unwrap(), &base), dirty);
        store.verify().unwrap();

        // Delta write-back of those chunks only, into a framework-owned buffer holding `a`.
        let mut framework = a.clone();
        let now = store.tensor("x").unwrap().clone();
        let back = now.copy_changed_into(&mut framework, &base).unwrap();
        assert_eq!(back.chunks_changed, dirty.len());
        assert_eq!(framework, b);
        let mut undo = b.clone();
        base.copy_changed_into(&mut undo, &now).unwrap();
        assert_eq!(undo, a);

        store.update_map::<f32>("x", |x| x * 2.0).unwrap();
        want.iter_mut().for_each(|x| *x *= 2.0);
        let g = ramp(shape, 1.0);
        store
            .zip_update("x", &transposed_copy(&g), |w, g| w + g)
            .unwrap();
        for (w, g) in want.iter_mut().zip(g.iter()) {
            *w += g;
        }
        assert_eq!(
            flat(&store.get::<f32>("x").unwrap()),
            want,
            "shape {shape:?}"
        );
        let mut out = ArrayD::from_elem(IxDyn(shape), 0.0f32);
        store.tensor("x").unwrap().copy_into(&mut out).unwrap();
        assert_eq!(flat(&out), want);
        store.verify().unwrap();
        store.restore(v).unwrap();
        assert!(store.tensor("x").unwrap().ptr_eq(&base));
    }
}

#[test]
fn tensors_above_the_parallel_threshold_match_the_model() {
    // 12 MiB with 64 KiB chunks: large enough that every per-tensor operation splits its
    // work over rayon's pool (the threshold is 8 MiB).
    let config = tensor_history::Config {
        chunk_bytes: 64 * 1024,
        ..tensor_history::Config::default()
    };
    let mut store = Store::with_config(config.clone()).unwrap();
    let shape = [3 << 10, 1 << 10];
    let a = ramp(&shape, 0.25);
    store.insert("x", &a).unwrap();
    let v = store.commit("a").unwrap();
    let base = store.tensor("x").unwrap().clone();
    assert!(base.num_chunks() > 100);
    let mut want = flat(&a);

    want.iter_mut().for_each(|x| *x *= 0.5);
    let stats = store.update_map::<f32>("x", |x| x * 0.5).unwrap();
    assert_eq!(stats.chunks_changed, base.num_chunks());
    let g = ramp(&shape, 1.0);
    store.zip_update("x", &g, |w, g| w - g).unwrap();
    for (w, g) in want.iter_mut().zip(g.iter()) {
        *w -= g;
    }
    assert_eq!(flat(&store.get::<f32>("x").unwrap()), want);

    // Change one element in each of two chunks through `write`: only those two chunks
    // stop being shared with the state before.
    let before = store.tensor("x").unwrap().clone();
    let ce = base.chunk_elems();
    let mut bv = want.clone();
    bv[3] = -7.0;
    bv[ce * 40 + 1] = -7.0;
    let b = ArrayD::from_shape_vec(IxDyn(&shape), bv).unwrap();
    let stats = store.write("x", &b).unwrap();
    assert_eq!(stats.chunks_changed, 2);
    let now = store.tensor("x").unwrap().clone();
    assert_eq!(unshared(&now, &before), vec![0, 40]);
    store.commit("b").unwrap();
    store
        .update_range::<f32>("x", 5..6, |_, xs| xs[0] = 9.0)
        .unwrap();
    match store.diff_working().get("x") {
        Some(tensor_history::VarDiff::Changed(t)) => assert_eq!(t.chunks, vec![0]),
        other => panic!("unexpected diff {other:?}"),
    }
    store.discard().unwrap();

    let want_arr = ArrayD::from_shape_vec(IxDyn(&shape), want.clone()).unwrap();
    let mut framework = want_arr.clone();
    let stats = now.copy_changed_into(&mut framework, &before).unwrap();
    assert_eq!(stats.chunks_changed, 2);
    assert_eq!(framework, b);
    let mut out = ArrayD::from_elem(IxDyn(&shape), 0.0f32);
    now.copy_into(&mut out).unwrap();
    assert_eq!(out, b);

    // The content hash does not depend on how the bytes got there.
    let mut fresh = Store::with_config(config).unwrap();
    fresh.insert("x", &b).unwrap();
    assert_eq!(
        fresh.tensor("x").unwrap().content_hash(),
        now.content_hash()
    );
    store.verify().unwrap();
    store.restore(v).unwrap();
    assert!(store.tensor("x").unwrap().ptr_eq(&base));
}

#[test]
fn fused_updates_on_a_working_state_larger_than_the_cache_match_the_model() {
    // 40 MiB of working state in 4 MiB tensors: above the default streaming threshold
    // (32 MiB), so update_map and zip_update stream their stores and split each tensor
    // over rayon's pool.
    let mut store = Store::new();
    let shape = [1024, 1024];
    let mut model: Vec<Vec<f32>> = Vec::new();
    for t in 0..10 {
        let a = ramp(&shape, t as f32);
        model.push(flat(&a));
        store.insert(&format!("t{t}"), &a).unwrap();
    }
    store.commit("init").unwrap();
    let before = store.tensor("t3").unwrap().clone();
    let g = ramp(&shape, 0.5);
    for (t, m) in model.iter_mut().enumerate() {
        let name = format!("t{t}");
        store.zip_update(&name, &g, |w, g| w - 0.25 * g).unwrap();
        for (w, g) in m.iter_mut().zip(g.iter()) {
            *w -= 0.25 * g;
        }
        // An identity map through the streaming path writes nothing.
        let stats = store.update_map::<f32>(&name, |x| x).unwrap();
        assert_eq!(stats.bytes_copied, 0, "{name}");
        assert_eq!(flat(&store.get::<f32>(&name).unwrap()), *m, "{name}");
    }
    // A map that changes nothing keeps every chunk shared with the version before it.
    store.commit("after").unwrap();
    let after = store.tensor("t3").unwrap().clone();
    let stats = store.update_map::<f32>("t3", |x| x).unwrap();
    assert_eq!(stats.chunks_changed, 0);
    assert!(store.tensor("t3").unwrap().ptr_eq(&after));
    assert_eq!(after.shared_chunks(&before), 0);
    assert!(!store.is_dirty());
    store.verify().unwrap();
}
