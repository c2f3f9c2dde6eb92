//! safetensors export and import: bit-identical round trips for every dtype, byte
//! equality with the reference writer, atomic export, all-or-nothing import, and typed
//! errors for files the store cannot hold.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use crate::common::{ramp, small_store, BOUNDARY_SHAPES, CHUNK_BYTES};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;
use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;
use tensor_history::{Config, DType, Element, Error, Store, Tensor, VersionId};

/// A tensor for the reference writer: dtype, shape and bytes.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Deterministic pseudo-random bytes (every bit pattern, NaN payloads included).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Insert a tensor of `T` with random bits.
fn insert_noise<T: Element>(store: &mut Store, name: &str, shape: &[usize], seed: u64) {
    let n: usize = shape.iter().product();
    let bytes = noise(n * std::mem::size_of::<T>(), seed);
    let mut values = vec![<T as bytemuck::Zeroable>::zeroed(); n];
    bytemuck::cast_slice_mut::<T, u8>(&mut values).copy_from_slice(&bytes);
    let a = ArrayD::from_shape_vec(IxDyn(shape), values).unwrap();
    store.insert(name, &a).unwrap();
}

fn insert_noise_of(store: &mut Store, dtype: DType, name: &str, shape: &[usize], seed: u64) {
    match dtype {
        DType::F16 => insert_noise::<f16>(store, name, shape, seed),
        DType::BF16 => insert_noise::<bf16>(store, name, shape, seed),
        DType::F32 => insert_noise::<f32>(store, name, shape, seed),
        DType::F64 => insert_noise::<f64>(store, name, shape, seed),
        DType::I8 => insert_noise::<i8>(store, name, shape, seed),
        DType::I16 => insert_noise::<i16>(store, name, shape, seed),
        DType::I32 => insert_noise::<i32>(store, name, shape, seed),
        DType::I64 => insert_noise::<i64>(store, name, shape, seed),
        DType::U8 => insert_noise::<u8>(store, name, shape, seed),
        DType::U16 => insert_noise::<u16>(store, name, shape, seed),
        DType::U32 => insert_noise::<u32>(store, name, shape, seed),
        DType::U64 => insert_noise::<u64>(store, name, shape, seed),
        other => panic!("no test data for {other}"),
    }
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        other => panic!("no safetensors dtype for {other}"),
    }
}

/// A tensor's bytes, concatenated over its chunks.
fn bytes_of(t: &Tensor) -> Vec<u8> {
    t.chunks()
        .flat_map(|c| c.bytes().unwrap().iter().copied())
        .collect()
}

/// The same tensors as [`Raw`] values, for the reference writer.
fn raws(store: &Store, names: &[String]) -> Vec<(String, Raw)> {
    names
        .iter()
        .map(|n| {
            let t = store.tensor(n).unwrap();
            (
                n.clone(),
                Raw {
                    dtype: st_dtype(t.dtype()),
                    shape: t.shape().to_vec(),
                    data: bytes_of(t),
                },
            )
        })
        .collect()
}

/// What the reference implementation writes for the store's working state.
fn reference_file(store: &Store, path: &Path) -> Vec<u8> {
    let raws = raws(store, &store.names());
    safetensors::serialize_to_file(raws.iter().map(|(n, r)| (n.as_str(), r)), None, path).unwrap();
    std::fs::read(path).unwrap()
}

