//! A store saves into the repository it connected to, and `save_as` onto an existing
//! repository neither loses that repository's history nor changes content addresses.

use std::fs;
use std::sync::Arc;

use ndarray::arr1;
use tensor_history::{Backend, Config, Error, MemoryBackend, Store};

fn one(x: f32) -> ndarray::Array1<f32> {
    arr1(&[x])
}

fn committed(x: f32) -> Store {
    let mut s = Store::new();
    s.insert("w", &one(x)).unwrap();
    s.commit(&format!("w = {x}")).unwrap();
    s
}

#[test]
fn save_after_repo_deleted_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut s = committed(1.0);
    s.save_as(&path).unwrap();
    fs::remove_dir_all(&path).unwrap();
    s.write("w", &one(2.0)).unwrap();
    s.commit("two").unwrap();
    let err = s.save().unwrap_err();
    assert!(
        matches!(&err, Error::RepositoryReplaced { reason, .. } if reason.contains("gone")),
        "{err:?}"
    );
    assert!(!path.join("refs").exists(), "no ref was written");
    assert!(matches!(s.refresh(), Err(Error::RepositoryReplaced { .. })));
    // Starting over at the location works.
    s.save_as(&path).unwrap();
    assert_eq!(
        Store::open(&path).unwrap().get::<f32>("w").unwrap(),
        one(2.0).into_dyn()
    );
}

/// A store whose saved versions left memory for the repository (the chunks only the
/// working state does not hold), then the repository deleted.
fn evicted_then_deleted(path: &std::path::Path) -> (Store, tensor_history::VersionId) {
    let mut s = Store::with_config(Config {
        chunk_bytes: 16,
        ..Config::default()
    })
    .unwrap();
    s.insert("w", &ndarray::Array1::from_iter((0..64).map(|i| i as f32)))
        .unwrap();
    let v0 = s.commit("first").unwrap();
    s.save_as(path).unwrap();
    s.write(
        "w",
        &ndarray::Array1::from_iter((0..64).map(|i| -(i as f32))),
    )
    .unwrap();
    s.commit("second").unwrap();
    s.save().unwrap();
    fs::remove_dir_all(path).unwrap();
    (s, v0)
}

#[test]
fn verify_after_repo_deleted_names_the_deleted_repository() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (s, _) = evicted_then_deleted(&path);
    let err = s.verify().unwrap_err();
    assert!(
        matches!(&err, Error::RepositoryReplaced { reason, .. } if reason.contains("gone")),
        "{err:?}"
    );
}

#[test]
fn reading_a_version_held_only_by_a_deleted_repo_names_the_deleted_repository() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let (s, v0) = evicted_then_deleted(&path);
    let err = s.snapshot(v0).unwrap().get::<f32>("w").unwrap_err();
    assert!(
        matches!(&err, Error::RepositoryReplaced { location, reason }
            if reason.contains("gone") && location.contains(path.to_str().unwrap())),
        "{err:?}"
    );
    // The working state never left memory.
    assert_eq!(s.get::<f32>("w").unwrap()[3], -3.0);
}

#[test]
fn save_into_a_repository_created_again_at_the_location_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut s = committed(1.0);
    s.save_as(&path).unwrap();
    fs::remove_dir_all(&path).unwrap();
    committed(5.0).save_as(&path).unwrap();
    s.write("w", &one(2.0)).unwrap();
    s.commit("two").unwrap();
    let err = s.save().unwrap_err();
    assert!(
        matches!(&err, Error::RepositoryReplaced { reason, .. } if reason.contains("replaced")),
        "{err:?}"
    );
    assert_eq!(
        Store::open(&path).unwrap().get::<f32>("w").unwrap(),
        one(5.0).into_dyn()
    );
}

#[test]
fn save_after_a_memory_repository_was_emptied_is_an_error() {
    let mem = Arc::new(MemoryBackend::new());
    let mut s = committed(1.0);
    s.save_to(mem.clone()).unwrap();
    for o in mem.list("").unwrap() {
        mem.delete(&o.key).unwrap();
    }
    s.write("w", &one(2.0)).unwrap();
    s.commit("two").unwrap();
    assert!(matches!(s.save(), Err(Error::RepositoryReplaced { .. })));
    assert!(mem.list("").unwrap().is_empty(), "nothing was written");
    let _ = Config::default();
}

// ---- content addresses ---------------------------------------------------------------

