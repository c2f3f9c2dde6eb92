//! Power loss and backend errors during saves and gc: reopening never panics, finds the
//! previous or the new save, and verifies; a failed save loses nothing.

use std::io::ErrorKind;
use std::sync::Arc;

use ndarray::ArrayD;
use tensor_history::{
    Backend, Config, ContentHash, Error, GcOptions, Meta, Retention, SimBackend, Store,
};

use crate::common::{
    dense_weights, fingerprint, ramp, same_bits, Fingerprint, CHUNK_BYTES, DENSE_CHUNK_BYTES,
};

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

fn base_store() -> Store {
    let mut s = Store::with_config(config()).unwrap();
    s.insert("w", &ramp(&[40, 16], 0.0)).unwrap();
    s.insert("b", &ramp(&[5], 1.0)).unwrap();
    s.commit("init").unwrap();
    s.update::<f32>("w", |_, xs| xs[3] += 1.0).unwrap();
    s.commit("step").unwrap();
    s.tag("t0", s.head().unwrap()).unwrap();
    s
}

/// Reopen what a power loss left and check that HEAD and every ref are as in `old` or
/// as in `new` (refs move one by one, each atomically), and that every version holds
/// the data it was saved with.
/// `reads` checks what the reopened store reads against what was written.
fn check_survivor(
    sim: &SimBackend,
    seed: u64,
    old: &Fingerprint,
    new: &Fingerprint,
    what: &str,
    reads: &dyn Fn(&Store, &str),
) {
    let survivor = sim.power_loss(seed);
    let r = Store::open_backend(Arc::new(survivor), config())
        .unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    r.verify()
        .unwrap_or_else(|e| panic!("{what}: verify failed: {e}"));
    reads(&r, what);
    let f = fingerprint(&r);
    let either = |a: Option<&(bool, ContentHash)>, name: &str| {
        a == old.refs.get(name) || a == new.refs.get(name)
    };
    for name in f.refs.keys().chain(old.refs.keys()).chain(new.refs.keys()) {
        assert!(either(f.refs.get(name), name), "{what}: ref {name}: {f:#?}");
    }
    assert!(
        (f.head, &f.branch) == (old.head, &old.branch)
            || (f.head, &f.branch) == (new.head, &new.branch),
        "{what}: HEAD: {f:#?}"
    );
    for (v, content) in &f.versions {
        let saved = old.versions.get(v).or(new.versions.get(v));
        assert_eq!(saved, Some(content), "{what}: version {v}");
    }
    // Refs still as before the call reach every version they reached then: none is
    // hidden by a prune marker, and gc deletes none of them.
    let old_refs = f.refs == old.refs && old.refs != new.refs;
    let hidden = |f: &Fingerprint| -> Vec<ContentHash> {
        old.versions
            .keys()
            .filter(|v| !f.versions.contains_key(v))
            .copied()
            .collect()
    };
    if old_refs {
        assert_eq!(
            hidden(&f),
            [],
            "{what}: versions the old refs reach are hidden"
        );
    }
    let mut r = r;
    r.gc_with(&GcOptions::immediate())
        .unwrap_or_else(|e| panic!("{what}: gc of the survivor failed: {e}"));
    let after_gc = reopen_backend(r.backend().unwrap(), what);
    reads(&after_gc, what);
    let after_gc = fingerprint(&after_gc);
    if old_refs {
        assert_eq!(
            hidden(&after_gc),
            [],
            "{what}: gc deleted versions the old refs reach"
        );
    }
}

fn reopen_backend(b: Arc<dyn Backend>, what: &str) -> Store {
    let r =
        Store::open_backend(b, config()).unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    r.verify()
        .unwrap_or_else(|e| panic!("{what}: verify failed: {e}"));
    r
}

/// Run `prepare` then `act` on a fresh simulated disk with a crash at every operation
/// index of `act`, checking each survivor.
fn crash_everywhere(
    name: &str,
    prepare: impl Fn(&Arc<SimBackend>) -> Store,
    act: impl Fn(&mut Store, &Arc<SimBackend>) -> Result<(), Error>,
) {
    crash_everywhere_reading(name, prepare, act, &|_, _| {});
}

