//! Every repository object parser (`tensor_history::parse_object`: config, HEAD, refs,
//! pruned markers, packs, indexes, manifests, versions, gc records, gc generation
//! entries) on arbitrary bytes: `Ok`, or a typed error naming the object; never a panic,
//! never a huge allocation.
//!
//! The first input byte picks the object kind; with its high bit set the input is sealed
//! with a valid BLAKE3 trailer, so the fuzzer reaches the body parsers behind the
//! checksum. Shared by the cargo-fuzz target and `tests/oracles/fuzz_replay.rs`.

use tensor_history::{parse_object, Error};

const ID: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Check `data` as one repository object.
pub fn run(data: &[u8]) {
    let Some((&select, rest)) = data.split_first() else {
        return;
    };
    let keys = [
        "config.json".to_owned(),
        "HEAD.json".to_owned(),
        "refs/main/00000000000000000001.json".to_owned(),
        format!("pruned/{ID}.json"),
        format!("packs/00/{ID}.thpack"),
        format!("index/{ID}.thidx"),
        format!("manifests/00/{ID}.thman"),
        format!("versions/00/{ID}.thver"),
        format!("gc/{ID}.thgc"),
        "gc/generations/00000000000000000001.json".to_owned(),
    ];
    let key = &keys[usize::from(select & 0x7f) % keys.len()];
    let mut bytes = rest.to_vec();
    if select & 0x80 != 0 {
        bytes.extend_from_slice(blake3::hash(rest).as_bytes());
    }
    match parse_object(key, &bytes) {
        Ok(()) => {}
        Err(Error::CorruptObject { path, .. } | Error::UnsupportedFormat { path, .. }) => {
            assert_eq!(&path, key, "the error names another object");
        }
        Err(e) => panic!("{key}: unexpected error {e:?}"),
    }
}
