//! The chunk source of a repository: its chunk index (read from the index files), and
//! the loader of stored chunks, which reads them from their packs on first use.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::backend::{is_not_found, Backend, Bytes};
use super::format::{
    corrupt, encode_index_in, manifest_key, pack_key, parse_manifest, IndexBody, Manifest,
    CONFIG_KEY, FORMAT_VERSION, INDEX_PREFIX,
};
use super::index::{read_index_files, IndexFile, IndexFiles};
use super::pack::{self, Loc};
use crate::chunk::{Chunk, ChunkSource, WeakChunk};
use crate::codec;
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// Builds [`IdHasher`]s with a per-process random key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdState(u64);

impl Default for IdState {
    fn default() -> Self {
        use std::hash::BuildHasher;
        static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        IdState(*KEY.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64)))
    }
}

impl std::hash::BuildHasher for IdState {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.0)
    }
}

/// Hashes content ids for hash maps: a keyed folded multiply over their 8-byte words,
/// several times cheaper than SipHash on the tens of thousands of chunk ids an open
/// looks up. The per-process key keeps a crafted repository from aiming collisions.
pub(crate) struct IdHasher(u64);

impl IdHasher {
    fn mix(&mut self, w: u64) {
        let m = u128::from(self.0 ^ w) * 0x9E37_79B9_7F4A_7C15_u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map keyed by content ids.
pub(crate) type IdMap<V> = HashMap<ContentHash, V, IdState>;

/// The chunk index of a repository, and the loader of stored chunks.
pub(crate) struct RepoChunks {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) index: RwLock<IdMap<Loc>>,
    /// Index files read into `index`.
    indexes: Mutex<HashSet<ContentHash>>,
    /// Index files that failed their checksum (left by an interrupted save, or damaged).
    pub(crate) bad_indexes: Mutex<Vec<String>>,
    /// Index ids that some index read supersedes.
    superseded: Mutex<HashSet<ContentHash>>,
    /// Stored chunks handed out, so that each is one shared handle; sharded by the
    /// first byte of the id so that tensors built in parallel rarely wait.
    stored: [Mutex<IdMap<WeakChunk>>; STORED_SHARDS],
    /// The repository's format version (`config.json`): what packs and index files
    /// this store writes there.
    format: AtomicU16,
}

/// The longest delta chain a reader follows (links, the chunk's own included):
/// writers cut chains at [`MAX_DELTA_CHAIN`](super::pack::MAX_DELTA_CHAIN) links; a
/// longer chain is refused as damaged before anything past it is read.
pub(crate) const MAX_READ_CHAIN: usize = 64;

/// Shards of [`RepoChunks`]'s table of stored chunks.
const STORED_SHARDS: usize = 16;

impl fmt::Debug for RepoChunks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RepoChunks")
            .field("backend", &self.backend.location())
            .finish()
    }
}

impl RepoChunks {
    /// The chunk index of the repository behind `backend`, empty until
    /// [`read_indexes`](Self::read_indexes).
    pub(crate) fn new(backend: Arc<dyn Backend>) -> RepoChunks {
        RepoChunks {
            backend,
            index: RwLock::new(IdMap::default()),
            indexes: Mutex::new(HashSet::new()),
            bad_indexes: Mutex::new(Vec::new()),
            superseded: Mutex::new(HashSet::new()),
            stored: std::array::from_fn(|_| Mutex::new(IdMap::default())),
            format: AtomicU16::new(FORMAT_VERSION),
        }
    }

    /// The repository's format version.
    pub(crate) fn format(&self) -> u16 {
        self.format.load(Ordering::Relaxed)
    }

    /// Set the repository's format version (read from its `config.json`).
    pub(crate) fn set_format(&self, format: u16) {
        self.format.store(format, Ordering::Relaxed);
    }

    /// The stored chunk handle of `id` if one is alive and its bytes are in memory.
    fn resident(&self, id: &ContentHash) -> Option<Chunk> {
        let shard = &self.stored[usize::from(id.0[0]) % STORED_SHARDS];
        let cache = shard.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(id)
            .and_then(WeakChunk::upgrade)
            .filter(|c| !c.is_unloaded())
    }

