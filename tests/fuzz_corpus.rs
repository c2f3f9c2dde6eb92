//! Replays the committed cargo-fuzz corpora on stable: every input the fuzzers kept runs
//! through the same checks as under the fuzzer (`fuzz/logic/`).

use std::path::Path;

#[path = "../fuzz/logic/repo_object.rs"]
mod repo_object;
#[path = "../fuzz/logic/safetensors_import.rs"]
mod safetensors_import;

/// Run every file of `fuzz/corpus/<target>` through `check`; returns how many ran.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let data = std::fs::read(&path).unwrap();
        let ok = std::panic::catch_unwind(|| check(&data));
        assert!(ok.is_ok(), "{target}: {} failed", path.display());
        n += 1;
    }
    n
}

#[test]
fn safetensors_import_corpus_replays() {
    assert!(replay("safetensors_import", safetensors_import::run) >= 7);
}

#[test]
fn repo_object_corpus_replays() {
    assert!(replay("repo_object", repo_object::run) >= 9);
}
