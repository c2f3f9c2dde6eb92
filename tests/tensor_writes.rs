//! Copy-on-write writes on every boundary shape (`update`, `update_range`, `update_map`,
//! `zip_update`, `write`), and model-based property tests of random write sequences
//! against a plain `Vec<T>`, checking values, sharing and `verify()` after every step.

mod common;

use std::collections::BTreeSet;
use std::ops::Range;

use common::{ramp, small_store, BOUNDARY_SHAPES};
use ndarray::{Array1, Array2, ArrayD, Axis, IxDyn, Slice};
use proptest::prelude::*;
use tensor_history::{Config, Element, Store, Tensor, VersionId};

fn len_of(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn flat(a: &ArrayD<f32>) -> Vec<f32> {
    a.iter().copied().collect()
}

/// A store holding `x = ramp(shape, 0.5)`, committed.
fn committed(shape: &[usize]) -> (Store, ArrayD<f32>, VersionId, Tensor) {
    let mut store = small_store();
    let a = ramp(shape, 0.5);
    store.insert("x", &a).unwrap();
    let v = store.commit("base").unwrap();
    let t = store.tensor("x").unwrap().clone();
    (store, a, v, t)
}

/// Indices of the chunks of `t` that are not pointer-shared with the same chunk of `base`.
fn unshared(t: &Tensor, base: &Tensor) -> Vec<usize> {
    (0..t.num_chunks())
        .filter(|&i| !t.chunk(i).unwrap().ptr_eq(base.chunk(i).unwrap()))
        .collect()
}

/// Chunks (of `chunk_elems` elements) that hold any of the flat indices in `elems`.
fn chunks_of(elems: impl IntoIterator<Item = usize>, chunk_elems: usize) -> Vec<usize> {
    let set: BTreeSet<usize> = elems.into_iter().map(|i| i / chunk_elems).collect();
    set.into_iter().collect()
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
            t.chunks().map(|c| c.bytes().as_ptr() as usize).collect()
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

// ---- model-based property tests ------------------------------------------------------

/// Element types the model runs on, with deterministic operations.
trait ModelElem: Element + Copy {
    fn from_i(v: i64) -> Self;
    fn bits(self) -> u64;
    fn map(op: u8, x: Self) -> Self;
    fn zip(op: u8, x: Self, y: Self) -> Self;
    fn add(x: Self, d: i8) -> Self;
}

impl ModelElem for f32 {
    fn from_i(v: i64) -> Self {
        v as f32 * 0.5
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn map(op: u8, x: Self) -> Self {
        match op % 4 {
            0 => x,
            1 => x + 1.0,
            2 => -x,
            _ => (x * 0.5).floor(),
        }
    }
    fn zip(op: u8, x: Self, y: Self) -> Self {
        match op % 3 {
            0 => x - 0.25 * y,
            1 => x + y,
            _ => x,
        }
    }
    fn add(x: Self, d: i8) -> Self {
        x + f32::from(d) * 0.5
    }
}

impl ModelElem for i32 {
    fn from_i(v: i64) -> Self {
        v as i32
    }
    fn bits(self) -> u64 {
        u64::from(self as u32)
    }
    fn map(op: u8, x: Self) -> Self {
        match op % 4 {
            0 => x,
            1 => x.wrapping_add(1),
            2 => x.wrapping_neg(),
            _ => x / 2,
        }
    }
    fn zip(op: u8, x: Self, y: Self) -> Self {
        match op % 3 {
            0 => x.wrapping_sub(y),
            1 => x.max(y),
            _ => x,
        }
    }
    fn add(x: Self, d: i8) -> Self {
        x.wrapping_add(d.into())
    }
}

impl ModelElem for u8 {
    fn from_i(v: i64) -> Self {
        v as u8
    }
    fn bits(self) -> u64 {
        u64::from(self)
    }
    fn map(op: u8, x: Self) -> Self {
        match op % 4 {
            0 => x,
            1 => x.wrapping_add(1),
            2 => x.wrapping_mul(3),
            _ => x / 2,
        }
    }
    fn zip(op: u8, x: Self, y: Self) -> Self {
        match op % 3 {
            0 => x.wrapping_sub(y),
            1 => x.max(y),
            _ => x,
        }
    }
    fn add(x: Self, d: i8) -> Self {
        x.wrapping_add(d as u8)
    }
}

/// Where a `write` takes its array from.
#[derive(Clone, Debug)]
enum Source {
    /// The current values (nothing changes).
    Current,
    /// The current values with a few elements set.
    Few(Vec<(usize, i8)>),
    /// Fresh small values (many coincide with the current ones).
    Random(u64),
}

#[derive(Clone, Debug)]
enum Op {
    /// `update` setting a few elements (flat index seed, value).
    Set(Vec<(usize, i8)>),
    /// `update_range` over `start..end` (seeds) adding `delta` (0 changes nothing).
    Range(usize, usize, i8),
    /// `update_map` with one of the model's maps.
    Map(u8),
    /// `zip_update` with a fresh operand; `layout` picks contiguous/transposed/strided.
    Zip(u8, u64, u8),
    /// `write` from a source in one of three layouts.
    Write(Source, u8),
    Commit,
    Discard,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let few = prop::collection::vec((any::<usize>(), -3i8..4), 1..4);
    prop_oneof![
        4 => few.clone().prop_map(Op::Set),
        3 => (any::<usize>(), any::<usize>(), -1i8..2).prop_map(|(a, b, d)| Op::Range(a, b, d)),
        2 => any::<u8>().prop_map(Op::Map),
        2 => (any::<u8>(), any::<u64>(), any::<u8>()).prop_map(|(o, s, l)| Op::Zip(o, s, l)),
        4 => (prop_oneof![
                Just(Source::Current),
                few.prop_map(Source::Few),
                any::<u64>().prop_map(Source::Random),
            ], any::<u8>()).prop_map(|(s, l)| Op::Write(s, l)),
        2 => Just(Op::Commit),
        1 => Just(Op::Discard),
    ]
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        (0..BOUNDARY_SHAPES.len()).prop_map(|i| BOUNDARY_SHAPES[i].to_vec()),
        (0usize..70).prop_map(|n| vec![n]),
        (0usize..6, 0usize..25).prop_map(|(r, c)| vec![r, c]),
        (0usize..4, 0usize..4, 0usize..6).prop_map(|(a, b, c)| vec![a, b, c]),
    ]
}

/// Small deterministic values from a seed (splitmix64), in -4..4.
fn values<T: ModelElem>(seed: u64, n: usize) -> Vec<T> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            T::from_i((z % 8) as i64 - 4)
        })
        .collect()
}

