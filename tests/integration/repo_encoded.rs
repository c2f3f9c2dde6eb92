//! Packs of format versions 2 and 3 hold chunks coded (byte planes, deltas against the same
//! variable's chunk in the parent version): a dense history takes a fraction of its raw
//! bytes on disk and reads back bit for bit; gc keeps the bases live deltas need; a
//! damaged or truncated base is an error naming its pack, never other bytes.

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Config, Error, GcOptions, Retention, Store, VersionId};

/// 16 KiB chunks: a tensor of [`ELEMS`] f32 is 4 chunks.
const CHUNK_BYTES: usize = 16 << 10;
const ELEMS: usize = 16 << 10;

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

/// A pseudo-random generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Weights at step 0, and the weights after each of `steps` dense steps (every element
/// moves by a relative step of up to 1e-4, as a small learning rate does).
fn dense_steps(seed: u64, steps: usize) -> Vec<ArrayD<f32>> {
    let mut rng = Rng(seed | 1);
    let mut w: Vec<f32> = (0..ELEMS).map(|_| rng.unit() * 0.1).collect();
    let mut out = vec![ArrayD::from_shape_vec(IxDyn(&[ELEMS]), w.clone()).unwrap()];
    for _ in 0..steps {
        for x in &mut w {
            *x *= 1.0 + 1e-4 * rng.unit();
        }
        out.push(ArrayD::from_shape_vec(IxDyn(&[ELEMS]), w.clone()).unwrap());
    }
    out
}

