//! Behaviour of the version history: undo-tree semantics, redo, diff, merge, average,
//! retention, stats, rendering, and the sharing that makes commits cheap.

use crate::common::{ramp, small_store, CHUNK_BYTES, CHUNK_F32};
use half::f16;
use ndarray::{arr1, Array1, ArrayD};
use tensor_history::{
    Config, Error, MergeStrategy, Ref, Retention, Stats, Store, TensorDiff, VarDiff, VersionId,
};

/// Set element `i` of the `f32` variable `name` to `x`.
fn set(store: &mut Store, name: &str, i: usize, x: f32) {
    store
        .update_range::<f32>(name, i..i + 1, |_, xs| xs[0] = x)
        .unwrap();
}

fn w_at(store: &Store, id: VersionId) -> ArrayD<f32> {
    store.snapshot(id).unwrap().get::<f32>("w").unwrap()
}

/// A store with `w`: 40 `f32` in 3 chunks (16, 16, 8 elements) and one commit.
fn one_commit() -> (Store, VersionId) {
    let mut store = small_store();
    store.insert("w", &ramp(&[40], 0.0)).unwrap();
    let v0 = store.commit("init").unwrap();
    (store, v0)
}

/// `n` commits after `init`, each setting element 0 of `w` to its index.
fn chain(n: usize) -> (Store, Vec<VersionId>) {
    let (mut store, v0) = one_commit();
    let mut ids = vec![v0];
    for i in 1..=n {
        set(&mut store, "w", 0, i as f32);
        ids.push(store.commit(&format!("step {i}")).unwrap());
    }
    (store, ids)
}

// ---- undo, redo and the tree -------------------------------------------------------

#[test]
fn first_commit_creates_main_and_attaches_head() {
    let mut store = small_store();
    assert_eq!(store.head(), None);
    assert_eq!(store.current_branch(), Some("main"));
    assert!(store.refs().is_empty());
    store.insert("w", &ramp(&[3], 0.0)).unwrap();
    let v0 = store.commit("init").unwrap();
    assert_eq!(store.refs(), vec![("main".to_owned(), Ref::Branch(v0))]);
    assert_eq!(store.head(), Some(v0));
    assert_eq!(store.resolve("main").unwrap(), v0);
    assert_eq!(store.resolve("HEAD").unwrap(), v0);
}

#[test]
fn commit_after_undo_starts_a_new_branch_and_keeps_the_old_future() {
    let (mut store, ids) = chain(2);
    let (v1, v2) = (ids[1], ids[2]);
    assert_eq!(store.undo().unwrap(), v1);
    assert_eq!(
        store.resolve("main").unwrap(),
        v1,
        "the branch moves with undo"
    );
    set(&mut store, "w", 0, 42.0);
    let v3 = store.commit("other future").unwrap();
    assert_eq!(store.parent(v3).unwrap(), Some(v1));
    assert_eq!(store.children(v1).unwrap(), vec![v2, v3]);
    assert_eq!(store.tips(), vec![v2, v3]);
    // The old future is intact and reachable by id.
    assert_eq!(w_at(&store, v2)[0], 2.0);
    store.restore(v2).unwrap();
    assert_eq!(store.get::<f32>("w").unwrap()[0], 2.0);
    store.verify().unwrap();
}

#[test]
fn redo_returns_along_the_path_undo_took() {
    let (mut store, ids) = chain(3);
    assert_eq!(store.undo().unwrap(), ids[2]);
    assert_eq!(store.undo().unwrap(), ids[1]);
    assert_eq!(store.get::<f32>("w").unwrap()[0], 1.0);
    assert_eq!(store.redo().unwrap(), ids[2]);
    assert_eq!(store.redo().unwrap(), ids[3]);
    assert_eq!(store.get::<f32>("w").unwrap()[0], 3.0);
    assert!(matches!(store.redo(), Err(Error::NothingToRedo)));
    assert_eq!(store.resolve("main").unwrap(), ids[3]);
}

