//! Several stores on one repository: saves of different branches both land, a save of a
//! branch another store moved is a conflict that loses nothing, refresh takes in what
//! others saved.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use tensor_history::{
    Backend, Bytes, Config, Error, GcOptions, MemoryBackend, MergeStrategy, ObjectInfo, PutOutcome,
    Retention, SaveStats, Store,
};

use crate::common::{dense_weights, ramp, same_bits, CHUNK_BYTES, DENSE_CHUNK_BYTES};

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

/// A repository with one saved version on `main`, and its directory.
fn shared_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open_with(dir.path(), config()).unwrap();
    s.insert("w", &ramp(&[16, 16], 0.0)).unwrap();
    s.commit("init").unwrap();
    s.save().unwrap();
    dir
}

fn open(dir: &tempfile::TempDir) -> Store {
    Store::open_with(dir.path(), config()).unwrap()
}

/// Delete branch `exp`, prune what nothing reaches (gc keeps what the store running it
/// still holds) and save: what only `exp` reached is then unreferenced.
fn drop_exp_and_save(b: &mut Store) {
    b.checkout("main").unwrap();
    b.delete_branch("exp").unwrap();
    b.prune(&Retention::default().drop_unreachable(true))
        .unwrap();
    b.save().unwrap();
}

fn bump(s: &mut Store, row: usize) {
    s.update_range::<f32>("w", row * 16..row * 16 + 1, |_, xs| xs[0] += 1.0)
        .unwrap();
}

#[test]
fn saves_of_different_branches_both_land() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    let base = a.head().unwrap();
    a.branch("a", base).unwrap();
    a.checkout("a").unwrap();
    bump(&mut a, 1);
    let va = a.commit("on a").unwrap();
    b.branch("b", base).unwrap();
    b.checkout("b").unwrap();
    bump(&mut b, 2);
    b.commit("on b").unwrap();
    a.save().unwrap();
    b.save().unwrap();

    let r = open(&dir);
    r.verify().unwrap();
    let names: Vec<String> = r.refs().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "b", "main"]);
    assert_eq!(
        r.snapshot(r.resolve("a").unwrap()).unwrap().content_hash(),
        a.snapshot(va).unwrap().content_hash()
    );
    assert_eq!(r.message(r.resolve("b").unwrap()).unwrap(), "on b");
}

#[test]
fn a_save_of_a_branch_moved_by_another_store_is_a_conflict_that_loses_nothing() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    bump(&mut a, 1);
    a.commit("a's step").unwrap();
    a.save().unwrap();

    bump(&mut b, 2);
    let vb = b.commit("b's step").unwrap();
    let before = b.get::<f32>("w").unwrap();
    let e = b.save().unwrap_err();
    assert!(
        matches!(&e, Error::BranchMoved { branch, .. } if branch == "main"),
        "{e:?}"
    );
    // Nothing lost in memory, nothing written for main.
    assert_eq!(b.head(), Some(vb));
    assert_eq!(b.get::<f32>("w").unwrap(), before);
    b.verify().unwrap();
    let r = open(&dir);
    assert_eq!(r.message(r.head().unwrap()).unwrap(), "a's step");

    // Refresh, merge the other store's work, save: a fast-forward over theirs.
    let stats = b.refresh().unwrap();
    assert_eq!(stats.diverged, ["main"]);
    assert_eq!(stats.versions_loaded, 1);
    let theirs = b
        .tips()
        .into_iter()
        .find(|v| b.message(*v).unwrap() == "a's step")
        .unwrap();
    b.merge(theirs, MergeStrategy::Ours).unwrap();
    b.save().unwrap();
    let r = open(&dir);
    r.verify().unwrap();
    let head = r.head().unwrap();
    assert_eq!(r.parents(head).unwrap().len(), 2);
    let w = r.get::<f32>("w").unwrap();
    assert_eq!(w[[1, 0]], 1.0 + ramp(&[16, 16], 0.0)[[1, 0]]);
    assert_eq!(w[[2, 0]], 1.0 + ramp(&[16, 16], 0.0)[[2, 0]]);
}

#[test]
fn refresh_takes_in_versions_and_refs_saved_by_another_store() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    bump(&mut a, 3);
    let va = a.commit("a's step").unwrap();
    a.tag("good", va).unwrap();
    a.save().unwrap();

    let stats = b.refresh().unwrap();
    assert_eq!(stats.versions_loaded, 1);
    assert_eq!(stats.refs_updated, ["good", "main"]);
    assert!(stats.diverged.is_empty());
    let head = b.head().unwrap();
    assert_eq!(b.message(head).unwrap(), "a's step");
    assert_eq!(b.resolve("good").unwrap(), head);
    assert_eq!(b.get::<f32>("w").unwrap(), a.get::<f32>("w").unwrap());
    assert_eq!(b.version_hash(head).unwrap(), a.version_hash(va).unwrap());
    b.verify().unwrap();
    // A second refresh finds nothing new.
    let again = b.refresh().unwrap();
    assert_eq!(again.versions_loaded, 0);
    assert!(again.refs_updated.is_empty());
    // And b can build on it and save without conflict.
    bump(&mut b, 4);
    b.commit("b after refresh").unwrap();
    b.save().unwrap();
}

#[test]
fn refresh_keeps_uncommitted_changes_and_reports_the_checked_out_branch() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    bump(&mut a, 3);
    a.commit("a's step").unwrap();
    a.save().unwrap();
    bump(&mut b, 5);
    let dirty = b.get::<f32>("w").unwrap();
    let stats = b.refresh().unwrap();
    assert_eq!(stats.diverged, ["main"]);
    assert_eq!(b.get::<f32>("w").unwrap(), dirty);
}