/// Commit each of `steps` as a version of `w` (and a bf16-sized i16 tensor `m` that
/// changes every step too), saving after each commit when `save_each`.
fn commit_all(s: &mut Store, steps: &[ArrayD<f32>], save_each: bool) -> Vec<VersionId> {
    let mut ids = Vec::new();
    for (i, w) in steps.iter().enumerate() {
        if s.contains("w") {
            s.write("w", w).unwrap();
            s.update::<i16>("m", |_, xs| {
                for x in xs.iter_mut() {
                    *x = x.wrapping_add(1);
                }
            })
            .unwrap();
        } else {
            s.insert("w", w).unwrap();
            s.insert(
                "m",
                &ArrayD::from_shape_fn(IxDyn(&[3000]), |ix| (ix[0] * 7) as i16),
            )
            .unwrap();
        }
        ids.push(s.commit(&format!("step {i}")).unwrap());
        if save_each {
            s.save().unwrap();
        }
    }
    ids
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn pack_bytes(dir: &Path) -> u64 {
    files(&dir.join("packs"))
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

#[test]
fn a_dense_history_takes_a_fraction_of_its_raw_bytes_and_reads_back_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let steps = dense_steps(7, 9);
    let mut s = Store::open_with(dir.path(), config()).unwrap();
    let ids = commit_all(&mut s, &steps, true);
    let raw = (steps.len() * ELEMS * 4) as u64;
    let stored = pack_bytes(dir.path());
    // Planes alone store such weights at about 0.85 of their bytes; deltas at a third.
    assert!(
        stored * 3 < raw * 2,
        "10 dense versions: {stored} bytes in packs for {raw} raw"
    );
    let r = Store::open_with(dir.path(), config()).unwrap();
    r.verify().unwrap();
    // Read newest first (each chain decoded from the packs), then oldest first.
    for (id, w) in ids.iter().zip(&steps).rev().chain(ids.iter().zip(&steps)) {
        let got = r.snapshot(*id).unwrap().get::<f32>("w").unwrap();
        let same = got
            .iter()
            .zip(w.iter())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{id}");
    }
    let m = r.snapshot(ids[9]).unwrap().get::<i16>("m").unwrap();
    assert!(m.iter().enumerate().all(|(i, &x)| x == (i * 7) as i16 + 9));
}

#[test]
fn one_save_of_many_dense_versions_reads_back_bit_for_bit() {
    // Every base is in the same save; chains are cut at their bound along the way.
    let dir = tempfile::tempdir().unwrap();
    let steps = dense_steps(11, 20);
    let mut s = Store::open_with(dir.path(), config()).unwrap();
    let ids = commit_all(&mut s, &steps, false);
    s.save().unwrap();
    let r = Store::open_with(dir.path(), config()).unwrap();
    r.verify().unwrap();
    for (id, w) in ids.iter().zip(&steps) {
        let got = r.snapshot(*id).unwrap().get::<f32>("w").unwrap();
        assert!(got
            .iter()
            .zip(w.iter())
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn gc_after_pruning_the_versions_that_introduced_the_bases_keeps_the_deltas_readable() {
    let dir = tempfile::tempdir().unwrap();
    let steps = dense_steps(3, 3);
    let mut s = Store::open_with(dir.path(), config()).unwrap();
    let ids = commit_all(&mut s, &steps, true);
    s.prune(&Retention::keep_last(1)).unwrap();
    s.save().unwrap();
    let gc = s.gc_with(&GcOptions::immediate()).unwrap();
    assert!(gc.objects_deleted > 0, "{gc:?}");
    let r = Store::open_with(dir.path(), config()).unwrap();
    r.verify().unwrap();
    assert_eq!(r.versions().len(), 1);
    let got = r.get::<f32>("w").unwrap();
    let want = &steps[3];
    assert!(got
        .iter()
        .zip(want.iter())
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // The store that ran gc reads it too.
    let got = s.snapshot(ids[3]).unwrap().get::<f32>("w").unwrap();
    assert!(got
        .iter()
        .zip(want.iter())
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// A repository of two saves: `step 0` (the bases, in the first pack) and `step 1`
/// (deltas against them, in a second pack). Returns the first pack's path and the
/// version ids.
fn two_saves(dir: &Path) -> (PathBuf, Vec<VersionId>) {
    let steps = dense_steps(5, 1);
    let mut s = Store::open_with(dir, config()).unwrap();
    let ids = commit_all(&mut s, &steps[..1], true);
    let first = files(&dir.join("packs"));
    assert_eq!(first.len(), 1);
    let more = commit_all(&mut s, &steps[1..], true);
    assert_eq!(files(&dir.join("packs")).len(), 2);
    let second = files(&dir.join("packs"));
    let delta_pack = second.iter().find(|p| !first.contains(p)).unwrap();
    // The deltas take a fraction of their chunks: the second pack is much smaller.
    let (a, b) = (
        std::fs::metadata(&first[0]).unwrap().len(),
        std::fs::metadata(delta_pack).unwrap().len(),
    );
    assert!(
        b * 3 < a * 2,
        "the second save stored deltas: {a} then {b} bytes"
    );
    (first[0].clone(), ids.into_iter().chain(more).collect())
}

fn names(err: &Error, pack: &Path) -> bool {
    let name = pack.file_name().unwrap().to_str().unwrap();
    matches!(err, Error::CorruptObject { path, .. } if path.ends_with(name))
}

#[test]
fn a_damaged_base_is_an_error_naming_its_pack_never_other_bytes() {
    for damage in ["flip", "truncate"] {
        let dir = tempfile::tempdir().unwrap();
        let (base_pack, ids) = two_saves(dir.path());
        let mut bytes = std::fs::read(&base_pack).unwrap();
        let mid = bytes.len() / 2;
        match damage {
            // The middle of the pack: inside `w`'s chunks, which take most of it.
            "flip" => bytes[mid] ^= 0x10,
            _ => bytes.truncate(bytes.len() / 2),
        }
        std::fs::write(&base_pack, &bytes).unwrap();
        let r = Store::open_with(dir.path(), config()).unwrap();
        // The delta version reads through its bases: a typed error naming the base's
        // pack, never other values.
        let err = r.snapshot(ids[1]).unwrap().get::<f32>("w").unwrap_err();
        assert!(names(&err, &base_pack), "{damage}: {err:?}");
        let err = r.verify().unwrap_err();
        assert!(
            matches!(err, Error::CorruptObject { .. }),
            "{damage}: {err:?}"
        );
    }
}

#[test]
fn save_stats_and_stats_report_raw_and_stored_chunk_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let steps = dense_steps(13, 1);
    let mut s = Store::open_with(dir.path(), config()).unwrap();
    s.insert("w", &steps[0]).unwrap();
    s.commit("step 0").unwrap();
    let first = s.save().unwrap();
    assert_eq!(first.chunk_bytes_raw, (ELEMS * 4) as u64);
    assert!(first.chunk_bytes_stored <= first.chunk_bytes_raw);
    s.write("w", &steps[1]).unwrap();
    s.commit("step 1").unwrap();
    let second = s.save().unwrap();
    assert_eq!(second.chunk_bytes_raw, (ELEMS * 4) as u64);
    assert!(
        second.chunk_bytes_stored * 3 < second.chunk_bytes_raw * 2,
        "{second:?}"
    );
    // The packs hold those bytes plus alignment, footers and headers.
    let stored = first.chunk_bytes_stored + second.chunk_bytes_stored;
    assert!(pack_bytes(dir.path()) >= stored);
    let r = Store::open_with(dir.path(), config()).unwrap();
    let st = r.stats();
    assert_eq!(st.stored_bytes, 2 * ELEMS * 4);
    assert_eq!(st.stored_pack_bytes as u64, stored);
}