#[test]
fn undo_and_redo_are_allowed_after_discarding_changes() {
    let (mut store, ids) = chain(2);
    store.undo().unwrap();
    set(&mut store, "w", 5, -1.0);
    assert!(matches!(store.redo(), Err(Error::UncommittedChanges)));
    store.discard().unwrap();
    assert_eq!(store.redo().unwrap(), ids[2]);
}

#[test]
fn writing_the_same_bytes_back_is_not_an_uncommitted_change() {
    let (mut store, _) = chain(1);
    set(&mut store, "w", 0, 1.0); // the value it already has
    assert!(!store.is_dirty());
    set(&mut store, "w", 0, 7.0);
    set(&mut store, "w", 0, 1.0);
    assert!(!store.is_dirty(), "equal contents, though a new chunk");
    store.undo().unwrap();
}

#[test]
fn commit_clears_the_redo_path() {
    let (mut store, _) = chain(2);
    store.undo().unwrap();
    store.commit("same contents, new version").unwrap();
    assert!(matches!(store.redo(), Err(Error::NothingToRedo)));
}

#[test]
fn restore_clears_the_redo_path() {
    let (mut store, ids) = chain(2);
    store.undo().unwrap();
    store.restore(ids[1]).unwrap();
    assert!(matches!(store.redo(), Err(Error::NothingToRedo)));
}

#[test]
fn checkout_clears_the_redo_path() {
    let (mut store, ids) = chain(2);
    store.branch("side", ids[0]).unwrap();
    store.undo().unwrap();
    store.checkout("side").unwrap();
    assert!(matches!(store.redo(), Err(Error::NothingToRedo)));
    assert_eq!(store.get::<f32>("w").unwrap(), w_at(&store, ids[0]));
}

#[test]
fn restore_moves_the_attached_branch_and_keeps_later_versions() {
    let (mut store, ids) = chain(3);
    store.restore(ids[1]).unwrap();
    assert_eq!(store.resolve("main").unwrap(), ids[1]);
    assert_eq!(store.versions(), ids);
    store.detach();
    store.restore(ids[3]).unwrap();
    assert_eq!(store.current_branch(), None);
    assert_eq!(
        store.resolve("main").unwrap(),
        ids[1],
        "detached: no branch moves"
    );
    assert_eq!(store.head(), Some(ids[3]));
}

#[test]
fn undo_follows_the_first_parent_of_a_merge() {
    let (mut store, v0) = one_commit();
    set(&mut store, "w", 0, 1.0);
    let ours = store.commit("ours").unwrap();
    store.branch("side", v0).unwrap();
    store.checkout("side").unwrap();
    set(&mut store, "w", 39, 1.0);
    let theirs = store.commit("theirs").unwrap();
    store.checkout("main").unwrap();
    store.merge(theirs, MergeStrategy::Fail).unwrap();
    assert_eq!(store.undo().unwrap(), ours);
}

#[test]
fn discard_before_the_first_commit_empties_the_working_state() {
    let mut store = small_store();
    store.insert("w", &ramp(&[3], 0.0)).unwrap();
    store.discard().unwrap();
    assert!(store.names().is_empty());
    assert!(!store.is_dirty());
}

#[test]
fn discard_drops_uncommitted_changes() {
    let (mut store, v0) = one_commit();
    set(&mut store, "w", 3, 99.0);
    store.insert("extra", &ramp(&[2], 0.0)).unwrap();
    store.discard().unwrap();
    assert_eq!(store.names(), vec!["w".to_owned()]);
    assert_eq!(store.get::<f32>("w").unwrap(), w_at(&store, v0));
}

#[test]
fn log_lists_ancestors_newest_first_and_merge_base_is_the_fork_point() {
    let (mut store, ids) = chain(2);
    store.branch("side", ids[1]).unwrap();
    store.checkout("side").unwrap();
    set(&mut store, "w", 1, 5.0);
    let side = store.commit("side").unwrap();
    assert_eq!(store.log(side).unwrap(), vec![side, ids[1], ids[0]]);
    assert_eq!(store.merge_base(side, ids[2]).unwrap(), Some(ids[1]));
    assert_eq!(store.merge_base(ids[0], ids[2]).unwrap(), Some(ids[0]));
}