/// A store holding one tensor of every dtype (multi-chunk at [`CHUNK_BYTES`]) and every
/// boundary shape in `f32`.
fn every_dtype_and_shape() -> Store {
    let mut store = small_store();
    for (i, d) in DType::ALL.iter().enumerate() {
        insert_noise_of(&mut store, *d, &format!("{d}"), &[7, 5], i as u64 + 1);
    }
    for (i, shape) in BOUNDARY_SHAPES.iter().enumerate() {
        insert_noise_of(
            &mut store,
            DType::F32,
            &format!("shape{i}"),
            shape,
            100 + i as u64,
        );
    }
    store
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

#[test]
fn round_trip_is_bit_identical_for_every_dtype_and_boundary_shape() {
    let mut store = every_dtype_and_shape();
    let v = store.commit("all").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    store.export_safetensors(v, &path).unwrap();

    // Imported into a store of the same chunk size: the same tensors, the same layout.
    let mut back = small_store();
    let names = back.import_safetensors(&path).unwrap();
    assert_eq!(names, store.names());
    for n in &names {
        let (a, b) = (store.tensor(n).unwrap(), back.tensor(n).unwrap());
        assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{n}");
        assert_eq!(bytes_of(a), bytes_of(b), "{n}");
        assert_eq!(a.content_hash(), b.content_hash(), "{n}: same chunk layout");
    }
    back.verify().unwrap();

    // Imported into a store of another chunk size: the same bytes, cut the store's way.
    let mut other = Store::with_config(Config {
        chunk_bytes: 24,
        ..Config::default()
    })
    .unwrap();
    other.import_safetensors(&path).unwrap();
    for n in &names {
        let t = other.tensor(n).unwrap();
        assert_eq!(bytes_of(t), bytes_of(store.tensor(n).unwrap()), "{n}");
        assert!(t.chunks().all(|c| c.len_bytes() <= 24), "{n}");
    }
}

#[test]
fn export_is_byte_identical_to_the_reference_writer() {
    let mut store = every_dtype_and_shape();
    // Names that sort differently as bytes and as dtype groups.
    insert_noise_of(&mut store, DType::U8, "a.first", &[3], 7);
    insert_noise_of(&mut store, DType::F64, "Z.upper", &[2, 2], 8);
    insert_noise_of(&mut store, DType::BF16, "é.unicode \"quoted\"", &[2], 9);
    let v = store.commit("all").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.safetensors");
    store.export_safetensors(v, &ours).unwrap();
    let theirs = reference_file(&store, &dir.path().join("theirs.safetensors"));
    assert_eq!(std::fs::read(&ours).unwrap(), theirs);
}

#[test]
fn export_is_read_back_by_the_reference_parser() {
    let mut store = every_dtype_and_shape();
    let v = store.commit("all").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    store.export_safetensors(v, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.len(), store.names().len());
    for n in store.names() {
        let t = store.tensor(&n).unwrap();
        let view = file.tensor(&n).unwrap();
        assert_eq!(view.dtype(), st_dtype(t.dtype()), "{n}");
        assert_eq!(view.shape(), t.shape(), "{n}");
        assert_eq!(view.data(), &bytes_of(t)[..], "{n}");
    }
}

#[test]
fn import_then_export_gives_back_the_reference_file() {
    let mut src = every_dtype_and_shape();
    let dir = tempfile::tempdir().unwrap();
    let original = reference_file(&src, &dir.path().join("orig.safetensors"));
    let mut store = Store::new();
    store
        .import_safetensors(dir.path().join("orig.safetensors"))
        .unwrap();
    let v = store.commit("imported").unwrap();
    store
        .export_safetensors(v, dir.path().join("again.safetensors"))
        .unwrap();
    assert_eq!(
        std::fs::read(dir.path().join("again.safetensors")).unwrap(),
        original
    );
    // The source store is untouched by all this.
    src.verify().unwrap();
    src.commit("still fine").unwrap();
}

#[test]
fn import_chunks_like_insert() {
    let mut src = Store::new();
    let a = ramp(&[300, 1000], 1.0);
    src.insert("big", &a).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    src.working_snapshot().write_safetensors(&path).unwrap();
    let mut store = Store::new();
    store.import_safetensors(&path).unwrap();
    let t = store.tensor("big").unwrap();
    assert!(t.num_chunks() > 1);
    assert_eq!(t.content_hash(), src.tensor("big").unwrap().content_hash());
    assert_eq!(store.get::<f32>("big").unwrap(), a);
}

#[test]
fn import_adds_to_the_working_state_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = small_store();
    src.insert("w", &ramp(&[4, 4], 2.0)).unwrap();
    src.working_snapshot()
        .write_safetensors(dir.path().join("w.safetensors"))
        .unwrap();
    let mut store = small_store();
    store.insert("bias", &ramp(&[4], 0.0)).unwrap();
    let v0 = store.commit("bias only").unwrap();
    assert_eq!(
        store
            .import_safetensors(dir.path().join("w.safetensors"))
            .unwrap(),
        vec!["w".to_string()]
    );
    assert!(store.is_dirty());
    assert_eq!(store.names(), vec!["bias".to_string(), "w".to_string()]);
    let v1 = store.commit("imported").unwrap();
    assert!(!store.snapshot(v0).unwrap().contains("w"));
    assert_eq!(
        store.snapshot(v1).unwrap().get::<f32>("w").unwrap(),
        ramp(&[4, 4], 2.0)
    );
}

