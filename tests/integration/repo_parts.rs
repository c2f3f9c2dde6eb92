//! Several writers, one version: parts written by many stores, one commit naming them
//! all, published by an ordinary save. Conflicts between coordinators, garbage of parts
//! never committed, and power loss at every operation.

use std::sync::Arc;

use ndarray::ArrayD;
use tensor_history::{
    Backend, Config, ContentHash, Error, GcOptions, MemoryBackend, Meta, Part, PartChunks,
    SimBackend, Store, Value,
};

use crate::common::{ramp, CHUNK_BYTES};

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

/// One writer's tensors: `w.<rank>` and a tensor every writer has with the same bytes.
fn writer(rank: usize, seed: f32) -> Store {
    let mut s = Store::with_config(config()).unwrap();
    s.insert(&format!("w.{rank}"), &ramp(&[20, 8], seed + rank as f32))
        .unwrap();
    s.insert("shared", &ramp(&[33], 7.0)).unwrap();
    s
}

fn write_parts(backend: &Arc<dyn Backend>, seed: f32, ranks: usize) -> Vec<Part> {
    (0..ranks)
        .map(|r| writer(r, seed).write_part_to(backend.clone()).unwrap().part)
        .collect()
}

fn expected(seed: f32, ranks: usize) -> Vec<(String, ArrayD<f32>)> {
    let mut out: Vec<(String, ArrayD<f32>)> = (0..ranks)
        .map(|r| (format!("w.{r}"), ramp(&[20, 8], seed + r as f32)))
        .collect();
    out.push(("shared".into(), ramp(&[33], 7.0)));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn check_version(s: &Store, refname: &str, seed: f32, ranks: usize) {
    let snap = s.snapshot(s.resolve(refname).unwrap()).unwrap();
    let want = expected(seed, ranks);
    assert_eq!(
        snap.names(),
        want.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>()
    );
    for (name, a) in want {
        assert_eq!(snap.get::<f32>(&name).unwrap(), a, "{name}");
    }
}

fn memory() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new())
}

#[test]
fn parts_of_several_writers_commit_as_one_version_that_reopens_bit_for_bit() {
    let backend = memory();
    let parts = write_parts(&backend, 0.0, 3);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    let meta = Meta::new().with("step", 1);
    let v = c.commit_parts("main", &parts, "dcp save", meta).unwrap();
    c.save().unwrap();
    assert_eq!(c.head(), Some(v));
    assert_eq!(c.current_branch(), Some("main"));

    let r = Store::open_backend(backend, config()).unwrap();
    r.verify().unwrap();
    check_version(&r, "main", 0.0, 3);
    let head = r.head().unwrap();
    assert_eq!(r.message(head).unwrap(), "dcp save");
    assert_eq!(r.metadata(head).unwrap().get("step"), Some(&Value::Int(1)));
    assert_eq!(r.version_hash(head).unwrap(), c.version_hash(v).unwrap());
}

#[test]
fn a_second_part_writes_only_the_chunks_that_changed() {
    let backend = memory();
    let parts = write_parts(&backend, 0.0, 2);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    c.commit_parts("main", &parts, "one", Meta::new()).unwrap();
    c.save().unwrap();

    let mut w = writer(0, 0.0);
    let first = w.write_part_to(backend.clone()).unwrap();
    assert_eq!(first.chunks_written, 0, "{first:?}");
    w.update_range::<f32>("w.0", 40..41, |_, xs| xs[0] = -1.0)
        .unwrap();
    let second = w.write_part_to(backend.clone()).unwrap();
    assert_eq!(second.chunks_written, 1, "{second:?}");
    assert_eq!(second.packs_written, 1);
    assert!(second.bytes_written < 1024, "{second:?}");

    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    let one = parts[1].clone();
    let v2 = c
        .commit_parts("main", &[second.part, one], "two", Meta::new())
        .unwrap();
    c.save().unwrap();
    let r = Store::open_backend(backend, config()).unwrap();
    let got = r.snapshot(r.resolve("main").unwrap()).unwrap();
    assert_eq!(got.get::<f32>("w.0").unwrap(), w.get::<f32>("w.0").unwrap());
    assert_eq!(r.log(r.head().unwrap()).unwrap().len(), 2);
    assert_eq!(
        r.version_hash(r.head().unwrap()).unwrap(),
        c.version_hash(v2).unwrap()
    );
}