    /// The one shared handle of stored chunk `id` of `len` bytes.
    pub(crate) fn stored_chunk(self: &Arc<Self>, id: ContentHash, len: usize) -> Chunk {
        let shard = &self.stored[usize::from(id.0[0]) % STORED_SHARDS];
        let mut cache = shard.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(&id).and_then(WeakChunk::upgrade) {
            if c.len_bytes() == len {
                return c;
            }
        }
        let source: Arc<dyn ChunkSource> = self.clone();
        let c = Chunk::stored(id, len, source);
        if cache.len() > 1024 && cache.len().is_power_of_two() {
            cache.retain(|_, w| w.is_alive());
        }
        cache.insert(id, c.downgrade());
        c
    }

    pub(crate) fn locate(&self, id: &ContentHash) -> Option<Loc> {
        self.index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
    }

    /// [`locate`](Self::locate) for many ids under one lock.
    pub(crate) fn locate_all(&self, ids: &[ContentHash]) -> Vec<Option<Loc>> {
        let idx = self.index.read().unwrap_or_else(|p| p.into_inner());
        ids.iter().map(|id| idx.get(id).copied()).collect()
    }

    pub(crate) fn contains(&self, id: &ContentHash) -> bool {
        self.locate(id).is_some()
    }

    /// The error for a chunk that no index lists: [`Error::RepositoryReplaced`] if the
    /// repository itself is gone (deleted since the store connected: its history there
    /// cannot be read any more, and no object of it is to blame), else
    /// [`Error::CorruptObject`] naming what is missing.
    pub(crate) fn missing(&self, id: &ContentHash, wanted_by: &str) -> Error {
        self.missing_item("chunk", id, wanted_by)
            .unwrap_or_else(|| corrupt(wanted_by, format!("chunk {id} is in no index")))
    }

    /// Why `what` `id` (a chunk or a manifest) is in no index, if a reason is found: the
    /// repository is gone, an index did not read, or a pack no index lists holds it.
    fn missing_item(&self, what: &str, id: &ContentHash, wanted_by: &str) -> Option<Error> {
        match self.backend.get(CONFIG_KEY) {
            Err(e) if is_not_found(&e) => {
                return Some(Error::RepositoryReplaced {
                    location: self.backend.location(),
                    reason: format!(
                        "is gone (no config.json): it was deleted since this store connected \
                         to it, and {what} {id} of `{wanted_by}` was held only there"
                    ),
                })
            }
            _ => {}
        }
        let bad = self.bad_indexes.lock().unwrap_or_else(|p| p.into_inner());
        match bad.first() {
            Some(path) => Some(corrupt(
                path,
                format!("unreadable index; {what} {id} of `{wanted_by}` is in no readable index"),
            )),
            None => pack::unindexed_pack_holding(&*self.backend, &self.indexed_packs(), id).map(
                |pack| {
                    corrupt(
                        &pack,
                        format!(
                            "{what} {id} of `{wanted_by}` is in this pack, but no index lists \
                             the pack (its index file is missing)"
                        ),
                    )
                },
            ),
        }
    }
}