/// [`crash_everywhere`], also checking every reopened store with `reads`.
fn crash_everywhere_reading(
    name: &str,
    prepare: impl Fn(&Arc<SimBackend>) -> Store,
    act: impl Fn(&mut Store, &Arc<SimBackend>) -> Result<(), Error>,
    reads: &dyn Fn(&Store, &str),
) {
    // A run without crash counts the operations.
    let sim = Arc::new(SimBackend::new());
    let mut s = prepare(&sim);
    let _ = reopen_fingerprint(&sim);
    let start = sim.ops();
    act(&mut s, &sim).unwrap();
    let total = sim.ops() - start;
    assert_eq!(
        reopen_fingerprint(&sim),
        fingerprint(&s),
        "{name}: the save is incomplete"
    );
    reads(&reopen_backend(sim.clone(), name), name);
    assert!(total > 0, "{name}: no operation to crash at");
    for n in 0..total {
        let sim = Arc::new(SimBackend::new());
        let mut s = prepare(&sim);
        let old = reopen_fingerprint(&sim);
        sim.crash_at(sim.ops() + n);
        let before = fingerprint(&s);
        let new = &before;
        let r = act(&mut s, &sim);
        assert!(
            r.is_err(),
            "{name}: op {n} of {total}: the crash was not reported"
        );
        assert_eq!(
            fingerprint(&s),
            before,
            "{name}: memory changed by a failed call"
        );
        for seed in 0..4 {
            check_survivor(
                &sim,
                seed,
                &old,
                new,
                &format!("{name}: op {n}/{total} seed {seed}"),
                reads,
            );
        }
        // The failed store saves onto what a power loss left (as a rerun holding the
        // same data would): whatever the index lists must be there, so that the save
        // may skip it.
        for seed in 0..4 {
            let what = format!("{name}: op {n}/{total} seed {seed}: save onto the survivor");
            let survivor: Arc<dyn Backend> = Arc::new(sim.power_loss(seed));
            s.save_to(survivor.clone())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let r = reopen_backend(survivor, &what);
            reads(&r, &what);
            assert_eq!(fingerprint(&r), fingerprint(&s), "{what}");
        }
    }
}

fn reopen_fingerprint(sim: &Arc<SimBackend>) -> Fingerprint {
    let b: Arc<dyn Backend> = sim.clone();
    match Store::open_backend(b, config()) {
        Ok(s) => fingerprint(&s),
        Err(e) => panic!("reopen failed: {e}"),
    }
}

#[test]
fn power_loss_during_a_first_save_leaves_an_empty_or_the_saved_repository() {
    crash_everywhere(
        "first save",
        |_| base_store(),
        |s, sim| s.save_to(sim.clone()).map(|_| ()),
    );
}

fn saved_store(sim: &Arc<SimBackend>) -> Store {
    let mut s = base_store();
    s.save_to(sim.clone()).unwrap();
    s
}

#[test]
fn power_loss_during_a_sparse_save_leaves_the_previous_or_the_new_save() {
    crash_everywhere(
        "sparse save",
        |sim| {
            let mut s = saved_store(sim);
            s.update_range::<f32>("w", 100..101, |_, xs| xs[0] = -1.0)
                .unwrap();
            s.commit("sparse").unwrap();
            s.branch("other", s.head().unwrap()).unwrap();
            s
        },
        |s, _| s.save().map(|_| ()),
    );
}

#[test]
fn power_loss_during_a_save_after_prune_leaves_the_previous_or_the_new_save() {
    crash_everywhere(
        "save after prune",
        |sim| {
            let mut s = saved_store(sim);
            for i in 0..4 {
                s.update::<f32>("w", |_, xs| xs[0] = i as f32).unwrap();
                s.commit(&format!("more {i}")).unwrap();
            }
            s.save().unwrap();
            s.prune(&Retention::keep_last(2)).unwrap();
            s.delete_tag("t0").unwrap();
            s
        },
        |s, _| s.save().map(|_| ()),
    );
}

