//! The repository's file formats, one file for each thing encoded: the envelope every
//! binary object shares (`envelope`), the direct reader of its postcard bodies (`wire`),
//! the bodies themselves (`bodies`), object keys (`keys`) and the small JSON files
//! (`json`). Packs have a layout of their own, in `repo/pack.rs`. `docs/FORMAT.md`
//! describes the same in prose.

mod bodies;
mod envelope;
mod json;
mod keys;
mod wire;

pub(crate) use bodies::*;
pub(crate) use envelope::*;
pub(crate) use json::*;
pub(crate) use keys::*;
pub(crate) use wire::*;

use super::backend::{is_not_found, Backend, Bytes};
use super::pack::parse_pack;
use crate::error::{Error, Result};

pub(crate) fn corrupt(path: &str, reason: impl Into<String>) -> Error {
    Error::CorruptObject {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Read an object that another object names, turning "not found" into a
/// corrupt-repository error naming it.
pub(crate) fn must_get(backend: &dyn Backend, key: &str) -> Result<Bytes> {
    backend.get(key).map_err(|e| {
        if is_not_found(&e) {
            corrupt(key, "missing (the repository refers to it)")
        } else {
            e
        }
    })
}

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