#[test]
fn ref_log_entries_are_create_if_absent_files() {
    let dir = shared_repo();
    let log = dir.path().join("refs").join("main");
    let entries: Vec<_> = std::fs::read_dir(&log).unwrap().collect();
    assert_eq!(entries.len(), 1);
    let mut s = open(&dir);
    bump(&mut s, 1);
    s.commit("two").unwrap();
    s.save().unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["00000000000000000000.json", "00000000000000000001.json"]
    );
}

#[test]
fn a_save_writes_again_what_another_stores_gc_recorded_since_it_opened() {
    let dir = shared_repo();
    let mut a = open(&dir);
    a.branch("exp", a.head().unwrap()).unwrap();
    a.checkout("exp").unwrap();
    bump(&mut a, 3);
    let e1 = a.commit("exp 1").unwrap();
    a.save().unwrap();
    // Another store deletes the branch and records what only it reached.
    let mut b = open(&dir);
    drop_exp_and_save(&mut b);
    let gc = b.gc().unwrap();
    assert!(gc.candidates_recorded > 0, "{gc:?}");
    // The first store still holds exp 1 and builds on it: the recorded version, its
    // manifests and its chunks are written again, not reused.
    a.branch("exp2", e1).unwrap();
    a.checkout("exp2").unwrap();
    a.insert("b", &ramp(&[4], 42.0)).unwrap();
    a.commit("exp 2").unwrap();
    let saved = a.save().unwrap();
    assert_eq!(saved.versions_written, 2, "{saved:?}");
    assert!(saved.chunks_written > 1, "{saved:?}");
    assert!(saved.manifests_written >= 2, "{saved:?}");
    // A gc that deletes at once what is still unreferenced keeps all of it.
    b.refresh().unwrap();
    b.gc_with(&GcOptions::immediate()).unwrap();
    let c = open(&dir);
    c.verify().unwrap();
    let tip = c.resolve("exp2").unwrap();
    assert_eq!(
        c.snapshot(tip).unwrap().get::<f32>("b").unwrap(),
        ramp(&[4], 42.0)
    );
}

#[test]
fn a_save_after_another_stores_gc_deleted_packs_writes_the_chunks_again() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let base = a.get::<f32>("w").unwrap();
    a.branch("exp", a.head().unwrap()).unwrap();
    a.checkout("exp").unwrap();
    bump(&mut a, 3);
    a.commit("exp 1").unwrap();
    a.save().unwrap();
    let changed = a.get::<f32>("w").unwrap();
    // Another store deletes the branch and its data at once.
    let mut b = open(&dir);
    drop_exp_and_save(&mut b);
    let gc = b.gc_with(&GcOptions::immediate()).unwrap();
    assert!(gc.bytes_deleted > 0, "{gc:?}");
    // The first store commits the same contents on a new branch from main: the chunks
    // its index listed in the deleted pack are written again.
    a.checkout("main").unwrap();
    a.branch("again", a.head().unwrap()).unwrap();
    a.checkout("again").unwrap();
    a.update::<f32>("w", |off, xs| {
        for (i, x) in xs.iter_mut().enumerate() {
            *x = changed.as_slice().unwrap()[off + i];
        }
    })
    .unwrap();
    assert_ne!(a.get::<f32>("w").unwrap(), base);
    a.commit("again").unwrap();
    let saved = a.save().unwrap();
    assert!(saved.chunks_written > 0, "{saved:?}");
    let c = open(&dir);
    c.verify().unwrap();
    let tip = c.resolve("again").unwrap();
    assert_eq!(c.snapshot(tip).unwrap().get::<f32>("w").unwrap(), changed);
}

/// The files below `dir/sub`, recursively.
fn count_files(dir: &std::path::Path, sub: &str) -> usize {
    let mut n = 0;
    let mut todo = vec![dir.join(sub)];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                n += 1;
            }
        }
    }
    n
}

/// A long-lived store saves a version; another store runs a whole gc cycle (grace 0)
/// that deletes only that version and a manifest of it (the pack holding just that
/// manifest, no chunk), and removes its gc record; the first store then commits on top of the version, reusing the manifest,
/// and saves (after a refresh, or not). The save must write both again: a repository
/// whose new ref reaches a deleted version or manifest is broken for every reader.
#[test]
fn a_save_after_another_stores_gc_deleted_only_versions_and_manifests_writes_them_again() {
    for refresh_first in [false, true] {
        let dir = shared_repo();
        let mut a = open(&dir);
        let w = a.get::<f32>("w").unwrap();
        let flat = w.clone().into_shape_with_order(vec![256]).unwrap();
        a.branch("exp", a.head().unwrap()).unwrap();
        a.checkout("exp").unwrap();
        // Same bytes as `w`, another shape: a new manifest, no new chunk.
        a.insert("v", &flat).unwrap();
        let e1 = a.commit("exp 1").unwrap();
        let saved = a.save().unwrap();
        assert_eq!(saved.chunks_written, 0, "{saved:?}");
        let (packs, indexes) = (
            count_files(dir.path(), "packs"),
            count_files(dir.path(), "index"),
        );
        let (versions, manifests) = (
            count_files(dir.path(), "versions"),
            count_files(dir.path(), "manifests"),
        );

        // Another store deletes the branch, prunes, saves, and collects at once.
        let mut b = open(&dir);
        drop_exp_and_save(&mut b);
        let gc = b.gc_with(&GcOptions::immediate()).unwrap();
        assert!(gc.objects_deleted >= 2, "{gc:?}");
        // Only the version and its new manifest went (the manifest was the only entry
        // of its save's pack: the pack went, and the indexes were written again without
        // it), and no gc record is left to tell.
        assert_eq!(count_files(dir.path(), "packs"), packs - 1);
        assert!(count_files(dir.path(), "index") <= indexes);
        assert_eq!(count_files(dir.path(), "versions"), versions - 1);
        assert_eq!((manifests, count_files(dir.path(), "manifests")), (0, 0));
        assert_eq!(
            std::fs::read_dir(dir.path().join("gc"))
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().is_file())
                .count(),
            0
        );
        drop(b);

        if refresh_first {
            a.refresh().unwrap();
        }
        // The first store builds on the collected version and reuses its manifest.
        a.branch("exp2", e1).unwrap();
        a.checkout("exp2").unwrap();
        bump(&mut a, 5);
        let e2 = a.commit("exp 2").unwrap();
        let want = a.snapshot(e2).unwrap().content_hash();
        let saved = a.save().unwrap();
        let r = Store::open_with(dir.path(), config())
            .unwrap_or_else(|e| panic!("refresh first: {refresh_first}: reopen: {e}"));
        r.verify().unwrap();
        // Both written again: the collected version and the manifest of `v`; and the
        // new version with its new manifest of `w`.
        assert_eq!(saved.versions_written, 2, "{saved:?}");
        assert_eq!(saved.manifests_written, 2, "{saved:?}");
        let tip = r.resolve("exp2").unwrap();
        assert_eq!(r.snapshot(tip).unwrap().content_hash(), want);
        assert_eq!(r.snapshot(tip).unwrap().get::<f32>("v").unwrap(), flat);
        let parent = r.parents(tip).unwrap()[0];
        assert_eq!(r.message(parent).unwrap(), "exp 1");
        assert_eq!(
            r.snapshot(parent).unwrap().content_hash(),
            a.snapshot(e1).unwrap().content_hash()
        );
        // Every version the first store's refs reach is in the repository.
        for (name, rf) in a.refs() {
            if name == "exp" {
                continue; // deleted by the other store, and not moved here since
            }
            let h = a.version_hash(rf.target()).unwrap();
            let id = r.resolve(&h.to_string()).unwrap();
            let mut todo = vec![rf.target()];
            while let Some(v) = todo.pop() {
                let hv = a.version_hash(v).unwrap();
                assert!(r.resolve(&hv.to_string()).is_ok(), "{name}: {hv} missing");
                todo.extend(a.parents(v).unwrap());
            }
            assert_eq!(r.version_hash(id).unwrap(), h);
        }
    }
}

