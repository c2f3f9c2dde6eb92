//! gc's re-basing (`GcOptions::rebase`): a dense history whose chunks were stored whole
//! (parts, as DCP saves write them) shrinks to deltas, and every version still reads bit
//! for bit, after reopening, after the old packs are deleted, and on a second run.

use std::sync::Arc;

use ndarray::{Array1, ArrayD};
use tensor_history::{Backend, Config, GcOptions, MemoryBackend, Meta, Store, REBASE_BELOW};

use crate::common::{repo_bytes, same_bits};

const CHUNK: usize = 16 << 10;

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK,
        ..Config::default()
    }
}

/// `steps` dense versions of two tensors (every element changed a little each step, as
/// an optimizer step does), each written as one part and committed: every chunk is
/// stored whole. Returns the coordinator and each version's arrays.
/// Each version's arrays by name, oldest first.
type Seen = Vec<Vec<(String, ArrayD<f32>)>>;

fn dense_parts_history(backend: &Arc<dyn Backend>, steps: usize) -> (Store, Seen) {
    let mut w = Store::with_config(config()).unwrap();
    w.insert(
        "a",
        &Array1::from_shape_fn(40_000, |i| (i as f32 * 0.01).sin()),
    )
    .unwrap();
    w.insert(
        "b",
        &Array1::from_shape_fn(5_000, |i| (i as f32).cos() * 3.0),
    )
    .unwrap();
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    let mut seen = Vec::new();
    for step in 0..steps {
        if step > 0 {
            // A relative change of about 3e-5, as a small optimizer step makes.
            let k = 1.0 - 3e-5 * (1 + step % 2) as f32;
            w.update_map::<f32>("a", move |x| x * k).unwrap();
            w.update_map::<f32>("b", move |x| x * k).unwrap();
        }
        let part = w.write_part_to(backend.clone()).unwrap();
        c.commit_parts("main", &[part.part], &format!("step {step}"), Meta::new())
            .unwrap();
        c.save().unwrap();
        seen.push(
            ["a", "b"]
                .iter()
                .map(|n| (n.to_string(), w.get::<f32>(n).unwrap()))
                .collect(),
        );
    }
    (c, seen)
}

/// Every version on `main` (newest first in the log) holds what was written, bit for bit.
fn check_history(s: &Store, seen: &Seen) {
    s.verify().unwrap();
    let log = s.log(s.resolve("main").unwrap()).unwrap();
    assert_eq!(log.len(), seen.len());
    for (v, want) in log.iter().rev().zip(seen) {
        let snap = s.snapshot(*v).unwrap();
        for (name, a) in want {
            let got = snap.get::<f32>(name).unwrap();
            assert!(same_bits(&got, a), "{name} of {v:?} differs");
        }
    }
}

fn rebase_now() -> GcOptions {
    let mut o = GcOptions::immediate();
    o.rebase = true;
    o
}

#[test]
fn rebasing_a_dense_parts_history_shrinks_it_and_every_version_reads_bit_for_bit() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut c, seen) = dense_parts_history(&backend, 6);

    // A plain gc rewrites no pack: every chunk is live.
    let plain = c.gc_with(&GcOptions::immediate()).unwrap();
    assert_eq!(
        (plain.packs_rewritten, plain.chunks_rebased),
        (0, 0),
        "{plain:?}"
    );
    let before = repo_bytes(&*backend);

    // A dry run does not re-base.
    let mut dry = rebase_now();
    dry.dry_run = true;
    assert_eq!(c.gc_with(&dry).unwrap().chunks_rebased, 0);
    assert_eq!(repo_bytes(&*backend), before);

    let stats = c.gc_with(&rebase_now()).unwrap();
    // 5 of the 6 versions have a parent; a has 10 chunks of 16 KiB, b 2.
    assert_eq!(stats.chunks_rebased, 5 * 12, "{stats:?}");
    assert!(stats.packs_rewritten >= 5, "{stats:?}");
    assert!(
        (stats.rewritten_bytes_after as f64) <= REBASE_BELOW * stats.rewritten_bytes_before as f64,
        "{stats:?}"
    );
    // The whole packs were recorded and, with no grace, deleted in the same run.
    let after = repo_bytes(&*backend);
    assert!(
        (after as f64) < 0.7 * before as f64,
        "{before} bytes before, {after} after: {stats:?}"
    );
    check_history(&c, &seen);

    // Reopened, everything reads from the deltas; nothing is left to re-base.
    let mut r = Store::open_backend(backend.clone(), config()).unwrap();
    check_history(&r, &seen);
    let again = r.gc_with(&rebase_now()).unwrap();
    assert_eq!(
        (again.chunks_rebased, again.packs_rewritten),
        (0, 0),
        "{again:?}"
    );
    assert_eq!(repo_bytes(&*backend), after);
}