// ---- diff --------------------------------------------------------------------------

#[test]
fn diff_reports_added_removed_changed_and_unchanged_variables() {
    let mut store = small_store();
    store.insert("w", &ramp(&[40], 0.0)).unwrap();
    store.insert("same", &ramp(&[5], 0.0)).unwrap();
    store.insert("gone", &ramp(&[5], 0.0)).unwrap();
    let a = store.commit("a").unwrap();
    set(&mut store, "w", 0, -1.0); // chunk 0
    set(&mut store, "w", CHUNK_F32, -1.0); // chunk 1
    set(&mut store, "w", 39, -1.0); // chunk 2, 8 elements
    store.remove("gone").unwrap();
    store.insert("new", &ramp(&[5], 0.0)).unwrap();
    let b = store.commit("b").unwrap();
    let diff = store.diff(a, b).unwrap();
    assert_eq!(diff.get("same"), Some(&VarDiff::Unchanged));
    assert_eq!(diff.get("gone"), Some(&VarDiff::Removed));
    assert_eq!(diff.get("new"), Some(&VarDiff::Added));
    assert_eq!(
        diff.get("w"),
        Some(&VarDiff::Changed(TensorDiff {
            chunks: vec![0, 1, 2],
            elements: std::iter::once(0..40).collect(),
            bytes: 160,
            layout_changed: false,
        }))
    );
    assert_eq!(diff.changed_names(), vec!["gone", "new", "w"]);
    assert_eq!(diff.changed_chunks(), 3);
    assert_eq!(diff.changed_bytes(), 160);
    assert!(!diff.is_empty());
    assert!(store.diff(b, b).unwrap().is_empty());
}

#[test]
fn diff_element_ranges_merge_only_adjacent_chunks() {
    let (mut store, v0) = one_commit();
    set(&mut store, "w", 2, -1.0);
    set(&mut store, "w", 2 * CHUNK_F32 + 1, -1.0);
    let v1 = store.commit("two chunks apart").unwrap();
    let Some(VarDiff::Changed(d)) = store.diff(v0, v1).unwrap().get("w").cloned() else {
        panic!("w should have changed");
    };
    assert_eq!(d.chunks, vec![0, 2]);
    assert_eq!(d.elements, vec![0..16, 32..40]);
    assert_eq!(d.bytes, CHUNK_BYTES + 8 * 4);
}

#[test]
fn independently_written_equal_chunks_count_as_unchanged() {
    let (mut store, v0) = one_commit();
    set(&mut store, "w", 0, 123.0);
    store.commit("changed").unwrap();
    set(&mut store, "w", 0, 0.0); // back to the original value, in a new buffer
    let v2 = store.commit("changed back").unwrap();
    let first = |id| {
        store
            .snapshot(id)
            .unwrap()
            .tensor("w")
            .unwrap()
            .chunk(0)
            .unwrap()
            .clone()
    };
    assert!(!first(v0).ptr_eq(&first(v2)), "the chunks are not shared");
    assert!(store.diff(v0, v2).unwrap().is_empty());
    assert_eq!(
        store
            .snapshot(v0)
            .unwrap()
            .diff(&store.snapshot(v2).unwrap()),
        store.diff(v0, v2).unwrap()
    );
}

#[test]
fn diff_with_a_new_shape_marks_the_layout_changed() {
    let (mut store, v0) = one_commit();
    store.remove("w").unwrap();
    store.insert("w", &ramp(&[2, 20], 0.0)).unwrap();
    let v1 = store.commit("reshaped").unwrap();
    let Some(VarDiff::Changed(d)) = store.diff(v0, v1).unwrap().get("w").cloned() else {
        panic!("w should have changed");
    };
    assert!(d.layout_changed);
    assert_eq!(d.chunks, vec![0, 1, 2]);
}

