//! Every error path of the history API returns the documented error and leaves the
//! store exactly as it was: the same `log_graph()`, HEAD, branch, refs, versions,
//! working state (bytes), dirty flag, reflog and buffer pool, and the same undo/redo
//! behaviour afterwards.

use crate::common::{ramp, small_store, CHUNK_F32};
use ndarray::{arr1, Array1};
use tensor_history::{
    Conflict, DType, Error, MergeStrategy, Ref, RefKind, Result, Retention, Store, VersionId,
};

/// Everything observable about a store.
#[derive(Debug, PartialEq)]
struct State {
    graph: String,
    head: Option<VersionId>,
    branch: Option<String>,
    refs: Vec<(String, Ref)>,
    versions: Vec<VersionId>,
    tips: Vec<VersionId>,
    working: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    dirty: bool,
    reflog: Vec<(String, VersionId)>,
    pooled_bytes: usize,
}

fn state(store: &Store) -> State {
    State {
        graph: store.log_graph(),
        head: store.head(),
        branch: store.current_branch().map(str::to_owned),
        refs: store.refs(),
        versions: store.versions(),
        tips: store.tips(),
        working: store
            .names()
            .into_iter()
            .map(|n| {
                let t = store.tensor(&n).unwrap();
                let bytes = t
                    .chunks()
                    .flat_map(|c| c.bytes().unwrap().to_vec())
                    .collect();
                (n, t.dtype(), t.shape().to_vec(), bytes)
            })
            .collect(),
        dirty: store.is_dirty(),
        reflog: store.reflog(),
        pooled_bytes: store.pooled_bytes(),
    }
}

/// Run `f`, which must fail, and check that the store did not change; return the error.
fn fails_unchanged<T: std::fmt::Debug>(
    store: &mut Store,
    f: impl FnOnce(&mut Store) -> Result<T>,
) -> Error {
    let before = state(store);
    let err = f(store).expect_err("the call should fail");
    assert_eq!(
        state(store),
        before,
        "a failed call changed the store: {err}"
    );
    store.verify().unwrap();
    err
}

/// `w`: 40 `f32` (3 chunks), `n`: 4 `i32`.
///
/// ```text
/// v2 (main)  w chunk 0 and 2 changed, n changed
/// v1 (dev)   w chunk 0 and 2 changed differently, n changed differently
/// v0 (tag: base)
/// ```
/// HEAD is attached to `main` at v2, and the working state is clean.
fn forked() -> (Store, [VersionId; 3]) {
    let mut store = small_store();
    store.insert("w", &ramp(&[40], 0.0)).unwrap();
    store.insert("n", &arr1(&[1i32, 2, 3, 4])).unwrap();
    let v0 = store.commit("init").unwrap();
    store.tag("base", v0).unwrap();
    store.branch("dev", v0).unwrap();
    store.checkout("dev").unwrap();
    store
        .update::<f32>("w", |off, xs| {
            if off == 0 || off == 2 * CHUNK_F32 {
                xs[0] = 100.0;
            }
        })
        .unwrap();
    store.write("n", &arr1(&[1i32, 2, 3, 5])).unwrap();
    let v1 = store.commit("dev work").unwrap();
    store.checkout("main").unwrap();
    store
        .update::<f32>("w", |off, xs| {
            if off == 0 || off == 2 * CHUNK_F32 {
                xs[1] = -100.0;
            }
        })
        .unwrap();
    store.write("n", &arr1(&[1i32, 2, 3, 6])).unwrap();
    let v2 = store.commit("main work").unwrap();
    (store, [v0, v1, v2])
}

fn make_dirty(store: &mut Store) {
    store
        .update::<f32>("w", |_, xs| xs.iter_mut().for_each(|x| *x += 1.0))
        .unwrap();
    assert!(store.is_dirty());
}

#[test]
fn unknown_version_changes_nothing() {
    let (mut store, _) = forked();
    let unknown = VersionId(99);
    let want = |e: &Error| matches!(e, Error::UnknownVersion { id } if *id == unknown);
    assert!(want(&fails_unchanged(&mut store, |s| s.restore(unknown))));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.branch("x", unknown))
    ));
    assert!(want(&fails_unchanged(&mut store, |s| s.tag("x", unknown))));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.merge(unknown, MergeStrategy::Ours))
    ));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.average(&[VersionId(0), unknown], None))
    ));
    assert!(want(&fails_unchanged(&mut store, |s| s
        .snapshot(unknown)
        .map(|_| ()))));
    assert!(want(&fails_unchanged(&mut store, |s| s
        .diff(VersionId(0), unknown)
        .map(|_| ()))));
    assert!(want(&fails_unchanged(&mut store, |s| s.parent(unknown))));
    assert!(want(&fails_unchanged(&mut store, |s| s.children(unknown))));
    assert!(want(&fails_unchanged(&mut store, |s| s.log(unknown))));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.merge_base(VersionId(0), unknown))
    ));
}

