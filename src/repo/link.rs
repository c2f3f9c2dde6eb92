//! A store's link to its repository ([`RepoLink`]): the backend, what the repository
//! holds as far as the store knows, and what it last saw of refs, HEAD and gc.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use super::backend::{is_not_found, Backend};
use super::chunks::RepoChunks;
use super::format::{HeadJson, RefEntry, CONFIG_KEY};
use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::History;
use crate::store::Store;
use crate::version::VersionId;

/// A store's link to its repository: what the repository holds, as far as this store
/// knows, and what it last saw of the refs.
// Invariant: `saved` and `by_hash` are inverse maps; every saved version's ancestors are
// saved; `refs_seen` holds, per ref name, the last log entry this store read or wrote.
pub(crate) struct RepoLink {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) location: String,
    pub(crate) chunks: Arc<RepoChunks>,
    pub(crate) saved: HashMap<VersionId, ContentHash>,
    pub(crate) by_hash: HashMap<ContentHash, VersionId>,
    /// Parents (content addresses) of the versions in `by_hash`.
    pub(crate) parents_of: HashMap<ContentHash, Vec<ContentHash>>,
    /// Manifests known to be in the repository.
    pub(crate) manifests: HashSet<ContentHash>,
    /// Prune markers in the repository: version → its parents.
    pub(crate) pruned: HashMap<ContentHash, Vec<ContentHash>>,
    pub(crate) refs_seen: BTreeMap<String, (u64, RefEntry)>,
    pub(crate) head_seen: Option<HeadJson>,
    /// Chunks recorded as gc candidates: a save writes them again rather than reuse them.
    pub(crate) gc_candidates: HashSet<ContentHash>,
    /// Objects (keys) recorded by gc records: a save writes them again rather than reuse
    /// them.
    pub(crate) gc_keys: HashSet<String>,
    /// Version objects this store saved or loaded that a gc has deleted since: a save
    /// that needs them writes them again.
    pub(crate) gone: HashSet<String>,
    /// The latest gc generation seen (`gc/generations/`; 0 without entries).
    pub(crate) generation: u64,
    /// The gc records (keys) seen: one that disappears means a gc run deleted objects.
    pub(crate) records_seen: HashSet<String>,
    /// A gc run may have deleted objects without a new generation or a record gone (it
    /// stopped at its deadline while a save wrote): the next catch-up lists again.
    pub(crate) relist: bool,
    /// `config.json` as read at connect: saves check that it is still there, unchanged.
    pub(crate) config: Vec<u8>,
    /// The `seq` each version was first written with, where the store gave it another id
    /// (renumbered at open): written again anywhere, a version keeps its content address.
    /// Carried over by `save_as` to the next repository.
    pub(crate) seqs: HashMap<VersionId, u64>,
    /// Ref states (kind and version, per name) this store saw in the repositories it was
    /// bound to before this one, carried over by `save_as`: a ref found in one of them
    /// is one this store moved on from, so its save moves it as a save there would.
    pub(crate) refs_seen_before: BTreeMap<String, Vec<RefEntry>>,
    /// Where `open` could not start at HEAD's version (see [`OpenFallback`]).
    pub(crate) fallback: Option<super::OpenFallback>,
    /// Versions recorded (saved or read) since the store last let heap chunks go: its
    /// next eviction looks at them (see [`Evictions`](super::Evictions)).
    pub(crate) unevicted: Vec<VersionId>,
}

impl fmt::Debug for RepoLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RepoLink")
            .field("location", &self.location)
            .field("saved_versions", &self.saved.len())
            .finish()
    }
}

impl RepoLink {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> RepoLink {
        RepoLink {
            location: backend.location(),
            chunks: Arc::new(RepoChunks::new(backend.clone())),
            backend,
            saved: HashMap::new(),
            by_hash: HashMap::new(),
            parents_of: HashMap::new(),
            manifests: HashSet::new(),
            pruned: HashMap::new(),
            refs_seen: BTreeMap::new(),
            head_seen: None,
            gc_candidates: HashSet::new(),
            gc_keys: HashSet::new(),
            gone: HashSet::new(),
            generation: 0,
            records_seen: HashSet::new(),
            relist: false,
            config: Vec::new(),
            seqs: HashMap::new(),
            refs_seen_before: BTreeMap::new(),
            fallback: None,
            unevicted: Vec::new(),
        }
    }

