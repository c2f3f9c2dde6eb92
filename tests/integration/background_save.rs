//! Background saves (`Store::save_in_background`): the store stays usable while the
//! writer runs, the repository ends up with exactly what the save captured, errors are
//! never dropped, and a dropped store waits for its save.

use std::io::ErrorKind;
use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Backend, Config, Error, MemoryBackend, Retention, SimBackend, Store};

use crate::common::{fingerprint, ramp};

/// 4 KiB chunks, so that the tensors below have a few hundred of them.
fn config() -> Config {
    Config {
        chunk_bytes: 4 << 10,
        ..Config::default()
    }
}

/// The versions of `f` that its refs and HEAD reach are what a save writes; with no
/// pruning, that is every version of these tests' stores.
fn reopen(b: Arc<dyn Backend>) -> Store {
    let r = Store::open_backend(b, config()).expect("reopen");
    r.verify().expect("verify the reopened repository");
    r
}

/// A store of about 2 MiB (`w`, dense) and a small `b`, two versions, saved to `backend`.
fn saved_store(backend: Arc<dyn Backend>) -> Store {
    let mut s = Store::with_config(config()).unwrap();
    s.insert("w", &ramp(&[512, 1024], 0.0)).unwrap();
    s.insert("b", &ramp(&[7], 1.0)).unwrap();
    s.commit("init").unwrap();
    s.update::<f32>("w", |_, xs| xs[0] += 1.0).unwrap();
    s.commit("step").unwrap();
    s.save_to(backend).unwrap();
    s
}

/// Dense change of `w`, committed.
fn dense_step(s: &mut Store, k: usize) {
    s.update_map::<f32>("w", move |x| x * 0.5 + k as f32)
        .unwrap();
    s.commit(&format!("dense {k}")).unwrap();
}

#[test]
fn a_background_save_racing_commits_restores_prunes_and_branch_moves_saves_what_it_captured() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend.clone());
    let first = s.head().unwrap();
    for k in 0..3 {
        dense_step(&mut s, k);
    }
    s.branch("exp", s.head().unwrap()).unwrap();
    s.tag("before", first).unwrap();
    let captured = fingerprint(&s);
    let pending = s.save_in_background().unwrap();
    // Meanwhile: commits, a restore, a branch moved and one deleted, a prune that drops
    // versions the save captured, a write.
    dense_step(&mut s, 10);
    s.restore(first).unwrap();
    s.delete_branch("exp").unwrap();
    s.branch("exp", first).unwrap();
    s.delete_tag("before").unwrap();
    dense_step(&mut s, 11);
    let pruned = s.prune(&Retention::keep_last(1)).unwrap();
    assert!(!pruned.dropped.is_empty(), "{pruned:?}");
    s.write("b", &ramp(&[7], 9.0)).unwrap();
    let after = fingerprint(&s);
    let stats = pending.wait().unwrap();
    assert_eq!(stats.versions_written, 3, "{stats:?}");
    // The repository holds what the save captured, and nothing the store did since.
    assert_eq!(fingerprint(&reopen(backend.clone())), captured);
    // The store kept everything it did meanwhile; its next save writes it.
    assert_eq!(fingerprint(&s), after);
    s.commit("last").unwrap();
    let want = fingerprint(&s);
    s.save().unwrap();
    let got = fingerprint(&reopen(backend));
    assert_eq!(
        (&got.head, &got.branch, &got.refs),
        (&want.head, &want.branch, &want.refs)
    );
    // Every version the refs reach (the store also keeps one only its reflog holds).
    for (v, content) in &got.versions {
        assert_eq!(want.versions.get(v), Some(content));
    }
    assert!(got.versions.len() + 1 >= want.versions.len());
    s.verify().unwrap();
}

#[test]
fn a_second_background_save_waits_for_the_first_and_saves_what_it_captured() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend.clone());
    dense_step(&mut s, 0);
    let first = s.save_in_background().unwrap();
    dense_step(&mut s, 1);
    s.branch("side", s.head().unwrap()).unwrap();
    let want = fingerprint(&s);
    let second = s.save_in_background().unwrap();
    // The first ended before the second started.
    assert!(first.is_finished());
    assert_eq!(first.wait().unwrap().versions_written, 1);
    assert_eq!(second.wait().unwrap().versions_written, 1);
    assert_eq!(fingerprint(&reopen(backend)), want);
}

