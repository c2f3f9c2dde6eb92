//! Limits the repository's readers enforce are enforced before anything is written, and
//! a repository that holds an object past them (written by an older build) still opens.

use std::fs;
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Error, Store, MAX_DIMS};

fn ones(dims: usize) -> ArrayD<f32> {
    ArrayD::from_elem(IxDyn(&vec![1; dims]), 1.5f32)
}

#[test]
fn inserting_a_tensor_of_more_than_max_dims_is_a_typed_error() {
    let mut s = Store::new();
    let err = s.insert("deep", &ones(MAX_DIMS + 1)).unwrap_err();
    assert!(
        matches!(err, Error::TooManyDims { ref name, dims, max } if name == "deep" && dims == MAX_DIMS + 1 && max == MAX_DIMS),
        "{err:?}"
    );
    assert!(!s.contains("deep"));
    assert!(matches!(
        s.insert_chunked("deep", &ones(100), 4),
        Err(Error::TooManyDims { dims: 100, .. })
    ));
    assert!(matches!(
        tensor_history::Tensor::from_array(&ones(MAX_DIMS + 1), 64),
        Err(Error::TooManyDims { .. })
    ));
}

#[test]
fn a_tensor_of_max_dims_saves_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Store::new();
    s.insert("deep", &ones(MAX_DIMS)).unwrap();
    s.commit("deep").unwrap();
    s.save_as(dir.path()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    assert_eq!(r.get::<f32>("deep").unwrap(), ones(MAX_DIMS));
}

/// A valid safetensors file holding one f32 element under `name` with `dims` axes.
fn safetensors_file(path: &Path, name: &str, dims: usize) {
    let shape = vec!["1"; dims].join(",");
    let header =
        format!(r#"{{"{name}":{{"dtype":"F32","shape":[{shape}],"data_offsets":[0,4]}}}}"#);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&1.5f32.to_le_bytes());
    fs::write(path, bytes).unwrap();
}

#[test]
fn importing_a_safetensors_tensor_of_more_than_max_dims_is_a_typed_error_and_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep.safetensors");
    safetensors_file(&path, "deep", MAX_DIMS + 1);
    let mut s = Store::new();
    let err = s.import_safetensors(&path).unwrap_err();
    assert!(
        matches!(err, Error::TooManyDims { ref name, dims, .. } if name == "deep" && dims == MAX_DIMS + 1),
        "{err:?}"
    );
    assert!(s.names().is_empty());
    // The same file at the limit imports.
    safetensors_file(&path, "deep", MAX_DIMS);
    assert_eq!(
        s.import_safetensors(&path).unwrap(),
        vec!["deep".to_owned()]
    );
}

// ---- a repository written by a build that did not check ------------------------------

fn varint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// An object in the envelope of `docs/FORMAT.md`: magic, kind, version 1, body, trailer.
fn envelope(kind: u8, body: &[u8]) -> (Vec<u8>, String) {
    let mut out = b"\x89TH\r\n\x1a\n".to_vec();
    out.push(kind);
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(body);
    let id = blake3::hash(&out);
    out.extend_from_slice(id.as_bytes());
    (out, id.to_hex().to_string())
}

fn put(root: &Path, prefix: &str, hex: &str, ext: &str, bytes: &[u8]) {
    let dir = root.join(prefix).join(&hex[..2]);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(format!("{hex}.{ext}")), bytes).unwrap();
}

