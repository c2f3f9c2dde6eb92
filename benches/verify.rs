//! Hashing the whole model: `Store::verify` (BLAKE3 of every chunk, in parallel over
//! chunks) against BLAKE3 of the same bytes as one stream on one thread.

mod common;

use std::hint::black_box;

use common::{group, sizes_mib, Keeper, Model, StoreKeeper};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn benches(c: &mut Criterion) {
    for size in sizes_mib() {
        let model = Model::new(size);
        let k = StoreKeeper::load(&model);
        let mut g = group(c, "verify", &model);
        g.bench_function(BenchmarkId::new("store", "verify"), |b| {
            b.iter(|| k.store.verify().expect("verify"))
        });
        g.bench_function(BenchmarkId::new("blake3", "one_thread"), |b| {
            b.iter(|| {
                let mut h = blake3::Hasher::new();
                for d in &model.data {
                    h.update(bytemuck::cast_slice(d));
                }
                black_box(h.finalize())
            })
        });
        g.finish();
    }
}

criterion_group! {
    name = verify;
    config = common::criterion();
    targets = benches
}
criterion_main!(verify);
