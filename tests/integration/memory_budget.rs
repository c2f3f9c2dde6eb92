//! The memory budget: a dense history past `Config::memory_budget` holds old versions
//! encoded (XOR deltas, byte planes), reads every version back bit for bit, keeps HEAD
//! and the working state raw, and keeps a delta's base alive after its version is pruned.

use std::time::{Duration, Instant};

use ndarray::{Array2, ArrayD};
use tensor_history::{Config, Retention, Store, VersionId};

/// A version and deep copies of its `w` and `m`.
type Kept = (VersionId, ArrayD<f32>, ArrayD<f32>);

const ROWS: usize = 64;
const COLS: usize = 256;

/// A store with 16 KiB chunks and `budget`, holding `w` and `m` (64 x 256 f32 each,
/// 64 KiB, 4 chunks), after `steps` dense AdamW-like steps, each committed. Returns the
/// deep copies of every version. Every version is tagged, so that the budget encodes
/// them all and lets none go (a budget that even encoded the history passes drops the
/// oldest versions nothing protects).
fn dense(budget: Option<usize>, steps: usize) -> (Store, Vec<Kept>) {
    dense_with(budget, steps, true, |_| {})
}

/// [`dense`], tagging each version or not (`tag`), calling `after` with the store after
/// each commit.
fn dense_with(
    budget: Option<usize>,
    steps: usize,
    tag: bool,
    mut after: impl FnMut(&Store),
) -> (Store, Vec<Kept>) {
    let mut s = Store::with_config(Config {
        chunk_bytes: 16 * 1024,
        memory_budget: budget,
        ..Config::default()
    })
    .unwrap();
    let w0 = Array2::from_shape_fn((ROWS, COLS), |(i, j)| {
        ((i * COLS + j) as f32 * 0.37).sin() * 0.05
    });
    s.insert("w", &w0).unwrap();
    s.insert("m", &Array2::<f32>::zeros((ROWS, COLS))).unwrap();
    let mut copies = Vec::new();
    let v = s.commit("init").unwrap();
    if tag {
        s.tag(&format!("t{v}"), v).unwrap();
    }
    copies.push((v, s.get::<f32>("w").unwrap(), s.get::<f32>("m").unwrap()));
    for step in 0..steps {
        let g = Array2::from_shape_fn((ROWS, COLS), |(i, j)| {
            (((i * 31 + j * 17 + step * 7) % 101) as f32 - 50.0) * 1e-4
        });
        s.zip_update::<f32, _, _>("m", &g, |m, g| 0.9 * m + 0.1 * g)
            .unwrap();
        let m = s.get::<f32>("m").unwrap();
        s.zip_update::<f32, _, _>("w", &m, |w, m| w - 1e-3 * m)
            .unwrap();
        let v = s.commit(&format!("step {step}")).unwrap();
        if tag {
            s.tag(&format!("t{v}"), v).unwrap();
        }
        after(&s);
        copies.push((v, s.get::<f32>("w").unwrap(), s.get::<f32>("m").unwrap()));
    }
    (s, copies)
}

fn check_all(s: &Store, copies: &[Kept]) {
    for (v, w, m) in copies {
        let snap = s.snapshot(*v).unwrap();
        assert_eq!(&snap.get::<f32>("w").unwrap(), w, "w at {v}");
        assert_eq!(&snap.get::<f32>("m").unwrap(), m, "m at {v}");
    }
}

