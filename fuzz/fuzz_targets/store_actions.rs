//! Random store actions (decoded from the fuzzer's bytes) applied to a `Store` and to the
//! deep-copy model of `tests/model`: after every step everything observable must agree,
//! a call that fails must change nothing, and `verify()` must pass.
#![no_main]

#[path = "../../tests/model/mod.rs"]
mod model;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: model::driver::Input| {
    if let Err(e) = model::driver::run_input(&input) {
        panic!("{e}");
    }
});