/// A backend operation, as a hook sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Put,
    PutIfAbsent,
    List,
    Delete,
}

type Hook = Box<dyn Fn(Op, &str) + Send + Sync>;

/// A memory backend shared by several stores, each through its own `Hooked`, whose hook
/// runs before every write, listing and deletion: what another process does at that
/// moment.
struct Hooked {
    inner: Arc<MemoryBackend>,
    hook: Mutex<Option<Hook>>,
}

impl Hooked {
    fn new(inner: &Arc<MemoryBackend>) -> Arc<Hooked> {
        Arc::new(Hooked {
            inner: inner.clone(),
            hook: Mutex::new(None),
        })
    }

    fn set(&self, hook: impl Fn(Op, &str) + Send + Sync + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }

    fn run(&self, op: Op, key: &str) {
        if let Some(h) = &*self.hook.lock().unwrap() {
            h(op, key);
        }
    }
}

impl std::fmt::Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooked")
    }
}

impl Backend for Hooked {
    fn get(&self, key: &str) -> tensor_history::Result<Bytes> {
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> tensor_history::Result<Bytes> {
        self.inner.get_range(key, range)
    }
    fn put(&self, key: &str, data: &[u8]) -> tensor_history::Result<()> {
        self.run(Op::Put, key);
        self.inner.put(key, data)
    }
    fn put_if_absent(&self, key: &str, data: &[u8]) -> tensor_history::Result<PutOutcome> {
        self.run(Op::PutIfAbsent, key);
        self.inner.put_if_absent(key, data)
    }
    fn list(&self, prefix: &str) -> tensor_history::Result<Vec<ObjectInfo>> {
        self.run(Op::List, prefix);
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> tensor_history::Result<()> {
        self.run(Op::Delete, key);
        self.inner.delete(key)
    }
    fn barrier(&self) -> tensor_history::Result<()> {
        self.inner.barrier()
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

/// A repository in memory where store `a` (through `hooked_a`) saved `main` and a
/// version `exp 1` on `exp` with a tensor `v` whose manifest only that version has; a
/// second store (through `hooked_b`) deleted `exp`, pruned, saved, and ran a gc that
/// recorded the version and that manifest (deleting nothing yet). Returns `a`, the
/// second store, `exp 1` and `v`.
fn recorded_by_another_store(
    hooked_a: &Arc<Hooked>,
    hooked_b: &Arc<Hooked>,
) -> (
    Store,
    Store,
    tensor_history::VersionId,
    ndarray::ArrayD<f32>,
) {
    let mut a = Store::with_config(config()).unwrap();
    a.insert("w", &ramp(&[16, 16], 0.0)).unwrap();
    a.commit("init").unwrap();
    a.save_to(hooked_a.clone()).unwrap();
    let flat = a
        .get::<f32>("w")
        .unwrap()
        .into_shape_with_order(vec![256])
        .unwrap();
    a.branch("exp", a.head().unwrap()).unwrap();
    a.checkout("exp").unwrap();
    a.insert("v", &flat).unwrap();
    let e1 = a.commit("exp 1").unwrap();
    a.save().unwrap();

    let mut b = Store::open_backend(hooked_b.clone(), config()).unwrap();
    drop_exp_and_save(&mut b);
    let gc = b.gc().unwrap();
    assert!(gc.candidates_recorded >= 2, "{gc:?}");
    assert_eq!(gc.objects_deleted, 0, "{gc:?}");
    (a, b, e1, flat)
}

/// `a` branches `exp2` from `e1`, changes `w` and commits.
fn build_on(a: &mut Store, e1: tensor_history::VersionId) {
    a.branch("exp2", e1).unwrap();
    a.checkout("exp2").unwrap();
    bump(a, 5);
    a.commit("exp 2").unwrap();
}

/// The repository opens and verifies, and `exp2` holds `v` on top of `exp 1`.
fn check_exp2(inner: &Arc<MemoryBackend>, flat: &ndarray::ArrayD<f32>) {
    let r = Store::open_backend(inner.clone(), config()).unwrap_or_else(|e| panic!("reopen: {e}"));
    r.verify().unwrap();
    let tip = r.resolve("exp2").unwrap();
    assert_eq!(&r.snapshot(tip).unwrap().get::<f32>("v").unwrap(), flat);
    let parent = r.parents(tip).unwrap()[0];
    assert_eq!(r.message(parent).unwrap(), "exp 1");
}

/// A gc run decides to delete a version and a manifest that it recorded an hour (here:
/// one run) before; just then another store saves a version built on them, writing
/// both again since a record lists them. The run lists the repository again after its
/// generation entry and keeps what was written since its first listing.
#[test]
fn a_gc_keeps_what_a_save_wrote_again_between_its_listing_and_its_deletions() {
    let inner = Arc::new(MemoryBackend::new());
    let hooked = Hooked::new(&inner);
    let (a, mut b, e1, flat) = recorded_by_another_store(&Hooked::new(&inner), &hooked);
    // The next run finds the record due; as it starts deleting, the first store saves.
    let a = Arc::new(Mutex::new(Some(a)));
    let a_hook = a.clone();
    hooked.set(move |op, key| {
        if op != Op::PutIfAbsent || !key.starts_with("gc/generations/") {
            return;
        }
        if let Some(mut a) = a_hook.lock().unwrap().take() {
            build_on(&mut a, e1);
            let saved = a.save().unwrap();
            assert_eq!(saved.versions_written, 2, "{saved:?}");
        }
    });
    b.gc_with(&GcOptions::immediate()).unwrap();
    assert!(a.lock().unwrap().is_none(), "the hook did not run");
    check_exp2(&inner, &flat);
    // And a later gc (the record is gone; nothing is unreferenced) keeps it all.
    b.refresh().unwrap();
    b.gc_with(&GcOptions::immediate()).unwrap();
    check_exp2(&inner, &flat);
}

/// A save reads the gc record, then a gc run creates its generation entry and lists the
/// repository; the save writes the recorded version and manifest again; the run deletes
/// them (its listing was older) and finishes. The save's check after its barrier finds
/// the new generation and writes them once more before any ref names them.
#[test]
fn a_save_writes_again_what_a_gc_deleted_between_its_writes_and_its_refs() {
    use std::sync::mpsc::channel;
    let inner = Arc::new(MemoryBackend::new());
    let (hooked_a, hooked_b) = (Hooked::new(&inner), Hooked::new(&inner));
    let (mut a, mut b, e1, flat) = recorded_by_another_store(&hooked_a, &hooked_b);
    build_on(&mut a, e1);

    let (caught_up_tx, caught_up_rx) = channel::<()>();
    let (at_delete_tx, at_delete_rx) = channel::<()>();
    let (go_b_tx, go_b_rx) = channel::<()>();
    let (b_done_tx, b_done_rx) = channel::<()>();
    let caught_up_tx = Mutex::new(Some(caught_up_tx));
    let at_delete_rx = Mutex::new(Some(at_delete_rx));
    let go_b_tx = Mutex::new(Some(go_b_tx));
    let b_done_rx = Mutex::new(Some(b_done_rx));
    let wrote = std::sync::atomic::AtomicBool::new(false);
    hooked_a.set(move |op, key| {
        if op == Op::Put && !wrote.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // `a` has caught up (read the record) and starts writing: the gc run lists
            // and stops before its first deletion.
            caught_up_tx
                .lock()
                .unwrap()
                .take()
                .unwrap()
                .send(())
                .unwrap();
            at_delete_rx.lock().unwrap().take().unwrap().recv().unwrap();
        } else if op == Op::List && key == "gc/" && wrote.load(std::sync::atomic::Ordering::SeqCst)
        {
            // `a` wrote everything again and checks gc: the run deletes and finishes first.
            if let Some(go) = go_b_tx.lock().unwrap().take() {
                go.send(()).unwrap();
                b_done_rx.lock().unwrap().take().unwrap().recv().unwrap();
            }
        }
    });
    let at_delete_tx = Mutex::new(Some(at_delete_tx));
    let go_b_rx = Mutex::new(Some(go_b_rx));
    hooked_b.set(move |op, _| {
        if op == Op::Delete {
            if let Some(tx) = at_delete_tx.lock().unwrap().take() {
                tx.send(()).unwrap();
                go_b_rx.lock().unwrap().take().unwrap().recv().unwrap();
            }
        }
    });
    let gc = std::thread::spawn(move || {
        caught_up_rx.recv().unwrap();
        let stats = b.gc_with(&GcOptions::immediate()).unwrap();
        b_done_tx.send(()).unwrap();
        stats
    });
    let saved = a.save().unwrap();
    let stats = gc.join().unwrap();
    assert!(stats.objects_deleted >= 2, "{stats:?}");
    check_exp2(&inner, &flat);
    // `exp 1` written twice: before the run deleted it and after; and `exp 2`.
    assert_eq!(saved.versions_written, 3, "{saved:?}");
}

/// A repository whose `main` holds three versions, each with a tensor of its own (so
/// that a pruned version's manifest is its alone); the middle one's id.
fn three_on_main(dir: &tempfile::TempDir) -> tensor_history::VersionId {
    let mut s = open(dir);
    s.insert("m1", &ramp(&[4], 1.0)).unwrap();
    let v1 = s.commit("second").unwrap();
    s.remove("m1").unwrap();
    s.insert("m2", &ramp(&[4], 2.0)).unwrap();
    s.commit("third").unwrap();
    s.save().unwrap();
    v1
}

#[test]
fn an_idle_store_saves_after_another_store_pruned_and_collected() {
    let cases = [
        (false, false, false),
        (true, false, false),
        (false, true, false),
        (false, true, true),
    ];
    for (refresh_first, two_runs, save_between) in cases {
        let dir = shared_repo();
        let v1 = three_on_main(&dir);
        // Store `a` opens the repository and stays idle.
        let mut a = open(&dir);
        let v1_hash = a.version_hash(v1).unwrap();
        let head_hash = a.version_hash(a.head().unwrap()).unwrap();

        // Another store prunes the middle version, saves and collects it.
        let mut b = open(&dir);
        b.prune(&Retention::keep_last(1)).unwrap();
        assert!(b.message(v1).is_err());
        b.save().unwrap();
        if two_runs {
            // Two runs a grace period apart: the first records, the second deletes.
            let grace = std::time::Duration::from_millis(50);
            let mut opts = GcOptions::default();
            opts.grace = grace;
            let first = b.gc_with(&opts).unwrap();
            assert_eq!(first.objects_deleted, 0, "{first:?}");
            if save_between {
                // A save between the runs does not write the pruned version again: the
                // second run still collects it.
                let saved = a.save().unwrap();
                assert_eq!(saved.versions_written, 0, "{saved:?}");
            }
            std::thread::sleep(grace * 2);
            let second = b.gc_with(&opts).unwrap();
            assert!(second.objects_deleted >= 2, "{second:?}");
        } else {
            let gc = b.gc_with(&GcOptions::immediate()).unwrap();
            assert!(gc.objects_deleted >= 2, "{gc:?}");
        }
        drop(b);

        if refresh_first {
            a.refresh().unwrap();
        }
        // The idle store forgets the collected version, as the other store pruned it,
        // and saves new work.
        a.save().unwrap();
        assert!(
            matches!(a.message(v1), Err(Error::PrunedVersion { .. })),
            "{:?}",
            a.message(v1)
        );
        assert_eq!(a.version_hash(a.head().unwrap()).unwrap(), head_hash);
        bump(&mut a, 4);
        let v = a.commit("after the gc").unwrap();
        a.save().unwrap();
        a.verify().unwrap();

        let r = open(&dir);
        r.verify().unwrap();
        assert_eq!(r.message(r.head().unwrap()).unwrap(), "after the gc");
        assert_eq!(
            r.version_hash(r.head().unwrap()).unwrap(),
            a.version_hash(v).unwrap()
        );
        let messages: Vec<String> = r
            .log(r.head().unwrap())
            .unwrap()
            .into_iter()
            .map(|e| r.message(e).unwrap().to_string())
            .collect();
        assert_eq!(messages, ["after the gc", "third"]);
        assert!(r.resolve(&v1_hash.to_string()).is_err());
    }
}

#[test]
fn a_branch_another_store_deleted_while_moved_here_is_written_again_after_a_refresh() {
    let dir = shared_repo();
    let mut s = open(&dir);
    s.branch("keep", s.head().unwrap()).unwrap();
    s.save().unwrap();
    let mut a = open(&dir);
    let mut b = open(&dir);
    a.checkout("keep").unwrap();
    bump(&mut a, 1);
    let va = a.commit("on keep").unwrap();
    b.delete_branch("keep").unwrap();
    b.save().unwrap();

    let e = a.save().unwrap_err();
    assert!(
        matches!(&e, Error::BranchMoved { branch, theirs: None, .. } if branch == "keep"),
        "{e:?}"
    );
    assert!(e.to_string().contains("deleted there"), "{e}");
    let stats = a.refresh().unwrap();
    assert_eq!(stats.diverged, ["keep"]);
    assert_eq!(stats.theirs.get("keep"), Some(&None));
    // The way out: this store's branch is written again, and HEAD with it.
    a.save().unwrap();
    assert_eq!(a.save().unwrap().refs_written, 0);
    let r = open(&dir);
    assert_eq!(r.resolve("keep").unwrap(), va);
    assert_eq!(r.current_branch(), Some("keep"));
    assert_eq!(r.message(r.head().unwrap()).unwrap(), "on keep");
}

#[test]
fn a_diverged_branch_whose_work_another_branch_holds_follows_the_repository_after_a_refresh() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    bump(&mut a, 1);
    let va = a.commit("a's step").unwrap();
    let va_hash = a.version_hash(va).unwrap();
    a.save().unwrap();

    bump(&mut b, 2);
    let vb = b.commit("b's step").unwrap();
    let e = b.save().unwrap_err();
    assert!(
        matches!(&e, Error::BranchMoved { branch, theirs: Some(h), .. } if branch == "main" && *h == va_hash),
        "{e:?}"
    );
    // b keeps its work on a branch of its own; `main` may then take the repository's.
    b.branch("b-side", vb).unwrap();
    b.checkout("b-side").unwrap();
    let stats = b.refresh().unwrap();
    assert!(stats.diverged.is_empty(), "{stats:?}");
    assert_eq!(stats.refs_updated, ["main"]);
    assert_eq!(b.version_hash(b.resolve("main").unwrap()).unwrap(), va_hash);
    b.save().unwrap();
    let r = open(&dir);
    assert_eq!(r.version_hash(r.resolve("main").unwrap()).unwrap(), va_hash);
    assert_eq!(r.message(r.resolve("b-side").unwrap()).unwrap(), "b's step");
    assert_eq!(r.current_branch(), Some("b-side"));
}

#[test]
fn the_checked_out_branch_moved_here_stays_after_a_refresh_even_when_a_tag_holds_its_version() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    bump(&mut a, 1);
    let va = a.commit("a's step").unwrap();
    let va_hash = a.version_hash(va).unwrap();
    a.save().unwrap();

    bump(&mut b, 2);
    let vb = b.commit("b's step").unwrap();
    b.tag("b-best", vb).unwrap();
    let working = b.get::<f32>("w").unwrap();
    assert!(matches!(b.save().unwrap_err(), Error::BranchMoved { .. }));
    let stats = b.refresh().unwrap();
    // `main` is where b trains: it stays at b's version with b's working state, and is
    // reported as diverged with the repository's version to merge.
    assert_eq!(stats.diverged, ["main"], "{stats:?}");
    assert_eq!(
        stats.theirs["main"].map(|v| b.version_hash(v).unwrap()),
        Some(va_hash)
    );
    assert_eq!(b.current_branch(), Some("main"));
    assert_eq!(b.resolve("main").unwrap(), vb);
    assert_eq!(b.head(), Some(vb));
    assert!(!b.is_dirty());
    assert!(same_bits(&b.get::<f32>("w").unwrap(), &working));
}

#[test]
fn a_branch_deleted_here_and_moved_by_another_store_follows_the_repository_after_a_refresh() {
    let dir = shared_repo();
    let mut s = open(&dir);
    s.branch("exp", s.head().unwrap()).unwrap();
    s.save().unwrap();
    let mut a = open(&dir);
    let mut b = open(&dir);
    b.checkout("exp").unwrap();
    bump(&mut b, 1);
    b.commit("on exp").unwrap();
    b.save().unwrap();
    a.delete_branch("exp").unwrap();
    assert!(matches!(a.save(), Err(Error::BranchMoved { branch, .. }) if branch == "exp"));
    let stats = a.refresh().unwrap();
    assert_eq!(stats.refs_updated, ["exp"]);
    assert_eq!(a.message(a.resolve("exp").unwrap()).unwrap(), "on exp");
    a.save().unwrap();
}

#[test]
fn a_diverged_branch_names_the_repositorys_version_and_leaves_the_other_refs_saved() {
    let dir = shared_repo();
    let mut a = open(&dir);
    let mut b = open(&dir);
    bump(&mut a, 1);
    let va = a.commit("a's step").unwrap();
    a.save().unwrap();
    let va_hash = a.version_hash(va).unwrap();

    let base = b.head().unwrap();
    bump(&mut b, 2);
    b.commit("b's step").unwrap();
    b.tag("b-tag", base).unwrap();
    b.branch("other", base).unwrap();
    assert!(matches!(b.save(), Err(Error::BranchMoved { .. })));
    let stats = b.refresh().unwrap();
    assert_eq!(stats.diverged, ["main"]);
    let theirs = stats.theirs["main"].unwrap();
    assert_eq!(b.version_hash(theirs).unwrap(), va_hash);
    assert_eq!(b.message(theirs).unwrap(), "a's step");
    // Still diverged: each save writes what it can and names the branch it could not.
    bump(&mut b, 3);
    let later = b.commit("later").unwrap();
    b.branch("later", later).unwrap();
    let e = b.save().unwrap_err();
    assert!(
        matches!(&e, Error::BranchMoved { branch, theirs: Some(h), .. } if branch == "main" && *h == va_hash),
        "{e:?}"
    );
    let r = open(&dir);
    for name in ["b-tag", "other", "later"] {
        assert!(r.resolve(name).is_ok(), "{name}");
    }
    assert_eq!(
        r.resolve("main").unwrap(),
        r.resolve(&va_hash.to_string()).unwrap()
    );
    // Merge theirs, save: a fast-forward over the repository's main.
    b.merge(theirs, MergeStrategy::Ours).unwrap();
    b.save().unwrap();
}

/// Every version `r` (a reopened repository) holds reads back bit for bit as the store
/// `a` that saved it holds it, and every version `a`'s refs reach is in `r` (but those of
/// `gone`, refs another store deleted).
fn reads_back_as_saved(a: &Store, r: &Store, gone: &[&str]) {
    r.verify().unwrap();
    for v in r.versions() {
        let h = r.version_hash(v).unwrap().to_string();
        let Ok(mine) = a.resolve(&h) else {
            continue; // saved by the other store only
        };
        let (theirs, mine) = (r.snapshot(v).unwrap(), a.snapshot(mine).unwrap());
        assert_eq!(theirs.names(), mine.names(), "{h}");
        for name in theirs.names() {
            let (x, y) = (
                theirs.get::<f32>(&name).unwrap(),
                mine.get::<f32>(&name).unwrap(),
            );
            assert_eq!(x.shape(), y.shape(), "{h} {name}");
            let bits = |t: &ndarray::ArrayD<f32>| t.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x), bits(&y), "{h} {name}");
        }
    }
    for (name, rf) in a.refs() {
        if gone.contains(&name.as_str()) {
            continue;
        }
        let mut todo = vec![rf.target()];
        while let Some(v) = todo.pop() {
            let h = a.version_hash(v).unwrap();
            assert!(r.resolve(&h.to_string()).is_ok(), "{name}: {h} missing");
            todo.extend(a.parents(v).unwrap());
        }
    }
}

