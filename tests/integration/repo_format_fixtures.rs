//! Repositories written by builds of earlier format versions, kept as fixtures: every
//! later build opens them, reads every version bit for bit, and can save to them.
//!
//! - `tests/fixtures/format1/`: format 1 (raw chunks in packs), the history [`build`]
//!   makes with 64-byte chunks: f32 with NaN, infinities, a denormal and negative zero,
//!   bf16, f64, i32 and u16 tensors, a 0-length tensor, ragged last chunks, a dense
//!   update of every element, a branch `side` and a tag `best`.
//! - `tests/fixtures/format2/`: format 2 (chunks stored raw, as byte planes or as XOR
//!   deltas against the parent's chunk), the same history with 4 KiB chunks and two
//!   more tensors, f32 and bf16 of 4096 elements changed densely at every step (so
//!   that the packs hold XOR deltas, and deltas of deltas), written by
//!   [`write_format_2_fixture`] with the last build of format 2.
//! - `tests/fixtures/format3/`: format 3 (chunks raw, as byte planes or as difference
//!   deltas; every manifest an object of its own), the history of the format 2 fixture,
//!   written by the same function (into `format3/`) with the last build of format 3
//!   (commit `a387608`).
//!
//! The tests build the same history themselves and compare every version's tensors
//! byte for byte, by commit message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::bf16;
use ndarray::{Array, ArrayD, IxDyn};
use tensor_history::{Config, Element, GcOptions, Meta, Ref, Store, VersionId};

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

/// f32 values of the large dense tensor at step `s` (every element changes).
fn big_values(s: u32) -> ArrayD<f32> {
    arr(&[4096], |i| {
        let x = ((i as f32) * 0.618).sin() * 0.05;
        x * (1.0 + 1e-4 * ((i as u32 * 7 + s * 13) % 17) as f32 * s as f32)
    })
}

/// bf16 values of the large dense tensor at step `s`.
fn bigh_values(s: u32) -> ArrayD<bf16> {
    big_values(s).mapv(|x| bf16::from_f32(x * (1.0 + 0.01 * s as f32)))
}

/// The history of the format 1 fixture.
fn build() -> Store {
    build_with(false)
}

/// The history of the fixtures: with `big`, 4 KiB chunks and the two large dense
/// tensors (format 2); without, 64-byte chunks (format 1).
fn build_with(big: bool) -> Store {
    let mut s = Store::with_config(Config {
        chunk_bytes: if big { 4096 } else { 64 },
        ..Config::default()
    })
    .unwrap();
    let dense = |s: &mut Store, step: u32| {
        if big {
            set(s, "big", &big_values(step));
            set(s, "bigh", &bigh_values(step));
        }
    };
    if big {
        s.insert("big", &big_values(0)).unwrap();
        s.insert("bigh", &bigh_values(0)).unwrap();
    }
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
    dense(&mut s, 1);
    let v1 = s.commit("step 1").unwrap();
    set(&mut s, "w", &w_values(2));
    set(
        &mut s,
        "h",
        &arr(&[20], |i| bf16::from_f32(i as f32 / 3.0 - 1.0)),
    );
    dense(&mut s, 2);
    s.commit("step 2").unwrap();
    s.branch("side", v1).unwrap();
    s.checkout("side").unwrap();
    set(&mut s, "u", &arr(&[33], |i| (i * 7) as u16));
    set(&mut s, "n", &arr(&[0], |i| i as i32));
    dense(&mut s, 3);
    s.commit("side step").unwrap();
    s.tag("best", v1).unwrap();
    s.tag("first", v0).unwrap();
    s.checkout("main").unwrap();
    s
}

fn fixture_dir(format: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/format{format}"))
}