#[test]
fn snapshot_export_outlives_the_store_and_exports_old_versions() {
    let mut store = small_store();
    store.insert("w", &ramp(&[10], 0.0)).unwrap();
    let v0 = store.commit("v0").unwrap();
    store.update_map::<f32>("w", |x| x + 1.0).unwrap();
    let v1 = store.commit("v1").unwrap();
    let old = store.snapshot(v0).unwrap();
    drop(store);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.safetensors");
    old.write_safetensors(&path).unwrap();
    let mut back = Store::new();
    back.import_safetensors(&path).unwrap();
    assert_eq!(back.get::<f32>("w").unwrap(), ramp(&[10], 0.0));
    assert_ne!(v0, v1);
}

#[test]
fn empty_snapshot_exports_a_valid_empty_file() {
    let mut store = Store::new();
    let v = store.commit("nothing").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.safetensors");
    store.export_safetensors(v, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(SafeTensors::deserialize(&bytes).unwrap().is_empty());
    assert_eq!(
        Store::new().import_safetensors(&path).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn export_replaces_an_existing_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    std::fs::write(&path, vec![0xAB; 100_000]).unwrap();
    let mut store = small_store();
    store.insert("w", &ramp(&[3], 0.0)).unwrap();
    let v = store.commit("small").unwrap();
    store.export_safetensors(v, &path).unwrap();
    let mut back = Store::new();
    back.import_safetensors(&path).unwrap();
    assert_eq!(back.get::<f32>("w").unwrap(), ramp(&[3], 0.0));
    assert_eq!(files_in(dir.path()), vec![path], "no temporary file left");
}

#[test]
fn failed_export_leaves_no_file_and_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = small_store();
    store.insert("w", &ramp(&[40], 0.0)).unwrap();
    let v = store.commit("w").unwrap();

    // The target is a non-empty directory: the data is written, the rename fails.
    let target = dir.path().join("taken");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"keep").unwrap();
    let err = store.export_safetensors(v, &target).unwrap_err();
    assert!(
        matches!(&err, Error::Io { path, .. } if path.contains("taken")),
        "{err:?}"
    );
    assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"keep");

    // The directory does not exist.
    let missing = dir.path().join("no/such/dir/m.safetensors");
    let err = store.export_safetensors(v, &missing).unwrap_err();
    assert!(
        matches!(&err, Error::Io { kind, .. } if *kind == std::io::ErrorKind::NotFound),
        "{err:?}"
    );

    // An unknown version.
    let path = dir.path().join("m.safetensors");
    let err = store.export_safetensors(VersionId(99), &path).unwrap_err();
    assert!(matches!(err, Error::UnknownVersion { .. }), "{err:?}");

    // A name the format reserves.
    let mut bad = small_store();
    bad.insert("__metadata__", &ramp(&[2], 0.0)).unwrap();
    let bv = bad.commit("reserved").unwrap();
    let err = bad.export_safetensors(bv, &path).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");

    assert_eq!(
        files_in(dir.path()),
        vec![target],
        "nothing else was created"
    );
}