fn raw(bits: &ArrayD<f32>) -> Vec<u32> {
    bits.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_dense_history_past_its_budget_holds_less_and_reads_back_bit_for_bit() {
    let (mut unbounded, _) = dense(None, 12);
    let (mut s, copies) = dense(Some(0), 12);
    let before = unbounded.stats();
    let held = s.enforce_memory_budget();
    let st = s.stats();
    assert_eq!(held, st.held_bytes);
    assert!(st.encoded_bytes > 0);
    assert!(
        st.held_bytes * 2 < before.held_bytes,
        "held {} of {} without a budget",
        st.held_bytes,
        before.held_bytes
    );
    assert!(st.encoded_held_bytes * 2 < st.encoded_bytes, "{st:?}");
    assert_eq!(
        st.unique_bytes, before.unique_bytes,
        "the same chunks, held differently"
    );
    assert_eq!(st.logical_bytes, before.logical_bytes);
    check_all(&s, &copies);
    s.verify().unwrap();
    // Without a budget, enforcing does nothing.
    assert_eq!(unbounded.enforce_memory_budget(), before.held_bytes);
    assert_eq!(unbounded.stats().encoded_bytes, 0);
}

#[test]
fn head_and_the_working_state_stay_raw() {
    let (mut s, _) = dense(Some(0), 4);
    s.enforce_memory_budget();
    for name in ["w", "m"] {
        assert!(s.tensor(name).unwrap().chunks().all(|c| !c.is_encoded()));
        let head = s.snapshot(s.head().unwrap()).unwrap();
        assert!(head.tensor(name).unwrap().chunks().all(|c| !c.is_encoded()));
    }
    let first = s.versions()[0];
    let old = s.snapshot(first).unwrap();
    assert!(old.tensor("w").unwrap().chunks().all(|c| c.is_encoded()));
}

#[test]
fn a_budget_that_is_not_passed_encodes_nothing() {
    let (mut s, _) = dense(Some(1 << 30), 6);
    s.enforce_memory_budget();
    assert_eq!(s.stats().encoded_bytes, 0);
}

#[test]
fn commits_past_the_budget_encode_in_the_background() {
    let (mut s, copies) = dense(Some(64 * 1024), 8);
    // The pass started by a commit is taken in by a later commit once it is done.
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.stats().encoded_bytes == 0 {
        assert!(Instant::now() < deadline, "no background pass finished");
        std::thread::sleep(Duration::from_millis(20));
        s.commit("again").unwrap();
    }
    check_all(&s, &copies);
}

#[test]
fn commits_faster_than_the_encoder_keep_the_raw_bytes_near_twice_the_budget() {
    // Back-pressure: a commit that finds the raw bytes past twice the budget while a
    // pass runs waits for it, so the raw part of the history cannot run away from the
    // encoder. A model is 128 KiB (w and m); the bound leaves room for the versions
    // committed while the running pass was planned and for HEAD and the working state.
    let budget = 128 * 1024;
    let model = 2 * ROWS * COLS * 4;
    let mut peak = 0;
    let (s, copies) = dense_with(Some(budget), 60, true, |s| {
        peak = peak.max(s.stats().heap_bytes);
    });
    assert!(
        peak <= 2 * budget + 4 * model,
        "raw bytes held peaked at {peak}, past twice the budget ({budget}) and four models"
    );
    check_all(&s, &copies);
}

#[test]
fn restore_of_an_encoded_version_then_writes_and_commits() {
    let (mut s, copies) = dense(Some(0), 6);
    s.enforce_memory_budget();
    let (v, w, _) = &copies[2];
    s.restore(*v).unwrap();
    assert_eq!(&s.get::<f32>("w").unwrap(), w);
    s.update_map::<f32>("w", |x| x * 2.0).unwrap();
    let nv = s.commit("doubled").unwrap();
    let want: Vec<u32> = w.iter().map(|x| (x * 2.0).to_bits()).collect();
    assert_eq!(raw(&s.snapshot(nv).unwrap().get::<f32>("w").unwrap()), want);
    s.enforce_memory_budget();
    check_all(&s, &copies);
    s.verify().unwrap();
}

#[test]
fn a_base_pruned_while_a_delta_needs_it_still_decodes() {
    let (mut s, copies) = dense(Some(0), 10);
    s.enforce_memory_budget();
    // Drop the oldest versions, whose chunks are the bases of the deltas that follow
    // (first the tags that kept the budget from letting them go).
    for (name, _) in s.refs() {
        if name != "main" {
            s.delete_tag(&name).unwrap();
        }
    }
    s.prune(&Retention::keep_last(4)).unwrap();
    let live = s.versions();
    assert!(!live.contains(&copies[0].0));
    let kept: Vec<_> = copies.into_iter().filter(|c| live.contains(&c.0)).collect();
    assert_eq!(kept.len(), 4);
    check_all(&s, &kept);
    s.verify().unwrap();
}

#[test]
fn a_chain_longer_than_its_bound_reads_back() {
    let steps = 3 * tensor_history::MAX_DELTA_CHAIN + 2;
    let (mut s, copies) = dense(Some(0), steps);
    s.enforce_memory_budget();
    check_all(&s, &copies);
}

#[test]
fn an_encoded_history_saves_and_reopens_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, copies) = dense(Some(0), 5);
    s.enforce_memory_budget();
    s.save_as(dir.path()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    check_all(&r, &copies);
    r.verify().unwrap();
}