/// A copy of the fixture of `format` in a temporary directory (tests never write into
/// the source tree).
fn fixture_copy(format: u32) -> tempfile::TempDir {
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
    copy(&fixture_dir(format), dir.path());
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

/// Every version of `store`, by message, has the content address `want` gives it.
fn assert_addresses(store: &Store, want: &[(&str, &str)]) {
    let found: Vec<(String, String)> = by_message(store)
        .iter()
        .map(|(m, &id)| (m.clone(), store.version_hash(id).unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(m, h)| ((*m).to_owned(), (*h).to_owned()))
        .collect();
    assert_eq!(found, want);
}

#[test]
fn a_format_1_repository_opens_and_reads_every_version_bit_for_bit() {
    let dir = fixture_copy(1);
    let store = Store::open(dir.path()).unwrap();
    store.verify().unwrap();
    assert_eq!(store.current_branch(), Some("main"));
    assert_same_history(&store, &build());
    assert_addresses(&store, ADDRESSES);
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
    let dir = fixture_copy(1);
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

/// Writes `tests/fixtures/format2/` (run once, by the last build of format 2:
/// `TH_WRITE_FIXTURE=1 cargo test --test repo_format_fixtures -- --ignored`), and
/// prints the content addresses for [`ADDRESSES_2`].
#[test]
#[ignore = "writes the format 2 fixture into the source tree"]
fn write_format_2_fixture() {
    if std::env::var_os("TH_WRITE_FIXTURE").is_none() {
        return;
    }
    let dir = fixture_dir(2);
    assert!(!dir.exists(), "{} exists", dir.display());
    let mut s = build_with(true);
    s.save_as(&dir).unwrap();
    for (m, id) in by_message(&s) {
        println!("{m}: {}", s.version_hash(id).unwrap());
    }
}

/// The content addresses of the format 2 fixture's versions, by message.
const ADDRESSES_2: &[(&str, &str)] = &[
    (
        "init",
        "706c4213a3eb4c1f2588e682c1c322b37e84179e34a0585df48938e029fd503a",
    ),
    (
        "side step",
        "03b80b837aa3d6a4b3667c91885e579c65feecc7723d28a12db92f420f9fdbb6",
    ),
    (
        "step 1",
        "7b52f0004c656139e46765cfdbd03cbdf6699690b3d5ebbaca353b2f6ace63fe",
    ),
    (
        "step 2",
        "89afbff298c02c9fc7d57250341760395df15fdda1f4f6f0af4f100645659a16",
    ),
];

/// The `version` of the repository's `config.json`.
fn config_version(dir: &Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["version"].as_u64().unwrap()
}

#[test]
fn a_format_2_repository_opens_and_reads_every_version_bit_for_bit() {
    let dir = fixture_copy(2);
    assert_eq!(config_version(dir.path()), 2);
    let store = Store::open(dir.path()).unwrap();
    store.verify().unwrap();
    assert_eq!(store.current_branch(), Some("main"));
    assert_same_history(&store, &build_with(true));
    assert_addresses(&store, ADDRESSES_2);
    // The packs hold coded chunks (byte planes and XOR deltas): fewer bytes than raw.
    let stats = store.stats();
    assert!(
        stats.stored_pack_bytes * 10 < stats.stored_bytes * 7,
        "{} bytes in packs for {} raw",
        stats.stored_pack_bytes,
        stats.stored_bytes
    );
}

/// Every pack file of the repository at `dir`: (envelope version, bytes).
fn packs(dir: &Path) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir.join("packs")).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let bytes = std::fs::read(f.unwrap().path()).unwrap();
            out.push((u16::from_le_bytes([bytes[8], bytes[9]]), bytes));
        }
    }
    out
}

/// Whether `pack` holds a chunk coded as a difference delta: the codec header of one
/// (codec version 2, method 3, an element width, raw-plane flags within it, a raw
/// length of at most 1 MiB) at some offset. Random bytes match it with a chance of
/// about 2^-50 per offset.
fn holds_difference_deltas(pack: &[u8]) -> bool {
    pack.windows(12).any(|h| {
        let w = h[2];
        let len = u64::from_le_bytes(h[4..12].try_into().unwrap());
        h[0] == 2
            && h[1] == 3
            && matches!(w, 1 | 2 | 4 | 8)
            && u32::from(h[3]) < 1 << w
            && (1..=1 << 20).contains(&len)
    })
}

#[test]
fn a_format_2_repository_takes_saves_and_stays_format_2() {
    let dir = fixture_copy(2);
    // The store holds its older versions coded (as difference deltas), which a save
    // into format 2 must not write as they are. No budget while committing (a budget the
    // history passes spills versions into the repository), then a budget of 0.
    let mut store = Store::open(dir.path()).unwrap();
    let mut want = build_with(true);
    for step in 4..10 {
        for s in [&mut store, &mut want] {
            set(s, "big", &big_values(step));
            set(s, "bigh", &bigh_values(step));
            s.commit(&format!("step {step}")).unwrap();
        }
    }
    // The versions not saved yet are coded in memory before the save.
    store.set_memory_budget(Some(0));
    store.enforce_memory_budget();
    let saved = store.save().unwrap();
    assert!(saved.chunks_written_as_held > 0, "{saved:?}");
    assert_eq!(config_version(dir.path()), 2);
    let packs = packs(dir.path());
    assert!(packs.len() > 1, "the saves wrote packs");
    for (version, bytes) in &packs {
        assert_eq!(*version, 2);
        assert!(!holds_difference_deltas(bytes));
    }
    let again = Store::open(dir.path()).unwrap();
    again.verify().unwrap();
    assert_same_history(&again, &want);
}