#[test]
fn save_during_a_background_save_waits_for_it_then_saves() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend.clone());
    dense_step(&mut s, 0);
    let pending = s.save_in_background().unwrap();
    dense_step(&mut s, 1);
    let stats = s.save().unwrap();
    assert!(pending.is_finished());
    assert_eq!(pending.wait().unwrap().versions_written, 1);
    assert_eq!(stats.versions_written, 1);
    assert_eq!(stats.chunks_present, 1, "{stats:?}"); // `b`, shared
    assert_eq!(fingerprint(&reopen(backend)), fingerprint(&s));
}

#[test]
fn reads_that_name_the_repository_work_while_a_save_runs() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend.clone());
    let location = s.location().unwrap().to_owned();
    let v1 = s.head().unwrap();
    let prefix = s.version_hash(v1).unwrap().to_string()[..12].to_owned();
    dense_step(&mut s, 0);
    let pending = s.save_in_background().unwrap();
    assert_eq!(s.location(), Some(location.as_str()));
    assert!(s.backend().is_some());
    assert_eq!(s.resolve(&prefix).unwrap(), v1);
    pending.wait().unwrap();
}

/// A store saved to a simulated disk whose `n`-th operation from now fails, with one
/// new version committed.
fn failing_store(kind: ErrorKind) -> (Store, Arc<SimBackend>) {
    let sim = Arc::new(SimBackend::new());
    let mut s = saved_store(sim.clone());
    dense_step(&mut s, 0);
    sim.fail_at(sim.ops(), kind);
    (s, sim)
}

#[test]
fn a_background_save_error_comes_from_wait_and_only_once() {
    let (mut s, sim) = failing_store(ErrorKind::StorageFull);
    let r = s.save_in_background().unwrap().wait();
    assert!(
        matches!(
            r,
            Err(Error::Io {
                kind: ErrorKind::StorageFull,
                ..
            })
        ),
        "{r:?}"
    );
    // Seen through wait: the next save does not give it again; it saves.
    s.save().unwrap();
    assert_eq!(fingerprint(&reopen(sim)), fingerprint(&s));
}

