//! Saving to a repository and opening it again: contents, history, refs and ids come
//! back as saved; saves write only what the repository lacks.

use std::sync::Arc;

use half::{bf16, f16};
use ndarray::{Array, ArrayD, IxDyn};
use tensor_history::{
    Backend, Config, Element, Error, MemoryBackend, Ref, Retention, Store, VersionId,
};

use crate::common::{ramp, small_store, BOUNDARY_SHAPES, CHUNK_BYTES};

fn small_config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

fn arr<T: Element>(shape: &[usize], f: impl Fn(usize) -> T) -> ArrayD<T> {
    let n: usize = shape.iter().product();
    Array::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).unwrap()
}

fn reopen(store: &Store) -> Store {
    Store::open_with(store.location().unwrap(), store.config().clone()).unwrap()
}

#[test]
fn every_dtype_comes_back_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = small_store();
    let shape = [5, 7];
    s.insert("f16", &arr(&shape, |i| f16::from_f32(i as f32 * 0.3)))
        .unwrap();
    s.insert("bf16", &arr(&shape, |i| bf16::from_f32(-(i as f32))))
        .unwrap();
    s.insert(
        "f32",
        &arr(&shape, |i| f32::from_bits(0x3f80_0000 + i as u32)),
    )
    .unwrap();
    s.insert(
        "f64",
        &arr(&shape, |i| {
            f64::NAN.copysign(if i % 2 == 0 { 1.0 } else { -1.0 })
        }),
    )
    .unwrap();
    s.insert("i8", &arr(&shape, |i| i as i8 - 17)).unwrap();
    s.insert("i16", &arr(&shape, |i| i as i16 * -301)).unwrap();
    s.insert("i32", &arr(&shape, |i| i as i32 * 99_999))
        .unwrap();
    s.insert("i64", &arr(&shape, |i| i64::MIN + i as i64))
        .unwrap();
    s.insert("u8", &arr(&shape, |i| i as u8)).unwrap();
    s.insert("u16", &arr(&shape, |i| u16::MAX - i as u16))
        .unwrap();
    s.insert("u32", &arr(&shape, |i| i as u32 * 7)).unwrap();
    s.insert("u64", &arr(&shape, |i| u64::MAX - i as u64))
        .unwrap();
    s.commit("all dtypes").unwrap();
    s.save_as(dir.path()).unwrap();

    let r = Store::open(dir.path()).unwrap();
    r.verify().unwrap();
    assert_eq!(r.names(), s.names());
    for name in s.names() {
        let a = s.tensor(&name).unwrap();
        let b = r.tensor(&name).unwrap();
        assert_eq!(a.dtype(), b.dtype(), "{name}");
        assert_eq!(a.shape(), b.shape(), "{name}");
        let ab: Vec<u8> = a
            .chunks()
            .flat_map(|c| c.bytes().unwrap().to_vec())
            .collect();
        let bb: Vec<u8> = b
            .chunks()
            .flat_map(|c| c.bytes().unwrap().to_vec())
            .collect();
        assert_eq!(ab, bb, "{name}");
        assert_eq!(a.content_hash(), b.content_hash(), "{name}");
    }
    assert_eq!(r.get::<i64>("i64").unwrap(), s.get::<i64>("i64").unwrap());
}

#[test]
fn boundary_shapes_round_trip() {
    let mut s = small_store();
    for (i, shape) in BOUNDARY_SHAPES.iter().enumerate() {
        s.insert(&format!("t{i}"), &ramp(shape, i as f32)).unwrap();
    }
    s.commit("shapes").unwrap();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let r = reopen_mem(&s);
    for (i, shape) in BOUNDARY_SHAPES.iter().enumerate() {
        let name = format!("t{i}");
        assert_eq!(
            r.get::<f32>(&name).unwrap(),
            ramp(shape, i as f32),
            "{shape:?}"
        );
    }
    r.verify().unwrap();
}

/// Reopen a store saved to a memory backend through the same backend.
fn reopen_mem(s: &Store) -> Store {
    let backend = s.backend().unwrap();
    Store::open_backend(backend, s.config().clone()).unwrap()
}