/// Two stores commit on separate branches of one repository, so that two versions have
/// the same `seq`: a third store that opens it gives one of them another id.
fn renumbered_repository(path: &std::path::Path) -> Vec<tensor_history::ContentHash> {
    let mut a = committed(1.0);
    a.save_as(path).unwrap();
    let mut b = Store::open(path).unwrap();
    b.branch("b", b.head().unwrap()).unwrap();
    b.checkout("b").unwrap();
    b.write("w", &one(2.0)).unwrap();
    let vb = b.commit("on b").unwrap();
    b.save().unwrap();
    a.write("w", &one(3.0)).unwrap();
    let va = a.commit("on main").unwrap();
    a.save().unwrap();
    assert_eq!(va, vb, "both stores gave their commit the same id");
    let mut hashes = vec![a.version_hash(va).unwrap(), b.version_hash(vb).unwrap()];
    hashes.sort();
    hashes
}

fn all_hashes(s: &Store) -> Vec<tensor_history::ContentHash> {
    let mut h: Vec<_> = s
        .versions()
        .into_iter()
        .map(|v| s.version_hash(v).unwrap())
        .collect();
    h.sort();
    h
}

fn count_files(dir: &std::path::Path) -> usize {
    match fs::read_dir(dir) {
        Err(_) => 0,
        Ok(rd) => rd
            .map(|e| {
                let p = e.unwrap().path();
                if p.is_dir() {
                    count_files(&p)
                } else {
                    1
                }
            })
            .sum(),
    }
}

#[test]
fn a_renumbered_version_keeps_its_content_address_in_every_repository() {
    let dir = tempfile::tempdir().unwrap();
    let saved = renumbered_repository(dir.path());
    let mut c = Store::open(dir.path()).unwrap();
    let before = all_hashes(&c);
    assert_eq!(before.len(), 3);
    assert!(
        saved.iter().all(|h| before.contains(h)),
        "open keeps the addresses"
    );

    // To another repository: the same addresses there.
    let other = tempfile::tempdir().unwrap();
    c.save_as(other.path()).unwrap();
    assert_eq!(all_hashes(&c), before);
    assert_eq!(all_hashes(&Store::open(other.path()).unwrap()), before);

    // Back to the first one: no new version object, no ref entry moves.
    let versions = count_files(&dir.path().join("versions"));
    let refs = count_files(&dir.path().join("refs"));
    c.save_as(dir.path()).unwrap();
    assert_eq!(count_files(&dir.path().join("versions")), versions);
    assert_eq!(count_files(&dir.path().join("refs")), refs);
    assert_eq!(all_hashes(&Store::open(dir.path()).unwrap()), before);
}

// ---- save_as onto a repository with a history -----------------------------------------