#[test]
fn an_error_nobody_waited_for_comes_back_from_the_next_save_which_changes_nothing() {
    let (mut s, sim) = failing_store(ErrorKind::StorageFull);
    let before = fingerprint(&s);
    drop(s.save_in_background().unwrap());
    dense_step(&mut s, 1);
    let during = fingerprint(&s);
    let r = s.save();
    assert!(
        matches!(
            r,
            Err(Error::Io {
                kind: ErrorKind::StorageFull,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(
        fingerprint(&s),
        during,
        "the failing call changed the store"
    );
    assert_ne!(during, before);
    // Reported once: the next save saves everything.
    s.save().unwrap();
    assert_eq!(fingerprint(&reopen(sim)), during);
}

#[test]
fn an_error_nobody_waited_for_comes_back_from_the_next_background_save() {
    let (mut s, sim) = failing_store(ErrorKind::PermissionDenied);
    drop(s.save_in_background().unwrap());
    let r = s.save_in_background();
    assert!(
        matches!(
            r,
            Err(Error::Io {
                kind: ErrorKind::PermissionDenied,
                ..
            })
        ),
        "{r:?}"
    );
    s.save_in_background().unwrap().wait().unwrap();
    assert_eq!(fingerprint(&reopen(sim)), fingerprint(&s));
}

#[test]
fn an_error_nobody_waited_for_comes_back_from_refresh_and_from_close() {
    let (mut s, _) = failing_store(ErrorKind::StorageFull);
    drop(s.save_in_background().unwrap());
    let r = s.refresh();
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");
    s.refresh().unwrap();

    let (mut s, _) = failing_store(ErrorKind::StorageFull);
    drop(s.save_in_background().unwrap());
    let r = s.close();
    assert!(matches!(r, Err(Error::Io { .. })), "{r:?}");

    // Waited for: close does not give it again.
    let (mut s, _) = failing_store(ErrorKind::StorageFull);
    assert!(s.save_in_background().unwrap().wait().is_err());
    s.close().unwrap();
}

#[test]
fn a_conflict_of_a_background_save_comes_from_wait() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend.clone());
    let mut other = reopen(backend.clone());
    other.update::<f32>("w", |_, xs| xs[1] = 5.0).unwrap();
    other.commit("theirs").unwrap();
    other.save().unwrap();
    dense_step(&mut s, 0);
    let r = s.save_in_background().unwrap().wait();
    assert!(
        matches!(&r, Err(Error::BranchMoved { branch, .. }) if branch == "main"),
        "{r:?}"
    );
    // As after a conflicting save: refresh reports the branch as diverged.
    let stats = s.refresh().unwrap();
    assert_eq!(stats.diverged, ["main"]);
}

#[test]
fn a_store_dropped_with_a_save_in_flight_leaves_every_version_that_save_captured() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::with_config(config()).unwrap();
    s.insert("w", &ramp(&[1024, 1024], 0.0)).unwrap();
    s.commit("init").unwrap();
    s.save_as(dir.path()).unwrap();
    for k in 0..3 {
        dense_step(&mut s, k);
    }
    s.tag("t", s.head().unwrap()).unwrap();
    let captured = fingerprint(&s);
    let pending = s.save_in_background().unwrap();
    // Changes after the capture are not saved.
    dense_step(&mut s, 9);
    drop(pending);
    drop(s);
    let r = Store::open_with(dir.path(), config()).unwrap();
    r.verify().unwrap();
    assert_eq!(fingerprint(&r), captured);
}

#[test]
fn after_a_background_save_only_the_working_state_stays_on_the_heap() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend);
    let first = s.head().unwrap();
    for k in 0..3 {
        dense_step(&mut s, k);
    }
    let pending = s.save_in_background().unwrap();
    // The working state moves back to a version the save covers: its chunks stay raw.
    s.restore(first).unwrap();
    pending.wait().unwrap();
    s.commit("again").unwrap(); // takes the finished save back
    assert!(!s.save_in_flight());
    let working = s.working_snapshot();
    for name in working.names() {
        let t = working.tensor(&name).unwrap();
        assert!(t.chunks().all(|c| !c.is_stored()), "{name} was evicted");
    }
    let stats = s.stats();
    let working_bytes: usize = ["w", "b"]
        .iter()
        .map(|n| s.tensor(n).unwrap().nbytes())
        .sum();
    assert!(
        stats.held_bytes <= working_bytes + (64 << 10),
        "held {} for a working state of {working_bytes}",
        stats.held_bytes
    );
    // Evicted versions read back from the repository.
    s.verify().unwrap();
}

#[test]
fn a_failed_call_during_a_background_save_changes_nothing() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = saved_store(backend);
    let pending = s.save_in_background().unwrap();
    let before = fingerprint(&s);
    let bad = ArrayD::<f32>::zeros(IxDyn(&[3]));
    assert!(s.write("w", &bad).is_err());
    assert!(s.branch("exp", tensor_history::VersionId(99)).is_err());
    assert_eq!(fingerprint(&s), before);
    pending.wait().unwrap();
}

#[test]
fn a_background_save_of_a_store_without_a_repository_is_an_error() {
    let mut s = Store::new();
    s.insert("w", &ramp(&[4], 0.0)).unwrap();
    s.commit("c").unwrap();
    let r = s.save_in_background();
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    s.close().unwrap();
}

#[test]
fn background_saves_of_two_stores_on_different_branches_race_and_both_land() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = saved_store(Arc::new(MemoryBackend::new()));
    s.save_as(dir.path()).unwrap();
    drop(s);
    let mut a = Store::open_with(dir.path(), config()).unwrap();
    let mut b = Store::open_with(dir.path(), config()).unwrap();
    b.branch("exp", b.head().unwrap()).unwrap();
    b.checkout("exp").unwrap();
    for round in 0..4 {
        dense_step(&mut a, round);
        dense_step(&mut b, 100 + round);
        let pa = a.save_in_background().unwrap();
        let pb = b.save_in_background().unwrap();
        // Both writers run at once; each store goes on meanwhile.
        dense_step(&mut a, 50 + round);
        pa.wait().unwrap();
        pb.wait().unwrap();
    }
    a.save().unwrap();
    let r = Store::open_with(dir.path(), config()).unwrap();
    r.verify().unwrap();
    let hash = |s: &Store, name: &str| s.version_hash(s.resolve(name).unwrap()).unwrap();
    assert_eq!(hash(&r, "main"), hash(&a, "main"));
    assert_eq!(hash(&r, "exp"), hash(&b, "exp"));
    a.close().unwrap();
    b.close().unwrap();
}