#[test]
fn diff_working_shows_uncommitted_changes() {
    let mut store = small_store();
    store.insert("w", &ramp(&[40], 0.0)).unwrap();
    assert_eq!(store.diff_working().get("w"), Some(&VarDiff::Added));
    store.commit("init").unwrap();
    assert!(store.diff_working().is_empty());
    set(&mut store, "w", 20, 9.0);
    let diff = store.diff_working();
    let Some(VarDiff::Changed(d)) = diff.get("w") else {
        panic!("w should have changed: {diff:?}");
    };
    assert_eq!(d.chunks, vec![1]);
    assert_eq!(d.elements, vec![16..32]);
}

// ---- merge -------------------------------------------------------------------------

/// `w` forked at v0: HEAD on `main` changed `main_at`, branch `side` changed `side_at`
/// (element index → value). Returns the store (HEAD on main) and (base, ours, theirs).
fn forked(
    main_at: &[(usize, f32)],
    side_at: &[(usize, f32)],
) -> (Store, (VersionId, VersionId, VersionId)) {
    let (mut store, v0) = one_commit();
    store.branch("side", v0).unwrap();
    for &(i, x) in main_at {
        set(&mut store, "w", i, x);
    }
    let ours = store.commit("main work").unwrap();
    store.checkout("side").unwrap();
    for &(i, x) in side_at {
        set(&mut store, "w", i, x);
    }
    let theirs = store.commit("side work").unwrap();
    store.checkout("main").unwrap();
    (store, (v0, ours, theirs))
}

#[test]
fn merge_takes_chunks_changed_on_one_side_and_records_two_parents() {
    let (mut store, (v0, ours, theirs)) = forked(&[(0, 10.0)], &[(39, 20.0)]);
    let m = store.merge(theirs, MergeStrategy::Fail).unwrap();
    assert_eq!(store.parents(m).unwrap(), vec![ours, theirs]);
    assert_eq!(store.head(), Some(m));
    assert_eq!(store.resolve("main").unwrap(), m);
    let mut want = w_at(&store, v0);
    want[0] = 10.0;
    want[39] = 20.0;
    assert_eq!(store.get::<f32>("w").unwrap(), want);
    // Chunk 1, changed by neither side, is still the base's buffer.
    let chunk1 = |id| {
        store
            .snapshot(id)
            .unwrap()
            .tensor("w")
            .unwrap()
            .chunk(1)
            .cloned()
    };
    assert!(chunk1(m).unwrap().ptr_eq(&chunk1(v0).unwrap()));
    assert!(!store.is_dirty());
    assert!(matches!(store.redo(), Err(Error::NothingToRedo)));
}

#[test]
fn merge_of_the_same_change_on_both_sides_is_not_a_conflict() {
    let (mut store, (_, _, theirs)) = forked(&[(3, 7.0)], &[(3, 7.0)]);
    let m = store.merge(theirs, MergeStrategy::Fail).unwrap();
    assert_eq!(w_at(&store, m)[3], 7.0);
}

#[test]
fn merge_conflict_names_the_chunks_changed_on_both_sides() {
    let (mut store, (_, _, theirs)) = forked(&[(1, 1.0), (39, 1.0)], &[(2, 2.0), (20, 2.0)]);
    let err = store.merge(theirs, MergeStrategy::Fail).unwrap_err();
    let Error::MergeConflict { conflicts } = &err else {
        panic!("expected a conflict, got {err:?}");
    };
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].variable, "w");
    assert_eq!(conflicts[0].chunks, Some(vec![0]));
    assert!(err.to_string().contains("`w`"), "{err}");
}