#[test]
fn two_coordinators_on_one_branch_one_wins_and_the_other_gets_branch_moved() {
    let backend = memory();
    let first = write_parts(&backend, 0.0, 2);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    c.commit_parts("main", &first, "first", Meta::new())
        .unwrap();
    c.save().unwrap();

    let a_parts = write_parts(&backend, 1.0, 2);
    let b_parts = write_parts(&backend, 2.0, 2);
    let mut a = Store::open_backend(backend.clone(), config()).unwrap();
    let mut b = Store::open_backend(backend.clone(), config()).unwrap();
    let va = a.commit_parts("main", &a_parts, "a", Meta::new()).unwrap();
    b.commit_parts("main", &b_parts, "b", Meta::new()).unwrap();
    a.save().unwrap();
    let err = b.save().unwrap_err();
    let theirs = a.version_hash(va).unwrap();
    assert!(
        matches!(&err, Error::BranchMoved { branch, theirs: Some(t) } if branch == "main" && *t == theirs),
        "{err}"
    );

    let r = Store::open_backend(backend.clone(), config()).unwrap();
    r.verify().unwrap();
    check_version(&r, "main", 1.0, 2);
    let parent = r.parent(r.head().unwrap()).unwrap().unwrap();
    assert_eq!(r.message(parent).unwrap(), "first");
    check_version(&r, &r.version_hash(parent).unwrap().to_string(), 0.0, 2);

    // The loser opens again and commits its parts on top: nothing is lost.
    drop(b);
    let mut b = Store::open_backend(backend.clone(), config()).unwrap();
    b.commit_parts("main", &b_parts, "b again", Meta::new())
        .unwrap();
    b.save().unwrap();
    let r = Store::open_backend(backend, config()).unwrap();
    check_version(&r, "main", 2.0, 2);
    let parent = r.parent(r.head().unwrap()).unwrap().unwrap();
    assert_eq!(r.version_hash(parent).unwrap(), theirs);
}

#[test]
fn commit_parts_onto_another_branch_leaves_head_where_it_is() {
    let backend = memory();
    let parts = write_parts(&backend, 0.0, 1);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    let v0 = c.commit_parts("main", &parts, "main", Meta::new()).unwrap();
    c.save().unwrap();
    let other = write_parts(&backend, 5.0, 2);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    c.commit_parts("ckpt", &other, "ckpt", Meta::new()).unwrap();
    assert_eq!(c.head(), Some(v0));
    assert_eq!(c.current_branch(), Some("main"));
    c.save().unwrap();
    let r = Store::open_backend(backend, config()).unwrap();
    assert_eq!(r.current_branch(), Some("main"));
    check_version(&r, "main", 0.0, 1);
    check_version(&r, "ckpt", 5.0, 2);
    assert_eq!(r.parents(r.resolve("ckpt").unwrap()).unwrap(), []);
}

#[test]
fn commit_parts_refuses_what_it_cannot_commit_and_changes_nothing() {
    let backend = memory();
    let parts = write_parts(&backend, 0.0, 2);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    c.commit_parts("main", &parts, "one", Meta::new()).unwrap();
    c.tag("t", c.head().unwrap()).unwrap();
    c.save().unwrap();
    let before = (c.versions(), c.refs(), c.head());

    let missing = Part {
        items: vec![("x".into(), ContentHash::of_bytes(b"no such manifest"))],
    };
    let err = c
        .commit_parts("main", &[missing], "m", Meta::new())
        .unwrap_err();
    assert!(matches!(err, Error::CorruptObject { .. }), "{err}");

    let err = c.commit_parts("t", &parts, "m", Meta::new()).unwrap_err();
    assert!(matches!(err, Error::WrongRefKind { .. }), "{err}");

    let clash = Part {
        items: vec![(parts[0].items[1].0.clone(), parts[1].items[1].1)],
    };
    let err = c
        .commit_parts("main", &[parts[0].clone(), clash], "m", Meta::new())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");

    let err = c.commit_parts("v1", &parts, "m", Meta::new()).unwrap_err();
    assert!(matches!(err, Error::InvalidRefName { .. }), "{err}");

    c.insert("dirty", &ramp(&[3], 0.0)).unwrap();
    let err = c
        .commit_parts("main", &parts, "m", Meta::new())
        .unwrap_err();
    assert!(matches!(err, Error::UncommittedChanges), "{err}");

    let mut fresh = Store::with_config(config()).unwrap();
    let err = fresh
        .commit_parts("main", &parts, "m", Meta::new())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");

    assert_eq!((c.versions(), c.refs(), c.head()), before);
}