/// A store with branches, a tag, a merge and pruned versions.
fn rich_history() -> (Store, Vec<VersionId>) {
    let mut s = small_store();
    s.insert("w", &ramp(&[8, 8], 0.0)).unwrap();
    s.insert("b", &ramp(&[3], 1.0)).unwrap();
    let v0 = s.commit("init").unwrap();
    s.update::<f32>("w", |_, xs| xs[0] += 1.0).unwrap();
    let meta = tensor_history::Meta::new()
        .with("loss", 0.25)
        .with("step", 1)
        .with("note", "first step")
        .with("ok", true);
    let v1 = s.commit_with("step 1", meta).unwrap();
    s.update::<f32>("w", |_, xs| xs[1] += 1.0).unwrap();
    let v2 = s.commit("step 2").unwrap();
    s.branch("side", v0).unwrap();
    s.checkout("side").unwrap();
    s.update::<f32>("b", |_, xs| xs[0] = 9.0).unwrap();
    let v3 = s.commit("side step").unwrap();
    s.tag("best", v1).unwrap();
    s.checkout("main").unwrap();
    let v4 = s.merge(v3, tensor_history::MergeStrategy::Ours).unwrap();
    s.update::<f32>("w", |_, xs| xs[2] += 1.0).unwrap();
    let v5 = s.commit("after merge").unwrap();
    (s, vec![v0, v1, v2, v3, v4, v5])
}

#[test]
fn history_refs_messages_and_ids_come_back_as_saved() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, ids) = rich_history();
    s.save_as(dir.path()).unwrap();
    let r = reopen(&s);
    r.verify().unwrap();
    assert_eq!(r.versions(), s.versions());
    assert_eq!(r.refs(), s.refs());
    assert_eq!(r.head(), s.head());
    assert_eq!(r.current_branch(), Some("main"));
    assert_eq!(r.log_graph(), s.log_graph());
    for id in &ids {
        assert_eq!(r.message(*id).unwrap(), s.message(*id).unwrap());
        assert_eq!(r.metadata(*id).unwrap(), s.metadata(*id).unwrap());
        assert_eq!(r.parents(*id).unwrap(), s.parents(*id).unwrap());
        assert_eq!(r.children(*id).unwrap(), s.children(*id).unwrap());
        assert_eq!(
            r.snapshot(*id).unwrap().time(),
            s.snapshot(*id).unwrap().time()
        );
        assert_eq!(
            r.snapshot(*id).unwrap().content_hash(),
            s.snapshot(*id).unwrap().content_hash()
        );
        assert_eq!(r.version_hash(*id).unwrap(), s.version_hash(*id).unwrap());
    }
    assert_eq!(
        r.diff(ids[0], ids[5]).unwrap(),
        s.diff(ids[0], ids[5]).unwrap()
    );
    assert_eq!(r.metadata(ids[1]).unwrap().number("loss"), Some(0.25));
}

#[test]
fn pruned_versions_stay_pruned_and_ids_keep_their_gaps() {
    let (mut s, ids) = rich_history();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    s.prune(&Retention::keep_last(2)).unwrap();
    s.save().unwrap();
    let r = reopen_mem(&s);
    r.verify().unwrap();
    assert_eq!(r.versions(), s.versions());
    assert_eq!(r.log_graph(), s.log_graph());
    for id in &ids {
        match s.parents(*id) {
            Ok(p) => assert_eq!(r.parents(*id).unwrap(), p),
            Err(e) => assert_eq!(r.parents(*id).unwrap_err(), e),
        }
    }
}

#[test]
fn detached_head_comes_back_detached() {
    let (mut s, ids) = rich_history();
    s.restore(ids[2]).unwrap();
    s.detach();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let r = reopen_mem(&s);
    assert_eq!(r.head(), Some(ids[2]));
    assert_eq!(r.current_branch(), None);
    assert_eq!(r.get::<f32>("w").unwrap(), s.get::<f32>("w").unwrap());
}

#[test]
fn a_second_save_with_nothing_new_writes_no_chunk() {
    let (mut s, _) = rich_history();
    let first = s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    assert!(first.chunks_written > 0);
    assert_eq!(first.versions_written, 6);
    let second = s.save().unwrap();
    assert_eq!(second.chunks_written, 0);
    assert_eq!(second.versions_written, 0);
    assert_eq!(second.refs_written, 0);
    assert_eq!(second.bytes_written, 0);
}

#[test]
fn an_incremental_save_writes_only_the_changed_chunks() {
    let mut s = small_store();
    s.insert("w", &ramp(&[64, 16], 0.0)).unwrap(); // 64 chunks of one row
    s.commit("init").unwrap();
    let first = s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    assert_eq!(first.chunks_written, 64);
    s.update_range::<f32>("w", 16 * 10..16 * 13, |_, xs| {
        xs.iter_mut().for_each(|x| *x += 1.0)
    })
    .unwrap();
    s.commit("three rows").unwrap();
    let second = s.save().unwrap();
    assert_eq!(second.chunks_written, 3);
    assert_eq!(second.chunks_present, 61);
    assert_eq!(second.versions_written, 1);
    assert_eq!(second.manifests_written, 1);
    let r = reopen_mem(&s);
    assert_eq!(r.get::<f32>("w").unwrap(), s.get::<f32>("w").unwrap());
}

