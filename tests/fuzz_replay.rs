//! Replays every committed fuzz input on stable, so CI checks what the fuzzers found
//! without a nightly toolchain: each file under `fuzz/corpus/<target>/` is decoded and run
//! as the target would run it. A new target adds one line to `TARGETS`.

mod model;

use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};

/// Runs one input the way `fuzz/fuzz_targets/store_actions.rs` does.
fn store_actions(data: &[u8]) -> Result<(), String> {
    // libfuzzer-sys decodes a target's argument with `arbitrary_take_rest`.
    let Ok(input) = model::driver::Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return Ok(()); // the target skips undecodable input the same way
    };
    model::driver::run_input(&input).map_err(|e| e.to_string())
}

/// How one target runs one input: `Err` describes the failure.
type Runner = fn(&[u8]) -> Result<(), String>;

/// `(target, runner)`: the corpus directory `fuzz/corpus/<target>` and how to run a file.
const TARGETS: &[(&str, Runner)] = &[("store_actions", store_actions)];

#[test]
fn every_committed_fuzz_input_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, run) in TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no corpus for {target}");
        for file in &files {
            let data = std::fs::read(file).expect("a corpus file");
            if let Err(e) = run(&data) {
                panic!("{target}: {} fails: {e}", file.display());
            }
        }
        println!("{target}: {} inputs replayed", files.len());
    }
}