#[test]
fn pruned_version_changes_nothing() {
    let (mut store, [v0, _, _]) = forked();
    // A commit on top of main, undone and replaced: the old future is reachable from no
    // ref.
    make_dirty(&mut store);
    let gone = store.commit("soon pruned").unwrap();
    store.undo().unwrap();
    make_dirty(&mut store);
    store.commit("replaces it").unwrap();
    store.clear_reflog(); // the reflog holds the undone version until cleared
    let dropped = store
        .prune(&Retention::default().drop_unreachable(true))
        .unwrap()
        .dropped;
    assert_eq!(dropped, vec![gone]);
    let want = |e: &Error| matches!(e, Error::PrunedVersion { id } if *id == gone);
    assert!(want(&fails_unchanged(&mut store, |s| s.restore(gone))));
    assert!(want(&fails_unchanged(&mut store, |s| s.branch("x", gone))));
    assert!(want(&fails_unchanged(&mut store, |s| s.tag("x", gone))));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.merge(gone, MergeStrategy::Theirs))
    ));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.average(&[gone], None))
    ));
    assert!(want(&fails_unchanged(&mut store, |s| s
        .snapshot(gone)
        .map(|_| ()))));
    assert!(want(&fails_unchanged(&mut store, |s| s
        .message(gone)
        .map(str::to_owned))));
    assert!(want(&fails_unchanged(&mut store, |s| s
        .diff(gone, v0)
        .map(|_| ()))));
}

#[test]
fn unknown_ref_changes_nothing() {
    let (mut store, _) = forked();
    let want = |e: &Error| matches!(e, Error::UnknownRef { name } if name == "nope");
    assert!(want(&fails_unchanged(&mut store, |s| s.checkout("nope"))));
    assert!(want(
        &fails_unchanged(&mut store, |s| s.delete_branch("nope"))
    ));
    assert!(want(&fails_unchanged(&mut store, |s| s.delete_tag("nope"))));
    assert!(want(&fails_unchanged(&mut store, |s| s.resolve("nope"))));
    // `v7` reads as a version id (no ref can have that name), and no version 7 exists.
    let err = fails_unchanged(&mut store, |s| s.resolve("v7"));
    assert!(matches!(err, Error::UnknownVersion { id } if id == VersionId(7)));
}

#[test]
fn existing_ref_name_changes_nothing_whatever_its_kind() {
    let (mut store, [v0, v1, _]) = forked();
    for name in ["main", "dev", "base"] {
        let err = fails_unchanged(&mut store, |s| s.branch(name, v1));
        assert!(matches!(&err, Error::RefExists { name: n } if n == name));
        let err = fails_unchanged(&mut store, |s| s.tag(name, v0));
        assert!(matches!(&err, Error::RefExists { name: n } if n == name));
    }
}

#[test]
fn ref_on_the_unborn_main_branch_is_taken() {
    let mut store = small_store();
    store.insert("w", &ramp(&[3], 0.0)).unwrap();
    // No version exists yet, but HEAD is attached to the branch `main` the first commit
    // creates: the name is taken.
    let err = fails_unchanged(&mut store, |s| s.tag("main", VersionId(0)));
    assert!(matches!(err, Error::RefExists { name } if name == "main"));
}

#[test]
fn invalid_ref_names_change_nothing() {
    let (mut store, [v0, ..]) = forked();
    for name in ["", "HEAD", "a b", "tab\there", "new\nline", "bell\u{7}"] {
        let err = fails_unchanged(&mut store, |s| s.branch(name, v0));
        assert!(matches!(&err, Error::InvalidRefName { name: n } if n == name));
        let err = fails_unchanged(&mut store, |s| s.tag(name, v0));
        assert!(matches!(&err, Error::InvalidRefName { name: n } if n == name));
    }
}