#[test]
fn diff_and_export_read_encoded_versions() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, copies) = dense(Some(0), 4);
    s.enforce_memory_budget();
    let d = s.diff(copies[0].0, copies[1].0).unwrap();
    assert!(d.get("w").is_some());
    let path = dir.path().join("v1.safetensors");
    s.export_safetensors(copies[1].0, &path).unwrap();
    let mut t = Store::new();
    t.import_safetensors(&path).unwrap();
    assert_eq!(t.get::<f32>("w").unwrap(), copies[1].1);
}

#[test]
fn a_save_writes_the_chunks_held_coded_as_they_are_and_they_read_back() {
    // Twice the delta chain's bound, so that chains restart on disk as in memory.
    let steps = 2 * tensor_history::MAX_DELTA_CHAIN + 3;
    let (mut s, copies) = dense(Some(0), steps);
    s.enforce_memory_budget();
    let coded: usize = copies
        .iter()
        .map(|(v, _, _)| {
            let snap = s.snapshot(*v).unwrap();
            ["w", "m"]
                .iter()
                .map(|n| {
                    snap.tensor(n)
                        .unwrap()
                        .chunks()
                        .filter(|c| c.is_encoded())
                        .count()
                })
                .sum::<usize>()
        })
        .sum();
    assert!(coded > 0);
    let backend: std::sync::Arc<dyn tensor_history::Backend> =
        std::sync::Arc::new(tensor_history::MemoryBackend::new());
    let first = s.save_to(backend.clone()).unwrap();
    // The chunks held coded are written so (a chunk shared by versions counts once).
    assert!(first.chunks_written_as_held > 0, "{first:?}");
    assert!(first.chunks_written_as_held <= coded, "{first:?}");
    assert!(
        first.chunk_bytes_stored * 2 < first.chunk_bytes_raw,
        "{first:?}"
    );
    check_all(&s, &copies);
    // More dense steps on top, held coded against bases the repository holds now.
    let (v, w, m) = copies.last().cloned().unwrap();
    drop(s);
    let mut s = Store::open_backend(
        backend.clone(),
        Config {
            chunk_bytes: 16 * 1024,
            memory_budget: Some(0),
            ..Config::default()
        },
    )
    .unwrap();
    assert_eq!(s.head(), Some(v));
    let mut more = vec![(v, w, m)];
    // No budget while committing (a store bound to a repository spills what passes
    // it: these versions would be saved by their commits), then encode them at once.
    s.set_memory_budget(None);
    for step in 0..5 {
        s.update_map::<f32>("w", move |x| x * (1.0 - 1e-4) + step as f32 * 1e-6)
            .unwrap();
        let id = s.commit(&format!("more {step}")).unwrap();
        more.push((id, s.get::<f32>("w").unwrap(), s.get::<f32>("m").unwrap()));
    }
    s.set_memory_budget(Some(0));
    s.enforce_memory_budget();
    let second = s.save().unwrap();
    assert!(second.chunks_written_as_held > 0, "{second:?}");
    drop(s);
    let r = Store::open_backend(backend, Config::default()).unwrap();
    r.verify().unwrap();
    check_all(&r, &copies);
    check_all(&r, &more);
}

/// The bytes one commit of the dense model adds (`w` and `m`).
const MODEL: usize = 2 * ROWS * COLS * 4;