/// A safetensors file by hand: a JSON header and the data after it.
fn handmade(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn import_of_a_dtype_the_store_lacks_names_the_tensor_and_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in ["BOOL", "F8_E4M3", "F8_E5M2", "C64"] {
        let n = if dtype == "C64" { 8 } else { 1 };
        let header = format!(
            r#"{{"a_ok":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}},"mask":{{"dtype":"{dtype}","shape":[4],"data_offsets":[8,{}]}}}}"#,
            8 + 4 * n
        );
        let path = dir.path().join(format!("{dtype}.safetensors"));
        std::fs::write(&path, handmade(&header, &vec![0u8; 8 + 4 * n])).unwrap();
        let mut store = small_store();
        store.insert("x", &ramp(&[2], 0.0)).unwrap();
        let err = store.import_safetensors(&path).unwrap_err();
        assert!(
            matches!(&err, Error::UnsupportedSafeTensorsDType { name, dtype: d, path: p }
                if name == "mask" && d == dtype && p.contains(dtype)),
            "{err:?}"
        );
        assert_eq!(store.names(), vec!["x".to_string()], "nothing imported");
    }
}

#[test]
fn import_of_a_taken_name_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = small_store();
    src.insert("a", &ramp(&[3], 0.0)).unwrap();
    src.insert("b", &ramp(&[3], 1.0)).unwrap();
    src.insert("c", &ramp(&[3], 2.0)).unwrap();
    let path = dir.path().join("abc.safetensors");
    src.working_snapshot().write_safetensors(&path).unwrap();
    let mut store = small_store();
    store.insert("b", &ramp(&[5], 9.0)).unwrap();
    let err = store.import_safetensors(&path).unwrap_err();
    assert!(
        matches!(&err, Error::VariableExists { name } if name == "b"),
        "{err:?}"
    );
    assert_eq!(store.names(), vec!["b".to_string()]);
    assert_eq!(store.get::<f32>("b").unwrap(), ramp(&[5], 9.0));
}

#[test]
fn import_ignores_free_form_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let header = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"I16","shape":[2,1],"data_offsets":[0,4]}}"#;
    let path = dir.path().join("meta.safetensors");
    std::fs::write(&path, handmade(header, &[1, 0, 2, 0])).unwrap();
    let mut store = Store::new();
    assert_eq!(
        store.import_safetensors(&path).unwrap(),
        vec!["w".to_string()]
    );
    assert_eq!(
        store.get::<i16>("w").unwrap(),
        ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![1i16, 2]).unwrap()
    );
}

#[test]
fn import_of_a_broken_file_is_a_typed_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = {
        let mut s = small_store();
        s.insert("w", &ramp(&[8], 0.0)).unwrap();
        s.insert("v", &ramp(&[3, 3], 1.0)).unwrap();
        let p = dir.path().join("good.safetensors");
        s.working_snapshot().write_safetensors(&p).unwrap();
        std::fs::read(&p).unwrap()
    };
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short", vec![1, 2, 3]),
        ("huge-length", u64::MAX.to_le_bytes().to_vec()),
        (
            "length-past-end",
            handmade("{}", &[]).into_iter().take(9).collect(),
        ),
        ("not-json", handmade("{{{{{{{{", &[])),
        (
            "not-utf8",
            [8u64.to_le_bytes().to_vec(), vec![0xFF; 8]].concat(),
        ),
        (
            "gap",
            handmade(
                r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "overlap",
            handmade(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                &[0; 12],
            ),
        ),
        (
            "shape-overflow",
            handmade(
                r#"{"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ),
        (
            "unknown-dtype",
            handmade(
                r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#,
                &[0],
            ),
        ),
        ("trailing", [good.clone(), vec![0]].concat()),
    ];
    for cut in [good.len() - 1, good.len() / 2, 12] {
        cases.push(("truncated", good[..cut].to_vec()));
    }
    for (what, bytes) in cases {
        let path = dir.path().join(format!("{what}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let mut store = small_store();
        let err = store.import_safetensors(&path).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSafeTensors { path: p, .. } if p.contains(what)),
            "{what}: {err:?}"
        );
        assert!(store.names().is_empty(), "{what}: nothing imported");
    }
    let err = small_store()
        .import_safetensors(dir.path().join("absent.safetensors"))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Io { kind, path, .. }
            if *kind == std::io::ErrorKind::NotFound && path.contains("absent")),
        "{err:?}"
    );
}