#[test]
fn merge_strategies_resolve_conflicts_ours_theirs_and_mean() {
    let main = [(1, 1.0), (39, 5.0)];
    let side = [(1, 4.0), (20, 9.0)];
    let (mut store, (v0, ours, theirs)) = forked(&main, &side);
    let base = w_at(&store, v0);
    let m_ours = store.merge(theirs, MergeStrategy::Ours).unwrap();
    store.restore(ours).unwrap();
    let m_theirs = store.merge(theirs, MergeStrategy::Theirs).unwrap();
    store.restore(ours).unwrap();
    let m_mean = store.merge(theirs, MergeStrategy::Mean).unwrap();
    for (id, at1) in [(m_ours, 1.0), (m_theirs, 4.0), (m_mean, 2.5)] {
        let w = w_at(&store, id);
        assert_eq!(w[1], at1, "conflicting chunk 0 of {id}");
        assert_eq!(w[39], 5.0, "chunk 2 from ours in {id}");
        assert_eq!(w[20], 9.0, "chunk 1 from theirs in {id}");
        // The rest of the conflicting chunk: the mean of equal values is that value.
        assert_eq!(w[0], base[0]);
        assert_eq!(store.parents(id).unwrap(), vec![ours, theirs]);
    }
}

#[test]
fn mean_merge_rounds_the_exact_mean_once_to_the_float_type() {
    let mut store = small_store();
    let one = f16::from_f32(1.0);
    let next = f16::from_bits(one.to_bits() + 1); // 1 + 2^-10
    store.insert("h", &arr1(&[f16::ZERO, f16::ZERO])).unwrap();
    let v0 = store.commit("base").unwrap();
    store.branch("side", v0).unwrap();
    store.write("h", &arr1(&[one, f16::from_f32(2.0)])).unwrap();
    store.commit("ours").unwrap();
    store.checkout("side").unwrap();
    store
        .write("h", &arr1(&[next, f16::from_f32(3.0)]))
        .unwrap();
    let theirs = store.commit("theirs").unwrap();
    store.checkout("main").unwrap();
    store.merge(theirs, MergeStrategy::Mean).unwrap();
    let h = store.get::<f16>("h").unwrap();
    // (1 + (1 + 2^-10)) / 2 lies halfway between two f16 values: ties go to even (1.0).
    assert_eq!(
        h[0].to_bits(),
        f16::from_f64((1.0 + next.to_f64()) / 2.0).to_bits()
    );
    assert_eq!(h[0], one);
    assert_eq!(h[1], f16::from_f32(2.5));
}

// ---- average -----------------------------------------------------------------------

#[test]
fn average_is_the_weighted_mean_and_keeps_equal_chunks_shared() {
    let (mut store, v0) = one_commit();
    store.insert("steps", &arr1(&[3i64])).unwrap();
    let a = store.commit("a").unwrap();
    store
        .update_range::<f32>("w", 0..CHUNK_F32, |_, xs| xs.fill(4.0))
        .unwrap();
    let b = store.commit("b").unwrap();
    let avg = store.average(&[a, b], Some(&[3.0, 1.0])).unwrap();
    assert_eq!(store.parents(avg).unwrap(), vec![b, a]);
    let base = w_at(&store, v0);
    let w = w_at(&store, avg);
    for i in 0..CHUNK_F32 {
        let want = ((f64::from(base[i]) * 3.0 + 4.0) / 4.0) as f32;
        assert_eq!(w[i], want, "element {i}");
    }
    assert_eq!(
        w.as_slice().unwrap()[CHUNK_F32..],
        base.as_slice().unwrap()[CHUNK_F32..]
    );
    // Chunks equal in every version are the versions' own buffers, not copies; equal
    // integers are kept as they are.
    let snap_avg = store.snapshot(avg).unwrap();
    let snap_a = store.snapshot(a).unwrap();
    let (ta, tavg) = (snap_a.tensor("w").unwrap(), snap_avg.tensor("w").unwrap());
    assert_eq!(tavg.shared_chunks(ta), 2);
    assert!(!tavg.chunk(0).unwrap().ptr_eq(ta.chunk(0).unwrap()));
    assert!(snap_avg
        .tensor("steps")
        .unwrap()
        .ptr_eq(snap_a.tensor("steps").unwrap()));
}

