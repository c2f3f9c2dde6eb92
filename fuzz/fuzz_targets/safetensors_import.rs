//! Fuzz `Store::import_safetensors` with arbitrary file contents.
#![no_main]

#[path = "../logic/safetensors_import.rs"]
mod logic;

libfuzzer_sys::fuzz_target!(|data: &[u8]| logic::run(data));