#[test]
fn wrong_ref_kind_changes_nothing() {
    let (mut store, _) = forked();
    let err = fails_unchanged(&mut store, |s| s.checkout("base"));
    assert!(
        matches!(err, Error::WrongRefKind { name, expected: RefKind::Branch } if name == "base")
    );
    let err = fails_unchanged(&mut store, |s| s.delete_branch("base"));
    assert!(
        matches!(err, Error::WrongRefKind { name, expected: RefKind::Branch } if name == "base")
    );
    let err = fails_unchanged(&mut store, |s| s.delete_tag("dev"));
    assert!(matches!(err, Error::WrongRefKind { name, expected: RefKind::Tag } if name == "dev"));
}

#[test]
fn deleting_the_checked_out_branch_changes_nothing() {
    let (mut store, _) = forked();
    let err = fails_unchanged(&mut store, |s| s.delete_branch("main"));
    assert!(matches!(err, Error::BranchCheckedOut { name } if name == "main"));
}

#[test]
fn calls_that_need_a_commit_change_nothing_before_the_first() {
    let mut store = small_store();
    // An empty store: nothing to undo or redo, no HEAD to merge into.
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.undo()),
        Error::NothingToUndo
    ));
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.redo()),
        Error::NothingToRedo
    ));
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.resolve("HEAD")),
        Error::NoCommits
    ));
    // With a variable, the working state is dirty; merge still needs a HEAD first.
    store.insert("w", &ramp(&[3], 0.0)).unwrap();
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.merge(VersionId(0), MergeStrategy::Fail)),
        Error::NoCommits
    ));
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.undo()),
        Error::UncommittedChanges
    ));
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.checkout("main")),
        Error::UnknownRef { name } if name == "main"
    ));
}

#[test]
fn uncommitted_changes_block_undo_redo_merge_and_average_and_survive() {
    let (mut store, [v0, v1, v2]) = forked();
    // Set up a redo path, then dirty the working state.
    assert_eq!(store.undo().unwrap(), v0);
    make_dirty(&mut store);
    let dirty_w = store.get::<f32>("w").unwrap();
    for err in [
        fails_unchanged(&mut store, |s| s.undo()),
        fails_unchanged(&mut store, |s| s.redo()),
        fails_unchanged(&mut store, |s| s.merge(v1, MergeStrategy::Ours)),
        fails_unchanged(&mut store, |s| s.average(&[v1, v2], None)),
    ] {
        assert!(matches!(err, Error::UncommittedChanges), "{err:?}");
    }
    assert_eq!(store.get::<f32>("w").unwrap(), dirty_w);
    // The redo path is still there once the changes are discarded.
    store.discard().unwrap();
    assert_eq!(store.redo().unwrap(), v2);
}

#[test]
fn nothing_to_undo_at_the_root_changes_nothing() {
    let (mut store, [v0, ..]) = forked();
    store.restore(v0).unwrap();
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.undo()),
        Error::NothingToUndo
    ));
}

#[test]
fn nothing_to_redo_changes_nothing() {
    let (mut store, [v0, ..]) = forked();
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.redo()),
        Error::NothingToRedo
    ));
    // Undo, then a restore: the redo path is gone.
    store.undo().unwrap();
    store.restore(v0).unwrap();
    assert!(matches!(
        fails_unchanged(&mut store, |s| s.redo()),
        Error::NothingToRedo
    ));
}

#[test]
fn merge_conflict_lists_variables_and_chunks_and_changes_nothing() {
    let (mut store, _) = forked();
    // A third variable added on both sides with different contents conflicts as a whole.
    store.insert("z", &ramp(&[2], 0.0)).unwrap();
    store.commit("add z on main").unwrap();
    store.checkout("dev").unwrap();
    store.insert("z", &ramp(&[2], 9.0)).unwrap();
    let dev = store.commit("add z on dev").unwrap();
    store.checkout("main").unwrap();

    let err = fails_unchanged(&mut store, |s| s.merge(dev, MergeStrategy::Fail));
    let Error::MergeConflict { conflicts } = err else {
        panic!("expected a merge conflict, got {err:?}");
    };
    assert_eq!(
        conflicts,
        vec![
            Conflict {
                variable: "n".into(),
                chunks: Some(vec![0]),
            },
            Conflict {
                variable: "w".into(),
                chunks: Some(vec![0, 2]),
            },
            Conflict {
                variable: "z".into(),
                chunks: None,
            },
        ]
    );
    // Mean resolves the float conflicts but not the integer one.
    let err = fails_unchanged(&mut store, |s| s.merge(dev, MergeStrategy::Mean));
    assert!(matches!(err, Error::UnsupportedDType { name, .. } if name == "n"));
}