#[test]
fn average_with_default_weights_is_the_plain_mean() {
    let (mut store, ids) = chain(3);
    let avg = store.average(&ids[1..], None).unwrap();
    assert_eq!(w_at(&store, avg)[0], 2.0);
    assert_eq!(store.message(avg).unwrap(), "average of v1, v2, v3");
}

// ---- retention ---------------------------------------------------------------------

#[test]
fn keep_last_keeps_the_newest_versions_of_each_branch() {
    let (mut store, ids) = chain(9);
    store.branch("old", ids[4]).unwrap();
    let stats = store.prune(&Retention::keep_last(3)).unwrap();
    let kept = vec![ids[2], ids[3], ids[4], ids[7], ids[8], ids[9]];
    assert_eq!(store.versions(), kept);
    assert_eq!(stats.kept, 6);
    assert_eq!(stats.dropped, vec![ids[0], ids[1], ids[5], ids[6]]);
    assert!(stats.bytes_after < stats.bytes_before);
    // Children of pruned versions are re-parented past them.
    assert_eq!(store.parent(ids[7]).unwrap(), Some(ids[4]));
    assert_eq!(store.parent(ids[2]).unwrap(), None);
    assert_eq!(
        store.log(ids[9]).unwrap(),
        vec![ids[9], ids[8], ids[7], ids[4], ids[3], ids[2]]
    );
    assert_eq!(w_at(&store, ids[7])[0], 7.0);
    store.verify().unwrap();
}

#[test]
fn keep_every_also_keeps_every_kth_version() {
    let (mut store, ids) = chain(9);
    store.prune(&Retention::keep_last(2).keep_every(4)).unwrap();
    assert_eq!(store.versions(), vec![ids[0], ids[4], ids[8], ids[9]]);
    assert_eq!(store.parent(ids[4]).unwrap(), Some(ids[0]));
}

#[test]
fn tags_and_the_redo_path_are_protected_from_pruning() {
    let (mut store, ids) = chain(6);
    store.tag("best", ids[1]).unwrap();
    store.undo().unwrap(); // HEAD at v5, v6 on the redo path
    store.prune(&Retention::keep_last(1)).unwrap();
    assert_eq!(store.versions(), vec![ids[1], ids[5], ids[6]]);
    assert_eq!(store.redo().unwrap(), ids[6]);
    assert_eq!(store.parent(ids[5]).unwrap(), Some(ids[1]));
}

#[test]
fn drop_unreachable_drops_only_versions_no_ref_reaches() {
    let (mut store, ids) = chain(3);
    store.restore(ids[1]).unwrap();
    set(&mut store, "w", 0, -5.0);
    let new = store.commit("new future").unwrap();
    // Nothing is dropped without a policy that asks for it.
    assert!(store
        .prune(&Retention::default())
        .unwrap()
        .dropped
        .is_empty());
    // The old tip that `restore` moved `main` off is in the reflog, which reaches v2, v3.
    assert_eq!(store.reflog(), vec![("main".to_owned(), ids[3])]);
    let policy = Retention::default().drop_unreachable(true);
    assert!(store.prune(&policy).unwrap().dropped.is_empty());
    store.clear_reflog();
    let stats = store.prune(&policy).unwrap();
    assert_eq!(stats.dropped, vec![ids[2], ids[3]]);
    assert_eq!(store.versions(), vec![ids[0], ids[1], new]);
}

