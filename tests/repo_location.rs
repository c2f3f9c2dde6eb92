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
