//! Chunks that live in a repository and cannot be read any more (their pack was damaged
//! or deleted after the store opened it): every public call that reads them returns a
//! typed error naming the pack, and changes nothing; calls that need no chunk data
//! (diffs by hash, content hashes, metadata) still give the right answer when only the
//! chunks were damaged, or a typed error naming the pack when the pack is gone with the
//! manifests it also held (format 4). Never a panic.

use crate::common;

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use ndarray::{Array2, ArrayD, IxDyn};
use tensor_history::{Error, MergeStrategy, Store, Tensor, VersionId};

/// A saved repository in `dir`: `w` (f32, several chunks) and `b` (i16), versions v0
/// (main), v1 (main, `w` changed) and v2 (branch `side` from v0, `b` changed).
fn build(dir: &Path) -> [VersionId; 3] {
    let (mut store, v0, v1) = common::init_and_double();
    store.branch("side", v0).unwrap();
    store.checkout("side").unwrap();
    store.update_map::<i16>("b", |x| x + 7).unwrap();
    let v2 = store.commit("side").unwrap();
    store.checkout("main").unwrap();
    store.save_as(dir).unwrap();
    [v0, v1, v2]
}

fn packs(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(dir.join("packs")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    assert!(!out.is_empty());
    out
}

#[derive(Clone, Copy, Debug)]
enum Damage {
    /// Chunk bytes overwritten (the footer stays valid): hash mismatch.
    Zeroed,
    /// The pack file removed.
    Deleted,
}

fn damage(dir: &Path, how: Damage) {
    for p in packs(dir) {
        match how {
            Damage::Zeroed => {
                let mut bytes = std::fs::read(&p).unwrap();
                // Every chunk: from the header to the manifests the save wrote after
                // them (each at a 64-byte boundary, starting with the object magic and
                // kind `M`), or to the footer (its offset is in the tail).
                let at = bytes.len() - 48;
                let footer = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
                let end = (64..footer)
                    .step_by(64)
                    .find(|&o| bytes[o..].starts_with(b"\x89TH\r\n\x1a\nM"))
                    .unwrap_or(footer);
                for b in &mut bytes[64..end] {
                    *b ^= 0x5a;
                }
                std::fs::write(&p, bytes).unwrap();
            }
            Damage::Deleted => std::fs::remove_file(&p).unwrap(),
        }
    }
}

fn names_a_pack(e: &Error) -> bool {
    match e {
        Error::CorruptObject { path, .. } | Error::Io { path, .. } => path.contains("packs/"),
        _ => false,
    }
}

/// What a call returned, in a comparable form.
type Outcome = Result<String, Error>;

type Call = fn(&mut Store, [VersionId; 3]) -> Outcome;

fn ok<T: std::fmt::Debug>(r: Result<T, Error>) -> Outcome {
    r.map(|v| format!("{v:?}"))
}

/// Calls that read chunk data: each must fail with an error naming a pack.
const READING: &[(&str, Call)] = &[
    ("Store::get", |s, _| ok(s.get::<f32>("w"))),
    ("Store::tensor", |s, _| ok(s.tensor("w").map(|_| ()))),
    ("Snapshot::get", |s, v| {
        ok(s.snapshot(v[0])?.get::<i16>("b"))
    }),
    ("Snapshot::tensor", |s, v| {
        ok(s.snapshot(v[1])?.tensor("w").map(|_| ()))
    }),
    ("Snapshot::tensors, Tensor::to_array", |s, v| {
        let snap = s.snapshot(v[1])?;
        let arrays: Result<Vec<ArrayD<f32>>, Error> = snap
            .tensors()
            .filter(|(n, _)| *n == "w")
            .map(|(_, t)| t.to_array::<f32>())
            .collect();
        ok(arrays)
    }),
    ("Snapshot::tensors, Tensor::chunk_slices", |s, v| {
        let snap = s.snapshot(v[1])?;
        let (_, t) = snap.tensors().find(|(n, _)| *n == "w").unwrap();
        ok(t.chunk_slices::<f32>()
            .map(|c| c.map(<[f32]>::to_vec).collect::<Vec<_>>()))
    }),
    ("Snapshot::tensors, Tensor::row_blocks", |s, v| {
        let snap = s.snapshot(v[1])?;
        let (_, t) = snap.tensors().find(|(n, _)| *n == "w").unwrap();
        ok(t.row_blocks::<f32>()
            .map(|c| c.map(|(r, _)| r).collect::<Vec<_>>()))
    }),
    ("Snapshot::tensors, Tensor::copy_into", |s, v| {
        let snap = s.snapshot(v[1])?;
        let (_, t) = snap.tensors().find(|(n, _)| *n == "w").unwrap();
        let mut out = Array2::<f32>::zeros((6, 8));
        ok(t.copy_into(&mut out).map(|_| out))
    }),
    ("Snapshot::tensors, Tensor::load", |s, v| {
        let snap = s.snapshot(v[1])?;
        let r: Result<Vec<()>, Error> = snap.tensors().map(|(_, t)| t.load()).collect();
        ok(r)
    }),
    ("Snapshot::tensors, Chunk::bytes", |s, v| {
        let snap = s.snapshot(v[1])?;
        let (_, t) = snap.tensors().find(|(n, _)| *n == "w").unwrap();
        let r: Result<Vec<Vec<u8>>, Error> =
            t.chunks().map(|c| c.bytes().map(<[u8]>::to_vec)).collect();
        ok(r)
    }),
    ("Store::update_range", |s, _| {
        ok(s.update_range::<f32>("w", 0..3, |_, xs| xs.fill(1.0)))
    }),
    ("Store::update_map", |s, _| {
        ok(s.update_map::<f32>("w", |x| x + 1.0))
    }),
    ("Store::update", |s, _| {
        ok(s.update::<i16>("b", |_, xs| xs.fill(3)))
    }),
    ("Store::write", |s, _| {
        ok(s.write("w", &Array2::<f32>::ones((6, 8))))
    }),
    ("Store::zip_update", |s, _| {
        ok(s.zip_update("w", &Array2::<f32>::ones((6, 8)), |a, b| a + b))
    }),
    (
        "Store::merge",
        |s, v| ok(s.merge(v[2], MergeStrategy::Mean)),
    ),
    ("Store::average", |s, v| ok(s.average(&[v[0], v[1]], None))),
    ("Store::verify", |s, _| ok(s.verify())),
    ("Store::export_safetensors", |s, v| {
        let dir = tempfile::tempdir().unwrap();
        ok(s.export_safetensors(v[1], dir.path().join("out.safetensors")))
    }),
    ("Snapshot::write_safetensors (working)", |s, _| {
        let dir = tempfile::tempdir().unwrap();
        ok(s.working_snapshot()
            .write_safetensors(dir.path().join("out.safetensors")))
    }),
    ("Tensor::content_eq across layouts", |s, v| {
        let snap = s.snapshot(v[1])?;
        let t = snap.tensors().find(|(n, _)| *n == "w").unwrap().1.clone();
        let other = Tensor::from_array(
            &Array2::from_shape_fn((6, 8), |(i, j)| (i * 8 + j) as f32 * 2.0),
            32,
        )?;
        // Equal contents, different chunking: the bytes must be read.
        ok(t.content_eq(&other))
    }),
];

/// Calls that need no chunk data: each must give what it gives on an undamaged
/// repository.
const METADATA: &[(&str, Call)] = &[
    ("Store::diff", |s, v| ok(s.diff(v[0], v[1]))),
    ("Store::diff_working", |s, _| {
        Ok(format!("{:?}", s.diff_working()))
    }),
    ("Store::is_dirty", |s, _| Ok(format!("{:?}", s.is_dirty()))),
    ("Store::layout", |s, _| ok(s.layout("w"))),
    ("Snapshot::layout", |s, v| {
        ok(s.snapshot(v[1])?
            .layout("w")
            .map(|(d, sh)| (d, sh.to_vec())))
    }),
    ("Snapshot::diff", |s, v| {
        Ok(format!("{:?}", s.snapshot(v[0])?.diff(&s.snapshot(v[2])?)))
    }),
    ("Snapshot::content_hash", |s, v| {
        Ok(s.snapshot(v[1])?.content_hash().to_string())
    }),
    ("Store::restore, Store::is_dirty", |s, v| {
        s.restore(v[2])?;
        Ok(format!("{:?} {}", s.current_branch(), s.is_dirty()))
    }),
    ("Store::checkout", |s, _| {
        s.checkout("side")?;
        Ok(format!("{:?}", s.head()))
    }),
    ("Store::commit", |s, _| ok(s.commit("again"))),
    // The removed tensor's chunks are read (and fail) only when used.
    ("Store::remove", |s, _| {
        ok(s.remove("w").map(|t| t.shape().to_vec()))
    }),
    ("Store::save", |s, _| {
        ok(s.save().map(|st| st.chunks_written))
    }),
    ("Store::stats", |s, _| {
        Ok(format!("{}", s.stats().stored_bytes))
    }),
];

fn run(call: Call, dir: &Path, ids: [VersionId; 3]) -> Result<(Outcome, String), String> {
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut store = Store::open(dir).unwrap();
        let out = call(&mut store, ids);
        (out, store.log_graph())
    }))
    .map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default()
    })
}