#[test]
fn uncommitted_changes_are_not_saved() {
    let mut s = small_store();
    s.insert("w", &ramp(&[4], 0.0)).unwrap();
    s.commit("init").unwrap();
    s.write("w", &ramp(&[4], 5.0)).unwrap();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let r = reopen_mem(&s);
    assert_eq!(r.get::<f32>("w").unwrap(), ramp(&[4], 0.0));
    assert_eq!(s.get::<f32>("w").unwrap(), ramp(&[4], 5.0));
}

#[test]
fn resolve_accepts_a_hex_prefix_of_the_content_address() {
    let (mut s, ids) = rich_history();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let r = reopen_mem(&s);
    for id in &ids {
        let hex = s.version_hash(*id).unwrap().to_string();
        assert_eq!(r.resolve(&hex[..12]).unwrap(), *id);
        assert_eq!(r.resolve(&hex).unwrap(), *id);
        assert_eq!(r.resolve(&hex.to_uppercase()[..10]).unwrap(), *id);
    }
    assert!(matches!(r.resolve("zzzz"), Err(Error::UnknownRef { .. })));
}

#[test]
fn version_hash_of_an_unsaved_version_matches_the_saved_one() {
    let (mut s, ids) = rich_history();
    let before: Vec<_> = ids.iter().map(|i| s.version_hash(*i).unwrap()).collect();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let after: Vec<_> = ids.iter().map(|i| s.version_hash(*i).unwrap()).collect();
    assert_eq!(before, after);
}

#[test]
fn open_creates_an_empty_repository_and_a_first_commit_saves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new-repo");
    let mut s = Store::open(&path).unwrap();
    assert_eq!(s.head(), None);
    assert_eq!(s.location(), Some(path.to_str().unwrap()));
    s.insert("x", &ramp(&[10], 0.0)).unwrap();
    let v0 = s.commit("first").unwrap();
    s.save().unwrap();
    let r = Store::open(&path).unwrap();
    assert_eq!(r.head(), Some(v0));
    assert_eq!(r.resolve("main").unwrap(), v0);
}

#[test]
fn save_without_a_repository_is_an_error() {
    let mut s = Store::new();
    assert!(matches!(s.save(), Err(Error::InvalidArgument { .. })));
}

#[test]
fn an_unknown_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    s.insert("x", &ramp(&[10], 0.0)).unwrap();
    s.commit("c").unwrap();
    s.save().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        br#"{"format":"tensor-history","version":5}"#,
    )
    .unwrap();
    assert!(matches!(
        Store::open(dir.path()),
        Err(Error::UnsupportedFormat { .. })
    ));
}

#[test]
fn an_object_of_a_newer_format_version_is_refused() {
    let mem = MemoryBackend::new();
    let mut s = small_store();
    s.insert("x", &ramp(&[10], 0.0)).unwrap();
    s.commit("c").unwrap();
    s.save_to(Arc::new(mem.clone())).unwrap();
    let key = mem
        .list("versions/")
        .unwrap()
        .into_iter()
        .next()
        .unwrap()
        .key;
    let mut bytes = mem.get(&key).unwrap().to_vec();
    bytes[8] = 9;
    mem.put(&key, &bytes).unwrap();
    let e = Store::open_backend(Arc::new(mem), small_config()).unwrap_err();
    assert!(
        matches!(e, Error::UnsupportedFormat { ref path, .. } if path == &key),
        "{e:?}"
    );
}

#[test]
fn a_non_empty_directory_that_is_not_a_repository_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"hello").unwrap();
    assert!(matches!(
        Store::open(dir.path()),
        Err(Error::UnsupportedFormat { .. })
    ));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("notes.txt")]);
    assert_eq!(
        std::fs::read(dir.path().join("notes.txt")).unwrap(),
        b"hello"
    );
}

#[test]
fn save_as_an_unsupported_url_is_a_clear_error_and_keeps_the_store() {
    let mut s = small_store();
    s.insert("x", &ramp(&[10], 0.0)).unwrap();
    s.commit("c").unwrap();
    // A provider this build lacks (`gs://` needs the `gcs` feature).
    let url = if cfg!(feature = "gcs") {
        "ftp://bucket/prefix"
    } else {
        "gs://bucket/prefix"
    };
    let e = s.save_as(url).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_eq!(s.location(), None);
}

