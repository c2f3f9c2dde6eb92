//! A repository written by a build of format version 1 (raw chunks in packs), kept as a
//! fixture in `tests/fixtures/format1/`: every later build opens it and reads every
//! version bit for bit, and can save to it.
//!
//! The fixture holds the history [`build`] makes (64-byte chunks): f32 with NaN,
//! infinities, a denormal and negative zero, bf16, f64, i32 and u16 tensors, a 0-length
//! tensor, ragged last chunks, a dense update of every element, a branch `side` and a
//! tag `best`. The test builds the same history itself and compares every version's
//! tensors byte for byte, by commit message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::bf16;
use ndarray::{Array, ArrayD, IxDyn};
use tensor_history::{Config, Element, Ref, Store, VersionId};

fn arr<T: Element>(shape: &[usize], f: impl Fn(usize) -> T) -> ArrayD<T> {
    let n: usize = shape.iter().product();
    Array::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).unwrap()
}

/// f32 values of step `s`: special values first, then a ramp that every step changes
/// in every element (a dense update).
fn w_values(s: u32) -> ArrayD<f32> {
    let special = [
        f32::NAN,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1),
    ];
    arr(&[5, 7], |i| {
        if i < special.len() {
            special[i]
        } else {
            (i as f32 * 0.37 - 3.0) * (1.0 + 1e-4 * s as f32)
        }
    })
}

/// Replace variable `name` by `a`.
fn set<T: Element>(s: &mut Store, name: &str, a: &ArrayD<T>) {
    s.remove(name).unwrap();
    s.insert(name, a).unwrap();
}

/// The history of the fixture.
fn build() -> Store {
    let mut s = Store::with_config(Config {
        chunk_bytes: 64,
        ..Config::default()
    })
    .unwrap();
    s.insert("w", &w_values(0)).unwrap();
    s.insert("h", &arr(&[20], |i| bf16::from_f32(i as f32 / 3.0 - 2.0)))
        .unwrap();
    s.insert("d", &arr(&[9], |i| (i as f64).sqrt() * -1.5e300))
        .unwrap();
    s.insert("n", &arr(&[3, 0], |i| i as i32)).unwrap();
    s.insert("u", &arr(&[33], |i| (i * 2001) as u16)).unwrap();
    let v0 = s.commit("init").unwrap();
    set(&mut s, "w", &w_values(1));
    set(
        &mut s,
        "d",
        &arr(&[9], |i| (i as f64).sqrt() * -1.5e300 + 1.0),
    );
    let v1 = s.commit("step 1").unwrap();
    set(&mut s, "w", &w_values(2));
    set(
        &mut s,
        "h",
        &arr(&[20], |i| bf16::from_f32(i as f32 / 3.0 - 1.0)),
    );
    s.commit("step 2").unwrap();
    s.branch("side", v1).unwrap();
    s.checkout("side").unwrap();
    set(&mut s, "u", &arr(&[33], |i| (i * 7) as u16));
    set(&mut s, "n", &arr(&[0], |i| i as i32));
    s.commit("side step").unwrap();
    s.tag("best", v1).unwrap();
    s.tag("first", v0).unwrap();
    s.checkout("main").unwrap();
    s
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format1")
}

/// A copy of the fixture in a temporary directory (tests never write into the source
/// tree).
fn fixture_copy() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dst = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dst);
            } else {
                std::fs::copy(e.path(), dst).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&fixture_dir(), dir.path());
    dir
}

/// Every tensor of version `id` of `store`: name -> (dtype, shape, raw bytes).
fn contents(store: &Store, id: VersionId) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let snap = store.snapshot(id).unwrap();
    snap.tensors()
        .map(|(name, t)| {
            let bytes: Vec<u8> = t
                .chunks()
                .flat_map(|c| c.bytes().unwrap().to_vec())
                .collect();
            (
                name.to_owned(),
                (format!("{:?}", t.dtype()), t.shape().to_vec(), bytes),
            )
        })
        .collect()
}

/// Version id by commit message.
fn by_message(store: &Store) -> BTreeMap<String, VersionId> {
    store
        .versions()
        .into_iter()
        .map(|v| (store.message(v).unwrap().to_owned(), v))
        .collect()
}

/// Every version of `got` holds, bit for bit, what the version of the same message in
/// `want` holds, and the refs name the same messages.
fn assert_same_history(got: &Store, want: &Store) {
    let g = by_message(got);
    let w = by_message(want);
    assert_eq!(
        g.keys().collect::<Vec<_>>(),
        w.keys().collect::<Vec<_>>(),
        "messages"
    );
    for (msg, &gid) in &g {
        assert_eq!(contents(got, gid), contents(want, w[msg]), "version {msg}");
    }
    let refs = |s: &Store| -> Vec<(String, String, String)> {
        s.refs()
            .into_iter()
            .map(|(name, r)| {
                let kind = format!("{:?}", r.kind());
                (name, kind, s.message(r.target()).unwrap().to_owned())
            })
            .collect()
    };
    assert_eq!(refs(got), refs(want));
}

/// The content addresses of the fixture's versions, by message: reading a version
/// written by format 1 gives the address it was written with.
const ADDRESSES: &[(&str, &str)] = &[
    (
        "init",
        "08f23a2be6b4b0d11c4bca09274523bad8d69df66bdc25bd9f8fd768073be1d1",
    ),
    (
        "side step",
        "1b7a58d34ade8056a1a40954363b7ef1259afc3e919ec4250fc0a7f585ed3bed",
    ),
    (
        "step 1",
        "9dea8e0124c5e0a9b0bfeead2da8c992bcbbda99b1bf96bbb0de344dca2a2869",
    ),
    (
        "step 2",
        "8e8222eacaf878a0ce3da7b610d06539e488de6413ac6b2a09a743abe4675db7",
    ),
];

#[test]
fn a_format_1_repository_opens_and_reads_every_version_bit_for_bit() {
    let dir = fixture_copy();
    let store = Store::open(dir.path()).unwrap();
    store.verify().unwrap();
    assert_eq!(store.current_branch(), Some("main"));
    assert_same_history(&store, &build());
    let msgs = by_message(&store);
    let found: Vec<(String, String)> = msgs
        .iter()
        .map(|(m, &id)| (m.clone(), store.version_hash(id).unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = ADDRESSES
        .iter()
        .map(|(m, h)| ((*m).to_owned(), (*h).to_owned()))
        .collect();
    assert_eq!(found, want);
    // The side branch's tip and the tags resolve by name.
    let side = store.resolve("side").unwrap();
    assert_eq!(store.message(side).unwrap(), "side step");
    assert!(matches!(
        store.refs().iter().find(|(n, _)| n == "best").map(|r| r.1),
        Some(Ref::Tag(_))
    ));
}

#[test]
fn a_format_1_repository_takes_a_save_and_still_reads_every_version() {
    let dir = fixture_copy();
    let mut store = Store::open(dir.path()).unwrap();
    let mut want = build();
    for s in [&mut store, &mut want] {
        set(s, "w", &w_values(3));
        s.commit("step 3").unwrap();
    }
    store.save().unwrap();
    let again = Store::open(dir.path()).unwrap();
    again.verify().unwrap();
    assert_same_history(&again, &want);
}
