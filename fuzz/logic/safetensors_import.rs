//! `Store::import_safetensors` on arbitrary bytes: a typed error that imports nothing,
//! or exactly the tensors the reference parser reads, which export back to a file the
//! reference parser reads the same.
//!
//! Shared by the cargo-fuzz target and the corpus replay in `tests/oracles/fuzz_replay.rs`.

use std::path::PathBuf;
use std::sync::OnceLock;

use safetensors::SafeTensors;
use tensor_history::{Config, Error, Store};

/// One scratch directory per process for the file under test.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory").keep())
}

/// Import `data` as a file; check the outcome against the reference parser.
pub fn run(data: &[u8]) {
    let path = scratch().join(format!(
        "input-{:?}.safetensors",
        std::thread::current().id()
    ));
    std::fs::write(&path, data).expect("write the input file");
    let mut store = Store::with_config(Config {
        chunk_bytes: 64,
        ..Config::default()
    })
    .expect("valid config");
    store
        .insert("taken", &ndarray::arr1(&[1.0f32, 2.0]))
        .expect("insert");
    let reference = SafeTensors::deserialize(data);
    match store.import_safetensors(&path) {
        Ok(names) => {
            let reference = reference.expect("imported a file the reference parser rejects");
            assert_eq!(names.len(), reference.len());
            for name in &names {
                let view = reference
                    .tensor(name)
                    .expect("an imported name is in the file");
                let t = store
                    .tensor(name)
                    .expect("an imported name is in the store");
                assert_eq!(t.shape(), view.shape());
                let bytes: Vec<u8> = t
                    .chunks()
                    .flat_map(|c| c.bytes().unwrap().to_vec())
                    .collect();
                assert_eq!(bytes, view.data());
                assert!(t.chunks().all(|c| c.len_bytes() <= 64));
            }
            // Export back: the reference parser reads the same tensors.
            let out = scratch().join(format!(
                "output-{:?}.safetensors",
                std::thread::current().id()
            ));
            store
                .working_snapshot()
                .write_safetensors(&out)
                .expect("export");
            let written = std::fs::read(&out).expect("read the export");
            let again = SafeTensors::deserialize(&written).expect("the export parses");
            for name in &names {
                assert_eq!(
                    again.tensor(name).expect("exported").data(),
                    reference.tensor(name).expect("in the file").data()
                );
            }
            store.verify().expect("verify after import");
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::InvalidSafeTensors { .. }
                        | Error::UnsupportedSafeTensorsDType { .. }
                        | Error::VariableExists { .. }
                ),
                "unexpected error {e:?}"
            );
            if matches!(e, Error::InvalidSafeTensors { .. }) {
                assert!(
                    reference.is_err(),
                    "rejected a file the reference parser reads"
                );
            }
            assert_eq!(
                store.names(),
                vec!["taken".to_string()],
                "a failed import changed the store"
            );
        }
    }
}
