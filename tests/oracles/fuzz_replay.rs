//! Replays every committed fuzz input on stable, so CI checks what the fuzzers found
//! without a nightly toolchain: each file under `fuzz/corpus/<target>/` runs through the
//! same checks as under the fuzzer (`fuzz/logic/` and the store model's driver). A new
//! target adds one line to `TARGETS`.

use crate::model;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};

#[path = "../../fuzz/logic/chunk_decode.rs"]
mod chunk_decode;
#[path = "../../fuzz/logic/repo_object.rs"]
mod repo_object;
#[path = "../../fuzz/logic/safetensors_import.rs"]
mod safetensors_import;

/// Runs one input the way `fuzz/fuzz_targets/store_actions.rs` does.
fn store_actions(data: &[u8]) -> Result<(), String> {
    // libfuzzer-sys decodes a target's argument with `arbitrary_take_rest`.
    let Ok(input) = model::driver::Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return Ok(()); // the target skips undecodable input the same way
    };
    model::driver::run_input(&input).map_err(|e| e.to_string())
}

/// Runs a target whose checks panic on failure (as a fuzz target does).
fn panics_as_failure(check: fn(&[u8]), data: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| check(data))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panicked".to_owned())
    })
}

fn repo_object(data: &[u8]) -> Result<(), String> {
    panics_as_failure(repo_object::run, data)
}

fn chunk_decode(data: &[u8]) -> Result<(), String> {
    panics_as_failure(chunk_decode::run, data)
}

fn safetensors_import(data: &[u8]) -> Result<(), String> {
    panics_as_failure(safetensors_import::run, data)
}

/// How one target runs one input: `Err` describes the failure.
type Runner = fn(&[u8]) -> Result<(), String>;

/// `(target, runner, at least this many inputs)`: the corpus directory
/// `fuzz/corpus/<target>`, how to run a file, and how many files it must hold (so that
/// a corpus lost by mistake fails the test).
const TARGETS: &[(&str, Runner, usize)] = &[
    ("store_actions", store_actions, 1),
    ("repo_object", repo_object, 9),
    ("safetensors_import", safetensors_import, 7),
    ("chunk_decode", chunk_decode, 231),
];

#[test]
fn every_committed_fuzz_input_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, run, at_least) in TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        files.sort();
        assert!(
            files.len() >= *at_least,
            "{target}: {} inputs, expected at least {at_least}",
            files.len()
        );
        for file in &files {
            let data = std::fs::read(file).expect("a corpus file");
            if let Err(e) = run(&data) {
                panic!("{target}: {} fails: {e}", file.display());
            }
        }
        println!("{target}: {} inputs replayed", files.len());
    }
}

/// The committed `decode-*` seeds of `chunk_decode` are encoded chunks of the codec
/// version this build writes (regenerated when it changes), so replaying them runs the
/// decoder to its end: whole and damaged ones reach the hash check (their id, the hash
/// of the input, matches no decoded bytes), cut ones stop at a truncation.
#[test]
fn committed_chunk_seeds_reach_the_decoders_hash_check() {
    use tensor_history::codec::{decode, CodecError, Header, Method};
    use tensor_history::ContentHash;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/chunk_decode");
    let mut methods = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the chunk_decode corpus") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("decode-") {
            continue;
        }
        let data = std::fs::read(&path).expect("a corpus file");
        let encoded = &data[1..];
        let h = Header::parse(encoded, 64 * 1024).unwrap_or_else(|e| panic!("{name}: {e}"));
        let base: Vec<u8> = (0..h.raw_len).map(|i| (i * 7 % 251) as u8).collect();
        let r = decode(
            encoded,
            &ContentHash::of_bytes(encoded),
            64 * 1024,
            Some(&base),
        );
        if name.ends_with("-cut") {
            assert!(
                matches!(r, Err(CodecError::Truncated { .. })),
                "{name}: {r:?}"
            );
        } else {
            assert!(
                matches!(r, Err(CodecError::HashMismatch { .. })),
                "{name}: {r:?}"
            );
            methods.push((h.method, h.width, h.raw_planes));
        }
    }
    // Every method, and deltas with planes both raw and zstd-coded.
    for m in [
        Method::Raw,
        Method::Planes,
        Method::XorPlanes,
        Method::DiffPlanes,
    ] {
        assert!(
            methods.iter().any(|s| s.0 == m),
            "no seed of {m}: {methods:?}"
        );
    }
    for delta in [Method::XorPlanes, Method::DiffPlanes] {
        assert!(
            methods
                .iter()
                .any(|&(m, w, raw)| m == delta && raw != 0 && u32::from(raw) != (1u32 << w) - 1),
            "no {delta} seed with mixed planes: {methods:?}"
        );
    }
}