/// A memory backend whose barriers wait while the gate is closed: a save holds there
/// until the test opens it.
#[derive(Debug, Default)]
struct Gated {
    inner: MemoryBackend,
    closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gated {
    fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }
}

/// Opens the gate when dropped.
struct OpenOnDrop(Arc<Gated>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl Backend for Gated {
    fn get(&self, key: &str) -> tensor_history::Result<tensor_history::Bytes> {
        self.inner.get(key)
    }
    fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> tensor_history::Result<tensor_history::Bytes> {
        self.inner.get_range(key, range)
    }
    fn put(&self, key: &str, data: &[u8]) -> tensor_history::Result<()> {
        self.inner.put(key, data)
    }
    fn put_if_absent(
        &self,
        key: &str,
        data: &[u8],
    ) -> tensor_history::Result<tensor_history::PutOutcome> {
        self.inner.put_if_absent(key, data)
    }
    fn list(&self, prefix: &str) -> tensor_history::Result<Vec<tensor_history::ObjectInfo>> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> tensor_history::Result<()> {
        self.inner.delete(key)
    }
    fn barrier(&self) -> tensor_history::Result<()> {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
        drop(closed);
        self.inner.barrier()
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

fn chunks_of(s: &Store, id: tensor_history::VersionId) -> Vec<tensor_history::Chunk> {
    s.snapshot(id)
        .unwrap()
        .tensor("w")
        .unwrap()
        .chunks()
        .cloned()
        .collect()
}

#[test]
fn the_budget_leaves_what_a_save_writes_raw_and_a_saved_parent_stays_on_the_heap_for_the_next_save()
{
    let gated = Arc::new(Gated::default());
    let backend: Arc<dyn Backend> = gated.clone();
    // A budget of 1.75 models (`w` is 2 MiB): the raw versions pass it, but HEAD with
    // the history encoded does not, so the budget encodes and never spills (a spill is
    // a background save of its own: the gated one below would wait for it).
    let mut s = Store::with_config(Config {
        memory_budget: Some(7 << 19),
        ..config()
    })
    .unwrap();
    // Dropped before the store (a failed assertion then ends the test, not hangs it).
    let _open_at_the_end = OpenOnDrop(gated.clone());
    s.insert("w", &ramp(&[512, 1024], 0.0)).unwrap();
    s.commit("init").unwrap();
    s.save_to(backend.clone()).unwrap();
    dense_step(&mut s, 1);
    let captured = s.head().unwrap();
    gated.set(true);
    let pending = s.save_in_background().unwrap();
    // While the save holds at its barrier, a dense commit puts the store over its
    // budget: the version the save is writing is not encoded in memory as well.
    dense_step(&mut s, 2);
    let next = s.head().unwrap();
    s.enforce_memory_budget();
    assert!(s.save_in_flight());
    assert!(
        chunks_of(&s, captured)
            .iter()
            .all(|c| !c.is_encoded() && !c.is_stored()),
        "the version being saved was encoded in memory"
    );
    gated.set(false);
    pending.wait().unwrap();
    // From here on no budget is passed: a spill (a save of the budget's own) would
    // save the unsaved version before the save below.
    s.set_memory_budget(Some(64 << 20));
    dense_step(&mut s, 3); // takes the finished save back
    assert!(!s.save_in_flight());
    // The saved version is the parent of an unsaved one: the next save's deltas are
    // taken against its chunks, which stay on the heap until that save.
    assert!(chunks_of(&s, captured).iter().all(|c| !c.is_stored()));
    let stats = s.save().unwrap();
    assert!(
        stats.chunk_bytes_stored < stats.chunk_bytes_raw,
        "{stats:?}"
    );
    assert!(chunks_of(&s, captured).iter().all(|c| c.is_stored()));
    assert!(chunks_of(&s, next).iter().all(|c| c.is_stored()));
    let head = s.head().unwrap();
    assert!(chunks_of(&s, head).iter().all(|c| !c.is_stored()));
    let before = fingerprint(&s);
    drop(s);
    assert_eq!(fingerprint(&reopen(backend)), before);
}
