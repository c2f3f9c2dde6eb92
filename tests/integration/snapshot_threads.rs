//! Snapshots are read from other threads while the store keeps committing and pruning,
//! and stay valid after their version is pruned and after the store is dropped.

use std::sync::mpsc;
use std::thread;

use crate::common::{ramp, small_store};
use ndarray::ArrayD;
use tensor_history::{Retention, Snapshot, Store, VersionId};

/// Element `i` of `w` in version `k` of [`history`]: the ramp, with element `k` set to
/// `-k` (so every version differs from the others in one chunk).
fn expected(k: usize) -> ArrayD<f32> {
    let mut w = ramp(&[64], 0.0);
    if k > 0 {
        w[k] = -(k as f32);
    }
    w
}

/// Commit version `k` of the history on top of HEAD (restoring element `k - 1`).
fn commit_version(store: &mut Store, k: usize) -> VersionId {
    if k > 1 {
        let prev = expected(0)[k - 1];
        store
            .update_range::<f32>("w", k - 1..k, |_, xs| xs[0] = prev)
            .unwrap();
    }
    if k > 0 {
        store
            .update_range::<f32>("w", k..k + 1, |_, xs| xs[0] = -(k as f32))
            .unwrap();
    }
    store.commit(&format!("version {k}")).unwrap()
}

fn check(snap: &Snapshot, k: usize) {
    assert_eq!(snap.get::<f32>("w").unwrap(), expected(k), "version {k}");
    assert_eq!(snap.message(), format!("version {k}"));
}

#[test]
fn snapshot_is_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>(_: &T) {}
    let mut store = small_store();
    store.insert("w", &ramp(&[3], 0.0)).unwrap();
    let v0 = store.commit("init").unwrap();
    send_sync(&store.snapshot(v0).unwrap());
}

#[test]
fn snapshots_are_read_on_other_threads_while_the_store_commits_and_prunes() {
    let mut store = small_store();
    store.insert("w", &expected(0)).unwrap();
    let first: Vec<(usize, Snapshot)> = (0..4)
        .map(|k| {
            let id = commit_version(&mut store, k);
            (k, store.snapshot(id).unwrap())
        })
        .collect();
    let (tx, rx) = mpsc::channel::<(usize, Snapshot)>();
    thread::scope(|s| {
        // Readers of snapshots taken before the threads started.
        for (k, snap) in &first {
            s.spawn(move || {
                for _ in 0..50 {
                    check(snap, *k);
                }
            });
        }
        // A reader of snapshots sent while the store moves on.
        let reader = s.spawn(move || {
            let mut seen = 0;
            for (k, snap) in rx {
                check(&snap, k);
                let clone = snap.clone();
                drop(snap);
                check(&clone, k);
                seen += 1;
            }
            seen
        });
        // The writer: commits, sends snapshots, prunes to the last 2 versions.
        for k in 4..60 {
            let id = commit_version(&mut store, k);
            tx.send((k, store.snapshot(id).unwrap())).unwrap();
            if k % 5 == 0 {
                store.prune(&Retention::keep_last(2)).unwrap();
                assert!(store.versions().len() <= 2);
            }
        }
        drop(tx);
        assert_eq!(reader.join().unwrap(), 56);
    });
    store.verify().unwrap();
    // The first versions are long pruned; their snapshots still read.
    for (k, snap) in &first {
        assert!(store.snapshot(snap.id().unwrap()).is_err());
        check(snap, *k);
    }
}

#[test]
fn snapshot_stays_valid_after_its_version_is_pruned() {
    let mut store = small_store();
    store.insert("w", &expected(0)).unwrap();
    let v0 = commit_version(&mut store, 0);
    let snap = store.snapshot(v0).unwrap();
    let weak = snap.tensor("w").unwrap().chunk(0).unwrap().downgrade();
    for k in 1..=3 {
        commit_version(&mut store, k);
    }
    let dropped = store.prune(&Retention::keep_last(1)).unwrap().dropped;
    assert!(dropped.contains(&v0));
    assert!(store.snapshot(v0).is_err());
    // Chunk 0 of v0 now lives only in the snapshot.
    assert!(weak.is_alive());
    let handle = thread::spawn(move || {
        check(&snap, 0);
        snap
    });
    let snap = handle.join().unwrap();
    check(&snap, 0);
    drop(snap);
    assert!(!weak.is_alive(), "the last holder is gone, so is the chunk");
}

#[test]
fn snapshot_stays_valid_after_the_store_is_dropped() {
    let mut store = small_store();
    store.insert("w", &expected(0)).unwrap();
    let snaps: Vec<Snapshot> = (0..3)
        .map(|k| {
            let id = commit_version(&mut store, k);
            store.snapshot(id).unwrap()
        })
        .collect();
    let working = store.working_snapshot();
    let weak = snaps[2].tensor("w").unwrap().chunk(0).unwrap().downgrade();
    drop(store);
    assert!(weak.is_alive());
    let handles: Vec<_> = snaps
        .into_iter()
        .enumerate()
        .map(|(k, snap)| thread::spawn(move || check(&snap, k)))
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(working.get::<f32>("w").unwrap(), expected(2));
    assert_eq!(working.id(), None);
    // The working snapshot shares chunk 0 with version 2; dropping it frees it.
    drop(working);
    assert!(!weak.is_alive());
}
