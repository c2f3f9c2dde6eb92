//! Writing arrays back into the working state (`Store::write`), where a fraction of the
//! chunks differ from what is there. Each run writes the other of two sources, so every
//! run changes that fraction.
//!
//! - `store_shared`: the working chunks are shared with a version (a commit follows every
//!   write, untimed): changed chunks are copied, unchanged ones stay shared.
//! - `store_unshared`: no version holds the chunks: changed chunks are written in place.
//! - `copy_prealloc`: copy into the existing buffers; `clone`: replace every array by a
//!   clone of the source (what users write).

mod common;

use std::time::{Duration, Instant};

use common::{group, sizes_mib, CloneKeeper, CopyKeeper, Keeper, Model, StoreKeeper, FRACTIONS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn write<K: Keeper>(
    c: &mut Criterion,
    model: &Model,
    name: &str,
    load: impl Fn(&Model) -> K,
    commit_after: bool,
) {
    let mut g = group(c, "write", model);
    for (label, share) in FRACTIONS {
        let other = model.changed(&model.pick(share));
        let mut k = load(model);
        let mut flip = false;
        g.bench_function(BenchmarkId::new(name, label), |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    flip = !flip;
                    let src = if flip { &other } else { model };
                    let t = Instant::now();
                    k.write_from(src);
                    spent += t.elapsed();
                    if commit_after {
                        k.commit();
                    }
                }
                spent
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    for size in sizes_mib() {
        let model = Model::new(size);
        write(c, &model, "store_shared", StoreKeeper::load, true);
        write(c, &model, "store_unshared", StoreKeeper::uncommitted, false);
        write(c, &model, CopyKeeper::NAME, CopyKeeper::load, false);
        write(c, &model, CloneKeeper::NAME, CloneKeeper::load, false);
    }
}

criterion_group! {
    name = write_benches;
    config = common::criterion();
    targets = benches
}
criterion_main!(write_benches);