#[test]
fn power_loss_between_moved_refs_and_prune_markers_hides_no_version_the_old_refs_reach() {
    crash_everywhere(
        "save after prune and a commit",
        |sim| {
            let mut s = saved_store(sim);
            for i in 0..4 {
                s.update::<f32>("w", |_, xs| xs[1] = i as f32).unwrap();
                s.commit(&format!("more {i}")).unwrap();
            }
            s.save().unwrap();
            s.delete_tag("t0").unwrap();
            s.prune(&Retention::keep_last(1)).unwrap();
            s.update::<f32>("w", |_, xs| xs[2] = -2.0).unwrap();
            s.commit("after prune").unwrap();
            s
        },
        |s, _| s.save().map(|_| ()),
    );
}

/// A background save whose outcome is waited for: the same protocol as `save`, on the
/// writer thread.
fn save_in_background(s: &mut Store) -> Result<(), Error> {
    s.save_in_background()?.wait().map(|_| ())
}

#[test]
fn power_loss_during_a_first_background_save_leaves_an_empty_or_the_saved_repository() {
    crash_everywhere(
        "first background save",
        |sim| {
            // A repository with nothing saved yet: the background save writes all of it.
            let mut s = Store::with_config(config()).unwrap();
            s.save_to(sim.clone()).unwrap();
            let b = base_store();
            for name in b.names() {
                s.insert_tensor(&name, b.tensor(&name).unwrap().clone())
                    .unwrap();
            }
            s.commit("init").unwrap();
            s.tag("t0", s.head().unwrap()).unwrap();
            s
        },
        |s, _| save_in_background(s),
    );
}

#[test]
fn power_loss_during_a_sparse_background_save_leaves_the_previous_or_the_new_save() {
    crash_everywhere(
        "sparse background save",
        |sim| {
            let mut s = saved_store(sim);
            s.update_range::<f32>("w", 100..101, |_, xs| xs[0] = -1.0)
                .unwrap();
            s.commit("sparse").unwrap();
            s.branch("other", s.head().unwrap()).unwrap();
            s
        },
        |s, _| save_in_background(s),
    );
}

#[test]
fn power_loss_during_a_background_save_after_prune_leaves_the_previous_or_the_new_save() {
    crash_everywhere(
        "background save after prune and a commit",
        |sim| {
            let mut s = saved_store(sim);
            for i in 0..4 {
                s.update::<f32>("w", |_, xs| xs[1] = i as f32).unwrap();
                s.commit(&format!("more {i}")).unwrap();
            }
            s.save().unwrap();
            s.delete_tag("t0").unwrap();
            s.prune(&Retention::keep_last(1)).unwrap();
            s.update::<f32>("w", |_, xs| xs[2] = -2.0).unwrap();
            s.commit("after prune").unwrap();
            s
        },
        |s, _| save_in_background(s),
    );
}

#[test]
fn power_loss_during_gc_keeps_the_saved_repository() {
    crash_everywhere(
        "gc",
        |sim| {
            let mut s = saved_store(sim);
            for i in 0..4 {
                s.update::<f32>("w", |_, xs| xs.iter_mut().for_each(|x| *x += i as f32))
                    .unwrap();
                s.commit(&format!("dense {i}")).unwrap();
            }
            s.save().unwrap();
            s.delete_tag("t0").unwrap();
            s.prune(&Retention::keep_last(1)).unwrap();
            s.save().unwrap();
            s
        },
        |s, sim| {
            let stats = s.gc_with(&GcOptions::immediate())?;
            // The run deleted objects, so it wrote a gc generation entry first: the
            // crashes above hit that write too.
            assert!(stats.objects_deleted > 0, "{stats:?}");
            assert_eq!(sim.list("gc/generations/").unwrap().len(), 1);
            Ok(())
        },
    );
}

