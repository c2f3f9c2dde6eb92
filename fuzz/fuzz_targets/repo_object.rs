//! Fuzz every repository object parser.
#![no_main]

#[path = "../logic/repo_object.rs"]
mod logic;

libfuzzer_sys::fuzz_target!(|data: &[u8]| logic::run(data));