fn bits_eq<T: ModelElem>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.bits() == y.bits())
}

/// Call `f` with `data` (of `shape`) as an array view in layout `layout % 3`: contiguous,
/// transposed or strided.
fn with_layout<T: ModelElem, R>(
    shape: &[usize],
    data: &[T],
    layout: u8,
    f: impl FnOnce(ndarray::ArrayViewD<'_, T>) -> R,
) -> R {
    let a = ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap();
    match layout % 3 {
        0 => f(a.view()),
        1 => {
            let t = a.t().to_owned();
            f(t.t())
        }
        _ => {
            let big: Vec<usize> = shape.iter().map(|d| 2 * d).collect();
            let mut buf = ArrayD::from_elem(IxDyn(&big), T::from_i(99));
            buf.slice_each_axis_mut(|_| Slice::new(0, None, 2))
                .assign(&a);
            f(buf.slice_each_axis(|_| Slice::new(0, None, 2)))
        }
    }
}

struct Model<T> {
    cur: Vec<T>,
    /// Committed values and tensor, once there is a commit.
    committed: Option<(Vec<T>, Tensor)>,
    /// Chunks whose bytes changed since the last commit or discard.
    dirty: BTreeSet<usize>,
    head: Option<VersionId>,
}

fn run_model<T: ModelElem>(shape: &[usize], ops: &[Op]) {
    run_model_in::<T>(small_store(), shape, ops);
}

fn run_model_in<T: ModelElem>(mut store: Store, shape: &[usize], ops: &[Op]) {
    let len = len_of(shape);
    let init: Vec<T> = values(0xfeed, len);
    store
        .insert(
            "x",
            &ArrayD::from_shape_vec(IxDyn(shape), init.clone()).unwrap(),
        )
        .unwrap();
    let ce = store.tensor("x").unwrap().chunk_elems();
    let bytes_of = |i: usize| (len - i * ce).min(ce) * std::mem::size_of::<T>();
    let mut m = Model {
        cur: init,
        committed: None,
        dirty: BTreeSet::new(),
        head: None,
    };
    for (step, op) in ops.iter().enumerate() {
        let before = m.cur.clone();
        // Chunks the store owns alone (written in place) before this step.
        let unique = |i: usize, m: &Model<T>| m.committed.is_none() || m.dirty.contains(&i);
        let mut visited: Option<Vec<usize>> = None;
        let stats = match op {
            Op::Set(sets) if len > 0 => {
                for &(i, v) in sets {
                    m.cur[i % len] = T::from_i(v.into());
                }
                let sets: Vec<(usize, T)> = sets
                    .iter()
                    .map(|&(i, v)| (i % len, T::from_i(v.into())))
                    .collect();
                visited = Some((0..len.div_ceil(ce)).collect());
                Some(
                    store
                        .update::<T>("x", |off, xs| {
                            for &(i, v) in &sets {
                                if (off..off + xs.len()).contains(&i) {
                                    xs[i - off] = v;
                                }
                            }
                        })
                        .unwrap(),
                )
            }
            Op::Set(_) => None,
            Op::Range(a, b, d) => {
                let (mut s, mut e) = (a % (len + 1), b % (len + 1));
                if s > e {
                    std::mem::swap(&mut s, &mut e);
                }
                let d = *d;
                let add = move |x: T| T::add(x, d);
                for x in &mut m.cur[s..e] {
                    *x = add(*x);
                }
                visited = Some(chunks_of(s..e, ce));
                let mut calls = Vec::new();
                let stats = store
                    .update_range::<T>("x", s..e, |off, xs| {
                        calls.push(off..off + xs.len());
                        xs.iter_mut().for_each(|x| *x = add(*x));
                    })
                    .unwrap();
                let covered: usize = calls.iter().map(|r| r.len()).sum();
                assert_eq!(
                    covered,
                    e - s,
                    "step {step}: update_range visited {calls:?}"
                );
                assert!(calls.iter().all(|r| r.start >= s && r.end <= e));
                Some(stats)
            }
            Op::Map(k) => {
                for x in &mut m.cur {
                    *x = T::map(*k, *x);
                }
                let k = *k;
                Some(store.update_map::<T>("x", move |x| T::map(k, x)).unwrap())
            }
            Op::Zip(k, seed, layout) => {
                let g: Vec<T> = values(*seed, len);
                for (x, y) in m.cur.iter_mut().zip(&g) {
                    *x = T::zip(*k, *x, *y);
                }
                let k = *k;
                Some(with_layout(shape, &g, *layout, |view| {
                    store
                        .zip_update("x", &view, move |x, y| T::zip(k, x, y))
                        .unwrap()
                }))
            }
            Op::Write(src, layout) => {
                match src {
                    Source::Current => {}
                    Source::Few(sets) if len > 0 => {
                        for &(i, v) in sets {
                            m.cur[i % len] = T::from_i(v.into());
                        }
                    }
                    Source::Few(_) => {}
                    Source::Random(seed) => m.cur = values(*seed, len),
                }
                let stats = with_layout(shape, &m.cur, *layout, |view| {
                    store.write("x", &view).unwrap()
                });
                Some(stats)
            }
            Op::Commit => {
                let v = store.commit(&format!("step {step}")).unwrap();
                m.head = Some(v);
                m.committed = Some((m.cur.clone(), store.tensor("x").unwrap().clone()));
                m.dirty.clear();
                None
            }
            Op::Discard => {
                if let Some((vals, _)) = &m.committed {
                    store.discard().unwrap();
                    m.cur = vals.clone();
                    m.dirty.clear();
                }
                None
            }
        };

        // Chunks whose bytes this step changed.
        let changed_now: BTreeSet<usize> = (0..len)
            .filter(|&i| before[i].bits() != m.cur[i].bits())
            .map(|i| i / ce)
            .collect();
        if let Some(stats) = stats {
            let total = len.div_ceil(ce);
            assert_eq!(stats.chunks_total, total, "step {step} {op:?}");
            let copied: usize = changed_now
                .iter()
                .filter(|&&i| !unique(i, &m))
                .map(|&i| bytes_of(i))
                .sum();
            match op {
                Op::Write(..) => {
                    assert_eq!(
                        stats.chunks_changed,
                        changed_now.len(),
                        "step {step} {op:?}"
                    );
                    let all: usize = changed_now.iter().map(|&i| bytes_of(i)).sum();
                    assert_eq!(stats.bytes_copied, all, "step {step} {op:?}");
                }
                _ => {
                    let visited = visited.unwrap_or_else(|| (0..total).collect());
                    let written = visited
                        .iter()
                        .filter(|&&i| unique(i, &m) || changed_now.contains(&i))
                        .count();
                    if matches!(op, Op::Set(_) | Op::Range(..)) {
                        // Documented: chunks written in place or replaced by a changed copy.
                        assert_eq!(stats.chunks_changed, written, "step {step} {op:?}");
                    } else {
                        // Fused paths: at least every changed chunk, at most every written one.
                        let n = stats.chunks_changed;
                        assert!(
                            (changed_now.len()..=written).contains(&n),
                            "step {step} {op:?}: {n} chunks reported"
                        );
                    }
                    assert_eq!(stats.bytes_copied, copied, "step {step} {op:?}");
                }
            }
        }
        if !matches!(op, Op::Commit | Op::Discard) {
            m.dirty.extend(changed_now);
        }

        // Values, bytes and invariants.
        let got = store.get::<T>("x").unwrap();
        assert_eq!(got.shape(), shape);
        let got: Vec<T> = got.iter().copied().collect();
        assert!(
            bits_eq(&got, &m.cur),
            "step {step} {op:?}: {got:?} != {:?}",
            m.cur
        );
        store
            .verify()
            .unwrap_or_else(|e| panic!("step {step} {op:?}: {e}"));
        assert_eq!(store.head(), m.head, "step {step}");

        // Sharing: exactly the chunks changed since the commit are unshared.
        let t = store.tensor("x").unwrap();
        match &m.committed {
            Some((vals, base)) => {
                assert_eq!(
                    store.is_dirty(),
                    !bits_eq(vals, &m.cur),
                    "step {step} {op:?}"
                );
                let want: Vec<usize> = m.dirty.iter().copied().collect();
                assert_eq!(unshared(t, base), want, "step {step} {op:?}");
                assert_eq!(t.shared_chunks(base), t.num_chunks() - want.len());
                assert_eq!(t.ptr_eq(base), want.is_empty());
            }
            None => assert!(store.is_dirty()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_writes_on_f32_match_a_vec_model(
        shape in shape_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..40),
    ) {
        run_model::<f32>(&shape, &ops);
    }

    #[test]
    fn random_writes_on_i32_match_a_vec_model(
        shape in shape_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..40),
    ) {
        run_model::<i32>(&shape, &ops);
    }

    #[test]
    fn random_writes_on_u8_match_a_vec_model(
        shape in shape_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..40),
    ) {
        run_model::<u8>(&shape, &ops);
    }

    #[test]
    fn random_writes_with_odd_chunk_sizes_match_a_vec_model(
        chunk_bytes in prop::sample::select(vec![4usize, 6, 12, 20, 100, 4096]),
        recycle in any::<bool>(),
        shape in shape_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..40),
    ) {
        let store = Store::with_config(Config {
            chunk_bytes,
            recycle_bytes: if recycle { 1 << 20 } else { 0 },
            ..Config::default()
        })
        .unwrap();
        run_model_in::<i32>(store, &shape, &ops);
    }

    #[test]
    fn write_and_update_of_a_few_elements_share_every_untouched_chunk(
        rows in 1usize..40,
        cols in 1usize..30,
        sets in prop::collection::vec((any::<usize>(), -2i32..3), 1..6),
        via_write in any::<bool>(),
    ) {
        let shape = [rows, cols];
        let len = rows * cols;
        let mut store = small_store();
        let a = ramp(&shape, 0.0).mapv(|x| (x as i32 % 3) as f32);
        store.insert("x", &a).unwrap();
        store.commit("base").unwrap();
        let base = store.tensor("x").unwrap().clone();
        let ce = base.chunk_elems();
        let sets: Vec<(usize, f32)> = sets.iter().map(|&(i, v)| (i % len, v as f32)).collect();
        let mut want = flat(&a);
        for &(i, v) in &sets {
            want[i] = v;
        }
        let changed = chunks_of((0..len).filter(|&i| want[i] != flat(&a)[i]), ce);
        let stats = if via_write {
            let b = ArrayD::from_shape_vec(IxDyn(&shape), want.clone()).unwrap();
            store.write("x", &b).unwrap()
        } else {
            store.update::<f32>("x", |off, xs| {
                for &(i, v) in &sets {
                    if (off..off + xs.len()).contains(&i) {
                        xs[i - off] = v;
                    }
                }
            }).unwrap()
        };
        let t = store.tensor("x").unwrap();
        prop_assert_eq!(unshared(t, &base), changed.clone());
        prop_assert_eq!(t.shared_chunks(&base), t.num_chunks() - changed.len());
        prop_assert_eq!(stats.chunks_changed, changed.len());
        prop_assert_eq!(flat(&store.get::<f32>("x").unwrap()), want);
        prop_assert_eq!(store.is_dirty(), !changed.is_empty());
        store.verify().unwrap();
    }
}
