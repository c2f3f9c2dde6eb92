//! Object keys: where each kind of object lives in a repository, and the ids and ref
//! names read back from keys.

use crate::hash::ContentHash;

pub(crate) const CONFIG_KEY: &str = "config.json";
pub(crate) const HEAD_KEY: &str = "HEAD.json";
pub(crate) const REFS_PREFIX: &str = "refs/";
pub(crate) const INDEX_PREFIX: &str = "index/";
pub(crate) const PACKS_PREFIX: &str = "packs/";
pub(crate) const MANIFESTS_PREFIX: &str = "manifests/";
pub(crate) const VERSIONS_PREFIX: &str = "versions/";
pub(crate) const PRUNED_PREFIX: &str = "pruned/";
pub(crate) const GC_PREFIX: &str = "gc/";
pub(crate) const GENERATIONS_PREFIX: &str = "gc/generations/";

fn fanout(prefix: &str, id: &ContentHash, ext: &str) -> String {
    let hex = id.to_string();
    format!("{prefix}{}/{hex}.{ext}", &hex[..2])
}

pub(crate) fn pack_key(id: &ContentHash) -> String {
    fanout(PACKS_PREFIX, id, "thpack")
}
pub(crate) fn manifest_key(id: &ContentHash) -> String {
    fanout(MANIFESTS_PREFIX, id, "thman")
}
pub(crate) fn version_key(id: &ContentHash) -> String {
    fanout(VERSIONS_PREFIX, id, "thver")
}
pub(crate) fn pruned_key(id: &ContentHash) -> String {
    fanout(PRUNED_PREFIX, id, "json")
}
pub(crate) fn index_key(id: &ContentHash) -> String {
    format!("{INDEX_PREFIX}{id}.thidx")
}
pub(crate) fn gc_key(id: &ContentHash) -> String {
    format!("{GC_PREFIX}{id}.thgc")
}

/// `gc/generations/<seq:020>.json`.
pub(crate) fn generation_key(seq: u64) -> String {
    format!("{GENERATIONS_PREFIX}{seq:020}.json")
}

/// The sequence number of a gc generation key.
pub(crate) fn parse_generation_key(key: &str) -> Option<u64> {
    let seq = key
        .strip_prefix(GENERATIONS_PREFIX)?
        .strip_suffix(".json")?;
    if seq.len() != 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// The id in a content-addressed key (`.../<64 hex>.<ext>`), if it is one.
pub(crate) fn id_of_key(key: &str, ext: &str) -> Option<ContentHash> {
    let name = key.rsplit('/').next()?;
    let hex = name.strip_suffix(ext)?.strip_suffix('.')?;
    hex.parse().ok()
}

/// A ref name as one key component: ASCII letters, digits, `-` and `_` as they are,
/// every other byte as `%XX`.
pub(crate) fn encode_ref_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn decode_ref_name(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `refs/<name>/<seq:020>.json`.
pub(crate) fn ref_key(name: &str, seq: u64) -> String {
    format!("{REFS_PREFIX}{}/{seq:020}.json", encode_ref_name(name))
}

/// The name and sequence number of a ref log key.
pub(crate) fn parse_ref_key(key: &str) -> Option<(String, u64)> {
    let rest = key.strip_prefix(REFS_PREFIX)?;
    let (enc, file) = rest.split_once('/')?;
    let seq = file.strip_suffix(".json")?;
    if seq.len() != 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((decode_ref_name(enc)?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_names_round_trip_through_keys() {
        for name in ["main", "a/b", "../x", "v1.0", "ünï", "%41", "a b"] {
            let key = ref_key(name, 7);
            assert_eq!(parse_ref_key(&key), Some((name.to_owned(), 7)), "{key}");
            assert_eq!(key.matches('/').count(), 2, "{key}");
        }
    }

    #[test]
    fn the_ref_name_length_check_agrees_with_the_encoder() {
        for name in ["main", "a/b", "ünï", "%41", "a b", "x-y_z", "日本", ""] {
            assert_eq!(
                crate::history::ref_name_key_len(name),
                encode_ref_name(name).len(),
                "{name}"
            );
        }
    }

    #[test]
    fn generation_keys_round_trip_and_reject_other_names() {
        for seq in [0, 1, 42, u64::MAX] {
            assert_eq!(parse_generation_key(&generation_key(seq)), Some(seq));
        }
        for key in [
            "gc/generations/1.json",
            "gc/generations/0000000000000000000a.json",
            "gc/generations/00000000000000000001.json.tmp",
            "gc/00000000000000000001.json",
            "gc/generations/99999999999999999999.json",
        ] {
            assert_eq!(parse_generation_key(key), None, "{key}");
        }
    }
}