#[test]
fn every_call_reading_an_unreadable_chunk_is_a_typed_error_naming_the_pack() {
    let good = tempfile::tempdir().unwrap();
    let ids = build(good.path());
    let mut failures = Vec::new();
    for how in [Damage::Zeroed, Damage::Deleted] {
        for (name, call) in READING {
            let case = tempfile::tempdir().unwrap();
            copy_dir(good.path(), case.path());
            // Open first, then damage: the store has opened and holds unloaded chunks.
            let mut store = Store::open(case.path()).unwrap();
            let before = store.log_graph();
            let working: Vec<String> = store.names();
            damage(case.path(), how);
            let out = std::panic::catch_unwind(AssertUnwindSafe(|| call(&mut store, ids)));
            match out {
                Err(_) => failures.push(format!("{how:?} {name}: panicked")),
                Ok(Ok(v)) => failures.push(format!("{how:?} {name}: returned {v}")),
                Ok(Err(e)) if !names_a_pack(&e) => {
                    failures.push(format!("{how:?} {name}: {e:?} names no pack"));
                }
                Ok(Err(_)) => {
                    // Nothing changed.
                    if store.log_graph() != before || store.names() != working {
                        failures.push(format!("{how:?} {name}: failed and changed the store"));
                    }
                }
            }
        }
        let initial = Store::open(good.path()).unwrap().log_graph();
        for (name, call) in METADATA {
            let case = tempfile::tempdir().unwrap();
            copy_dir(good.path(), case.path());
            let want = run(*call, case.path(), ids);
            let case2 = tempfile::tempdir().unwrap();
            copy_dir(good.path(), case2.path());
            let got = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut store = Store::open(case2.path()).unwrap();
                damage(case2.path(), how);
                let out = call(&mut store, ids);
                (out, store.log_graph())
            }));
            match (got, want) {
                (Err(_), _) => failures.push(format!("{how:?} {name}: panicked")),
                (Ok((Ok(g), _)), Ok((Ok(w), _))) if g == w => {}
                // A deleted pack took the manifests the save wrote with its chunks (format
                // 4): a call that must read one fails naming the pack, and changes
                // nothing; `stats`, which cannot fail, counts the versions it can read.
                (Ok((Err(e), log)), Ok(_))
                    if matches!(how, Damage::Deleted) && names_a_pack(&e) && log == initial => {}
                (Ok((Ok(g), _)), Ok((Ok(w), _)))
                    if matches!(how, Damage::Deleted)
                        && *name == "Store::stats"
                        && g.parse::<u64>().unwrap() < w.parse::<u64>().unwrap() => {}
                (got, want) => failures.push(format!(
                    "{how:?} {name}: {:?}, undamaged {:?}",
                    got.map(|g| g.0),
                    want.map(|w| w.0)
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_chunk_read_after_its_pack_is_repaired_reads_correctly() {
    // An error is not cached: once the pack is back, the same store reads the data.
    let good = tempfile::tempdir().unwrap();
    build(good.path());
    let case = tempfile::tempdir().unwrap();
    copy_dir(good.path(), case.path());
    let store = Store::open(case.path()).unwrap();
    let saved: Vec<(PathBuf, Vec<u8>)> = packs(case.path())
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect();
    damage(case.path(), Damage::Deleted);
    assert!(store.get::<f32>("w").is_err());
    for (p, b) in saved {
        std::fs::write(p, b).unwrap();
    }
    let want = Array2::from_shape_fn((6, 8), |(i, j)| (i * 8 + j) as f32 * 2.0);
    assert_eq!(store.get::<f32>("w").unwrap(), want.into_dyn());
    let snap = store.working_snapshot();
    let (_, t) = snap.tensors().find(|(n, _)| *n == "b").unwrap();
    let b: Vec<u8> = t
        .chunks()
        .flat_map(|c| c.bytes().unwrap().to_vec())
        .collect();
    let want_b: Vec<i16> = (0..5).map(|i| i - 2).collect();
    assert_eq!(b, bytemuck::cast_slice::<i16, u8>(&want_b));
    let _ = IxDyn(&[0]);
}

fn copy_dir(from: &Path, to: &Path) {
    let mut todo = vec![from.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let dst = to.join(p.strip_prefix(from).unwrap());
            if p.is_dir() {
                std::fs::create_dir_all(&dst).unwrap();
                todo.push(p);
            } else {
                std::fs::copy(&p, &dst).unwrap();
            }
        }
    }
}
