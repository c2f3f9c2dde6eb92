//! An opened store reads a version's manifests only when a call first needs its
//! variables: opening never touches the manifests of versions other than HEAD, and a
//! call that cannot read them fails with an error naming the file and changes nothing.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{flat, ramp};
use tensor_history::{Error, Store, VersionId};

/// Every file under `dir/manifests`, as paths relative to `dir`.
fn manifests(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dir.join("manifests")];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("readable") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.strip_prefix(dir).expect("under dir").to_path_buf());
            }
        }
    }
    out
}

/// The manifests of a store holding exactly `tensors` as its only version: manifests
/// are content-addressed, so these are the manifests any version with these tensors
/// names.
fn manifests_of(tensors: &[(&str, f32)]) -> BTreeSet<PathBuf> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Store::new();
    for (name, seed) in tensors {
        s.insert(name, &ramp(&[64, 8], *seed)).expect("insert");
    }
    s.commit("only").expect("commit");
    s.save_as(dir.path()).expect("save");
    manifests(dir.path())
}

/// v0, v1, v2 on `main`: `a` changes in every version, `b` never.
fn three_versions(dir: &Path) -> [VersionId; 3] {
    let mut s = Store::new();
    s.insert("b", &ramp(&[64, 8], 100.0)).expect("insert");
    s.insert("a", &ramp(&[64, 8], 0.0)).expect("insert");
    let mut ids = [VersionId(0); 3];
    for (k, id) in ids.iter_mut().enumerate() {
        s.write("a", &ramp(&[64, 8], k as f32)).expect("write");
        *id = s.commit(&format!("v{k}")).expect("commit");
    }
    s.save_as(dir).expect("save");
    ids
}

fn assert_names_manifest(e: &Error) {
    match e {
        Error::CorruptObject { path, .. } => {
            assert!(path.starts_with("manifests/"), "names {path}")
        }
        other => panic!("expected CorruptObject naming a manifest, got {other:?}"),
    }
}

#[test]
fn open_needs_only_the_manifests_of_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [v0, _, v2] = three_versions(dir.path());
    let keep = manifests_of(&[("a", 2.0), ("b", 100.0)]);
    let all = manifests(dir.path());
    assert!(keep.is_subset(&all) && keep.len() == 2 && all.len() == 4);
    for p in all.difference(&keep) {
        std::fs::remove_file(dir.path().join(p)).expect("remove");
    }

    let mut s = Store::open(dir.path()).expect("open reads no other manifest");
    assert_eq!(s.head(), Some(v2));
    assert_eq!(s.versions().len(), 3);
    assert_eq!(s.message(v0).expect("message"), "v0");
    assert_eq!(
        flat(&s.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 2.0))
    );

    // Every call that needs v0's variables names the missing manifest, and changes
    // nothing.
    assert_names_manifest(&s.restore(v0).unwrap_err());
    assert_names_manifest(&s.snapshot(v0).unwrap_err());
    assert_names_manifest(&s.diff(v0, v2).unwrap_err());
    assert_names_manifest(&s.checkout_detached(v0).unwrap_err());
    assert!(matches!(s.verify(), Err(Error::CorruptObject { .. })));
    assert_eq!(s.head(), Some(v2));
    assert_eq!(s.current_branch(), Some("main"));
    assert!(!s.is_dirty());
    assert_eq!(
        flat(&s.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 2.0))
    );

    // The error is not kept: with the files back, the same calls succeed.
    let full = tempfile::tempdir().expect("tempdir");
    three_versions(full.path());
    for p in all.difference(&keep) {
        std::fs::copy(full.path().join(p), dir.path().join(p)).expect("copy back");
    }
    s.restore(v0).expect("restore reads v0 now");
    assert_eq!(
        flat(&s.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 0.0))
    );
    s.verify().expect("verify");
}

#[test]
fn versions_read_on_first_use_match_the_saved_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = three_versions(dir.path());
    let s = Store::open(dir.path()).expect("open");
    for (k, id) in ids.iter().enumerate() {
        let snap = s.snapshot(*id).expect("snapshot");
        assert_eq!(
            flat(&snap.get::<f32>("a").expect("a")),
            flat(&ramp(&[64, 8], k as f32))
        );
        assert_eq!(
            flat(&snap.get::<f32>("b").expect("b")),
            flat(&ramp(&[64, 8], 100.0))
        );
    }
    // Versions read separately share the chunks they have in common.
    let b_of = |id| {
        s.snapshot(id)
            .expect("snapshot")
            .tensor("b")
            .expect("b")
            .clone()
    };
    let (b0, b2) = (b_of(ids[0]), b_of(ids[2]));
    assert_eq!(b0.shared_chunks(&b2), b0.num_chunks());
    let d = s.diff(ids[0], ids[2]).expect("diff");
    assert_eq!(d.changed_names(), vec!["a"]);
    s.verify().expect("verify");
}

#[test]
fn a_save_after_reopening_writes_only_the_new_manifests() {
    let dir = tempfile::tempdir().expect("tempdir");
    three_versions(dir.path());
    let mut s = Store::open(dir.path()).expect("open");
    s.write("a", &ramp(&[64, 8], 7.0)).expect("write");
    s.commit("v3").expect("commit");
    let stats = s.save().expect("save");
    assert_eq!((stats.versions_written, stats.manifests_written), (1, 1));
    let reopened = Store::open(dir.path()).expect("reopen");
    reopened.verify().expect("verify");
    assert_eq!(
        flat(&reopened.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 7.0))
    );
}

#[test]
fn refresh_that_cannot_read_the_new_head_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let [_, _, v2] = three_versions(dir.path());
    let mut reader = Store::open(dir.path()).expect("open");

    let before = manifests(dir.path());
    let mut writer = Store::open(dir.path()).expect("open");
    writer.write("a", &ramp(&[64, 8], 3.0)).expect("write");
    writer.commit("v3").expect("commit");
    writer.save().expect("save");
    let new: Vec<PathBuf> = manifests(dir.path()).difference(&before).cloned().collect();
    assert_eq!(new.len(), 1, "v3 adds one manifest");
    let path = dir.path().join(&new[0]);
    let good = std::fs::read(&path).expect("read");
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    std::fs::write(&path, &bad).expect("damage");

    assert_names_manifest(&reader.refresh().unwrap_err());
    assert_eq!(reader.head(), Some(v2));
    assert_eq!(reader.resolve("main").expect("main"), v2);
    assert_eq!(reader.versions().len(), 3);
    assert_eq!(
        flat(&reader.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 2.0))
    );

    std::fs::write(&path, &good).expect("repair");
    let stats = reader.refresh().expect("refresh");
    assert_eq!(stats.versions_loaded, 1);
    assert_eq!(
        flat(&reader.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 3.0))
    );
    reader.verify().expect("verify");
}