/// A gc run created its generation entry and listed the repository again, and is about
/// to delete a version and a manifest it recorded. A save that starts just then sees
/// that generation and the record, so it writes both again, and its check after its
/// barrier still finds the same generation and the record: without more, its refs
/// would name what the run deletes next. The run's entry lists the record and is not
/// closed, so the save waits until the run is done, then writes again what it deleted.
#[test]
fn a_save_that_starts_while_a_gc_run_deletes_waits_for_it_and_writes_again_what_it_deleted() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::channel;
    let inner = Arc::new(MemoryBackend::new());
    let (hooked_a, hooked_b) = (Hooked::new(&inner), Hooked::new(&inner));
    let (mut a, mut b, e1, flat) = recorded_by_another_store(&hooked_a, &hooked_b);
    build_on(&mut a, e1);

    // The run stops before its first deletion (after its entry and its second listing)
    // until the save has written everything again and checks gc.
    let (at_delete_tx, at_delete_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    let at_delete_tx = Mutex::new(Some(at_delete_tx));
    let go_rx = Mutex::new(Some(go_rx));
    hooked_b.set(move |op, _| {
        if op == Op::Delete {
            if let Some(tx) = at_delete_tx.lock().unwrap().take() {
                tx.send(()).unwrap();
                go_rx.lock().unwrap().take().unwrap().recv().unwrap();
            }
        }
    });
    let gc = std::thread::spawn(move || b.gc_with(&GcOptions::immediate()).unwrap());
    at_delete_rx.recv().unwrap();
    assert_eq!(inner.list("gc/generations/").unwrap().len(), 1);

    let go_tx = Mutex::new(Some(go_tx));
    let wrote = AtomicBool::new(false);
    hooked_a.set(move |op, key| {
        if op == Op::Put {
            wrote.store(true, Ordering::SeqCst);
        } else if op == Op::List && key == "gc/" && wrote.load(Ordering::SeqCst) {
            if let Some(go) = go_tx.lock().unwrap().take() {
                go.send(()).unwrap();
            }
        }
    });
    let saved = a.save().unwrap();
    let stats = gc.join().unwrap();
    assert!(stats.objects_deleted >= 2, "{stats:?}");
    check_exp2(&inner, &flat);
    let r = Store::open_backend(inner.clone(), config()).unwrap();
    reads_back_as_saved(&a, &r, &[]);
    // `exp 1` written twice (before the run deleted it and after), and `exp 2`.
    assert_eq!(saved.versions_written, 3, "{saved:?}");
}

