//! Any repository object parsed from its key and bytes: the entry point that reaches
//! every parser behind `Store::open` (the JSON files, the binary bodies in `format/` and
//! the pack layout in `pack.rs`), for fuzzing and for tools such as the CLI's `verify`.

use super::format::{
    corrupt, parse_gc, parse_generation_key, parse_index, parse_json, parse_manifest,
    parse_version, ConfigJson, GenerationJson, HeadJson, PrunedJson, RefEntry, CONFIG_KEY,
    GENERATIONS_PREFIX, HEAD_KEY, PRUNED_PREFIX, REFS_PREFIX,
};
use super::pack::parse_pack;
use crate::error::Result;

/// Parse any repository object from its key and bytes, for fuzzing and tools: every
/// parser behind `Store::open` is reached from here. Never panics; garbage gives
/// [`Error::CorruptObject`] or [`Error::UnsupportedFormat`].
///
/// # Errors
///
/// As described.
#[doc(hidden)]
pub fn parse_object(key: &str, bytes: &[u8]) -> Result<()> {
    if key == CONFIG_KEY {
        parse_json::<ConfigJson>(key, bytes).map(|_| ())
    } else if key == HEAD_KEY {
        parse_json::<HeadJson>(key, bytes).map(|_| ())
    } else if key.starts_with(REFS_PREFIX) {
        parse_json::<RefEntry>(key, bytes).map(|_| ())
    } else if key.starts_with(PRUNED_PREFIX) {
        parse_json::<PrunedJson>(key, bytes).map(|_| ())
    } else if key.starts_with(GENERATIONS_PREFIX) {
        if parse_generation_key(key).is_none() {
            return Err(corrupt(key, "not a gc generation key"));
        }
        parse_json::<GenerationJson>(key, bytes).map(|_| ())
    } else if key.ends_with(".thpack") {
        parse_pack(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thidx") {
        parse_index(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thman") {
        parse_manifest(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thver") {
        parse_version(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thgc") {
        parse_gc(key, bytes, None).map(|_| ())
    } else {
        Err(corrupt(key, "not a repository object key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::format::{FORMAT_VERSION, HEADER_LEN, MAGIC};

    #[test]
    fn every_parser_survives_garbage() {
        let keys = [
            CONFIG_KEY,
            HEAD_KEY,
            "refs/main/00000000000000000000.json",
            "pruned/ab/x.json",
            "packs/ab/x.thpack",
            "index/x.thidx",
            "manifests/ab/x.thman",
            "versions/ab/x.thver",
            "gc/x.thgc",
            "gc/generations/00000000000000000001.json",
        ];
        let mut seed = 1u64;
        for key in keys {
            for len in [0usize, 1, 10, 42, 100, 300] {
                let mut bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        (seed >> 33) as u8
                    })
                    .collect();
                assert!(parse_object(key, &bytes).is_err());
                if bytes.len() >= HEADER_LEN {
                    bytes[..7].copy_from_slice(&MAGIC);
                    bytes[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                    assert!(parse_object(key, &bytes).is_err());
                }
            }
        }
    }
}
