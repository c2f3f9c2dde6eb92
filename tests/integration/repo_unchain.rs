//! gc's unchaining (`GcOptions::unchain`, on by default): a dense history saved with
//! delta chains, most of whose versions are then pruned, gives back the pruned
//! versions' bytes. The chunks of the kept versions whose chains ran through pruned
//! versions are coded again (against the kept ancestor's chunks, or whole), and every
//! kept version reads bit for bit, after reopening and after further runs.

use std::sync::Arc;
use std::time::Duration;

use ndarray::{Array1, ArrayD};
use tensor_history::{Backend, Config, GcOptions, MemoryBackend, Retention, Store, VersionId};

use crate::common::{repo_bytes, same_bits};

const CHUNK: usize = 16 << 10;
const STEPS: usize = 20;
/// The versions tagged before pruning (the last one, the head, is kept too).
const TAGGED: [usize; 3] = [4, 11, 15];

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK,
        ..Config::default()
    }
}

fn chunk_bytes(b: &dyn Backend) -> u64 {
    b.list("")
        .unwrap()
        .iter()
        .filter(|o| o.key.starts_with("packs/"))
        .map(|o| o.size)
        .sum()
}

/// A kept version and the arrays it holds.
type Kept = Vec<(VersionId, Vec<(String, ArrayD<f32>)>)>;

/// `STEPS` dense versions of two tensors (every element changes a little at each step,
/// as an optimizer step makes it), each committed and saved with deltas against the
/// previous one; the versions of `TAGGED` tagged; then every other version but the
/// head pruned and the prune saved. Returns the store and the kept versions.
fn pruned_dense_history(backend: &Arc<dyn Backend>) -> (Store, Kept) {
    let mut s = Store::open_backend(backend.clone(), config()).unwrap();
    s.insert(
        "a",
        &Array1::from_shape_fn(40_000, |i| (i as f32 * 0.01).sin()),
    )
    .unwrap();
    s.insert(
        "b",
        &Array1::from_shape_fn(5_000, |i| (i as f32).cos() * 3.0),
    )
    .unwrap();
    let mut kept = Vec::new();
    for step in 0..STEPS {
        if step > 0 {
            let k = 1.0 - 3e-5 * (1 + step % 3) as f32;
            s.update_map::<f32>("a", move |x| x * k).unwrap();
            s.update_map::<f32>("b", move |x| x * k + 1e-6).unwrap();
        }
        let v = s.commit(&format!("step {step}")).unwrap();
        if TAGGED.contains(&step) {
            s.tag(&format!("t{step}"), v).unwrap();
        }
        s.save().unwrap();
        if TAGGED.contains(&step) || step == STEPS - 1 {
            let arrays = ["a", "b"]
                .iter()
                .map(|n| (n.to_string(), s.get::<f32>(n).unwrap()))
                .collect();
            kept.push((v, arrays));
        }
    }
    s.clear_reflog();
    let stats = s.prune(&Retention::keep_last(1)).unwrap();
    assert_eq!(stats.kept, TAGGED.len() + 1, "{stats:?}");
    s.save().unwrap();
    (s, kept)
}

fn check_kept(s: &Store, kept: &Kept) {
    s.verify().unwrap();
    for (v, arrays) in kept {
        let snap = s.snapshot(*v).unwrap();
        for (name, want) in arrays {
            let got = snap.get::<f32>(name).unwrap();
            assert!(same_bits(&got, want), "{name} of {v:?} differs");
        }
    }
}

fn no_unchain() -> GcOptions {
    let mut o = GcOptions::immediate();
    o.unchain = false;
    o
}

