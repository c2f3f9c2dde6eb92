//! Fuzz the chunk decoder, and round trips through the encoder.
#![no_main]

#[path = "../logic/chunk_decode.rs"]
mod logic;

libfuzzer_sys::fuzz_target!(|data: &[u8]| logic::run(data));
