//! The model-based property tests: the store and the repository against naive models
//! written from the contract (`tests/model`), and the replay of the fuzz corpora. CI runs
//! this binary again in release with more cases (`TH_PROPTEST_CASES`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../model/mod.rs"]
mod model;

mod fuzz_replay;
mod history_model;
mod repo_model;
mod tensor_writes_model;