/// A repository whose `main` is at a version `v1` holding `good` (readable) and `deep`, a
/// manifest of `MAX_DIMS + 1` axes, over a readable root `v0` holding `good`; as a build
/// that did not check the dimensions wrote it. Returns v0's content address.
fn repository_with_a_deep_manifest(root: &Path) -> String {
    let mut s = Store::new();
    s.insert("good", &ndarray::arr1(&[1.5f32])).unwrap();
    let v0 = s.commit("v0").unwrap();
    s.save_as(root).unwrap();
    let v0_hash = s.version_hash(v0).unwrap().to_string();
    // `good` again, as a manifest of its own (the save keeps manifests in its pack):
    // dtype f32, shape [1], one element per chunk, the one chunk.
    let mut body = vec![2u8];
    varint(&mut body, 1);
    varint(&mut body, 1);
    varint(&mut body, 1);
    varint(&mut body, 1);
    body.extend_from_slice(blake3::hash(&1.5f32.to_le_bytes()).as_bytes());
    let (manifest, good_manifest) = envelope(b'M', &body);
    put(root, "manifests", &good_manifest, "thman", &manifest);

    // Manifest: dtype f32 (2), shape of 65 ones, one element per chunk, the one chunk
    // (the same bytes as `good`'s, so the index lists it).
    let mut body = vec![2u8];
    varint(&mut body, (MAX_DIMS + 1) as u64);
    body.extend(std::iter::repeat_n(1u8, MAX_DIMS + 1));
    varint(&mut body, 1);
    varint(&mut body, 1);
    body.extend_from_slice(blake3::hash(&1.5f32.to_le_bytes()).as_bytes());
    let (manifest, deep_manifest) = envelope(b'M', &body);
    put(root, "manifests", &deep_manifest, "thman", &manifest);

    // Version: seq 1, parent v0, time, message, no metadata, vars sorted by name.
    let mut body = Vec::new();
    varint(&mut body, 1);
    varint(&mut body, 1);
    body.extend_from_slice(&hex_bytes(&v0_hash));
    varint(&mut body, 1_700_000_000);
    varint(&mut body, 0);
    varint(&mut body, 2);
    body.extend_from_slice(b"v1");
    varint(&mut body, 0);
    varint(&mut body, 2);
    for (name, m) in [("deep", &deep_manifest), ("good", &good_manifest)] {
        varint(&mut body, name.len() as u64);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&hex_bytes(m));
    }
    let (version, v1_hash) = envelope(b'V', &body);
    put(root, "versions", &v1_hash, "thver", &version);
    fs::write(
        root.join("refs/main/00000000000000000001.json"),
        format!("{{\"kind\": \"branch\", \"version\": \"{v1_hash}\"}}\n"),
    )
    .unwrap();
    v0_hash
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_repository_holding_a_manifest_past_the_dimension_limit_opens_and_the_rest_reads() {
    let dir = tempfile::tempdir().unwrap();
    let v0_hash = repository_with_a_deep_manifest(dir.path());

    let mut s = Store::open(dir.path()).unwrap();
    // HEAD (main) is at the unreadable version: the store starts detached at its parent.
    let v0 = s.resolve(&v0_hash[..12]).unwrap();
    assert_eq!(s.head(), Some(v0));
    assert_eq!(s.current_branch(), None);
    assert_eq!(
        s.get::<f32>("good").unwrap(),
        ndarray::arr1(&[1.5f32]).into_dyn()
    );
    assert_eq!(s.versions().len(), 2);
    let v1 = s.resolve("main").unwrap();
    // The version past the limit gives a typed error naming its manifest when used.
    for err in [
        s.snapshot(v1).map(|_| ()).unwrap_err(),
        s.checkout("main").unwrap_err(),
        s.restore(v1).unwrap_err(),
    ] {
        assert!(
            matches!(&err, Error::CorruptObject { path, reason } if path.contains("manifests/") && reason.contains("dimensions")),
            "{err:?}"
        );
    }
    assert_eq!(s.head(), Some(v0), "a failed call changes nothing");

    // The rest of the repository keeps working: commit on a new branch, save, reopen.
    s.branch("fix", v0).unwrap();
    s.checkout("fix").unwrap();
    s.write("good", &ndarray::arr1(&[2.5f32])).unwrap();
    s.commit("fixed").unwrap();
    s.save().unwrap();
    let r = Store::open(dir.path()).unwrap();
    assert_eq!(r.current_branch(), Some("fix"));
    assert_eq!(
        r.get::<f32>("good").unwrap(),
        ndarray::arr1(&[2.5f32]).into_dyn()
    );
}

// ---- ref names -----------------------------------------------------------------------

#[test]
fn a_ref_name_past_the_key_limit_is_refused_at_branch_and_tag() {
    use tensor_history::MAX_REF_NAME_BYTES;
    let mut s = Store::new();
    s.insert("w", &ndarray::arr1(&[1.0f32])).unwrap();
    let v = s.commit("v").unwrap();
    // 'é' is two bytes of UTF-8, each `%XX` in a key: 6 bytes.
    for (name, bytes) in [
        ("é".repeat(43), 258),
        ("a".repeat(MAX_REF_NAME_BYTES + 1), 256),
        (format!("{}/", "b".repeat(253)), 256),
        ("日".repeat(29), 261),
    ] {
        for err in [
            s.branch(&name, v).unwrap_err(),
            s.tag(&name, v).unwrap_err(),
        ] {
            assert!(
                matches!(&err, Error::RefNameTooLong { name: n, bytes: b, max } if *n == name && *b == bytes && *max == MAX_REF_NAME_BYTES),
                "{err:?}"
            );
        }
        assert!(s.resolve(&name).is_err());
    }
    // At the limit, every kind of name is accepted, saves and reopens.
    let dir = tempfile::tempdir().unwrap();
    let fits = [
        "é".repeat(42),
        "a".repeat(MAX_REF_NAME_BYTES),
        "日".repeat(28),
    ];
    for name in &fits {
        s.branch(name, v).unwrap();
    }
    s.save_as(dir.path()).unwrap();
    let r = Store::open(dir.path()).unwrap();
    for name in &fits {
        assert_eq!(r.resolve(name).unwrap(), v, "{name}");
    }
}