#[test]
fn every_flipped_byte_of_the_header_is_an_error_or_imports_what_the_parser_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = small_store();
    s.insert("w", &ramp(&[6], 0.0)).unwrap();
    insert_noise_of(&mut s, DType::I64, "n", &[2], 3);
    let p = dir.path().join("good.safetensors");
    s.working_snapshot().write_safetensors(&p).unwrap();
    let good = std::fs::read(&p).unwrap();
    let header_end = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    for i in 0..header_end {
        for flip in [0x01u8, 0x20, 0x80] {
            let mut bytes = good.clone();
            bytes[i] ^= flip;
            let path = dir.path().join("flipped.safetensors");
            std::fs::write(&path, &bytes).unwrap();
            let mut store = small_store();
            match store.import_safetensors(&path) {
                // The parser accepted it: what was imported is what it reads.
                Ok(names) => {
                    let file = SafeTensors::deserialize(&bytes).unwrap();
                    for n in names {
                        let view = file.tensor(&n).unwrap();
                        let t = store.tensor(&n).unwrap();
                        assert_eq!(view.data(), &bytes_of(t)[..], "byte {i} ^ {flip:#x}");
                        assert_eq!(view.shape(), t.shape(), "byte {i} ^ {flip:#x}");
                    }
                }
                Err(e) => {
                    assert!(
                        matches!(
                            e,
                            Error::InvalidSafeTensors { .. }
                                | Error::UnsupportedSafeTensorsDType { .. }
                        ),
                        "byte {i} ^ {flip:#x}: {e:?}"
                    );
                    assert!(store.names().is_empty());
                }
            }
        }
    }
}

fn any_dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random tensors of random dtypes, shapes and chunk sizes: the export equals the
    /// reference writer's file and imports back bit-identical.
    #[test]
    fn random_stores_round_trip_and_match_the_reference(
        tensors in proptest::collection::btree_map(
            "[a-z]{1,6}",
            (any_dtype(), proptest::collection::vec(0usize..6, 0..4), any::<u64>()),
            0..6,
        ),
        chunk_bytes in prop_oneof![Just(8usize), Just(24), Just(CHUNK_BYTES), Just(1000)],
    ) {
        let config = Config { chunk_bytes, ..Config::default() };
        let mut store = Store::with_config(config.clone()).unwrap();
        for (name, (dtype, shape, seed)) in &tensors {
            insert_noise_of(&mut store, *dtype, name, shape, *seed);
        }
        let v = store.commit("random").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("ours.safetensors");
        store.export_safetensors(v, &ours).unwrap();
        let theirs = reference_file(&store, &dir.path().join("theirs.safetensors"));
        prop_assert_eq!(std::fs::read(&ours).unwrap(), theirs);
        let mut back = Store::with_config(config).unwrap();
        let names = back.import_safetensors(&ours).unwrap();
        prop_assert_eq!(&names, &store.names());
        for n in &names {
            let (a, b) = (store.tensor(n).unwrap(), back.tensor(n).unwrap());
            prop_assert_eq!(a.content_hash(), b.content_hash());
        }
    }
}
