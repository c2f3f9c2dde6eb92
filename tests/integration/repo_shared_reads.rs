//! What a save, a refresh and an open read of a repository that many stores save to, one
//! branch each (Ray Tune trials checkpointing into one repository): a save and a refresh
//! read what is new since the store last looked, not the whole repository, so their cost
//! does not grow with the number of versions, index files or ref log entries; an open
//! reads the repository's versions and index files once.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use tensor_history::{Backend, Bytes, Config, MemoryBackend, ObjectInfo, PutOutcome, Store};

use crate::common::{ramp, CHUNK_BYTES};

const TRIALS: usize = 8;

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

/// A memory backend that counts reads (`get`, `get_range`) and listings by the key's
/// first path component (`index`, `versions`, `refs`, ...).
struct Counting {
    inner: Arc<MemoryBackend>,
    reads: Mutex<BTreeMap<String, usize>>,
}

impl Counting {
    fn new(inner: &Arc<MemoryBackend>) -> Arc<Counting> {
        Arc::new(Counting {
            inner: inner.clone(),
            reads: Mutex::new(BTreeMap::new()),
        })
    }

    fn count(&self, what: &str, key: &str) {
        let top = key.split('/').next().unwrap_or(key);
        *self
            .reads
            .lock()
            .unwrap()
            .entry(format!("{what} {top}"))
            .or_default() += 1;
    }

    /// The counts since the last call, and zero them.
    fn take(&self) -> BTreeMap<String, usize> {
        std::mem::take(&mut *self.reads.lock().unwrap())
    }
}

impl std::fmt::Debug for Counting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counting")
    }
}

impl Backend for Counting {
    fn get(&self, key: &str) -> tensor_history::Result<Bytes> {
        self.count("get", key);
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> tensor_history::Result<Bytes> {
        self.count("get", key);
        self.inner.get_range(key, range)
    }
    fn put(&self, key: &str, data: &[u8]) -> tensor_history::Result<()> {
        self.inner.put(key, data)
    }
    fn put_if_absent(&self, key: &str, data: &[u8]) -> tensor_history::Result<PutOutcome> {
        self.inner.put_if_absent(key, data)
    }
    fn list(&self, prefix: &str) -> tensor_history::Result<Vec<ObjectInfo>> {
        self.count("list", prefix);
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> tensor_history::Result<()> {
        self.inner.delete(key)
    }
    fn barrier(&self) -> tensor_history::Result<()> {
        self.inner.barrier()
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

/// `TRIALS` stores on one repository, each on its own branch `trials/<i>` (first saved
/// with `save_to`, as `tensor_history.ray.checkpoint` does), each through its own
/// counting backend.
fn trials(inner: &Arc<MemoryBackend>) -> Vec<(Store, Arc<Counting>)> {
    (0..TRIALS)
        .map(|i| {
            let counting = Counting::new(inner);
            let mut s = Store::with_config(config()).unwrap();
            s.insert("w", &ramp(&[16, 16], i as f32)).unwrap();
            let v = s.commit("init").unwrap();
            s.branch(&format!("trials/{i}"), v).unwrap();
            s.checkout(&format!("trials/{i}")).unwrap();
            s.delete_branch("main").unwrap();
            s.save_to(counting.clone()).unwrap();
            (s, counting)
        })
        .collect()
}

/// One round: every trial changes a row, commits and saves.
fn round(trials: &mut [(Store, Arc<Counting>)], step: usize) {
    for (s, _) in trials.iter_mut() {
        s.update_range::<f32>("w", (step % 16) * 16..(step % 16) * 16 + 1, |_, xs| {
            xs[0] += 1.0;
        })
        .unwrap();
        s.commit(&format!("step {step}")).unwrap();
        s.save().unwrap();
    }
}

/// What trial 0's save of one more step reads, after every other trial saved once more.
fn reads_of_a_save(trials: &mut [(Store, Arc<Counting>)], step: usize) -> BTreeMap<String, usize> {
    round(&mut trials[1..], step);
    let (s, counting) = &mut trials[0];
    s.update_range::<f32>("w", 0..1, |_, xs| xs[0] += 1.0)
        .unwrap();
    s.commit(&format!("step {step}")).unwrap();
    counting.take();
    s.save().unwrap();
    counting.take()
}

/// What trial 0's refresh reads after every other trial saved once more since its last
/// refresh.
fn reads_of_a_refresh(
    trials: &mut [(Store, Arc<Counting>)],
    step: usize,
) -> BTreeMap<String, usize> {
    trials[0].0.refresh().unwrap();
    round(&mut trials[1..], step);
    let (s, counting) = &mut trials[0];
    counting.take();
    let stats = s.refresh().unwrap();
    assert_eq!(stats.versions_loaded, TRIALS - 1);
    counting.take()
}

#[test]
fn a_save_and_a_refresh_read_what_is_new_however_many_versions_the_repository_holds() {
    let inner = Arc::new(MemoryBackend::new());
    let mut t = trials(&inner);
    for step in 0..2 {
        round(&mut t, step);
    }
    let save_early = reads_of_a_save(&mut t, 2);
    let refresh_early = reads_of_a_refresh(&mut t, 3);
    for step in 4..40 {
        round(&mut t, step);
    }
    let save_late = reads_of_a_save(&mut t, 40);
    let refresh_late = reads_of_a_refresh(&mut t, 41);
    // The repository grew about tenfold: 8 branches of 3 versions, then of 41, an index
    // file per save, a ref log entry per save.
    let index_files = inner.list("index/").unwrap().len();
    assert!(index_files > 300, "{index_files} index files");
    assert_eq!(
        save_early, save_late,
        "reads of a save, at 4 and at 42 versions per branch"
    );
    assert_eq!(
        refresh_early, refresh_late,
        "reads of a refresh, at 4 and at 42 versions per branch"
    );
    // The index files the other trials wrote since trial 0's last save (7 in the round
    // that save was part of, 7 in the next), not all of them; no version object; the
    // latest entry of the ref written.
    assert_eq!(
        save_late.get("get index"),
        Some(&(2 * (TRIALS - 1))),
        "{save_late:?}"
    );
    assert_eq!(save_late.get("get versions"), None, "{save_late:?}");
    assert!(save_late.get("get refs") <= Some(&1), "{save_late:?}");
    // A refresh reads the new index files and the new versions (7 each), and the latest
    // entry of each ref log.
    assert_eq!(
        refresh_late.get("get index"),
        Some(&(TRIALS - 1)),
        "{refresh_late:?}"
    );
    assert_eq!(
        refresh_late.get("get versions"),
        Some(&(TRIALS - 1)),
        "{refresh_late:?}"
    );
    assert_eq!(
        refresh_late.get("get refs"),
        Some(&TRIALS),
        "{refresh_late:?}"
    );

    // An open reads every index file and every version once (the documented
    // O(versions) open), and one entry per ref log.
    let counting = Counting::new(&inner);
    let r = Store::open_backend(counting.clone(), config()).unwrap();
    let open = counting.take();
    let versions = inner.list("versions/").unwrap().len();
    assert_eq!(open.get("get index"), Some(&index_files), "{open:?}");
    assert_eq!(open.get("get versions"), Some(&versions), "{open:?}");
    assert_eq!(open.get("get refs"), Some(&TRIALS), "{open:?}");
    r.verify().unwrap();
}