/// A gc run whose deadline (`delete_within` after it announced its deletions) passes
/// while it deletes starts no deletion after it: the objects it did not delete stay, its
/// record stays for a later run, and its entry is closed. The next run deletes the rest.
#[test]
fn a_gc_run_past_its_deadline_deletes_nothing_more_and_a_later_run_deletes_the_rest() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let inner = Arc::new(MemoryBackend::new());
    let (hooked_a, hooked_b) = (Hooked::new(&inner), Hooked::new(&inner));
    let (a, mut b, _, _) = recorded_by_another_store(&hooked_a, &hooked_b);
    let records = || {
        inner
            .list("gc/")
            .unwrap()
            .into_iter()
            .filter(|o| o.key.ends_with(".thgc"))
            .count()
    };
    assert_eq!(records(), 1);

    // The first deletion takes longer than the run's whole time to delete.
    let slow = AtomicBool::new(true);
    let deletes = Arc::new(AtomicUsize::new(0));
    let counted = deletes.clone();
    hooked_b.set(move |op, _| {
        if op == Op::Delete {
            counted.fetch_add(1, Ordering::SeqCst);
            if slow.swap(false, Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
        }
    });
    let mut options = GcOptions::immediate();
    options.delete_within = std::time::Duration::from_millis(100);
    let stats = b.gc_with(&options).unwrap();
    assert_eq!(stats.objects_deleted, 1, "{stats:?}");
    assert_eq!(records(), 1, "the record stays for a later run");
    assert_eq!(
        deletes.load(Ordering::SeqCst),
        1,
        "a deletion after the deadline"
    );
    // The run's generation entry stays, closed.
    let entries = inner.list("gc/generations/").unwrap();
    assert_eq!(entries.len(), 1);
    let entry = String::from_utf8(inner.get(&entries[0].key).unwrap().to_vec()).unwrap();
    assert!(entry.contains("\"closed_ns\""), "{entry}");
    let r = Store::open_backend(inner.clone(), config()).unwrap();
    reads_back_as_saved(&a, &r, &["exp"]);

    let stats = b.gc_with(&GcOptions::immediate()).unwrap();
    assert!(stats.objects_deleted >= 1, "{stats:?}");
    assert_eq!(records(), 0, "{stats:?}");
    let r = Store::open_backend(inner.clone(), config()).unwrap();
    reads_back_as_saved(&a, &r, &["exp"]);
    // Nothing left to delete.
    assert_eq!(
        b.gc_with(&GcOptions::immediate()).unwrap().objects_deleted,
        0
    );
}