#[test]
fn part_text_round_trips_and_bad_lines_are_refused() {
    let backend = memory();
    let parts = write_parts(&backend, 0.0, 2);
    for p in &parts {
        assert_eq!(&Part::from_text(&p.to_text()).unwrap(), p);
    }
    let with_space = Part {
        items: vec![("a name with spaces".into(), parts[0].items[0].1)],
    };
    assert_eq!(Part::from_text(&with_space.to_text()).unwrap(), with_space);
    assert!(matches!(
        Part::from_text("zz name\n"),
        Err(Error::InvalidArgument { .. })
    ));
}

fn keys_under(b: &dyn Backend, prefix: &str) -> Vec<String> {
    let mut k: Vec<String> = b.list(prefix).unwrap().into_iter().map(|o| o.key).collect();
    k.sort();
    k
}

#[test]
fn parts_never_committed_are_garbage_that_gc_collects() {
    let backend = memory();
    let parts = write_parts(&backend, 0.0, 2);
    let mut c = Store::open_backend(backend.clone(), config()).unwrap();
    c.commit_parts("main", &parts, "one", Meta::new()).unwrap();
    c.save().unwrap();
    let packs = keys_under(&*backend, "packs/");
    let manifests = keys_under(&*backend, "manifests/");

    // A save whose coordinator never commits (a writer failed): the others' parts stay
    // unreferenced.
    let orphan = write_parts(&backend, 9.0, 2);
    assert!(keys_under(&*backend, "packs/").len() > packs.len());

    // gc with its grace period records them and deletes nothing yet.
    let mut g = Store::open_backend(backend.clone(), config()).unwrap();
    let stats = g.gc_with(&GcOptions::default()).unwrap();
    assert_eq!(stats.objects_deleted, 0);
    assert!(stats.candidates_recorded > 0);
    // Committing within the grace period still works: the coordinator's save writes
    // again what a gc record lists.
    let mut late = Store::open_backend(backend.clone(), config()).unwrap();
    late.commit_parts("late", &orphan, "late", Meta::new())
        .unwrap();
    late.save().unwrap();
    let r = Store::open_backend(backend.clone(), config()).unwrap();
    r.verify().unwrap();
    check_version(&r, "late", 9.0, 2);

    // Another orphan, and no commit: gc (grace 0, single process) deletes it.
    let mut late = late;
    late.delete_branch("late").unwrap();
    late.save().unwrap();
    let _ = write_parts(&backend, 11.0, 3);
    // Two runs: the first keeps the objects the late commit wrote again after the
    // earlier record (gc's rule), and records them; the second deletes them.
    for _ in 0..2 {
        let mut g = Store::open_backend(backend.clone(), config()).unwrap();
        g.gc_with(&GcOptions::immediate()).unwrap();
    }
    let after = keys_under(&*backend, "manifests/");
    assert_eq!(after, manifests, "{:?}", keys_under(&*backend, ""));
    let r = Store::open_backend(backend.clone(), config()).unwrap();
    r.verify().unwrap();
    check_version(&r, "main", 0.0, 2);
    let live_pack_bytes: u64 = backend.list("packs/").unwrap().iter().map(|o| o.size).sum();
    let first_pack_bytes: u64 = packs
        .iter()
        .map(|k| backend.get(k).map(|b| b.len() as u64).unwrap_or(0))
        .sum();
    assert!(
        live_pack_bytes <= first_pack_bytes,
        "{live_pack_bytes} > {first_pack_bytes}"
    );
}