#[test]
fn a_url_of_a_provider_this_build_lacks_names_the_feature_it_needs() {
    for (url, feature, on) in [
        ("s3://b/x", "`s3`", cfg!(feature = "s3")),
        ("gs://b/x", "`gcs`", cfg!(feature = "gcs")),
        ("az://c/x", "`azure`", cfg!(feature = "azure")),
        ("abfs://c/x", "`azure`", cfg!(feature = "azure")),
    ] {
        if on {
            continue;
        }
        let e = tensor_history::open_location(url).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument { reason } if reason.contains(feature)),
            "{url}: {e:?}"
        );
    }
}

#[test]
fn file_urls_are_local_directories_and_memory_urls_fresh_memory_stores() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("repo");
    let mut s = small_store();
    s.insert("x", &ramp(&[10], 0.0)).unwrap();
    s.commit("c").unwrap();
    s.save_as(format!("file://{}", path.display())).unwrap();
    let back = Store::open(&path).unwrap();
    assert_eq!(back.get::<f32>("x").unwrap(), ramp(&[10], 0.0));

    let e = tensor_history::open_location("file://relative/path").unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");

    let b = tensor_history::open_location("memory://").unwrap();
    assert!(b.list("").unwrap().is_empty());
    let mut m = small_store();
    m.insert("x", &ramp(&[10], 0.0)).unwrap();
    m.commit("c").unwrap();
    m.save_as("memory://").unwrap();
    assert!(
        m.location().unwrap().starts_with("memory://"),
        "{:?}",
        m.location()
    );
}

#[test]
fn deleted_refs_stay_deleted_after_reopen() {
    let (mut s, _) = rich_history();
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    s.delete_tag("best").unwrap();
    s.delete_branch("side").unwrap();
    s.save().unwrap();
    let r = reopen_mem(&s);
    assert_eq!(r.refs(), s.refs());
    assert!(!r.refs().iter().any(|(n, _)| n == "best" || n == "side"));
    assert!(matches!(r.refs()[0].1, Ref::Branch(_)));
}

#[test]
fn after_save_the_heap_holds_about_the_working_state_and_old_versions_still_read() {
    let mut s = small_store();
    s.insert("w", &ramp(&[64, 16], 0.0)).unwrap();
    let v0 = s.commit("v0").unwrap();
    for i in 1..8 {
        s.update_map::<f32>("w", |x| x + i as f32).unwrap();
        s.commit(&format!("dense {i}")).unwrap();
    }
    let model = 64 * 16 * 4;
    let before = s.stats();
    assert_eq!(before.heap_bytes, 8 * model);
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let after = s.stats();
    assert_eq!(after.heap_bytes, model, "{after:?}");
    assert_eq!(after.stored_bytes, 7 * model);
    // Restore, read, diff, write and verify work on stored chunks.
    let diff = s.diff(v0, s.head().unwrap()).unwrap();
    assert_eq!(diff.changed_chunks(), 64);
    s.restore(v0).unwrap();
    assert_eq!(s.get::<f32>("w").unwrap(), ramp(&[64, 16], 0.0));
    s.update_range::<f32>("w", 0..1, |_, xs| xs[0] = -5.0)
        .unwrap();
    assert_eq!(s.get::<f32>("w").unwrap()[[0, 0]], -5.0);
    s.verify().unwrap();
}

#[test]
fn after_save_evicted_buffers_leave_the_pool_too_and_the_pool_keeps_what_it_held() {
    let mut s = small_store();
    s.insert("w", &ramp(&[64, 16], 0.0)).unwrap();
    s.commit("v0").unwrap();
    for i in 1..8 {
        s.update_map::<f32>("w", |x| x + i as f32).unwrap();
        s.commit(&format!("dense {i}")).unwrap();
    }
    // A change thrown away puts its buffers into the pool: they serve the working state.
    s.update_map::<f32>("w", |x| x * 2.0).unwrap();
    s.discard().unwrap();
    let model = 64 * 16 * 4;
    let before = s.stats();
    assert_eq!(before.pooled_bytes, model, "{before:?}");
    assert_eq!(before.heap_bytes, 8 * model);
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    let after = s.stats();
    // The 7 versions' buffers are freed, not pooled: heap and pool hold the working
    // state and what the pool held before.
    assert_eq!(after.heap_bytes, model, "{after:?}");
    assert_eq!(after.pooled_bytes, model, "{after:?}");
    assert_eq!(after.stored_bytes, 7 * model);
    // The pooled buffers still serve copy-on-write after the save.
    s.update_map::<f32>("w", |x| x + 1.0).unwrap();
    assert_eq!(s.stats().pooled_bytes, 0);
    assert_eq!(s.get::<f32>("w").unwrap()[[0, 0]], 29.0);
}

