//! Corruption: every file of a small repository, over every file kind, has bytes
//! flipped, is truncated, or is deleted. Each case gives a typed error naming that file,
//! or correct data: never a panic, never wrong data, never an allocation sized by an
//! unchecked length (this binary's allocator refuses any single allocation over 256 MiB,
//! which aborts the test).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

use ndarray::Array1;
use tensor_history::{Error, GcOptions, Meta, Retention, Store, VersionId};

/// The system allocator, refusing single allocations over [`LIMIT`].
struct Bounded;

const LIMIT: usize = 256 << 20;

// SAFETY: calls are forwarded to `System` unchanged, except that requests over `LIMIT`
// get a null pointer, which `GlobalAlloc` allows (callers treat it as out of memory).
unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as it is.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > LIMIT {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `realloc` is passed on as it is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Bounded = Bounded;

/// A version's contents: name -> (dtype name, shape, bytes).
type Contents = BTreeMap<String, (String, Vec<usize>, Vec<u8>)>;

fn contents(store: &Store, id: VersionId) -> Result<Contents, Error> {
    let snap = store.snapshot(id)?;
    let mut out = Contents::new();
    for name in snap.names() {
        let t = snap.tensor(&name)?;
        let bytes: Vec<u8> = match t.dtype().name() {
            "f32" => bytemuck::cast_slice(snap.get::<f32>(&name)?.as_slice().unwrap()).to_vec(),
            "i16" => bytemuck::cast_slice(snap.get::<i16>(&name)?.as_slice().unwrap()).to_vec(),
            other => panic!("the test repository has no {other} tensor"),
        };
        out.insert(
            name,
            (t.dtype().name().to_owned(), t.shape().to_vec(), bytes),
        );
    }
    Ok(out)
}

/// A small repository with every kind of file: two saves (two packs, two indexes),
/// branches, a tag, a detached HEAD moved back to a branch, pruned versions and a gc
/// run. Returns the contents of every saved version by its hash.
fn build(dir: &Path) -> BTreeMap<String, Contents> {
    let (mut store, v0, v1) = common::init_and_double();
    store.tag("doubled", v1).unwrap();
    store.branch("side", v0).unwrap();
    store.checkout("side").unwrap();
    store
        .update_range::<i16>("b", 1..2, |_, xs| xs[0] = 99)
        .unwrap();
    store.commit("side change").unwrap();
    store.save_as(dir).unwrap();
    store.checkout("main").unwrap();
    for k in 0..3 {
        store
            .update_range::<f32>("w", k * 8..k * 8 + 3, |_, xs| xs.fill(-1.0))
            .unwrap();
        store.commit(&format!("sparse {k}")).unwrap();
    }
    store.prune(&Retention::keep_last(2)).unwrap();
    store.save().unwrap();
    store.gc_with(&GcOptions::immediate()).unwrap();
    // A version committed from a part (its chunks and manifests in the part's pack).
    let mut writer = Store::new();
    writer
        .insert("p", &ndarray::arr1(&[1.0f32, 2.0, 3.0]))
        .unwrap();
    let part = writer.write_part(dir.to_str().unwrap()).unwrap();
    store
        .commit_parts("parts", &[part.part], "from a part", Meta::new())
        .unwrap();
    store.save().unwrap();
    let mut all = BTreeMap::new();
    for id in store.versions() {
        all.insert(
            store.version_hash(id).unwrap().to_string(),
            contents(&store, id).unwrap(),
        );
    }
    all
}

fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    for rel in files(from) {
        let dst = to.join(&rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(from.join(&rel), dst).unwrap();
    }
}

/// Open the repository and read every ref, HEAD and every known version.
fn read_everything(dir: &Path, known: &BTreeMap<String, Contents>) -> Result<(), Error> {
    let store = Store::open(dir)?;
    let mut ids: Vec<VersionId> = store.head().into_iter().collect();
    for (name, _) in store.refs() {
        ids.push(store.resolve(&name)?);
    }
    for hash in known.keys() {
        if let Ok(id) = store.resolve(hash) {
            ids.push(id);
        }
    }
    for id in ids {
        let hash = store.version_hash(id)?.to_string();
        let want = known
            .get(&hash)
            .unwrap_or_else(|| panic!("{id} has hash {hash}, which no saved version had"));
        assert_eq!(&contents(&store, id)?, want, "version {hash}: wrong data");
    }
    store.verify()?;
    if store.head().is_some() {
        // The working state (HEAD's) reads too.
        for name in store.names() {
            store.tensor(&name)?;
        }
    }
    Ok(())
}

/// Whether `e` names a pack that the (deleted) index file `index` listed: what a missing
/// index leaves, since its own name is gone (an index is found by listing). The pack's id
/// is looked up as raw bytes in the index's original contents.
fn names_pack_of_index(e: &Error, index: &[u8]) -> bool {
    let Error::CorruptObject { path, .. } = e else {
        return false;
    };
    let Some(hex) = path
        .replace('\\', "/")
        .rsplit('/')
        .next()
        .and_then(|f| f.strip_suffix(".thpack"))
        .map(str::to_owned)
    else {
        return false;
    };
    let Ok(id) = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
    else {
        return false;
    };
    id.len() == 32 && index.windows(32).any(|w| w == id)
}

/// Whether `e` is a typed error that names the file `rel`: as the object at fault, or in
/// its reason (a ref entry naming a version whose file is missing names both, since
/// either may be at fault).
fn names_file(e: &Error, rel: &Path) -> bool {
    let rel = rel.to_string_lossy().replace('\\', "/");
    matches!(
        e,
        Error::CorruptObject { .. } | Error::UnsupportedFormat { .. } | Error::Io { .. }
    ) && e.to_string().replace('\\', "/").contains(&rel)
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Flip(usize, u8),
    Truncate(usize),
    Delete,
}

fn apply(path: &Path, damage: Damage) {
    match damage {
        Damage::Flip(at, mask) => {
            let mut bytes = std::fs::read(path).unwrap();
            let at = at.min(bytes.len() - 1);
            bytes[at] ^= mask;
            std::fs::write(path, bytes).unwrap();
        }
        Damage::Truncate(len) => {
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(len as u64).unwrap();
        }
        Damage::Delete => std::fs::remove_file(path).unwrap(),
    }
}

fn damages(len: usize) -> Vec<Damage> {
    let mut d = Vec::new();
    // Magic, kind and version bytes, the body, the trailer, the last byte.
    let spots = [
        0,
        1,
        7,
        8,
        9,
        10,
        16,
        len / 2,
        len.saturating_sub(33),
        len - 1,
    ];
    for at in spots {
        for mask in [0x01, 0x80] {
            d.push(Damage::Flip(at, mask));
        }
    }
    for cut in [0, 1, 9, len / 2, len.saturating_sub(32), len - 1] {
        if cut < len {
            d.push(Damage::Truncate(cut));
        }
    }
    d.push(Damage::Delete);
    d.dedup_by(|a, b| format!("{a:?}") == format!("{b:?}"));
    d
}

#[test]
fn every_damaged_file_is_a_typed_error_naming_it_or_reads_correct_data() {
    let base = tempfile::tempdir().unwrap();
    let known = build(base.path());
    let rels = files(base.path());
    // Per kind of file: correct data, an error naming the file (for a deleted index, a
    // pack that it listed).
    let mut kinds: BTreeMap<String, [usize; 2]> = BTreeMap::new();
    let mut failures = Vec::new();
    for rel in &rels {
        let kind = rel
            .iter()
            .next()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let outcomes = kinds.entry(kind).or_default();
        let original = std::fs::read(base.path().join(rel)).unwrap();
        let is_index = rel.extension().is_some_and(|x| x == "thidx");
        let len = original.len();
        for damage in damages(len.max(1)) {
            let case = tempfile::tempdir().unwrap();
            copy_dir(base.path(), case.path());
            apply(&case.path().join(rel), damage);
            let result =
                std::panic::catch_unwind(AssertUnwindSafe(|| read_everything(case.path(), &known)));
            match result {
                Ok(Ok(())) => outcomes[0] += 1,
                Ok(Err(e)) if names_file(&e, rel) => outcomes[1] += 1,
                Ok(Err(e))
                    if is_index
                        && matches!(damage, Damage::Delete)
                        && names_pack_of_index(&e, &original) =>
                {
                    outcomes[1] += 1
                }
                Ok(Err(e)) => failures.push(format!("{}: {damage:?}: {e:?}", rel.display())),
                Err(_) => failures.push(format!("{}: {damage:?}: panicked", rel.display())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("kind: [read correct data, named the damaged file]");
    for (kind, outcomes) in &kinds {
        eprintln!("{kind}: {outcomes:?}");
    }
    // Every kind of file was damaged. Damage to each file the repository's data depends on
    // was detected and named; HEAD, gc records and prune markers are hints whose damage
    // falls back to the defaults (FORMAT.md), so there only correct data is allowed.
    // (Manifests are entries of packs: `repo_format_fixtures` damages the manifest
    // objects of a format 3 repository.)
    for kind in ["config.json", "packs", "index", "versions", "refs"] {
        let outcomes = kinds
            .get(kind)
            .unwrap_or_else(|| panic!("no `{kind}` file in the repository: {kinds:?}"));
        assert!(
            outcomes[1] > 0,
            "no damage to `{kind}` was named: {outcomes:?}"
        );
    }
    assert!(kinds.contains_key("HEAD.json"), "no HEAD.json: {kinds:?}");
    for kind in ["HEAD.json", "gc", "pruned"] {
        if let Some(outcomes) = kinds.get(kind) {
            assert_eq!(outcomes[1], 0, "`{kind}`: {outcomes:?}");
        }
    }
}

/// A small saved repository in `dir`: branch `main` with two versions.
fn small(dir: &Path) -> Store {
    let mut store = Store::new();
    store
        .insert("w", &Array1::from_vec(vec![1.0f32, 2.0]))
        .unwrap();
    store.commit("one").unwrap();
    store.update_map::<f32>("w", |x| x + 1.0).unwrap();
    store.commit("two").unwrap();
    store.save_as(dir).unwrap();
    store
}

#[test]
fn a_ref_entry_of_an_unknown_kind_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = small(dir.path());
    let hash = store
        .version_hash(store.head().unwrap())
        .unwrap()
        .to_string();
    let entry = dir.path().join("refs/main/00000000000000000001.json");
    for body in [
        format!(r#"{{"kind": "brunch", "version": "{hash}"}}"#),
        r#"{"kind": "branch"}"#.to_owned(),
        format!(r#"{{"kind": "deleted", "version": "{hash}"}}"#),
    ] {
        std::fs::write(&entry, &body).unwrap();
        let e = Store::open(dir.path()).unwrap_err();
        assert!(
            names_file(&e, Path::new("refs/main/00000000000000000001.json")),
            "{body}: {e:?}"
        );
    }
}

#[test]
fn a_detached_head_naming_a_missing_version_falls_back_to_main() {
    let dir = tempfile::tempdir().unwrap();
    let store = small(dir.path());
    let head = store.head();
    drop(store);
    let gone = "ab".repeat(32);
    std::fs::write(
        dir.path().join("HEAD.json"),
        format!(r#"{{"detached": "{gone}"}}"#),
    )
    .unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.current_branch(), Some("main"));
    assert_eq!(store.head(), head);
    store.verify().unwrap();
}

/// A gc generation entry is only a key to readers: with its body damaged, or removed,
/// or with a stray file beside it, saves, refreshes and gc go on and the repository
/// stays readable.
#[test]
fn a_damaged_gc_generation_entry_is_ignored_by_saves_refreshes_and_gc() {
    let base = tempfile::tempdir().unwrap();
    let known = build(base.path());
    let gens = base.path().join("gc/generations");
    let entries: Vec<PathBuf> = std::fs::read_dir(&gens)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    let len = std::fs::metadata(entry).unwrap().len() as usize;
    let mut cases: Vec<Option<Damage>> = damages(len).into_iter().map(Some).collect();
    cases.push(None); // a stray file instead
    for damage in cases {
        let case = tempfile::tempdir().unwrap();
        copy_dir(base.path(), case.path());
        let rel = entry.strip_prefix(base.path()).unwrap();
        match damage {
            Some(d) => apply(&case.path().join(rel), d),
            None => std::fs::write(case.path().join("gc/generations/x.json"), b"\xff").unwrap(),
        }
        let mut a = Store::open(case.path()).unwrap();
        let mut b = Store::open(case.path()).unwrap();
        b.update_map::<f32>("w", |x| x + 1.0).unwrap();
        b.commit("more").unwrap();
        b.save().unwrap();
        b.gc_with(&GcOptions::immediate()).unwrap();
        a.refresh().unwrap();
        a.save().unwrap();
        a.gc_with(&GcOptions::immediate()).unwrap();
        let r = Store::open(case.path()).unwrap();
        r.verify().unwrap();
        assert_eq!(r.message(r.head().unwrap()).unwrap(), "more", "{damage:?}");
        for (name, _) in r.refs() {
            let id = r.resolve(&name).unwrap();
            let hash = r.version_hash(id).unwrap().to_string();
            if let Some(want) = known.get(&hash) {
                assert_eq!(&contents(&r, id).unwrap(), want, "{damage:?}: {name}");
            }
        }
    }
}

/// What `open` says of a repository with one byte damaged: where it starts is HEAD's
/// saved version on its branch, or an older version that `open_fallback` names (the
/// branch still pointing at the damaged version, which gives an error when read), or a
/// typed error. Never an older version without a word.
#[derive(Debug, Default)]
struct OpenOutcomes {
    at_head: usize,
    fallback: usize,
    error: usize,
}

fn open_outcome(dir: &Path, branch: &str, head: &str, o: &mut OpenOutcomes) -> Result<(), String> {
    let store = match Store::open(dir) {
        Ok(s) => s,
        Err(Error::CorruptObject { .. } | Error::UnsupportedFormat { .. } | Error::Io { .. }) => {
            o.error += 1;
            return Ok(());
        }
        Err(e) => return Err(format!("an error of an unexpected kind: {e:?}")),
    };
    let at = store
        .head()
        .map(|h| store.version_hash(h).unwrap().to_string());
    match store.open_fallback() {
        None if store.current_branch() == Some(branch) && at.as_deref() == Some(head) => {
            o.at_head += 1;
            Ok(())
        }
        None => Err(format!(
            "opened at {at:?} on {:?} without a fallback, saved at {head} on {branch}",
            store.current_branch()
        )),
        Some(f) => {
            if f.branch.as_deref() != Some(branch)
                || store.version_hash(f.wanted).unwrap().to_string() != head
                || store.head() != Some(f.opened_at)
                || store.current_branch().is_some()
                || store.snapshot(f.wanted).is_ok()
            {
                return Err(format!("a fallback that does not say what happened: {f:?}"));
            }
            o.fallback += 1;
            Ok(())
        }
    }
}

#[test]
fn every_single_byte_damage_opens_at_head_or_says_where_it_opened() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::new();
    store
        .insert("w", &Array1::from_vec((0..64).map(|i| i as f32).collect()))
        .unwrap();
    store.commit("one").unwrap();
    store.save_as(dir.path()).unwrap();
    store.update_map::<f32>("w", |x| x + 1.0).unwrap();
    store.commit("two").unwrap();
    store.save().unwrap();
    let head = store
        .version_hash(store.head().unwrap())
        .unwrap()
        .to_string();
    drop(store);
    let mut outcomes = OpenOutcomes::default();
    let mut failures = Vec::new();
    let mut cases = 0;
    for rel in files(dir.path()) {
        let path = dir.path().join(&rel);
        let original = std::fs::read(&path).unwrap();
        for at in 0..original.len() {
            let mut bytes = original.clone();
            bytes[at] ^= 0x01;
            std::fs::write(&path, &bytes).unwrap();
            cases += 1;
            let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                open_outcome(dir.path(), "main", &head, &mut outcomes)
            }));
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(format!("{} byte {at}: {e}", rel.display())),
                Err(_) => failures.push(format!("{} byte {at}: panicked", rel.display())),
            }
        }
        std::fs::write(&path, &original).unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
    eprintln!("{cases} single-byte flips: {outcomes:?}");
    // The packs hold HEAD's manifest: damage there falls back, and says so.
    assert!(outcomes.fallback > 0, "{outcomes:?}");
    assert!(outcomes.error > 0 && outcomes.at_head > 0, "{outcomes:?}");
}