// ---- dense histories: packs holding XOR deltas against the parent version -----------

/// Elements of the dense tensor `d`: 4 chunks of [`DENSE_CHUNK_BYTES`].
const DENSE_ELEMS: usize = DENSE_CHUNK_BYTES;

fn dense_config() -> Config {
    Config {
        chunk_bytes: DENSE_CHUNK_BYTES,
        ..Config::default()
    }
}

fn open_dense(dir: &tempfile::TempDir) -> Store {
    Store::open_with(dir.path(), dense_config()).unwrap()
}

/// Write `d` at `step`, commit it as `dense {step}` and save.
fn dense_step(s: &mut Store, step: usize) -> (tensor_history::VersionId, SaveStats) {
    s.write("d", &dense_weights(DENSE_ELEMS, step)).unwrap();
    let v = s.commit(&format!("dense {step}")).unwrap();
    (v, s.save().unwrap())
}

/// [`dense_step`], whose save stores the dense chunks as deltas (asserted).
fn dense_step_saved(s: &mut Store, step: usize) -> tensor_history::VersionId {
    let (v, saved) = dense_step(s, step);
    assert!(
        saved.chunk_bytes_stored * 2 < saved.chunk_bytes_raw,
        "dense step {step} not stored as deltas: {saved:?}"
    );
    v
}