/// `frozen` stays the same from v0 on while `w` changes at every step, and each step is
/// saved (in the background with `background`): the saved versions share `frozen`'s
/// chunks with the working state, so they stay on the heap, until a write lets them go:
/// the save after it takes them from every version that holds them. A version not saved
/// keeps its parent's chunks on the heap until it is saved (its deltas are taken
/// against them).
fn chunks_the_working_state_lets_go_leave_the_heap_at_the_next_save(background: bool) {
    let model = 64 * 16 * 4;
    let mut s = small_store();
    s.insert("frozen", &ramp(&[64, 16], 100.0)).unwrap();
    s.insert("w", &ramp(&[64, 16], 0.0)).unwrap();
    s.commit("v0").unwrap();
    let save = |s: &mut Store| {
        if background {
            s.save_in_background().unwrap().wait().unwrap();
            // The store takes the finished save back at its next commit.
            s.update_map::<f32>("w", |x| x + 0.5).unwrap();
            s.commit("after the background save").unwrap();
        } else {
            s.save().unwrap();
        }
    };
    s.save_to(Arc::new(MemoryBackend::new())).unwrap();
    for i in 1..6 {
        s.update_map::<f32>("w", |x| x + i as f32).unwrap();
        s.commit(&format!("step {i}")).unwrap();
        save(&mut s);
        let st = s.stats();
        let unsaved = if background { 1 } else { 0 };
        assert_eq!(st.heap_bytes, (2 + unsaved) * model, "step {i}: {st:?}");
    }
    // Two commits, not saved: the first one's parent keeps its chunks on the heap.
    s.update_map::<f32>("w", |x| x * 2.0).unwrap();
    s.commit("unsaved 1").unwrap();
    s.update_map::<f32>("w", |x| x * 2.0).unwrap();
    s.commit("unsaved 2").unwrap();
    s.write("frozen", &ramp(&[64, 16], -1.0)).unwrap();
    s.commit("frozen let go").unwrap();
    save(&mut s);
    let st = s.stats();
    let unsaved = if background { 1 } else { 0 };
    assert_eq!(st.heap_bytes, (2 + unsaved) * model, "{st:?}");
    for v in s.versions() {
        let snap = s.snapshot(v).unwrap();
        let frozen = snap.get::<f32>("frozen").unwrap();
        assert!(
            frozen == ramp(&[64, 16], 100.0) || frozen == ramp(&[64, 16], -1.0),
            "{v}"
        );
    }
    s.verify().unwrap();
}

#[test]
fn chunks_the_working_state_lets_go_leave_the_heap_at_the_next_save_in_the_foreground() {
    chunks_the_working_state_lets_go_leave_the_heap_at_the_next_save(false);
}

#[test]
fn chunks_the_working_state_lets_go_leave_the_heap_at_the_next_background_save() {
    chunks_the_working_state_lets_go_leave_the_heap_at_the_next_save(true);
}

#[test]
fn gc_after_prune_and_save_shrinks_the_repository() {
    let mem = MemoryBackend::new();
    let size = |m: &MemoryBackend| -> u64 { m.list("").unwrap().iter().map(|o| o.size).sum() };
    let mut s = small_store();
    s.insert("w", &ramp(&[64, 16], 0.0)).unwrap();
    s.commit("v0").unwrap();
    for i in 1..6 {
        s.update_map::<f32>("w", |x| x + i as f32).unwrap();
        s.commit(&format!("dense {i}")).unwrap();
    }
    s.save_to(Arc::new(mem.clone())).unwrap();
    let full = size(&mem);
    s.prune(&Retention::keep_last(1)).unwrap();
    s.save().unwrap();
    // With the default grace nothing is deleted yet, only recorded.
    let first = s.gc().unwrap();
    assert_eq!(first.objects_deleted, 0);
    assert!(first.candidates_recorded > 0);
    let stats = s.gc_with(&tensor_history::GcOptions::immediate()).unwrap();
    assert!(stats.objects_deleted > 0);
    let small = size(&mem);
    assert!(small * 3 < full, "{small} vs {full}");
    let r = reopen_mem(&s);
    r.verify().unwrap();
    assert_eq!(r.get::<f32>("w").unwrap(), s.get::<f32>("w").unwrap());
    assert_eq!(r.versions(), s.versions());
}