#[test]
fn without_a_repository_the_budget_holds_at_every_commit_and_the_oldest_unprotected_versions_go() {
    // Three models: HEAD and the working state raw, and about one model of encoded
    // versions. The bound at every commit is the budget plus the model in flight.
    let budget = 3 * MODEL;
    let mut peak = 0;
    let (mut s, copies) = dense_with(Some(budget), 40, false, |st| {
        peak = peak.max(st.stats().held_bytes);
    });
    assert!(
        peak <= budget + MODEL,
        "the history held {peak} bytes at a commit, past the budget {budget} plus a model {MODEL}"
    );
    s.enforce_memory_budget();
    let held = s.stats().held_bytes;
    assert!(held <= budget, "held {held} after enforcing {budget}");
    let live = s.versions();
    let dropped: Vec<&Kept> = copies.iter().filter(|c| !live.contains(&c.0)).collect();
    let kept: Vec<Kept> = copies
        .iter()
        .filter(|c| live.contains(&c.0))
        .cloned()
        .collect();
    assert!(
        !dropped.is_empty(),
        "40 dense versions fit in {budget} bytes?"
    );
    assert!(kept.len() >= 3, "{} versions kept", kept.len());
    // Oldest first: every dropped version is older than every kept one but HEAD's
    // protected ancestors (none here).
    let oldest_kept = kept[0].0;
    assert!(dropped.iter().all(|c| c.0 < oldest_kept), "{live:?}");
    // A dropped version is a typed error, never other data; the kept ones read back.
    for (v, _, _) in &dropped {
        assert!(
            matches!(
                s.snapshot(*v),
                Err(tensor_history::Error::PrunedVersion { .. })
            ),
            "{v}"
        );
    }
    check_all(&s, &kept);
    s.verify().unwrap();
}

#[test]
fn refs_and_head_protect_their_versions_from_the_budget() {
    let budget = 3 * MODEL;
    let (mut s, copies) = dense_with(Some(budget), 1, false, |_| {});
    let v0 = copies[0].0;
    s.tag("start", v0).unwrap();
    for step in 0..30 {
        s.update_map::<f32>("w", |x| x * 1.001 + 1e-4).unwrap();
        s.update_map::<f32>("m", |x| x * 0.9 + 1e-3).unwrap();
        s.commit(&format!("more {step}")).unwrap();
        assert!(s.stats().held_bytes <= budget + MODEL);
    }
    let live = s.versions();
    assert!(live.contains(&v0), "the tagged version went");
    assert!(live.contains(&s.head().unwrap()));
    assert!(live.len() < 32, "nothing was let go: {live:?}");
    check_all(&s, &copies[..1]);
    s.verify().unwrap();
}

#[test]
fn with_a_repository_the_budget_spills_versions_there_and_every_one_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 3 * MODEL;
    let mut s = Store::open_with(
        dir.path(),
        Config {
            chunk_bytes: 16 * 1024,
            memory_budget: Some(budget),
            ..Config::default()
        },
    )
    .unwrap();
    let w0 = Array2::from_shape_fn((ROWS, COLS), |(i, j)| ((i * COLS + j) as f32 * 0.37).sin());
    s.insert("w", &w0).unwrap();
    s.insert("m", &Array2::<f32>::zeros((ROWS, COLS))).unwrap();
    let mut copies = Vec::new();
    let mut peak = 0;
    for step in 0..40 {
        s.update_map::<f32>("w", |x| x * 1.001 + 1e-4).unwrap();
        s.update_map::<f32>("m", |x| x * 0.9 + 1e-3).unwrap();
        let v = s.commit(&format!("step {step}")).unwrap();
        peak = peak.max(s.stats().held_bytes);
        copies.push((v, s.get::<f32>("w").unwrap(), s.get::<f32>("m").unwrap()));
    }
    assert!(
        peak <= budget + MODEL,
        "the history held {peak} bytes at a commit, past the budget {budget} plus a model {MODEL}"
    );
    // Nothing was let go: the versions are in the repository and read back from it.
    assert_eq!(s.versions().len(), copies.len());
    check_all(&s, &copies);
    s.save().unwrap();
    drop(s);
    let r = Store::open(dir.path()).unwrap();
    check_all(&r, &copies);
    r.verify().unwrap();
}
