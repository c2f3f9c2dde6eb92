//! Which chunks changed between a saved state and the current one, for a fraction of
//! chunks changed.
//!
//! - `store`: both states in one store, sharing every unchanged chunk (pointer compares,
//!   bytes compared only where pointers differ).
//! - `store_unshared`: the same contents in two stores built independently (no chunk
//!   shared: every chunk compared by content) — the shared-vs-unshared pair.
//! - `copy_prealloc`: memcmp of two deep copies, chunk by chunk; `clone`: element-wise
//!   `==` of two deep copies, chunk by chunk.

mod common;

use std::hint::black_box;

use common::{group, sizes_mib, CloneKeeper, CopyKeeper, Keeper, Model, StoreKeeper, FRACTIONS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn shared<K: Keeper>(c: &mut Criterion, model: &Model) {
    let mut k = K::load(model);
    let mut g = group(c, "diff", model);
    for (label, share) in FRACTIONS {
        let sel = model.pick(share);
        k.touch(&sel);
        assert_eq!(k.changed_chunks(), sel.len(), "{} miscounted", K::NAME);
        g.bench_function(BenchmarkId::new(K::NAME, label), |b| {
            b.iter(|| black_box(k.changed_chunks()))
        });
        k.rollback();
    }
    g.finish();
}

fn unshared(c: &mut Criterion, model: &Model) {
    let mut a = StoreKeeper::uncommitted(model);
    let va = a.store.commit("a").expect("commit");
    let sa = a.store.snapshot(va).expect("snapshot");
    let mut g = group(c, "diff", model);
    for (label, share) in FRACTIONS {
        let sel = model.pick(share);
        let mut b_store = StoreKeeper::uncommitted(&model.changed(&sel));
        let vb = b_store.store.commit("b").expect("commit");
        let sb = b_store.store.snapshot(vb).expect("snapshot");
        assert_eq!(
            sa.diff(&sb).changed_chunks(),
            sel.len(),
            "unshared miscounted"
        );
        g.bench_function(BenchmarkId::new("store_unshared", label), |b| {
            b.iter(|| black_box(sa.diff(&sb).changed_chunks()))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    for size in sizes_mib() {
        let model = Model::new(size);
        shared::<StoreKeeper>(c, &model);
        unshared(c, &model);
        shared::<CopyKeeper>(c, &model);
        shared::<CloneKeeper>(c, &model);
    }
}

criterion_group! {
    name = diff;
    config = common::criterion();
    targets = benches
}
criterion_main!(diff);
