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