#[test]
fn a_backend_error_at_any_point_of_a_save_loses_nothing_and_the_next_save_succeeds() {
    for kind in [ErrorKind::StorageFull, ErrorKind::PermissionDenied] {
        let sim = Arc::new(SimBackend::new());
        let mut probe = saved_store(&sim);
        probe.update::<f32>("w", |_, xs| xs[7] = 7.0).unwrap();
        probe.commit("probe").unwrap();
        let start = sim.ops();
        probe.save().unwrap();
        let total = sim.ops() - start;
        for n in 0..total {
            let sim = Arc::new(SimBackend::new());
            let mut s = saved_store(&sim);
            s.update::<f32>("w", |_, xs| xs[7] = 7.0).unwrap();
            s.commit("probe").unwrap();
            let before = fingerprint(&s);
            sim.fail_at(sim.ops() + n, kind);
            let r = s.save();
            assert!(
                matches!(r, Err(Error::Io { kind: k, .. }) if k == kind),
                "op {n}: {r:?}"
            );
            assert_eq!(fingerprint(&s), before, "op {n}: memory changed");
            s.verify().unwrap();
            s.save().unwrap();
            let r = Store::open_backend(sim.clone(), config()).unwrap();
            r.verify().unwrap();
            assert_eq!(
                fingerprint(&r),
                before,
                "op {n}: the retried save is incomplete"
            );
        }
    }
}

// ---- dense changes: packs holding XOR deltas and chains of them ----------------------

/// Elements of the dense tensor `d`: 2 chunks of `f32`.
const DENSE_ELEMS: usize = 2 * DENSE_CHUNK_BYTES / 4;

fn dense_config() -> Config {
    Config {
        chunk_bytes: DENSE_CHUNK_BYTES,
        ..Config::default()
    }
}

/// `d` after `step` dense steps.
fn dense_d(step: usize) -> ArrayD<f32> {
    dense_weights(DENSE_ELEMS, step)
}

/// Commit `steps` dense steps of `d` after the one the working state holds, each as
/// `dense {step}`, saving after each commit when `save_each`; returns the last step.
fn dense_commits(s: &mut Store, from: usize, steps: usize, save_each: bool) -> usize {
    for step in from + 1..=from + steps {
        s.write("d", &dense_d(step)).unwrap();
        s.commit(&format!("dense {step}")).unwrap();
        if save_each {
            let st = s.save().unwrap();
            assert_stored_as_deltas(&st);
        }
    }
    from + steps
}

/// The save stored its dense chunks coded: a raw pack would store what it read.
fn assert_stored_as_deltas(st: &tensor_history::SaveStats) {
    assert!(
        st.chunk_bytes_stored * 2 < st.chunk_bytes_raw,
        "dense chunks stored at more than half their bytes: {st:?}"
    );
}

/// A saved store holding `d` at step 0 (committed as `dense 0`, tagged `t0`) and `b`.
fn dense_saved_store(sim: &Arc<SimBackend>) -> Store {
    let mut s = Store::with_config(dense_config()).unwrap();
    s.insert("d", &dense_d(0)).unwrap();
    s.insert("b", &ramp(&[5], 1.0)).unwrap();
    s.commit("dense 0").unwrap();
    s.tag("t0", s.head().unwrap()).unwrap();
    s.save_to(sim.clone()).unwrap();
    s
}

/// Every version of `r` whose message is `dense {step}` reads `d` as [`dense_d`]`(step)`,
/// bit for bit (decoded through its chain of deltas).
fn dense_reads(r: &Store, what: &str) {
    let mut read = 0;
    for id in r.versions() {
        let Some(step) = r.message(id).unwrap().strip_prefix("dense ") else {
            continue;
        };
        let step: usize = step.parse().unwrap();
        let got = r
            .snapshot(id)
            .unwrap()
            .get::<f32>("d")
            .unwrap_or_else(|e| panic!("{what}: {id}: {e}"));
        assert!(
            same_bits(&got, &dense_d(step)),
            "{what}: {id} (dense {step}) reads other bytes"
        );
        read += 1;
    }
    assert!(read > 0, "{what}: no dense version to read");
}