impl RepoChunks {
    /// The packs the index files read name.
    fn indexed_packs(&self) -> HashSet<ContentHash> {
        self.index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|l| l.pack)
            .collect()
    }

    /// Encode index `body` so that its id is not one that an index in the repository
    /// supersedes (readers would skip it): an index of the same content as a superseded
    /// one (a save writing chunks again into the same pack a gc deleted) also supersedes
    /// an id that names no index, derived from the superseded one.
    pub(crate) fn encode_index(&self, body: &mut IndexBody) -> (Vec<u8>, ContentHash) {
        let superseded = self.superseded.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let (bytes, id) = encode_index_in(self.format(), body);
            if !superseded.contains(&id) {
                return (bytes, id);
            }
            let mut salt = b"tensor-history index salt".to_vec();
            salt.extend_from_slice(&id.0);
            body.supersedes.push(ContentHash::of_bytes(&salt).0);
        }
    }

    /// Remember that index file `id` (written by this store) is in `index`.
    pub(crate) fn note_index(&self, id: Option<ContentHash>) {
        self.indexes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(id);
    }

    /// Read the index files not read yet; with `all`, forget everything and read every
    /// index file again (after gc rewrote packs). Returns whether everything was read
    /// again because a gc replaced an index read before (so it deleted objects).
    pub(crate) fn read_indexes(&self, all: bool) -> Result<bool> {
        let known: HashSet<ContentHash> = if all {
            HashSet::new()
        } else {
            self.indexes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        };
        let keys: Vec<String> = self.backend.list_keys(INDEX_PREFIX)?;
        let IndexFiles {
            read: fresh,
            damaged: bad,
            superseded,
        } = read_index_files(&*self.backend, keys.iter().map(String::as_str), &known)?;
        if !all && superseded.iter().any(|h| known.contains(h)) {
            // gc replaced an index this store read (its packs may be gone): start over.
            self.read_indexes(true)?;
            return Ok(true);
        }
        self.superseded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(superseded.iter().copied());
        let mut idx = self.index.write().unwrap_or_else(|p| p.into_inner());
        let mut indexes = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        if all {
            idx.clear();
            indexes.clear();
        }
        *self.bad_indexes.lock().unwrap_or_else(|p| p.into_inner()) = bad;
        for IndexFile { id, body, .. } in fresh {
            indexes.insert(id);
            if superseded.contains(&id) {
                continue;
            }
            for p in &body.packs {
                for e in &p.chunks {
                    idx.insert(
                        ContentHash(e.id),
                        Loc {
                            pack: ContentHash(p.pack),
                            span: e.span,
                        },
                    );
                }
            }
        }
        Ok(all)
    }

    /// Read and check manifest `id`, from the pack an index lists it in (format 4) or
    /// from its own object; with the name its errors give. A pack gc replaced since the
    /// indexes were read is found by reading them again, once.
    ///
    /// # Errors
    ///
    /// As for [`pack::read_manifest`].
    pub(crate) fn manifest(&self, id: &ContentHash) -> Result<(String, Manifest)> {
        let packed = |c: &Self| c.locate(id).filter(|l| l.span.form.is_plain());
        if let Some(loc) = packed(self) {
            return match pack::read_manifest(&*self.backend, id, Some(loc)) {
                Err(e) if is_not_found(&e) => {
                    self.read_indexes(true)?;
                    pack::read_manifest(&*self.backend, id, self.locate(id))
                }
                r => r,
            };
        }
        let key = manifest_key(id);
        match self.backend.get(&key) {
            Ok(bytes) => Ok((key.clone(), parse_manifest(&key, &bytes, Some(id))?)),
            Err(e) if is_not_found(&e) => {
                // In a pack of an index this store has not read (a gc replaced them)?
                self.read_indexes(true)?;
                if let Some(loc) = packed(self) {
                    return pack::read_manifest(&*self.backend, id, Some(loc));
                }
                Err(self
                    .missing_item("manifest", id, "a saved version")
                    .unwrap_or_else(|| corrupt(&key, "missing (the repository refers to it)")))
            }
            Err(e) => Err(e),
        }
    }

    fn load_once(&self, id: &ContentHash, len: usize) -> Result<Bytes> {
        let loc = self
            .locate(id)
            .ok_or_else(|| self.missing(id, "a stored chunk"))?;
        if loc.span.raw_len() != len as u64 {
            return Err(corrupt(
                &pack_key(&loc.pack),
                format!(
                    "chunk {id} is {} bytes in the index, {len} in its tensor",
                    loc.span.raw_len()
                ),
            ));
        }
        if loc.span.form.is_plain() {
            return pack::read_chunk(&*self.backend, id, &loc);
        }
        self.decode(id, loc, len)
    }

    /// The raw bytes of coded chunk `id` stored at `loc`: its chain of stored forms is
    /// read (each link's entry checked before its read, at most [`MAX_READ_CHAIN`]
    /// links, each of the chunk's raw length) down to a full chunk, a raw one, or a
    /// base whose bytes a live handle holds; then decoded in one pass and checked
    /// against `id` once. Allocates at most the links' stored bytes and one chunk.
    /// When the decoded bytes are wrong, each link is decoded on its own to name the
    /// pack at fault.
    fn decode(&self, id: &ContentHash, loc: Loc, len: usize) -> Result<Bytes> {
        let mut links: Vec<(ContentHash, Loc, Bytes)> = Vec::new();
        let mut end: Option<Bytes> = None;
        let mut held: Option<Chunk> = None;
        let (mut cur, mut at) = (*id, loc);
        loop {
            let key = pack_key(&at.pack);
            if at.span.raw_len() != len as u64 {
                return Err(corrupt(
                    &key,
                    format!(
                        "chunk {cur}, a link of chunk {id}'s delta chain, is {} bytes, the \
                         chunk {len}",
                        at.span.raw_len()
                    ),
                ));
            }
            let stored = pack::read_stored(&*self.backend, &cur, &at)?;
            if at.span.form.is_plain() {
                end = Some(pack::check_raw(&key, &cur, &at.span, stored)?);
                break;
            }
            links.push((cur, at, stored));
            let Some(base) = at.span.base() else { break };
            if let Some(c) = self.resident(&base) {
                held = Some(c);
                break;
            }
            if links.len() >= MAX_READ_CHAIN {
                return Err(corrupt(
                    &key,
                    format!("chunk {id}'s delta chain is longer than {MAX_READ_CHAIN} links"),
                ));
            }
            at = self
                .locate(&base)
                .ok_or_else(|| self.missing(&base, &format!("the delta chain of chunk {id}")))?;
            cur = base;
        }
        let base: Option<&[u8]> = match (&end, &held) {
            (Some(b), _) => Some(b),
            (None, Some(c)) => Some(c.data()),
            (None, None) => None,
        };
        let encoded: Vec<&[u8]> = links.iter().map(|l| &l.2[..]).collect();
        match codec::decode_chain(&encoded, base, id, len) {
            Ok(bytes) => Ok(bytes),
            Err(e) => {
                // Name the link at fault: decode from the chain's end, each link against
                // its own id; the first that fails is damaged (or its entry is).
                let mut below: Option<Bytes> = None;
                for (i, (h, l, _)) in links.iter().enumerate().rev() {
                    let b = below.as_deref().or(base);
                    match codec::decode_chain(&encoded[i..=i], b, h, len) {
                        Ok(bytes) => below = Some(bytes),
                        Err(e) => {
                            return Err(corrupt(
                                &pack_key(&l.pack),
                                format!(
                                    "chunk {h} at offset {} does not decode: {e}",
                                    l.span.offset
                                ),
                            ))
                        }
                    }
                }
                Err(corrupt(
                    &pack_key(&loc.pack),
                    format!(
                        "chunk {id} at offset {} does not decode: {e}",
                        loc.span.offset
                    ),
                ))
            }
        }
    }
}

impl ChunkSource for RepoChunks {
    fn load(&self, id: &ContentHash, len: usize) -> Result<Bytes> {
        match self.load_once(id, len) {
            // gc may have rewritten the pack: read the indexes again and retry once.
            Err(e) if is_not_found(&e) || self.locate(id).is_none() => {
                self.read_indexes(true)?;
                self.load_once(id, len)
            }
            r => r,
        }
    }
}

/// Bytes stored chunk `c` takes in its repository's pack (`None` if it is no stored
/// chunk of a repository, or no index lists it). O(1).
pub(crate) fn stored_len_of(c: &Chunk) -> Option<usize> {
    let source: &dyn std::any::Any = c.source()?.as_ref();
    let repo = source.downcast_ref::<RepoChunks>()?;
    let loc = repo.locate(&c.cached_hash()?)?;
    usize::try_from(loc.span.stored_len()).ok()
}