/// Files under `dir/manifests` (manifests stored as objects of their own).
fn manifest_files(dir: &Path) -> usize {
    let Ok(subs) = std::fs::read_dir(dir.join("manifests")) else {
        return 0;
    };
    subs.map(|d| std::fs::read_dir(d.unwrap().path()).unwrap().count())
        .sum()
}

#[test]
fn a_new_repository_is_format_4_with_its_manifests_in_its_packs() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = build_with(true);
    let saved = s.save_as(dir.path()).unwrap();
    assert_eq!(config_version(dir.path()), 4);
    let packs = packs(dir.path());
    assert!(packs.iter().all(|(v, _)| *v == 4));
    assert!(packs.iter().any(|(_, b)| holds_difference_deltas(b)));
    // Every manifest is an entry of a pack: none is a file, and the chunk counts leave
    // them out.
    assert_eq!(manifest_files(dir.path()), 0);
    assert_eq!(packs.len(), saved.packs_written);
    assert!(saved.manifests_written >= 7, "{saved:?}");
    let again = Store::open(dir.path()).unwrap();
    again.verify().unwrap();
    assert_same_history(&again, &build_with(true));
    // Versions keep their content addresses (they name the same manifest ids).
    let addresses = |st: &Store| -> Vec<(String, String)> {
        by_message(st)
            .into_iter()
            .map(|(m, id)| (m, st.version_hash(id).unwrap().to_string()))
            .collect()
    };
    assert_eq!(addresses(&again), addresses(&s));

    // A later save writes the manifests of what changed, into its own pack.
    let mut s = Store::open(dir.path()).unwrap();
    let mut want = build_with(true);
    for x in [&mut s, &mut want] {
        set(x, "big", &big_values(9));
        x.commit("step 9").unwrap();
    }
    let saved = s.save().unwrap();
    // `big` (16 KiB, one chunk at the default chunk size of the store that opened the
    // repository) changed: 1 chunk and 1 manifest in 1 pack.
    assert_eq!(
        (
            saved.chunks_written,
            saved.manifests_written,
            saved.packs_written
        ),
        (1, 1, 1),
        "{saved:?}"
    );
    assert_eq!(manifest_files(dir.path()), 0);
    let again = Store::open(dir.path()).unwrap();
    again.verify().unwrap();
    assert_same_history(&again, &want);
}

/// The content addresses of the format 3 fixture's versions, by message (the history of
/// the format 2 fixture, committed at other times).
const ADDRESSES_3: &[(&str, &str)] = &[
    (
        "init",
        "aea4fb4a4ae1b7435ce6e6673d13361bde50e3729708911b612aa82010cfa169",
    ),
    (
        "side step",
        "ada211ec5abd45296b7c613959f6e9ce0c1b99418548968b233a8edca028a8b8",
    ),
    (
        "step 1",
        "20f9e5496673a47c53e492652a89c077b7066bc942200a3f1a6b3a9106c33349",
    ),
    (
        "step 2",
        "9eefe59d0cdc25db45bfb71563feece6f1ca0974c0e6c086b2e13bee10119e2b",
    ),
];

#[test]
fn a_format_3_repository_opens_and_reads_every_version_bit_for_bit() {
    let dir = fixture_copy(3);
    assert_eq!(config_version(dir.path()), 3);
    assert!(manifest_files(dir.path()) > 0);
    let store = Store::open(dir.path()).unwrap();
    store.verify().unwrap();
    assert_eq!(store.current_branch(), Some("main"));
    assert_same_history(&store, &build_with(true));
    assert_addresses(&store, ADDRESSES_3);
    let packs = packs(dir.path());
    assert!(packs.iter().any(|(_, b)| holds_difference_deltas(b)));
}