#[test]
fn power_loss_during_a_dense_save_of_delta_chains_leaves_the_previous_or_the_new_save() {
    // Nine dense steps in one save on top of a saved full version: each chunk's chain
    // grows to its bound of 8 links, one version is stored whole again, and the next
    // starts a new chain.
    crash_everywhere_reading(
        "dense save",
        |sim| {
            let mut s = dense_saved_store(sim);
            dense_commits(&mut s, 0, 9, false);
            s.branch("other", s.head().unwrap()).unwrap();
            s
        },
        |s, _| {
            let st = s.save()?;
            assert_stored_as_deltas(&st);
            Ok(())
        },
        &dense_reads,
    );
}

#[test]
fn power_loss_during_gc_of_deltas_whose_bases_versions_were_pruned_keeps_the_saved_repository() {
    // Each dense step saved on its own: every delta's base is in an earlier save's pack.
    // Pruning to the last two versions leaves live deltas whose bases belong to pruned
    // versions; gc deletes the pruned versions but keeps those bases.
    crash_everywhere_reading(
        "gc of deltas",
        |sim| {
            let mut s = dense_saved_store(sim);
            dense_commits(&mut s, 0, 4, true);
            s.delete_tag("t0").unwrap();
            s.prune(&Retention::keep_last(2)).unwrap();
            s.save().unwrap();
            s
        },
        |s, sim| {
            let stats = s.gc_with(&GcOptions::immediate())?;
            assert!(stats.objects_deleted > 0, "{stats:?}");
            assert_eq!(sim.list("gc/generations/").unwrap().len(), 1);
            Ok(())
        },
        &dense_reads,
    );
}

#[test]
fn power_loss_during_a_dense_save_after_gc_of_pruned_bases_leaves_the_previous_or_the_new_save() {
    // The chains the next save extends start in packs that gc kept only as bases.
    crash_everywhere_reading(
        "dense save after gc",
        |sim| {
            let mut s = dense_saved_store(sim);
            let last = dense_commits(&mut s, 0, 3, true);
            s.delete_tag("t0").unwrap();
            s.prune(&Retention::keep_last(1)).unwrap();
            s.save().unwrap();
            s.gc_with(&GcOptions::immediate()).unwrap();
            dense_commits(&mut s, last, 2, false);
            s
        },
        |s, _| {
            let st = s.save()?;
            assert_stored_as_deltas(&st);
            Ok(())
        },
        &dense_reads,
    );
}

#[test]
fn a_backend_error_at_any_point_of_a_dense_save_loses_nothing_and_the_next_save_succeeds() {
    // Three dense steps on a saved full version: the failed save leaves packs without an
    // index, or an index without refs; the retry takes its deltas' bases only from what
    // the repository lists.
    let prepare = |sim: &Arc<SimBackend>| {
        let mut s = dense_saved_store(sim);
        dense_commits(&mut s, 0, 3, false);
        s
    };
    let sim = Arc::new(SimBackend::new());
    let mut probe = prepare(&sim);
    let start = sim.ops();
    assert_stored_as_deltas(&probe.save().unwrap());
    let total = sim.ops() - start;
    for n in 0..total {
        let sim = Arc::new(SimBackend::new());
        let mut s = prepare(&sim);
        let before = fingerprint(&s);
        sim.fail_at(sim.ops() + n, ErrorKind::StorageFull);
        let r = s.save();
        assert!(
            matches!(
                r,
                Err(Error::Io {
                    kind: ErrorKind::StorageFull,
                    ..
                })
            ),
            "op {n}: {r:?}"
        );
        assert_eq!(fingerprint(&s), before, "op {n}: memory changed");
        s.verify().unwrap();
        dense_reads(&s, &format!("op {n}: after the failed save"));
        s.save().unwrap();
        let r = reopen_backend(sim.clone(), &format!("op {n}"));
        dense_reads(&r, &format!("op {n}: the retried save"));
        assert_eq!(
            fingerprint(&r),
            before,
            "op {n}: the retried save is incomplete"
        );
    }
}