/// Every version of a store opened on `dir` reads `d` as its step wrote it, bit for bit;
/// returns the steps read.
fn dense_reads_back(dir: &tempfile::TempDir) -> Vec<usize> {
    let r = open_dense(dir);
    r.verify().unwrap();
    let mut steps = Vec::new();
    for id in r.versions() {
        let step: usize = r
            .message(id)
            .unwrap()
            .strip_prefix("dense ")
            .unwrap()
            .parse()
            .unwrap();
        let got = r.snapshot(id).unwrap().get::<f32>("d").unwrap();
        assert!(
            same_bits(&got, &dense_weights(DENSE_ELEMS, step)),
            "dense {step} reads other bytes"
        );
        steps.push(step);
    }
    steps.sort_unstable();
    steps
}

/// A repository whose `main` holds `dense 0`, saved whole.
fn dense_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open_dense(&dir);
    s.insert("d", &dense_weights(DENSE_ELEMS, 0)).unwrap();
    s.commit("dense 0").unwrap();
    s.save().unwrap();
    dir
}

#[test]
fn a_gc_by_another_store_keeps_the_bases_of_deltas_whose_versions_it_pruned() {
    let dir = dense_repo();
    let mut a = open_dense(&dir);
    for step in 1..=5 {
        dense_step_saved(&mut a, step);
    }
    // Another store keeps only the last version: its chunks are deltas whose chains run
    // back through the pruned versions' chunks to `dense 0`, all of them in packs of
    // pruned versions.
    // Without unchaining, gc keeps those chunks as the bases of the kept deltas.
    let mut b = open_dense(&dir);
    b.prune(&Retention::keep_last(1)).unwrap();
    b.save().unwrap();
    let mut keep_chains = GcOptions::immediate();
    keep_chains.unchain = false;
    let gc = b.gc_with(&keep_chains).unwrap();
    assert!(gc.objects_deleted >= 5, "{gc:?}");
    assert_eq!(dense_reads_back(&dir), [5]);
    // The first store, which still lists the pruned versions, builds on its HEAD: after
    // a refresh its save extends the kept chains.
    a.refresh().unwrap();
    dense_step_saved(&mut a, 6);
    assert_eq!(dense_reads_back(&dir), [5, 6]);
    let st = open_dense(&dir).stats();
    assert!(
        st.stored_pack_bytes * 2 < st.stored_bytes,
        "chains not read as deltas: {st:?}"
    );
    // A gc that unchains (the default) codes `dense 5` again (whole: no live version
    // is older) and keeps `dense 6` as its delta on it; the pruned chunks go.
    let before = pack_bytes(&dir);
    for _ in 0..2 {
        b.gc_with(&GcOptions::immediate()).unwrap();
    }
    assert_eq!(dense_reads_back(&dir), [5, 6]);
    let after = pack_bytes(&dir);
    assert!(after < before, "{before} -> {after}");
    let st = open_dense(&dir).stats();
    assert!(
        st.stored_pack_bytes * 4 < st.stored_bytes * 3,
        "dense 6 is no delta on dense 5: {st:?}"
    );
}