    /// [`Error::RepositoryReplaced`] if `config.json` is gone (the repository was
    /// deleted) or differs from the one read at connect (another repository was created
    /// at the location): a save must not write into a repository it did not connect to,
    /// nor report success for objects written where no repository is. One small read.
    pub(crate) fn check_config(&self) -> Result<()> {
        let reason = match self.backend.get(CONFIG_KEY) {
            Ok(bytes) if *bytes == *self.config => return Ok(()),
            Ok(_) => "was replaced by another repository since this store connected to it",
            Err(e) if is_not_found(&e) => {
                "is gone (no config.json): it was deleted since this store connected to it"
            }
            Err(e) => return Err(e),
        };
        Err(Error::RepositoryReplaced {
            location: self.location.clone(),
            reason: reason.into(),
        })
    }

    /// The links of the delta chain of chunk `id` in the repository (1 for a chunk
    /// stored whole), if a save may use the chunk as it is: it is in the index, and
    /// neither it nor any chunk its chain needs is in a pack a gc record lists (those
    /// may be deleted: the chunk is written again instead, and a delta is not taken
    /// against it). O(links) index lookups, at most
    /// [`MAX_READ_CHAIN`](super::chunks::MAX_READ_CHAIN).
    pub(crate) fn chain_links(&self, id: &ContentHash) -> Option<usize> {
        let mut cur = *id;
        for n in 1..=super::chunks::MAX_READ_CHAIN {
            if self.gc_candidates.contains(&cur) {
                return None;
            }
            match self.chunks.locate(&cur)?.span.base() {
                Some(base) => cur = base,
                None => return Some(n),
            }
        }
        None
    }

    /// The one shared handle of stored chunk `id` of `len` bytes.
    pub(crate) fn stored_chunk(&self, id: ContentHash, len: usize) -> Chunk {
        self.chunks.stored_chunk(id, len)
    }

    pub(crate) fn record_version(
        &mut self,
        id: VersionId,
        hash: ContentHash,
        parents: Vec<ContentHash>,
    ) {
        self.saved.insert(id, hash);
        self.unevicted.push(id);
        self.by_hash.insert(hash, id);
        self.parents_of.insert(hash, parents);
    }

    /// The version whose content address starts with the hex digits `text` (at least 4),
    /// among versions saved or loaded and still live in `hist`; `None` if `text` is not
    /// such a prefix of any.
    pub(crate) fn resolve_prefix(&self, hist: &History, text: &str) -> Result<Option<VersionId>> {
        resolve_prefix(&self.saved, hist, text)
    }
}

/// The version of `saved` whose content address starts with the hex digits `text` (see
/// [`RepoLink::resolve_prefix`]).
pub(crate) fn resolve_prefix(
    saved: &HashMap<VersionId, ContentHash>,
    hist: &History,
    text: &str,
) -> Result<Option<VersionId>> {
    if text.len() < 4 || text.len() > 64 || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let want = text.to_ascii_lowercase();
    let mut found: Vec<VersionId> = saved
        .iter()
        .filter(|(id, h)| hist.node(**id).is_ok() && h.to_string().starts_with(&want))
        .map(|(id, _)| *id)
        .collect();
    found.sort_unstable();
    match found.len() {
        0 => Ok(None),
        1 => Ok(Some(found[0])),
        n => Err(Error::AmbiguousRef {
            prefix: text.to_owned(),
            matches: n,
        }),
    }
}

impl Store {
    /// Where this store saves (`None` for a store that was never opened or saved to a
    /// repository). O(1).
    #[must_use]
    pub fn location(&self) -> Option<&str> {
        match (&self.repo, &self.bg.inflight) {
            (Some(b), _) => Some(b.location.as_str()),
            (None, Some(f)) => Some(f.location.as_str()),
            (None, None) => None,
        }
    }

    /// The backend this store saves to (`None` without a repository). O(1).
    #[must_use]
    pub fn backend(&self) -> Option<Arc<dyn Backend>> {
        match (&self.repo, &self.bg.inflight) {
            (Some(b), _) => Some(b.backend.clone()),
            (None, Some(f)) => Some(f.backend.clone()),
            (None, None) => None,
        }
    }
}