#[test]
fn power_loss_during_a_rebasing_gc_of_parts_keeps_the_saved_repository() {
    // Dense steps written as parts (every chunk stored whole, as DCP saves write them),
    // then gc re-bases them onto their parents' chunks: new packs of deltas, an index,
    // then the whole packs recorded and deleted.
    crash_everywhere_reading(
        "rebasing gc",
        |sim| {
            let mut w = Store::with_config(dense_config()).unwrap();
            w.insert("d", &dense_d(0)).unwrap();
            let mut c = Store::open_backend(sim.clone(), dense_config()).unwrap();
            for step in 0..4 {
                w.write("d", &dense_d(step)).unwrap();
                let part = w.write_part_to(sim.clone()).unwrap().part;
                c.commit_parts("main", &[part], &format!("dense {step}"), Meta::new())
                    .unwrap();
                c.save().unwrap();
            }
            // The store holds every version's bytes (the harness saves it onto each
            // survivor afterwards, and the crashed disk cannot be read then).
            for v in c.versions() {
                c.snapshot(v).unwrap().tensor("d").unwrap().load().unwrap();
            }
            c
        },
        |s, _| {
            let mut o = GcOptions::immediate();
            o.rebase = true;
            let stats = s.gc_with(&o)?;
            assert_eq!(stats.chunks_rebased, 3 * 2, "{stats:?}");
            assert!(stats.objects_deleted > 0, "{stats:?}");
            Ok(())
        },
        &dense_reads,
    );
}

#[test]
fn power_loss_during_a_gc_that_merges_index_files_keeps_the_saved_repository() {
    // More saves than MERGE_INDEXES_ABOVE, one index file each: a gc (with its grace
    // period, so nothing else is deleted) writes one index listing them all, then
    // deletes them.
    crash_everywhere_reading(
        "index merge",
        |sim| {
            let mut s = saved_store(sim);
            for i in 0..tensor_history::MERGE_INDEXES_ABOVE {
                // Four chunks of `w` each: the first save's pack ends up mostly dead
                // once only HEAD is kept, and a later gc rewrites it.
                for c in 0..4 {
                    let at = (i * 4 + c) * CHUNK_BYTES / 4;
                    s.update_range::<f32>("w", at..at + 1, |_, xs| xs[0] = -(i as f32))
                        .unwrap();
                }
                s.commit(&format!("save {i}")).unwrap();
                s.save().unwrap();
            }
            s
        },
        |s, sim| {
            let stats = s.gc()?;
            assert!(
                stats.indexes_merged > tensor_history::MERGE_INDEXES_ABOVE,
                "{stats:?}"
            );
            assert_eq!(sim.list("index/").unwrap().len(), 1);
            Ok(())
        },
        &gc_after_a_stopped_merge,
    );
}

/// After a gc stopped between writing an index that supersedes others and deleting
/// them: prune all but HEAD, save, and gc at once (it deletes packs those old indexes
/// name, and replaces the index that superseded them); every chunk of HEAD then reads.
/// It changes the survivor, which nothing reads after it.
fn gc_after_a_stopped_merge(r: &Store, what: &str) {
    let b = r.backend().unwrap();
    let mut s = Store::open_backend(b.clone(), config()).unwrap();
    let head = s.get::<f32>("w").unwrap();
    if s.resolve("t0").is_ok() {
        s.delete_tag("t0").unwrap();
    }
    s.prune(&Retention::keep_last(1)).unwrap();
    s.clear_reflog();
    s.save().unwrap();
    s.gc_with(&GcOptions::immediate())
        .unwrap_or_else(|e| panic!("{what}: gc after the crash: {e}"));
    let again = reopen_backend(b, what);
    assert!(same_bits(&again.get::<f32>("w").unwrap(), &head), "{what}");
}
