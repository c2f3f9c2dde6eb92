//! The small JSON files: `config.json`, `HEAD.json`, ref log entries, prune markers and
//! gc generation entries.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::corrupt;
use crate::error::Result;
use crate::hash::ContentHash;
use crate::version::RefKind;

/// The format name in `config.json`.
pub(crate) const FORMAT_NAME: &str = "tensor-history";

/// `config.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ConfigJson {
    pub(crate) format: String,
    pub(crate) version: u64,
    /// A random id given at creation, so that a store can tell a repository created
    /// again at the same location from the one it connected to (absent in older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
}

/// A new repository id: 32 hex digits, from the time, the process and a counter.
pub(crate) fn new_repository_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let local = 0u8;
    h.update(&(std::ptr::addr_of!(local) as usize).to_le_bytes());
    h.finalize().to_hex()[..32].to_owned()
}

/// One entry of a ref's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RefEntry {
    pub(crate) kind: EntryKind,
    /// The version (absent for `deleted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<ContentHash>,
}

/// What a ref log entry records: the ref is a branch or a tag (with a version), or was
/// deleted (without one). Written as `"branch"`, `"tag"` or `"deleted"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EntryKind {
    Branch,
    Tag,
    Deleted,
}

impl EntryKind {
    /// The kind as written on disk.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            EntryKind::Branch => "branch",
            EntryKind::Tag => "tag",
            EntryKind::Deleted => "deleted",
        }
    }
}

impl From<RefKind> for EntryKind {
    fn from(k: RefKind) -> EntryKind {
        match k {
            RefKind::Branch => EntryKind::Branch,
            RefKind::Tag => EntryKind::Tag,
        }
    }
}

/// `HEAD.json`: attached to a branch, or detached at a version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HeadJson {
    Branch(String),
    Detached(ContentHash),
}

/// `pruned/<2hex>/<id>.json`: a version dropped by `prune`, with its parents, so that
/// its children can be linked past it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PrunedJson {
    pub(crate) parents: Vec<ContentHash>,
}

/// `gc/generations/<seq:020>.json`: created by a gc run before it deletes anything, and
/// replaced by the same run with `closed_ns` set when it is done deleting. The highest
/// `seq` is the repository's gc generation. A save that wrote again an object that a
/// record named here lists reads the body: until the run closed its entry or passed its
/// deadline, the run may still delete that object (see `docs/FORMAT.md`, Garbage
/// collection). Entries written before these fields existed hold only `time_ns`: they
/// are read as covering every record, with the deadline `time_ns` +
/// [`DEFAULT_DELETE_WITHIN`](crate::DEFAULT_DELETE_WITHIN).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GenerationJson {
    /// When the gc run started deleting, in nanoseconds since the Unix epoch.
    pub(crate) time_ns: u64,
    /// The gc records (keys) whose objects the run may delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) records: Option<Vec<String>>,
    /// The run starts no deletion at or after this time (its clock, nanoseconds since
    /// the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deadline_ns: Option<u64>,
    /// When the run was done deleting (it deletes nothing after): set when it closes
    /// its entry, whether it finished, stopped at its deadline or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) closed_ns: Option<u64>,
}

pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(path: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(path, format!("unreadable JSON: {e}")))
}

pub(crate) fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}