#[test]
fn pruned_ids_give_a_pruned_error_not_a_panic() {
    let (mut store, ids) = chain(4);
    store.prune(&Retention::keep_last(2)).unwrap();
    let gone = ids[1];
    assert!(matches!(store.restore(gone), Err(Error::PrunedVersion { id }) if id == gone));
    assert!(matches!(
        store.snapshot(gone),
        Err(Error::PrunedVersion { .. })
    ));
    assert!(matches!(
        store.parent(gone),
        Err(Error::PrunedVersion { .. })
    ));
    assert!(matches!(
        store.resolve(&gone.to_string()),
        Err(Error::PrunedVersion { .. })
    ));
    assert!(matches!(
        store.restore(VersionId(100)),
        Err(Error::UnknownVersion { .. })
    ));
    // Ids are never reused.
    let next = store.commit("next").unwrap();
    assert_eq!(next, VersionId(5));
}

#[test]
fn max_versions_prunes_after_every_commit() {
    let mut store = Store::with_config(Config {
        chunk_bytes: CHUNK_BYTES,
        max_versions: Some(3),
        ..Config::default()
    })
    .unwrap();
    store.insert("w", &ramp(&[40], 0.0)).unwrap();
    let v0 = store.commit("init").unwrap();
    store.tag("init", v0).unwrap();
    let mut last = v0;
    for i in 1..=10 {
        set(&mut store, "w", 0, i as f32);
        last = store.commit(&format!("step {i}")).unwrap();
        assert!(store.versions().len() <= 4, "after commit {i}");
    }
    assert_eq!(store.versions(), vec![v0, VersionId(8), VersionId(9), last]);
    assert_eq!(store.stats().versions, 4);
    assert_eq!(w_at(&store, v0)[0], 0.0);
}

// ---- stats, rendering, sharing -----------------------------------------------------

#[test]
fn stats_count_shared_chunks_once() {
    let (mut store, _) = one_commit();
    // 40 f32 = 160 bytes in chunks of 64, 64 and 32 bytes.
    let s = store.stats();
    assert_eq!(
        (
            s.versions,
            s.variables,
            s.unique_chunks,
            s.unique_bytes,
            s.logical_bytes
        ),
        (1, 1, 3, 160, 160)
    );
    assert_eq!(s.sharing_ratio, 1.0, "the working state is HEAD's copy");
    set(&mut store, "w", 0, 9.0);
    store.commit("one chunk changed").unwrap();
    let s: Stats = store.stats();
    assert_eq!(s.versions, 2);
    assert_eq!(s.variables, 1);
    assert_eq!(s.unique_chunks, 4);
    assert_eq!(s.unique_bytes, 160 + 64);
    assert_eq!(s.logical_bytes, 2 * 160, "two versions");
    assert!((s.sharing_ratio - 320.0 / 224.0).abs() < 1e-12);
    set(&mut store, "w", 20, 7.0);
    assert_eq!(
        store.stats().logical_bytes,
        3 * 160,
        "two versions + uncommitted changes"
    );
}

#[test]
fn log_graph_draws_a_fork_and_a_merge() {
    let (mut store, v0) = one_commit();
    set(&mut store, "w", 0, 9.0);
    store.commit("main 1").unwrap();
    store.branch("exp", v0).unwrap();
    store.checkout("exp").unwrap();
    set(&mut store, "w", 32, 9.0);
    let exp = store.commit("exp 1").unwrap();
    store.tag("good", exp).unwrap();
    store.checkout("main").unwrap();
    store.merge(exp, MergeStrategy::Fail).unwrap();
    set(&mut store, "w", 16, 9.0);
    store.commit("after merge").unwrap();
    assert_eq!(
        store.log_graph(),
        "* v4 (HEAD -> main) after merge\n\
         * v3 merge v2 into v1\n\
         |\\\n\
         | * v2 (exp, tag: good) exp 1\n\
         * | v1 main 1\n\
         |/\n\
         * v0 init\n"
    );
    store.detach();
    assert!(store
        .log_graph()
        .starts_with("* v4 (HEAD, main) after merge\n"));
}

