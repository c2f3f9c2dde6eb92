//! A pack file shorter than its index says, at open or after it was first mapped: reads
//! of chunks not in use yet give `Error::CorruptObject` naming the pack, in both read
//! modes. Under `ReadMode::Copy` a pack truncated while its chunks are in use never
//! ends the process (a forked child truncates under itself); under `ReadMode::Map` it
//! does (`SIGBUS`, outside the contract), which shows the child's check can fail.
#![cfg(unix)]

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Config, Error, LocalDir, ReadMode, Store};

use crate::common::{in_child, Ended};

const CHUNK_BYTES: usize = 64 << 10;

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

/// `n` f32 values of pseudo-random bits (no NaN) seeded by `start`: incompressible, so
/// a pack stores them raw and map mode reads them in place.
fn values(start: f32, n: usize) -> ArrayD<f32> {
    let mut x = u64::from(start.to_bits()) ^ 0x9E37_79B9_7F4A_7C15;
    let v = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut r = (x >> 16) as u32;
            if (r >> 23) & 0xff == 0xff {
                r ^= 1 << 23;
            }
            f32::from_bits(r)
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap()
}

const ELEMS: usize = 4 * CHUNK_BYTES / 4;

/// A repository at `dir` with tensors `a` and `b` of four chunks each, in one pack
/// (about 512 KiB: mapped on read). Returns the pack's path.
///
/// A save keeps the manifests it writes in its pack (format 4): the chunks are saved
/// first with `a` and `b` of another shape, then the version of the shape the tests
/// read, whose save writes only its two manifests (the chunks are the same bytes), in a
/// pack of their own. So opening reads HEAD's manifests whatever happens to the pack of
/// the chunks.
fn saved(dir: &Path) -> PathBuf {
    let mut s = Store::with_config(config()).unwrap();
    let halves = |v: ArrayD<f32>| v.into_shape_with_order(IxDyn(&[ELEMS / 2, 2])).unwrap();
    s.insert("a", &halves(values(0.0, ELEMS))).unwrap();
    s.insert("b", &halves(values(1e6, ELEMS))).unwrap();
    s.commit("a and b, in halves").unwrap();
    s.save_as(dir).unwrap();
    let packs: Vec<PathBuf> = walk(&dir.join("packs"));
    assert_eq!(packs.len(), 1, "one pack: {packs:?}");
    for (name, start) in [("a", 0.0), ("b", 1e6)] {
        s.remove(name).unwrap();
        s.insert(name, &values(start, ELEMS)).unwrap();
    }
    s.commit("a and b").unwrap();
    let stats = s.save().unwrap();
    assert_eq!((stats.chunks_written, stats.manifests_written), (0, 2));
    packs.into_iter().next().unwrap()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn open(dir: &Path, reads: ReadMode) -> Store {
    let backend = LocalDir::with_read_mode(dir, reads).unwrap();
    assert_eq!(backend.read_mode(), reads);
    Store::open_backend(Arc::new(backend), config()).unwrap()
}

/// Cut `path` to its 64-byte header: every chunk lies past its end.
fn truncate(path: &Path) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(64)
        .unwrap();
}

/// `err` is `CorruptObject` naming `pack` (by its key, `packs/<2 hex>/<id>.thpack`).
fn names_pack(err: &Error, pack: &Path) -> bool {
    let name = pack.file_name().unwrap().to_str().unwrap();
    matches!(err, Error::CorruptObject { path, .. } if path.ends_with(name))
}

#[test]
fn a_pack_short_at_open_is_a_corrupt_object_naming_it() {
    for reads in [ReadMode::Map, ReadMode::Copy] {
        let dir = tempfile::tempdir().unwrap();
        let pack = saved(dir.path());
        truncate(&pack);
        let s = open(dir.path(), reads);
        for name in ["a", "b"] {
            let err = s.get::<f32>(name).unwrap_err();
            assert!(names_pack(&err, &pack), "{reads:?} {name}: {err:?}");
        }
        // The rest of the store is unharmed: the history is there, and a failed read
        // changed nothing.
        assert_eq!(s.versions().len(), 2);
        assert!(s.get::<f32>("a").is_err());
    }
}

#[test]
fn a_pack_truncated_after_it_was_mapped_is_a_corrupt_object_for_chunks_not_read_yet() {
    for reads in [ReadMode::Map, ReadMode::Copy] {
        let dir = tempfile::tempdir().unwrap();
        let pack = saved(dir.path());
        let s = open(dir.path(), reads);
        // Reading `a` maps the pack (in map mode) and keeps the mapping for later reads.
        assert_eq!(s.get::<f32>("a").unwrap(), values(0.0, ELEMS));
        truncate(&pack);
        // `b`'s chunks were never read: without the length check, map mode would hash
        // pages past the file's new end (SIGBUS).
        let err = s.get::<f32>("b").unwrap_err();
        assert!(names_pack(&err, &pack), "{reads:?}: {err:?}");
        let again = s.get::<f32>("b").unwrap_err();
        assert!(names_pack(&again, &pack), "{reads:?} again: {again:?}");
    }
}

/// Read `a` (its chunks stay loaded in the store), truncate the pack under it, read `a`
/// again (from the chunks in use) and `b` (from the pack): `a` must be intact, `b` a
/// typed error.
fn truncate_under_a_reader(dir: &Path, pack: &Path, reads: ReadMode) -> bool {
    let s = open(dir, reads);
    let first = s.get::<f32>("a").unwrap();
    truncate(pack);
    let again = s.get::<f32>("a").unwrap();
    let b = s.get::<f32>("b");
    first == values(0.0, ELEMS) && again == first && matches!(&b, Err(e) if names_pack(e, pack))
}

#[test]
fn copy_reads_survive_a_pack_truncated_while_its_chunks_are_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let pack = saved(dir.path());
    let ended = in_child(|| truncate_under_a_reader(dir.path(), &pack, ReadMode::Copy));
    assert_eq!(ended, Ended::Exited(0), "copy mode");

    // The same in map mode touches pages past the file's end: the process gets SIGBUS.
    // This is what `ReadMode::Copy` is for, and it shows the child above can fail.
    let dir = tempfile::tempdir().unwrap();
    let pack = saved(dir.path());
    let ended = in_child(|| truncate_under_a_reader(dir.path(), &pack, ReadMode::Map));
    assert_eq!(ended, Ended::Signal(libc::SIGBUS), "map mode");
}