/// The whole multi-writer save (two parts, the coordinator's open, commit and save) on a
/// simulated disk that loses power at each mutating operation in turn: the survivor
/// opens and verifies, `main` is at the previous version or at the new one with every
/// part's tensors, and gc of the survivor keeps the previous version.
#[test]
fn power_loss_during_a_multi_writer_save_leaves_the_previous_or_the_new_version() {
    let prepare = |sim: &Arc<SimBackend>| {
        let b: Arc<dyn Backend> = sim.clone();
        let parts = write_parts(&b, 0.0, 2);
        let mut c = Store::open_backend(b, config()).unwrap();
        c.commit_parts("main", &parts, "one", Meta::new()).unwrap();
        c.save().unwrap();
    };
    let act = |sim: &Arc<SimBackend>| -> Result<(), Error> {
        let b: Arc<dyn Backend> = sim.clone();
        let mut parts = Vec::new();
        for r in 0..2 {
            let mut w = writer(r, 0.0);
            w.update_range::<f32>(&format!("w.{r}"), 0..1, |_, xs| xs[0] = 100.0)?;
            parts.push(w.write_part_to(b.clone())?.part);
        }
        let mut c = Store::open_backend(b, config())?;
        c.commit_parts("main", &parts, "two", Meta::new())?;
        c.save()?;
        Ok(())
    };
    let sim = Arc::new(SimBackend::new());
    prepare(&sim);
    let start = sim.ops();
    act(&sim).unwrap();
    let total = sim.ops() - start;
    assert!(total > 4, "{total}");
    let new_main = Store::open_backend(sim.clone(), config())
        .unwrap()
        .version_hash(
            Store::open_backend(sim.clone(), config())
                .unwrap()
                .head()
                .unwrap(),
        )
        .unwrap();
    for n in 0..total {
        let sim = Arc::new(SimBackend::new());
        prepare(&sim);
        let old = Store::open_backend(sim.clone(), config()).unwrap();
        let old_main = old.version_hash(old.head().unwrap()).unwrap();
        sim.crash_at(sim.ops() + n);
        assert!(
            act(&sim).is_err(),
            "op {n}/{total}: the crash was not reported"
        );
        for seed in 0..4 {
            let what = format!("op {n}/{total} seed {seed}");
            let survivor: Arc<dyn Backend> = Arc::new(sim.power_loss(seed));
            let r = Store::open_backend(survivor.clone(), config())
                .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            r.verify().unwrap_or_else(|e| panic!("{what}: verify: {e}"));
            let main = r.version_hash(r.resolve("main").unwrap()).unwrap();
            assert!(main == old_main || main == new_main, "{what}");
            if main == old_main {
                check_version(&r, "main", 0.0, 2);
            }
            let mut r = r;
            r.gc_with(&GcOptions::immediate())
                .unwrap_or_else(|e| panic!("{what}: gc: {e}"));
            let r = Store::open_backend(survivor, config())
                .unwrap_or_else(|e| panic!("{what}: reopen after gc: {e}"));
            r.verify()
                .unwrap_or_else(|e| panic!("{what}: verify after gc: {e}"));
            let again = r.version_hash(r.resolve("main").unwrap()).unwrap();
            assert_eq!(again, main, "{what}");
            if main == old_main {
                check_version(&r, "main", 0.0, 2);
            } else {
                let got = r.snapshot(r.resolve("main").unwrap()).unwrap();
                assert_eq!(got.get::<f32>("w.0").unwrap()[[0, 0]], 100.0, "{what}");
            }
        }
    }
}

#[test]
fn a_part_stores_its_chunks_raw_or_coded_as_asked_and_both_read_back() {
    // Smooth f32 weights: byte planes save on them, so coded parts are smaller.
    // 4 KiB chunks: a 64-byte chunk never pays for its header.
    let config = || Config {
        chunk_bytes: 4 << 10,
        ..Config::default()
    };
    let weights = |seed: f32| {
        let mut s = Store::with_config(config()).unwrap();
        s.insert(
            "w",
            &ArrayD::from_shape_fn(ndarray::IxDyn(&[64, 64]), |ix| {
                ((ix[0] * 64 + ix[1]) as f32 * 1e-3 + seed).sin()
            }),
        )
        .unwrap();
        s
    };
    let mut sizes = Vec::new();
    for how in [PartChunks::Raw, PartChunks::Coded] {
        let backend = memory();
        let w = weights(0.5);
        let stats = w.write_part_to_as(backend.clone(), how).unwrap();
        sizes.push(stats.bytes_written);
        let mut c = Store::open_backend(backend.clone(), config()).unwrap();
        c.commit_parts("main", &[stats.part], "one", Meta::new())
            .unwrap();
        c.save().unwrap();
        let r = Store::open_backend(backend, config()).unwrap();
        let got = r.snapshot(r.resolve("main").unwrap()).unwrap();
        assert_eq!(got.get::<f32>("w").unwrap(), w.get::<f32>("w").unwrap());
        r.verify().unwrap();
    }
    // Raw holds every byte of the 16 KiB tensor (plus pack, index and manifest).
    assert!(sizes[0] >= 64 * 64 * 4, "{sizes:?}");
    assert!(
        sizes[1] * 10 < sizes[0] * 9,
        "coded parts are smaller: {sizes:?}"
    );
}