/// A repository on an object store (here in memory: no name limit) that an older build
/// wrote with a ref whose name does not fit a local directory.
fn memory_repository_with_a_long_ref() -> (std::sync::Arc<tensor_history::MemoryBackend>, String) {
    use tensor_history::Backend;
    let mem = std::sync::Arc::new(tensor_history::MemoryBackend::new());
    let mut s = Store::new();
    s.insert("w", &ndarray::arr1(&[1.0f32])).unwrap();
    let v = s.commit("v").unwrap();
    s.save_to(mem.clone()).unwrap();
    let long = "é".repeat(60);
    let enc: String = long.bytes().map(|b| format!("%{b:02X}")).collect();
    let hash = s.version_hash(v).unwrap();
    mem.put(
        &format!("refs/{enc}/00000000000000000000.json"),
        format!("{{\"kind\": \"branch\", \"version\": \"{hash}\"}}\n").as_bytes(),
    )
    .unwrap();
    (mem, long)
}

#[test]
fn a_ref_too_long_for_the_target_never_blocks_the_other_refs_head_or_markers() {
    let (mem, long) = memory_repository_with_a_long_ref();
    let mut s = Store::open_backend(mem.clone(), tensor_history::Config::default()).unwrap();
    let v0 = s.resolve(&long).unwrap();
    // The repository that holds the name takes its moves.
    s.write("w", &ndarray::arr1(&[2.0f32])).unwrap();
    let v1 = s.commit("v1").unwrap();
    s.write("w", &ndarray::arr1(&[3.0f32])).unwrap();
    let v2 = s.commit("v2").unwrap();
    s.tag("t", v2).unwrap();
    s.checkout(&long).unwrap();
    s.restore(v2).unwrap();
    s.checkout("main").unwrap();
    s.save().unwrap();
    assert_eq!(
        Store::open_backend(mem.clone(), tensor_history::Config::default())
            .unwrap()
            .resolve(&long)
            .unwrap(),
        v2
    );

    // A local directory cannot hold it: every other ref, HEAD and the prune marker of
    // a version pruned since are saved, and the save says which name did not fit.
    let dir = tempfile::tempdir().unwrap();
    s.branch("side", v0).unwrap();
    s.prune(&tensor_history::Retention {
        unreachable: true,
        ..Default::default()
    })
    .unwrap();
    let err = s.save_as(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::RefNameTooLong { name, .. } if *name == long),
        "{err:?}"
    );
    assert!(s
        .location()
        .unwrap()
        .contains(&*dir.path().to_string_lossy()));
    let r = Store::open(dir.path()).unwrap();
    assert_eq!(r.resolve("main").unwrap(), v2);
    assert_eq!(r.resolve("t").unwrap(), v2);
    assert_eq!(r.resolve("side").unwrap(), v0);
    assert_eq!(r.current_branch(), Some("main"));
    assert!(r.resolve(&long).is_err());
    assert_eq!(r.parent(v2).unwrap(), Some(v1));

    // Later saves keep working for every other ref, and keep saying so.
    s.checkout("side").unwrap();
    s.write("w", &ndarray::arr1(&[9.0f32])).unwrap();
    let v3 = s.commit("side work").unwrap();
    assert!(matches!(s.save(), Err(Error::RefNameTooLong { .. })));
    let r = Store::open(dir.path()).unwrap();
    assert_eq!(r.resolve("side").unwrap(), v3);
    assert_eq!(r.current_branch(), Some("side"));
    // A version saved, then dropped by prune, gets its prune marker.
    s.branch("tmp", v3).unwrap();
    s.checkout("tmp").unwrap();
    s.write("w", &ndarray::arr1(&[10.0f32])).unwrap();
    s.commit("tmp work").unwrap();
    assert!(matches!(s.save(), Err(Error::RefNameTooLong { .. })));
    s.checkout("side").unwrap();
    s.delete_branch("tmp").unwrap();
    let pruned = s
        .prune(&tensor_history::Retention {
            unreachable: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(pruned.dropped.len(), 1, "{pruned:?}");
    assert!(matches!(s.save(), Err(Error::RefNameTooLong { .. })));
    assert!(dir
        .path()
        .join("pruned")
        .read_dir()
        .unwrap()
        .next()
        .is_some());
    // Deleting the ref clears it.
    s.delete_branch(&long).unwrap();
    s.save().unwrap();
}