#[test]
fn a_format_3_repository_takes_saves_and_gc_and_stays_format_3() {
    let dir = fixture_copy(3);
    let files = manifest_files(dir.path());
    let mut store = Store::open(dir.path()).unwrap();
    let mut want = build_with(true);
    for step in 4..8 {
        for s in [&mut store, &mut want] {
            set(s, "big", &big_values(step));
            s.commit(&format!("step {step}")).unwrap();
        }
    }
    let saved = store.save().unwrap();
    assert_eq!(saved.manifests_written, 4, "{saved:?}");
    // Still format 3: the new manifests are files, the packs of envelope version 3.
    assert_eq!(config_version(dir.path()), 3);
    assert_eq!(manifest_files(dir.path()), files + 4);
    assert!(packs(dir.path()).iter().all(|(v, _)| *v == 3));
    store.gc_with(&GcOptions::immediate()).unwrap();
    let again = Store::open(dir.path()).unwrap();
    again.verify().unwrap();
    assert_same_history(&again, &want);
}

#[test]
fn gc_rebases_a_format_2_repository_with_xor_deltas() {
    // Dense steps of a new variable written as parts (whole chunks, as DCP saves write
    // them) into the format 2 fixture, then gc with rebase: the chunks are coded again
    // as XOR deltas, the only delta format 2 has.
    let dir = fixture_copy(2);
    let location = dir.path().to_str().unwrap().to_owned();
    let config = Config {
        chunk_bytes: 4096,
        ..Config::default()
    };
    let mut w = Store::with_config(config.clone()).unwrap();
    w.insert("p", &big_values(0)).unwrap();
    let mut c = Store::open_with(dir.path(), config).unwrap();
    let mut written = Vec::new();
    for step in 0..4 {
        if step > 0 {
            // A relative change of about 3e-5, as a small optimizer step makes.
            w.update_map::<f32>("p", |x| x * (1.0 - 3e-5)).unwrap();
        }
        let part = w.write_part(&location).unwrap();
        let v = c
            .commit_parts("main", &[part.part], &format!("part {step}"), Meta::new())
            .unwrap();
        c.save().unwrap();
        written.push((v, w.get::<f32>("p").unwrap()));
    }
    let mut options = GcOptions::immediate();
    options.rebase = true;
    let stats = c.gc_with(&options).unwrap();
    assert!(stats.chunks_rebased > 0, "{stats:?}");
    assert_eq!(config_version(dir.path()), 2);
    for (version, bytes) in packs(dir.path()) {
        assert_eq!(version, 2);
        assert!(!holds_difference_deltas(&bytes));
    }
    let again = Store::open(dir.path()).unwrap();
    again.verify().unwrap();
    let msgs = by_message(&again);
    for (step, (_, want)) in written.iter().enumerate() {
        let v = msgs[&format!("part {step}")];
        assert_eq!(again.snapshot(v).unwrap().get::<f32>("p").unwrap(), *want);
    }
}

#[test]
fn a_damaged_manifest_of_a_format_3_repository_is_a_typed_error_naming_it() {
    let good = fixture_copy(3);
    let want = build_with(true);
    let mut files: Vec<PathBuf> = Vec::new();
    for sub in std::fs::read_dir(good.path().join("manifests")).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            files.push(f.unwrap().path().strip_prefix(good.path()).unwrap().into());
        }
    }
    files.sort();
    let mut named = 0;
    for rel in &files {
        for at in [0usize, 12, 40] {
            let dir = fixture_copy(3);
            let path = dir.path().join(rel);
            let mut bytes = std::fs::read(&path).unwrap();
            let at = at.min(bytes.len() - 1);
            bytes[at] ^= 0x20;
            std::fs::write(&path, &bytes).unwrap();
            // Every version read in full: correct data, or an error naming the file.
            let read = || -> Result<(), tensor_history::Error> {
                let store = Store::open(dir.path())?;
                let msgs = by_message(&store);
                let wants = by_message(&want);
                for (msg, id) in &msgs {
                    assert_eq!(contents(&store, *id), contents(&want, wants[msg]), "{msg}");
                }
                store.verify()
            };
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let store = Store::open(dir.path());
                let store = match store {
                    Ok(s) => s,
                    Err(e) => return Err(e),
                };
                for id in store.versions() {
                    store.snapshot(id)?;
                }
                read()
            }));
            match outcome {
                Ok(Ok(())) => panic!("{}: damage at {at} was not noticed", rel.display()),
                Ok(Err(tensor_history::Error::CorruptObject { path, .. }))
                    if Path::new(&path) == rel =>
                {
                    named += 1
                }
                Ok(Err(e)) => panic!("{}: {e:?}", rel.display()),
                Err(_) => panic!("{}: panicked", rel.display()),
            }
        }
    }
    assert_eq!(named, 3 * files.len());
}
