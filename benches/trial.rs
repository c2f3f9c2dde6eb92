//! Trial steps with undo: the store against deep copies (`clone` of every array, and copy
//! into preallocated buffers).
//!
//! - `trial_sparse/<size>/<keeper>/<fraction>`: save, change that fraction of chunks in
//!   place, go back to the saved state.
//! - `trial_dense/<size>`: save, then `w -= lr * g` over every element (undo of the step
//!   stays possible); `in_place_no_undo` is the same update with nothing saved, the floor.

mod common;

use common::{group, sizes_mib, CloneKeeper, CopyKeeper, Keeper, Model, StoreKeeper, FRACTIONS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn sparse<K: Keeper>(c: &mut Criterion, model: &Model) {
    let mut k = K::load(model);
    let mut g = group(c, "trial_sparse", model);
    for (label, share) in FRACTIONS {
        let sel = model.pick(share);
        g.bench_function(BenchmarkId::new(K::NAME, label), |b| {
            b.iter(|| {
                k.commit();
                k.touch(&sel);
                k.rollback();
            })
        });
    }
    g.finish();
}

fn dense<K: Keeper>(c: &mut Criterion, model: &Model, grads: &[Vec<f32>]) {
    let mut k = K::load(model);
    let mut g = group(c, "trial_dense", model);
    g.bench_function(BenchmarkId::new(K::NAME, "step_with_undo"), |b| {
        b.iter(|| {
            k.commit();
            k.sgd(grads);
        })
    });
    g.finish();
}

fn dense_floor(c: &mut Criterion, model: &Model, grads: &[Vec<f32>]) {
    let mut k = CopyKeeper::load(model);
    let mut g = group(c, "trial_dense", model);
    g.bench_function(BenchmarkId::new("in_place", "no_undo"), |b| {
        b.iter(|| k.sgd(grads))
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    for size in sizes_mib() {
        let model = Model::new(size);
        sparse::<StoreKeeper>(c, &model);
        sparse::<CopyKeeper>(c, &model);
        sparse::<CloneKeeper>(c, &model);
        let grads = model.grads();
        dense::<StoreKeeper>(c, &model, &grads);
        dense::<CopyKeeper>(c, &model, &grads);
        dense::<CloneKeeper>(c, &model, &grads);
        dense_floor(c, &model, &grads);
    }
}

criterion_group! {
    name = trial;
    config = common::criterion();
    targets = benches
}
criterion_main!(trial);