#[test]
fn to_dot_has_a_node_per_version_and_an_edge_per_parent() {
    let (mut store, (_, ours, theirs)) = forked(&[(0, 1.0)], &[(39, 1.0)]);
    let m = store.merge(theirs, MergeStrategy::Fail).unwrap();
    let dot = store.to_dot();
    assert!(dot.starts_with("digraph history {"));
    assert!(dot.trim_end().ends_with('}'));
    for id in store.versions() {
        assert!(
            dot.contains(&format!("  {} [label=\"{id}\\n", id.0)),
            "{dot}"
        );
    }
    for (child, parent) in [
        (ours, VersionId(0)),
        (theirs, VersionId(0)),
        (m, ours),
        (m, theirs),
    ] {
        assert!(
            dot.contains(&format!("  {} -> {};", child.0, parent.0)),
            "{dot}"
        );
    }
    assert!(dot.contains("\"ref:side\" -> 2"), "{dot}");
    assert!(dot.contains(&format!("HEAD -> {}", m.0)), "{dot}");
}

#[test]
fn commit_copies_no_data() {
    let mut store = Store::new();
    store.insert("big", &Array1::<f32>::zeros(1 << 20)).unwrap();
    store.insert("small", &ramp(&[7], 0.0)).unwrap();
    let v0 = store.commit("init").unwrap();
    let snap = store.snapshot(v0).unwrap();
    for name in ["big", "small"] {
        assert!(store
            .tensor(name)
            .unwrap()
            .ptr_eq(snap.tensor(name).unwrap()));
    }
    // A commit with no change records a version that shares everything, and hashes
    // nothing.
    let v1 = store.commit("no change").unwrap();
    let snap1 = store.snapshot(v1).unwrap();
    assert!(snap1
        .tensor("big")
        .unwrap()
        .ptr_eq(snap.tensor("big").unwrap()));
    assert!(snap1
        .tensor("big")
        .unwrap()
        .chunks()
        .all(|c| c.cached_hash().is_none()));
    assert_eq!(store.stats().unique_bytes, (1 << 22) + 28);
}

#[test]
fn content_hash_is_equal_for_equal_contents_whatever_the_history() {
    let (mut store, v0) = one_commit();
    set(&mut store, "w", 5, 1234.0);
    let v1 = store.commit("changed").unwrap();
    set(&mut store, "w", 5, 2.5); // ramp value at 5: back to v0's contents
    let v2 = store.commit("changed back").unwrap();
    let hash = |id| store.snapshot(id).unwrap().content_hash();
    assert_eq!(hash(v0), hash(v2));
    assert_ne!(hash(v0), hash(v1));
    // Another store holds the same contents, written independently.
    let mut other = small_store();
    other.insert("w", &ramp(&[40], 0.0)).unwrap();
    let o = other.commit("init").unwrap();
    assert_eq!(other.snapshot(o).unwrap().content_hash(), hash(v0));
    // Names matter.
    let mut renamed = small_store();
    renamed.insert("v", &ramp(&[40], 0.0)).unwrap();
    let r = renamed.commit("init").unwrap();
    assert_ne!(renamed.snapshot(r).unwrap().content_hash(), hash(v0));
}

#[test]
fn mean_merge_of_huge_f64_values_stays_finite() {
    let mut store = tensor_history::Store::new();
    store.insert("x", &ndarray::array![0.0f64, 0.0]).unwrap();
    let base = store.commit("base").unwrap();
    store.update::<f64>("x", |_, xs| xs[0] = 1.5e308).unwrap();
    store.commit("ours").unwrap();
    store.branch("theirs", base).unwrap();
    store.checkout("theirs").unwrap();
    store.update::<f64>("x", |_, xs| xs[0] = 1.7e308).unwrap();
    let theirs = store.commit("theirs").unwrap();
    store.checkout("main").unwrap();
    store.merge(theirs, MergeStrategy::Mean).unwrap();
    let x = store.get::<f64>("x").unwrap();
    assert!(x[0].is_finite(), "mean overflowed: {}", x[0]);
    assert_eq!(x[0], 0.5 * 1.5e308 + 0.5 * 1.7e308);
    store.verify().unwrap();
}