/// Bytes of the repository's pack files.
fn pack_bytes(dir: &tempfile::TempDir) -> u64 {
    walk(&dir.path().join("packs"))
}

fn walk(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |rd| {
        rd.flatten()
            .map(|e| {
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    walk(&e.path())
                } else {
                    m.len()
                }
            })
            .sum()
    })
}

#[test]
fn a_dense_save_on_versions_another_stores_gc_recorded_writes_them_again_and_reads_back() {
    let dir = dense_repo();
    let mut a = open_dense(&dir);
    a.branch("exp", a.head().unwrap()).unwrap();
    a.checkout("exp").unwrap();
    dense_step_saved(&mut a, 1);
    let e2 = dense_step_saved(&mut a, 2);
    // Another store deletes the branch and records what only it reached: the packs of
    // `dense 1` and `dense 2`, which hold the bases of any delta the next step takes.
    let mut b = open_dense(&dir);
    b.checkout("main").unwrap();
    b.delete_branch("exp").unwrap();
    b.prune(&Retention::default().drop_unreachable(true))
        .unwrap();
    b.save().unwrap();
    let gc = b.gc().unwrap();
    assert!(gc.candidates_recorded > 0, "{gc:?}");
    // The first store builds on `dense 2` on a new branch: the save writes `dense 2`
    // again, its chunks whole (their bases are recorded too), and `dense 3` as deltas
    // against them.
    a.branch("exp2", e2).unwrap();
    a.checkout("exp2").unwrap();
    let (_, saved) = dense_step(&mut a, 3);
    assert_eq!(saved.versions_written, 2, "{saved:?}");
    assert_eq!(saved.chunks_written, 8, "{saved:?}");
    assert!(
        saved.chunk_bytes_stored * 4 < saved.chunk_bytes_raw * 3,
        "dense 3 not stored as deltas: {saved:?}"
    );
    // A gc that deletes at once what is still unreferenced keeps every base: `dense 1`
    // and `dense 2` stay pruned (a reader passes through their markers), and `dense 3`'s
    // deltas read back through the chunks of `dense 2` written again.
    b.refresh().unwrap();
    let gc = b.gc_with(&GcOptions::immediate()).unwrap();
    assert!(gc.objects_deleted > 0, "{gc:?}");
    assert_eq!(dense_reads_back(&dir), [0, 3]);
    let c = open_dense(&dir);
    let tip = c.resolve("exp2").unwrap();
    assert_eq!(c.message(tip).unwrap(), "dense 3");
}

#[test]
fn a_store_that_finds_another_creating_the_repository_at_the_same_time_joins_it() {
    let inner = Arc::new(MemoryBackend::new());
    let hooked = Hooked::new(&inner);
    let other = inner.clone();
    let created = Arc::new(Mutex::new(None));
    let slot = created.clone();
    // Between this store's read of config.json (absent) and its listing of the
    // location, another store creates the repository and saves into it.
    hooked.set(move |op, prefix| {
        if matches!(op, Op::List) && prefix.is_empty() && slot.lock().unwrap().is_none() {
            let mut b = Store::with_config(config()).unwrap();
            b.insert("w", &ramp(&[64], 0.0)).unwrap();
            b.commit("other").unwrap();
            b.save_to(other.clone()).unwrap();
            *slot.lock().unwrap() = Some(b.version_hash(b.head().unwrap()).unwrap());
        }
    });
    let a = Store::open_backend(hooked.clone(), config()).expect("joins the new repository");
    let saved = created.lock().unwrap().expect("the other store saved");
    let main = a.resolve("main").unwrap();
    assert_eq!(a.version_hash(main).unwrap(), saved);
    a.verify().unwrap();
}