/// Every file of the repository at `dir`, with its bytes (gc aside, nothing may change).
fn files(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let key = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(key, fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The repository's refs and HEAD files only (the objects a failed save may leave are
/// unreferenced).
fn refs_and_head(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    files(dir)
        .into_iter()
        .filter(|(k, _)| k.starts_with("refs/") || k == "HEAD.json")
        .collect()
}

#[test]
fn save_as_onto_another_history_is_a_conflict_that_writes_no_ref() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = committed(1.0);
    let v1 = first.head().unwrap();
    first.tag("best", v1).unwrap();
    first.save_as(dir.path()).unwrap();
    let h1 = first.version_hash(v1).unwrap();
    let before = refs_and_head(dir.path());

    let mut second = committed(2.0);
    let err = second.save_as(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::OtherHistory { branch, theirs, .. } if branch == "main" && *theirs == Some(h1)),
        "{err:?}"
    );
    assert_eq!(second.location(), None, "the store stays unbound");
    assert_eq!(refs_and_head(dir.path()), before);
    // gc of what the failed save wrote keeps the first history whole.
    let mut r = Store::open(dir.path()).unwrap();
    r.gc_with(&tensor_history::GcOptions::immediate()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    r.verify().unwrap();
    assert_eq!(r.version_hash(r.resolve("main").unwrap()).unwrap(), h1);
    assert_eq!(r.get::<f32>("w").unwrap(), one(1.0).into_dyn());

    // Bound to a repository already, a failed save_as keeps that binding.
    let other = tempfile::tempdir().unwrap();
    second.save_as(other.path()).unwrap();
    let err = second.save_as(dir.path()).unwrap_err();
    assert!(matches!(err, Error::OtherHistory { .. }), "{err:?}");
    // The message says what happened and the two ways on.
    let text = err.to_string();
    assert!(text.contains("holds another history"), "{text}");
    assert!(
        text.contains("open it") && text.contains("elsewhere"),
        "{text}"
    );
    assert_eq!(second.location(), Some(other.path().to_str().unwrap()));
    assert_eq!(refs_and_head(dir.path()), before);
}

#[test]
fn save_as_under_other_ref_names_keeps_both_histories() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = committed(1.0);
    first.tag("best", first.head().unwrap()).unwrap();
    first.save_as(dir.path()).unwrap();

    let mut second = committed(2.0);
    second.branch("run2", second.head().unwrap()).unwrap();
    second.checkout("run2").unwrap();
    second.delete_branch("main").unwrap();
    second.save_as(dir.path()).unwrap();

    let mut r = Store::open(dir.path()).unwrap();
    assert_eq!(
        r.current_branch(),
        Some("run2"),
        "HEAD is the saving store's"
    );
    r.gc_with(&tensor_history::GcOptions::immediate()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    r.verify().unwrap();
    let at = |name: &str| {
        r.snapshot(r.resolve(name).unwrap())
            .unwrap()
            .get::<f32>("w")
            .unwrap()
    };
    assert_eq!(at("main"), one(1.0).into_dyn());
    assert_eq!(at("best"), one(1.0).into_dyn());
    assert_eq!(at("run2"), one(2.0).into_dyn());
}

#[test]
fn save_as_a_descendant_of_the_repository_history_moves_its_refs() {
    let dir = tempfile::tempdir().unwrap();
    committed(1.0).save_as(dir.path()).unwrap();
    let mut s = Store::open(dir.path()).unwrap();
    let base = s.head().unwrap();
    s.write("w", &one(2.0)).unwrap();
    let v2 = s.commit("two").unwrap();
    // Bound elsewhere (it saw `main` at v2 there, not at the repository's v1), the store
    // comes back: its main descends from the repository's, nothing is lost.
    let other = tempfile::tempdir().unwrap();
    s.save_as(other.path()).unwrap();
    s.save_as(dir.path()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    let main = r.resolve("main").unwrap();
    assert_eq!(r.version_hash(main).unwrap(), s.version_hash(v2).unwrap());
    let parent = r.parent(main).unwrap().unwrap();
    assert_eq!(
        r.version_hash(parent).unwrap(),
        s.version_hash(base).unwrap()
    );
}

#[test]
fn save_as_onto_a_conflicting_tag_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = committed(1.0);
    first.branch("run1", first.head().unwrap()).unwrap();
    first.checkout("run1").unwrap();
    first.delete_branch("main").unwrap();
    first.tag("best", first.head().unwrap()).unwrap();
    first.save_as(dir.path()).unwrap();
    let before = refs_and_head(dir.path());

    let mut second = committed(2.0);
    second.tag("best", second.head().unwrap()).unwrap();
    let err = second.save_as(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::OtherHistory { branch, .. } if branch == "best"),
        "{err:?}"
    );
    assert_eq!(refs_and_head(dir.path()), before);
}

#[test]
fn save_as_leaves_a_detached_head_of_the_repository_at_a_version_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = committed(1.0);
    let v1 = first.head().unwrap();
    first.write("w", &one(3.0)).unwrap();
    first.commit("three").unwrap();
    first.checkout_detached(v1).unwrap();
    first.write("w", &one(4.0)).unwrap();
    // Only the detached HEAD reaches this version.
    let lone = first.commit("only HEAD reaches this").unwrap();
    first.save_as(dir.path()).unwrap();
    let head = fs::read(dir.path().join("HEAD.json")).unwrap();

    let mut second = committed(2.0);
    second.branch("run2", second.head().unwrap()).unwrap();
    second.checkout("run2").unwrap();
    second.delete_branch("main").unwrap();
    second.save_as(dir.path()).unwrap();
    assert_eq!(fs::read(dir.path().join("HEAD.json")).unwrap(), head);
    let mut r = Store::open(dir.path()).unwrap();
    r.gc_with(&tensor_history::GcOptions::immediate()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    assert_eq!(
        r.version_hash(r.head().unwrap()).unwrap(),
        first.version_hash(lone).unwrap()
    );
    assert_eq!(r.get::<f32>("w").unwrap(), one(4.0).into_dyn());
}
