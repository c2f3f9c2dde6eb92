//! An opened store reads a version's manifests only when a call first needs its
//! variables: opening never touches the manifests of versions other than HEAD, and a
//! call that cannot read them fails with an error naming the file (the pack that holds
//! the manifest, and the manifest) and changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::{flat, ramp};
use tensor_history::{Error, Store, VersionId};

/// The first bytes of every manifest object: `\x89TH\r\n\x1a\n` and kind `M`. A
/// repository of format 4 keeps the manifests a save writes as entries of its packs,
/// the object's bytes without the trailer (a pack's own header has kind `P`; the
/// chunks of these tests never hold these bytes).
const MANIFEST_MAGIC: &[u8] = b"\x89TH\r\n\x1a\nM";

/// Bytes of a manifest that tell it from the others of these tests (its dtype, shape,
/// chunk layout and first chunk id are in them).
const PREFIX: usize = 64;

/// Where a manifest is in a repository: a pack file (relative to the repository) and
/// the offset of the manifest's entry in it.
type Spot = (PathBuf, usize);

/// Every manifest entry in the packs under `dir`, with its first [`PREFIX`] bytes.
fn manifests(dir: &Path) -> BTreeMap<Spot, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.join("packs")];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("readable") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                todo.push(p);
                continue;
            }
            let bytes = std::fs::read(&p).expect("read pack");
            let rel = p.strip_prefix(dir).expect("under dir").to_path_buf();
            for at in 0..bytes.len().saturating_sub(PREFIX) {
                if bytes[at..].starts_with(MANIFEST_MAGIC) {
                    out.insert((rel.clone(), at), bytes[at..at + PREFIX].to_vec());
                }
            }
        }
    }
    out
}

/// The manifests (their first bytes) of a store holding exactly `tensors` as its only
/// version: manifests are content-addressed, so these are the manifests any version
/// with these tensors names.
fn manifests_of(tensors: &[(&str, f32)]) -> BTreeSet<Vec<u8>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Store::new();
    for (name, seed) in tensors {
        s.insert(name, &ramp(&[64, 8], *seed)).expect("insert");
    }
    s.commit("only").expect("commit");
    s.save_as(dir.path()).expect("save");
    manifests(dir.path()).into_values().collect()
}

/// Flip a byte in the manifest at `spot` of the repository at `dir` (again to repair
/// it).
fn flip(dir: &Path, spot: &Spot) {
    let path = dir.join(&spot.0);
    let mut bytes = std::fs::read(&path).expect("read pack");
    bytes[spot.1 + 12] ^= 0x10;
    std::fs::write(&path, &bytes).expect("write pack");
}

/// v0, v1, v2 on `main`, each saved as it is committed (so each save's pack holds the
/// manifests it wrote): `a` changes in every version, `b` never.
fn three_versions(dir: &Path) -> [VersionId; 3] {
    let mut s = Store::new();
    s.insert("b", &ramp(&[64, 8], 100.0)).expect("insert");
    s.insert("a", &ramp(&[64, 8], 0.0)).expect("insert");
    let mut ids = [VersionId(0); 3];
    for (k, id) in ids.iter_mut().enumerate() {
        s.write("a", &ramp(&[64, 8], k as f32)).expect("write");
        *id = s.commit(&format!("v{k}")).expect("commit");
        if k == 0 {
            s.save_as(dir).expect("save");
        } else {
            s.save().expect("save");
        }
    }
    ids
}

fn assert_names_manifest(e: &Error) {
    match e {
        Error::CorruptObject { path, .. } => {
            assert!(
                path.starts_with("packs/") && path.contains("(manifest "),
                "names {path}"
            )
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
    assert_eq!((keep.len(), all.len()), (2, 4));
    let others: Vec<Spot> = all
        .iter()
        .filter(|(_, prefix)| !keep.contains(*prefix))
        .map(|(spot, _)| spot.clone())
        .collect();
    assert_eq!(others.len(), 2, "the manifests of v0's and v1's `a`");
    for spot in &others {
        flip(dir.path(), spot);
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

    // The error is not kept: with the manifests repaired, the same calls succeed.
    for spot in &others {
        flip(dir.path(), spot);
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
    let new: Vec<Spot> = manifests(dir.path())
        .into_keys()
        .filter(|spot| !before.contains_key(spot))
        .collect();
    assert_eq!(new.len(), 1, "v3 adds one manifest");
    flip(dir.path(), &new[0]);

    assert_names_manifest(&reader.refresh().unwrap_err());
    assert_eq!(reader.head(), Some(v2));
    assert_eq!(reader.resolve("main").expect("main"), v2);
    assert_eq!(reader.versions().len(), 3);
    assert_eq!(
        flat(&reader.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 2.0))
    );

    flip(dir.path(), &new[0]);
    let stats = reader.refresh().expect("refresh");
    assert_eq!(stats.versions_loaded, 1);
    assert_eq!(
        flat(&reader.get::<f32>("a").expect("a")),
        flat(&ramp(&[64, 8], 3.0))
    );
    reader.verify().expect("verify");
}
