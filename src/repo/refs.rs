//! Ref logs: the one reader of `refs/<name>/<seq:020>.json`. A ref's state is the latest
//! entry of its log (the highest `seq`); entries are only ever created (create-if-absent),
//! so a save moves a ref by creating the entry after the one it saw, and gc trims the
//! entries before the latest.

use std::collections::BTreeMap;

use super::backend::Backend;
use super::format::{
    corrupt, encode_ref_name, must_get, parse_json, parse_ref_key, EntryKind, RefEntry, REFS_PREFIX,
};
use crate::error::Result;
use crate::hash::ContentHash;
use crate::history::Ref;
use crate::version::VersionId;

/// The latest entry of one ref's log, as a listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Latest {
    pub(crate) seq: u64,
    /// The entry's key.
    pub(crate) key: String,
}

/// The latest entry of each ref log among `keys` (a listing; keys that are not ref log
/// entries are skipped). Of two keys of one name and `seq` (two spellings of one name),
/// the greater key.
pub(crate) fn latest_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, Latest> {
    let mut latest: BTreeMap<String, Latest> = BTreeMap::new();
    for key in keys {
        let Some((name, seq)) = parse_ref_key(key) else {
            continue;
        };
        let slot = latest.entry(name).or_insert_with(|| Latest {
            seq,
            key: key.to_owned(),
        });
        if (seq, key) > (slot.seq, slot.key.as_str()) {
            *slot = Latest {
                seq,
                key: key.to_owned(),
            };
        }
    }
    latest
}

/// A ref log entry: `branch` or `tag` with a version, or `deleted` without one. Anything
/// else is an error naming the entry (never a ref silently dropped).
pub(crate) fn parse_entry(key: &str, bytes: &[u8]) -> Result<RefEntry> {
    let e: RefEntry = parse_json(key, bytes)?;
    match (e.kind, e.version.is_some()) {
        (EntryKind::Branch | EntryKind::Tag, true) | (EntryKind::Deleted, false) => Ok(e),
        (kind, _) => Err(corrupt(
            key,
            format!(
                "a ref entry of kind `{}` with the version field wrong or absent",
                kind.name()
            ),
        )),
    }
}

/// Read and check the entry at `key`.
///
/// # Errors
///
/// [`Error::Io`](crate::Error::Io); [`Error::CorruptObject`](crate::Error::CorruptObject)
/// for an entry that is missing or does not parse.
pub(crate) fn read_entry(backend: &dyn Backend, key: &str) -> Result<RefEntry> {
    parse_entry(key, &must_get(backend, key)?)
}

/// The latest entry of ref `name`'s log, if it has one. One listing of the log.
///
/// # Errors
///
/// As for [`read_entry`].
pub(crate) fn read_latest(backend: &dyn Backend, name: &str) -> Result<Option<(u64, RefEntry)>> {
    let prefix = format!("{REFS_PREFIX}{}/", encode_ref_name(name));
    let listing = backend.list_keys(&prefix)?;
    match latest_keys(listing.iter().map(String::as_str))
        .into_values()
        .next()
    {
        None => Ok(None),
        Some(l) => Ok(Some((l.seq, read_entry(backend, &l.key)?))),
    }
}

/// The latest entry of every ref's log. One listing of `refs/`.
///
/// # Errors
///
/// As for [`read_entry`].
pub(crate) fn read_all(backend: &dyn Backend) -> Result<BTreeMap<String, (u64, RefEntry)>> {
    let listing = backend.list_keys(REFS_PREFIX)?;
    latest_keys(listing.iter().map(String::as_str))
        .into_iter()
        .map(|(name, l)| Ok((name, (l.seq, read_entry(backend, &l.key)?))))
        .collect()
}

/// The entry ref `r` should have in the repository (`None`: the ref is deleted), given
/// the content addresses of saved versions.
pub(crate) fn entry_of(
    r: Option<&Ref>,
    hash_of: &impl Fn(VersionId) -> Option<ContentHash>,
) -> RefEntry {
    match r {
        Some(r) => RefEntry {
            kind: r.kind().into(),
            version: hash_of(r.target()),
        },
        None => RefEntry {
            kind: EntryKind::Deleted,
            version: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::format::ref_key;

    #[test]
    fn the_latest_key_of_each_log_wins_and_other_keys_are_skipped() {
        let keys = [
            ref_key("main", 3),
            ref_key("main", 10),
            ref_key("main", 9),
            ref_key("a/b", 0),
            "refs/main/notanumber.json".to_owned(),
            "refs/x".to_owned(),
            "HEAD.json".to_owned(),
        ];
        let latest = latest_keys(keys.iter().map(String::as_str));
        assert_eq!(latest.len(), 2);
        assert_eq!(latest["main"].seq, 10);
        assert_eq!(latest["main"].key, ref_key("main", 10));
        assert_eq!(latest["a/b"].seq, 0);
    }
}