#[test]
fn unchaining_gives_back_the_bytes_of_pruned_versions_inside_delta_chains() {
    // Twin repositories with the same history: one collected without unchaining (the
    // pruned versions stay as the bases of the kept ones' deltas), one with it.
    let plain: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut p, _) = pruned_dense_history(&plain);
    let saved = chunk_bytes(&*plain);
    for _ in 0..2 {
        let stats = p.gc_with(&no_unchain()).unwrap();
        assert_eq!(stats.chunks_unchained, 0, "{stats:?}");
    }
    let kept_by_chains = chunk_bytes(&*plain);

    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut s, kept) = pruned_dense_history(&backend);
    assert_eq!(chunk_bytes(&*backend), saved);
    let first = s.gc_with(&GcOptions::immediate()).unwrap();
    // a has 10 chunks of 16 KiB, b 2: every chunk of the kept versions ran through a
    // pruned version (chains restart every 8 versions, at versions 0, 8 and 16).
    assert_eq!(first.chunks_unchained, 4 * 12, "{first:?}");
    assert!(first.packs_rewritten >= 4, "{first:?}");
    check_kept(&s, &kept);
    // The second run deletes the pruned versions' chunks, which the first kept for the
    // old forms it deleted.
    let second = s.gc_with(&GcOptions::immediate()).unwrap();
    assert_eq!(second.chunks_unchained, 0, "{second:?}");
    assert!(second.objects_deleted > 0, "{second:?}");
    let unchained = chunk_bytes(&*backend);
    // Without unchaining, 17 of the 20 versions' chunks stay (0-4 for version 4, 8-19
    // for the others); with it, the 4 kept versions': one whole, three deltas.
    assert!(
        (unchained as f64) < 0.5 * kept_by_chains as f64,
        "{saved} chunk bytes saved, {kept_by_chains} after gc without unchaining, \
         {unchained} with it"
    );

    // Reopened, everything reads; nothing is left to do.
    let mut r = Store::open_backend(backend.clone(), config()).unwrap();
    check_kept(&r, &kept);
    let total = repo_bytes(&*backend);
    let again = r.gc_with(&GcOptions::immediate()).unwrap();
    assert_eq!(
        (
            again.chunks_unchained,
            again.packs_rewritten,
            again.objects_deleted
        ),
        (0, 0, 0),
        "{again:?}"
    );
    assert_eq!(repo_bytes(&*backend), total);
    check_kept(&Store::open_backend(backend, config()).unwrap(), &kept);
}

#[test]
fn with_a_grace_period_the_old_forms_wait_and_nothing_is_coded_twice() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut s, kept) = pruned_dense_history(&backend);
    let mut graced = GcOptions::default();
    graced.grace = Duration::from_secs(3600);
    let first = s.gc_with(&graced).unwrap();
    assert_eq!(first.chunks_unchained, 4 * 12, "{first:?}");
    // Only index files go (more than 8 were merged into one).
    assert_eq!(first.objects_deleted, first.indexes_merged, "{first:?}");
    // The old packs are still there, holding the old forms: a second run serves the
    // chunks from their new forms and codes nothing again.
    let second = s.gc_with(&graced).unwrap();
    assert_eq!(
        (second.chunks_unchained, second.packs_rewritten),
        (0, 0),
        "{second:?}"
    );
    check_kept(
        &Store::open_backend(backend.clone(), config()).unwrap(),
        &kept,
    );
    // With the grace period over, the old packs go, then the pruned versions' chunks.
    let before = chunk_bytes(&*backend);
    s.gc_with(&GcOptions::immediate()).unwrap();
    s.gc_with(&GcOptions::immediate()).unwrap();
    let after = chunk_bytes(&*backend);
    assert!((after as f64) < 0.5 * before as f64, "{before} -> {after}");
    check_kept(&Store::open_backend(backend, config()).unwrap(), &kept);
}

#[test]
fn a_dry_run_predicts_the_unchaining_and_a_run_without_it_codes_nothing() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (mut s, kept) = pruned_dense_history(&backend);
    let mut dry = GcOptions::immediate();
    dry.dry_run = true;
    let before = repo_bytes(&*backend);
    let predicted = s.gc_with(&dry).unwrap();
    assert_eq!(predicted.chunks_unchained, 4 * 12, "{predicted:?}");
    assert_eq!(repo_bytes(&*backend), before);
    assert_eq!(s.gc_with(&no_unchain()).unwrap().chunks_unchained, 0);
    check_kept(
        &Store::open_backend(backend.clone(), config()).unwrap(),
        &kept,
    );
    let done = s.gc_with(&GcOptions::immediate()).unwrap();
    assert_eq!(
        done.chunks_unchained, predicted.chunks_unchained,
        "{done:?}"
    );
    assert_eq!(done.packs_rewritten, predicted.packs_rewritten, "{done:?}");
}