#[test]
fn a_long_history_is_rebased_in_chains_no_longer_than_the_bound_and_reads_back() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut c, seen) = dense_parts_history(&backend, 20);
    let stats = c.gc_with(&rebase_now()).unwrap();
    // Chains are cut at 8 deltas: of the 19 versions with a parent, two start a chain
    // again with a whole chunk (versions 8 and 16 of 0..20) and are not re-based.
    assert_eq!(stats.chunks_rebased, 17 * 12, "{stats:?}");
    let r = Store::open_backend(backend.clone(), config()).unwrap();
    check_history(&r, &seen);
}

#[test]
fn rebased_bases_stay_while_a_delta_needs_them_after_their_versions_are_pruned() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut c, seen) = dense_parts_history(&backend, 5);
    c.gc_with(&rebase_now()).unwrap();
    // Keep only the newest version: its chunks are deltas on the pruned ones.
    c.prune(&tensor_history::Retention::keep_last(1)).unwrap();
    c.clear_reflog();
    c.save().unwrap();
    let stats = c.gc_with(&rebase_now()).unwrap();
    assert_eq!(stats.chunks_rebased, 0, "{stats:?}");
    let r = Store::open_backend(backend.clone(), config()).unwrap();
    r.verify().unwrap();
    let head = r.head().unwrap();
    let snap = r.snapshot(head).unwrap();
    for (name, a) in &seen[4] {
        assert_eq!(&snap.get::<f32>(name).unwrap(), a, "{name}");
    }
}

#[test]
fn a_history_that_returns_to_earlier_values_is_rebased_without_a_cycle() {
    // Versions alternate between two states (A, B, A, B, ...): the same chunks appear in
    // many versions, each the "parent chunk" of the other; a delta of A on B and of B on
    // A would make a chain with no end.
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = Array1::from_shape_fn(20_000, |i| (i as f32 * 0.01).sin());
    let b = a.mapv(|x| x * (1.0 - 3e-5));
    let mut w = Store::with_config(config()).unwrap();
    w.insert("a", &a).unwrap();
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    for step in 0..6 {
        w.write("a", if step % 2 == 0 { &a } else { &b }).unwrap();
        let part = w.write_part_to(backend.clone()).unwrap();
        c.commit_parts("main", &[part.part], &format!("step {step}"), Meta::new())
            .unwrap();
        c.save().unwrap();
    }
    let stats = c.gc_with(&rebase_now()).unwrap();
    // B's chunks become deltas on A's; A's stay whole (they are B's bases).
    assert_eq!(stats.chunks_rebased, 5, "{stats:?}");
    let r = Store::open_backend(backend.clone(), config()).unwrap();
    r.verify().unwrap();
    for (k, v) in r
        .log(r.resolve("main").unwrap())
        .unwrap()
        .iter()
        .rev()
        .enumerate()
    {
        let want = if k % 2 == 0 { &a } else { &b };
        let got = r.snapshot(*v).unwrap().get::<f32>("a").unwrap();
        assert!(got
            .iter()
            .zip(want.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