#[test]
fn mean_merge_of_integers_is_unsupported_and_changes_nothing() {
    let (mut store, [_, v1, _]) = forked();
    let err = fails_unchanged(&mut store, |s| s.merge(v1, MergeStrategy::Mean));
    assert!(matches!(
        err,
        Error::UnsupportedDType { name, dtype: DType::I32, .. } if name == "n"
    ));
}

#[test]
fn average_of_differing_integers_is_unsupported_and_changes_nothing() {
    let (mut store, [v0, v1, v2]) = forked();
    let err = fails_unchanged(&mut store, |s| s.average(&[v1, v2], None));
    assert!(matches!(
        err,
        Error::UnsupportedDType { name, dtype: DType::I32, .. } if name == "n"
    ));
    let err = fails_unchanged(&mut store, |s| s.average(&[v0, v1], Some(&[1.0, 3.0])));
    assert!(matches!(
        err,
        Error::UnsupportedDType {
            dtype: DType::I32,
            ..
        }
    ));
}

#[test]
fn merging_a_version_into_itself_is_invalid_and_changes_nothing() {
    let (mut store, [_, _, v2]) = forked();
    assert_eq!(store.head(), Some(v2));
    let err = fails_unchanged(&mut store, |s| s.merge(v2, MergeStrategy::Ours));
    assert!(matches!(err, Error::InvalidArgument { .. }));
}

#[test]
fn average_with_bad_arguments_is_invalid_and_changes_nothing() {
    let (mut store, [v0, v1, _]) = forked();
    let cases: [(&[VersionId], Option<&[f64]>); 6] = [
        (&[], None),
        (&[v0, v1], Some(&[1.0])),
        (&[v0, v1], Some(&[1.0, 1.0, 1.0])),
        (&[v0, v1], Some(&[1.0, -1.0])),
        (&[v0, v1], Some(&[f64::NAN, 1.0])),
        (&[v0, v1], Some(&[0.0, 0.0])),
    ];
    for (ids, weights) in cases {
        let err = fails_unchanged(&mut store, |s| s.average(ids, weights));
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{ids:?} {weights:?}: {err:?}"
        );
    }
    let err = fails_unchanged(&mut store, |s| s.average(&[v0], Some(&[f64::INFINITY])));
    assert!(matches!(err, Error::InvalidArgument { .. }));
}

#[test]
fn average_of_versions_with_different_variables_changes_nothing() {
    let (mut store, [v0, ..]) = forked();
    store.insert("extra", &ramp(&[4], 0.0)).unwrap();
    let with_extra = store.commit("extra").unwrap();
    let err = fails_unchanged(&mut store, |s| s.average(&[with_extra, v0], None));
    assert!(matches!(err, Error::UnknownVariable { name } if name == "extra"));
    store.remove("extra").unwrap();
    store.insert("extra", &ramp(&[5], 0.0)).unwrap();
    let reshaped = store.commit("reshaped").unwrap();
    let err = fails_unchanged(&mut store, |s| s.average(&[reshaped, with_extra], None));
    assert!(matches!(err, Error::ShapeMismatch { name, .. } if name == "extra"));
    store.remove("extra").unwrap();
    store.insert("extra", &Array1::<f64>::zeros(5)).unwrap();
    let retyped = store.commit("retyped").unwrap();
    let err = fails_unchanged(&mut store, |s| s.average(&[retyped, reshaped], None));
    assert!(matches!(
        err,
        Error::DTypeMismatch { name, expected: DType::F64, found: DType::F32 } if name == "extra"
    ));
}

#[test]
fn working_state_errors_change_nothing() {
    let (mut store, _) = forked();
    make_dirty(&mut store);
    let err = fails_unchanged(&mut store, |s| s.insert("w", &ramp(&[2], 0.0)));
    assert!(matches!(err, Error::VariableExists { name } if name == "w"));
    let err = fails_unchanged(&mut store, |s| s.remove("nope").map(|_| ()));
    assert!(matches!(err, Error::UnknownVariable { name } if name == "nope"));
    let err = fails_unchanged(&mut store, |s| s.write("w", &ramp(&[41], 0.0)));
    assert!(matches!(err, Error::ShapeMismatch { name, .. } if name == "w"));
    let err = fails_unchanged(&mut store, |s| s.write("n", &ramp(&[4], 0.0)));
    assert!(matches!(
        err,
        Error::DTypeMismatch { name, expected: DType::I32, found: DType::F32 } if name == "n"
    ));
    let err = fails_unchanged(&mut store, |s| {
        s.update_range::<f32>("w", 30..41, |_, xs| xs.fill(0.0))
    });
    assert!(matches!(err, Error::RangeOutOfBounds { len: 40, .. }));
}
