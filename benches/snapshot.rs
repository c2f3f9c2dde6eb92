//! Commit and restore: the store against deep copies (`clone` of every array, and copy
//! into preallocated buffers), at model sizes over orders of magnitude.
//!
//! - `commit/<size>`: save an unchanged working state.
//! - `restore/<size>`: go back to the saved state right after saving it.
//! - `restore_into/<size>`: write the saved state into buffers the keeper does not own
//!   (a framework's parameters) that hold the working state, which differs from the
//!   saved one in a fraction of chunks (store: `copy_changed_into`; baselines: a full
//!   copy).

mod common;

use std::hint::black_box;

use common::{group, sizes_mib, CloneKeeper, CopyKeeper, Keeper, Model, StoreKeeper, FRACTIONS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn commit_and_restore<K: Keeper>(c: &mut Criterion, model: &Model) {
    let mut k = K::load(model);
    let mut g = group(c, "commit", model);
    g.bench_function(BenchmarkId::new(K::NAME, "unchanged"), |b| {
        b.iter(|| k.commit())
    });
    g.finish();
    let mut g = group(c, "restore", model);
    g.bench_function(BenchmarkId::new(K::NAME, "unchanged"), |b| {
        b.iter(|| k.rollback())
    });
    g.finish();
}

fn restore_into<K: Keeper>(c: &mut Criterion, model: &Model) {
    let mut k = K::load(model);
    let mut g = group(c, "restore_into", model);
    for (label, share) in FRACTIONS {
        let sel = model.pick(share);
        k.touch(&sel);
        // `out` holds the working state; each run writes the other state into it.
        let mut out = model.changed(&sel).data;
        let mut to_saved = true;
        g.bench_function(BenchmarkId::new(K::NAME, label), |b| {
            b.iter(|| {
                k.restore_into(black_box(&mut out), to_saved);
                to_saved = !to_saved;
            })
        });
        k.rollback();
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    for size in sizes_mib() {
        let model = Model::new(size);
        commit_and_restore::<StoreKeeper>(c, &model);
        commit_and_restore::<CopyKeeper>(c, &model);
        commit_and_restore::<CloneKeeper>(c, &model);
        restore_into::<StoreKeeper>(c, &model);
        restore_into::<CopyKeeper>(c, &model);
        restore_into::<CloneKeeper>(c, &model);
    }
}

criterion_group! {
    name = snapshot;
    config = common::criterion();
    targets = benches
}
criterion_main!(snapshot);
