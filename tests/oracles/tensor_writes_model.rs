//! Model-based property tests of random write sequences (`update`, `update_range`,
//! `update_map`, `zip_update`, `write`, commit, discard) against a plain `Vec<T>`,
//! checking values, sharing and `verify()` after every step. The deterministic per-shape
//! write tests are in `tensor_writes.rs`.

use crate::common;

use std::collections::BTreeSet;

use crate::common::{chunks_of, flat, len_of, ramp, small_store, unshared, BOUNDARY_SHAPES};
use ndarray::{ArrayD, IxDyn, Slice};
use proptest::prelude::*;
use tensor_history::{Config, Element, Store, Tensor, VersionId};

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
    #![proptest_config(ProptestConfig::with_cases(common::cases(256)))]

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
