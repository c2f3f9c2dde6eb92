//! Going to a version detached, what `restore` moves, and the reflog that keeps the
//! versions a branch or HEAD just left from being pruned.

use ndarray::array;
use tensor_history::{Config, Error, Retention, Store, VersionId, DEFAULT_REFLOG_ENTRIES};

fn with_max_versions(max: usize) -> Store {
    Store::with_config(Config {
        max_versions: Some(max),
        ..Config::default()
    })
    .unwrap()
}

/// `v0` tagged `ckpt`, then `v1` on `main`.
fn tagged_then_moved_on(store: &mut Store) -> (VersionId, VersionId) {
    store.insert("w", &array![0.0f32]).unwrap();
    let v0 = store.commit("v0").unwrap();
    store.tag("ckpt", v0).unwrap();
    store.write("w", &array![1.0f32]).unwrap();
    let v1 = store.commit("main tip").unwrap();
    (v0, v1)
}

#[test]
fn checkout_detached_moves_no_branch_and_commits_from_there_move_none() {
    let mut s = with_max_versions(10);
    let (v0, v1) = tagged_then_moved_on(&mut s);
    s.checkout_detached(s.resolve("ckpt").unwrap()).unwrap();
    assert_eq!(s.head(), Some(v0));
    assert_eq!(s.current_branch(), None);
    assert_eq!(s.resolve("main").unwrap(), v1);
    assert_eq!(s.get::<f32>("w").unwrap(), array![0.0f32].into_dyn());
    s.write("w", &array![2.0f32]).unwrap();
    let v2 = s.commit("experiment").unwrap();
    assert_eq!(s.resolve("main").unwrap(), v1);
    assert_eq!(s.parent(v2).unwrap(), Some(v0));
    // The branch tip survives auto-retention: a branch still points at it.
    assert!(s.snapshot(v1).is_ok());
    s.verify().unwrap();
}

#[test]
fn restore_while_attached_moves_the_branch_and_the_reflog_keeps_its_old_tip() {
    // The sequence from the docs' old advice: `restore` moved `main` off `v1`, and with
    // auto-retention the next commit used to prune `v1`, which no ref held any more.
    let mut s = with_max_versions(1);
    let (v0, v1) = tagged_then_moved_on(&mut s);
    s.restore(s.resolve("ckpt").unwrap()).unwrap();
    assert_eq!(s.current_branch(), Some("main"));
    assert_eq!(
        s.resolve("main").unwrap(),
        v0,
        "restore moves the attached branch"
    );
    assert_eq!(s.reflog(), vec![("main".to_owned(), v1)]);
    s.write("w", &array![2.0f32]).unwrap();
    s.commit("experiment").unwrap();
    let snap = s.snapshot(v1).expect("the reflog keeps the old branch tip");
    assert_eq!(snap.get::<f32>("w").unwrap(), array![1.0f32].into_dyn());
    // Explicit pruning keeps it too, until the reflog is cleared.
    s.prune(&Retention::keep_last(1).drop_unreachable(true))
        .unwrap();
    assert!(s.snapshot(v1).is_ok());
    s.clear_reflog();
    s.prune(&Retention::keep_last(1).drop_unreachable(true))
        .unwrap();
    assert!(matches!(s.snapshot(v1), Err(Error::PrunedVersion { .. })));
    s.verify().unwrap();
}

#[test]
fn reflog_keeps_the_newest_entries_up_to_its_bound() {
    let mut s = with_max_versions(1);
    s.insert("w", &array![0.0f32]).unwrap();
    let base = s.commit("base").unwrap();
    s.tag("base", base).unwrap();
    let mut trials = Vec::new();
    for k in 0..DEFAULT_REFLOG_ENTRIES + 3 {
        s.write("w", &array![k as f32 + 1.0]).unwrap();
        trials.push(s.commit("trial").unwrap());
        s.restore(base).unwrap();
    }
    s.commit("after the trials").unwrap(); // auto-retention runs
    let kept: Vec<VersionId> = s.reflog().into_iter().map(|(_, v)| v).collect();
    let newest: Vec<VersionId> = trials
        .iter()
        .rev()
        .take(DEFAULT_REFLOG_ENTRIES)
        .copied()
        .collect();
    assert_eq!(kept, newest);
    for old in &trials[..3] {
        assert!(matches!(s.snapshot(*old), Err(Error::PrunedVersion { .. })));
    }
    for v in newest {
        assert!(s.snapshot(v).is_ok());
    }
    s.verify().unwrap();
}

#[test]
fn a_reflog_of_zero_entries_keeps_nothing() {
    let mut s = Store::with_config(Config {
        max_versions: Some(1),
        reflog_entries: 0,
        ..Config::default()
    })
    .unwrap();
    let (v0, v1) = tagged_then_moved_on(&mut s);
    s.restore(v0).unwrap();
    assert!(s.reflog().is_empty());
    s.commit("next").unwrap();
    assert!(matches!(s.snapshot(v1), Err(Error::PrunedVersion { .. })));
}

#[test]
fn undo_then_commit_keeps_the_undone_version_in_the_reflog() {
    let mut s = with_max_versions(2);
    s.insert("w", &array![0.0f32]).unwrap();
    s.commit("a").unwrap();
    s.write("w", &array![1.0f32]).unwrap();
    let undone = s.commit("b").unwrap();
    s.undo().unwrap();
    s.write("w", &array![2.0f32]).unwrap();
    s.commit("c").unwrap();
    assert_eq!(s.reflog(), vec![("main".to_owned(), undone)]);
    assert!(s.snapshot(undone).is_ok());
    s.verify().unwrap();
}

#[test]
fn leaving_a_version_a_ref_still_holds_adds_no_entry() {
    let mut s = Store::new();
    let (v0, _) = tagged_then_moved_on(&mut s);
    s.branch("other", v0).unwrap();
    s.checkout("other").unwrap(); // `main` still holds v1
    s.checkout_detached(v0).unwrap(); // `other` and `ckpt` still hold v0
    s.checkout("main").unwrap();
    assert!(s.reflog().is_empty());
}

#[test]
fn checkout_from_a_detached_commit_records_it_under_head() {
    let mut s = Store::new();
    let (v0, _) = tagged_then_moved_on(&mut s);
    s.checkout_detached(v0).unwrap();
    s.write("w", &array![5.0f32]).unwrap();
    let loose = s.commit("detached work").unwrap();
    s.checkout("main").unwrap();
    assert_eq!(s.reflog(), vec![("HEAD".to_owned(), loose)]);
}

#[test]
fn checkout_detached_of_a_missing_version_changes_nothing() {
    let mut s = Store::new();
    let (_, v1) = tagged_then_moved_on(&mut s);
    assert!(matches!(
        s.checkout_detached(VersionId(99)),
        Err(Error::UnknownVersion { .. })
    ));
    assert_eq!((s.head(), s.current_branch()), (Some(v1), Some("main")));
    assert!(s.reflog().is_empty());
}
