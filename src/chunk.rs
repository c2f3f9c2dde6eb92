//! Chunks: immutable, `Arc`-shared pieces of a tensor's bytes with a lazily cached hash,
//! and the pool that recycles their buffers.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::buffer::Bytes;
use crate::element::Element;
use crate::error::Result;
use crate::hash::ContentHash;

/// Where the bytes of a stored chunk come from (a repository's packs, or an encoded form
/// held in memory): `load` returns exactly `len` bytes, 8-byte aligned, already checked
/// against `id`.
/// Stored chunks whose bytes were loaded into their handle, in this process: a handle
/// that holds its bytes holds more memory, and the memory budget's record of the
/// versions is rebuilt when this count moved.
static LOADS: AtomicU64 = AtomicU64::new(0);

/// How many stored chunks had their bytes loaded into their handle so far (see
/// [`LOADS`]).
pub(crate) fn loads() -> u64 {
    LOADS.load(Ordering::Relaxed)
}

pub(crate) trait ChunkSource: fmt::Debug + Send + Sync + Any {
    fn load(&self, id: &ContentHash, len: usize) -> Result<Bytes>;

    /// Whether the source is an encoded form in memory (not a repository).
    fn in_memory(&self) -> bool {
        false
    }
}

/// A chunk whose bytes live in a repository: loaded (mapped or fetched) on first read.
struct Stored {
    source: Arc<dyn ChunkSource>,
    bytes: OnceLock<Bytes>,
}

/// One piece of a tensor's flat (row-major, little-endian) bytes.
///
/// # Sharing
///
/// A `Chunk` is a reference-counted handle: cloning it is O(1) and shares the bytes.
/// Versions, snapshots and the working state hold the same chunks until one of them
/// writes; a write goes through a copy unless the chunk is uniquely owned
/// (copy-on-write). [`Chunk::ptr_eq`] makes sharing observable.
///
/// # Memory layout
///
/// The bytes live in a buffer of 8-byte words (so that every element type can be viewed
/// in place), next to the cached BLAKE3 hash. A buffer whose last holder drops may go
/// back to its store's pool, to be reused by the next copy-on-write without page faults.
#[derive(Clone)]
pub struct Chunk(Arc<ChunkData>);

// Invariant: `len <= words.len() * 8` for a heap chunk; a stored chunk has no words, its
// `hash` is set (its id) and its loaded bytes are `len` bytes with that hash; when `hash`
// is set it is the BLAKE3 hash of `bytes()`; a chunk reachable from more than one handle
// is never written.
pub(crate) struct ChunkData {
    words: Vec<u64>,
    len: usize,
    hash: OnceLock<ContentHash>,
    pool: Weak<Pool>,
    stored: Option<Box<Stored>>,
}

impl Chunk {
    /// The chunk's bytes (little-endian elements, row-major). A chunk stored in a
    /// repository is loaded (mapped or fetched, and checked against its hash) on first
    /// read: O(len) then, O(1) after.
    ///
    /// # Errors
    ///
    /// [`Error::Io`](crate::Error::Io) or
    /// [`Error::CorruptObject`](crate::Error::CorruptObject) if the chunk is stored in a
    /// repository and cannot be read (its pack was removed or damaged);
    /// [`Error::RepositoryReplaced`](crate::Error::RepositoryReplaced) if that repository
    /// was deleted. A later call tries again.
    pub fn bytes(&self) -> Result<&[u8]> {
        self.load()?;
        Ok(self.0.bytes())
    }

    /// The bytes of a chunk on the heap or already loaded: callers load stored chunks
    /// first (an unloadable one would panic here).
    pub(crate) fn data(&self) -> &[u8] {
        self.0.bytes()
    }

    /// Load a stored chunk's bytes (no-op for a chunk in memory or already loaded).
    ///
    /// # Errors
    ///
    /// [`Error::Io`](crate::Error::Io) or
    /// [`Error::CorruptObject`](crate::Error::CorruptObject) from the repository;
    /// [`Error::RepositoryReplaced`](crate::Error::RepositoryReplaced) if it was deleted.
    pub fn load(&self) -> Result<()> {
        match &self.0.stored {
            Some(s) if s.bytes.get().is_none() => {
                let b = s.source.load(&self.hash(), self.0.len)?;
                if s.bytes.set(b).is_ok() {
                    LOADS.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether the bytes live in a repository (mapped or fetched) rather than on the heap.
    #[must_use]
    pub fn is_stored(&self) -> bool {
        self.0
            .stored
            .as_ref()
            .is_some_and(|s| !s.source.in_memory())
    }

    /// Whether the chunk is held encoded in memory (under a
    /// [`memory_budget`](crate::Config::memory_budget)): its bytes are decoded when read.
    #[must_use]
    pub fn is_encoded(&self) -> bool {
        self.0.stored.as_ref().is_some_and(|s| s.source.in_memory())
    }

    /// The source of a stored or encoded chunk.
    pub(crate) fn source(&self) -> Option<&Arc<dyn ChunkSource>> {
        self.0.stored.as_ref().map(|s| &s.source)
    }

    /// A stored chunk whose bytes are not loaded yet.
    pub(crate) fn is_unloaded(&self) -> bool {
        self.0
            .stored
            .as_ref()
            .is_some_and(|s| s.bytes.get().is_none())
    }

    /// A chunk of `len` bytes with hash `id` whose bytes `source` loads on first read.
    pub(crate) fn stored(id: ContentHash, len: usize, source: Arc<dyn ChunkSource>) -> Chunk {
        let hash = OnceLock::new();
        let _ = hash.set(id);
        Chunk(Arc::new(ChunkData {
            words: Vec::new(),
            len,
            hash,
            pool: Weak::new(),
            stored: Some(Box::new(Stored {
                source,
                bytes: OnceLock::new(),
            })),
        }))
    }

    /// [`stored`](Chunk::stored) with its bytes already loaded: `bytes` must be the
    /// chunk's `len` bytes, whose hash is `id`.
    pub(crate) fn stored_loaded(
        id: ContentHash,
        source: Arc<dyn ChunkSource>,
        bytes: Bytes,
    ) -> Chunk {
        let c = Chunk::stored(id, bytes.len(), source);
        if let Some(s) = &c.0.stored {
            let _ = s.bytes.set(bytes);
        }
        c
    }

    /// Number of bytes.
    #[must_use]
    pub fn len_bytes(&self) -> usize {
        self.0.len
    }

    /// The BLAKE3 hash of the bytes: O(len) the first time, then cached.
    #[must_use]
    pub fn hash(&self) -> ContentHash {
        *self
            .0
            .hash
            .get_or_init(|| ContentHash::of_bytes(self.data()))
    }

    /// The hash if it has been computed already. O(1).
    #[must_use]
    pub fn cached_hash(&self) -> Option<ContentHash> {
        self.0.hash.get().copied()
    }

    /// Whether both handles point at the same buffer (shared, not just equal). O(1).
    #[must_use]
    pub fn ptr_eq(&self, other: &Chunk) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A weak handle, to observe when the chunk's memory is released.
    #[must_use]
    pub fn downgrade(&self) -> WeakChunk {
        WeakChunk(Arc::downgrade(&self.0))
    }

    /// Whether the content equals `other`'s: pointer equality, then cached hashes when both
    /// are known, else a byte compare. Never computes a hash.
    pub(crate) fn same_content(&self, other: &Chunk) -> bool {
        if self.ptr_eq(other) {
            return true;
        }
        if self.len_bytes() != other.len_bytes() {
            return false;
        }
        if self.is_unloaded() || other.is_unloaded() {
            // A stored chunk's hash is known: compare hashes rather than load it.
            return self.hash() == other.hash();
        }
        match (self.cached_hash(), other.cached_hash()) {
            (Some(a), Some(b)) => a == b,
            _ => self.data() == other.data(),
        }
    }

    pub(crate) fn as_slice<T: Element>(&self) -> &[T] {
        bytemuck::cast_slice(self.data())
    }

    /// Bytes of memory the chunk's buffer holds: its length rounded up to whole 8-byte
    /// words, or a full pool buffer for a chunk whose buffer came from the pool.
    pub(crate) fn held_bytes(&self) -> usize {
        self.0.words.len() * 8
    }

    /// Address of the shared buffer, an identity for de-duplication.
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    pub(crate) fn from_data(data: ChunkData) -> Chunk {
        Chunk(Arc::new(data))
    }

    /// Mutable access when this handle is the only one.
    pub(crate) fn get_mut(&mut self) -> Option<&mut ChunkData> {
        Arc::get_mut(&mut self.0)
    }

    /// Replace the cached hash (tests of `verify` plant wrong ones).
    #[cfg(test)]
    pub(crate) fn plant_hash_for_test(&self, h: ContentHash) {
        // Only possible before a hash is cached; callers use a fresh chunk.
        let _ = self.0.hash.set(h);
    }

    /// Recompute the hash; compare it with the cached one, or cache it if none was.
    pub(crate) fn verify_and_cache_hash(&self) -> bool {
        let h = ContentHash::of_bytes(self.data());
        *self.0.hash.get_or_init(|| h) == h
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("len_bytes", &self.len_bytes())
            .field("hash", &self.cached_hash())
            .finish()
    }
}

/// A weak handle to a chunk: does not keep its memory alive.
#[derive(Clone, Debug)]
pub struct WeakChunk(Weak<ChunkData>);

impl WeakChunk {
    /// Whether some tensor, version or snapshot still holds the chunk. O(1).
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }

    pub(crate) fn upgrade(&self) -> Option<Chunk> {
        self.0.upgrade().map(Chunk)
    }
}

impl ChunkData {
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.stored {
            None => &bytemuck::cast_slice(&self.words)[..self.len],
            Some(s) => s.bytes.get_or_init(|| {
                LOADS.fetch_add(1, Ordering::Relaxed);
                let id = self.hash.get().copied().unwrap_or(ContentHash([0; 32]));
                match s.source.load(&id, self.len) {
                    Ok(b) => b,
                    Err(e) => panic!("a stored chunk could not be read: {e}"),
                }
            }),
        }
    }

    /// Writable bytes; resets the cached hash. A stored chunk is first copied to the heap.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        if self.stored.is_some() {
            let bytes = self.bytes().to_vec();
            let mut words = vec![0u64; self.len.div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..self.len].copy_from_slice(&bytes);
            self.words = words;
            self.stored = None;
        }
        self.hash = OnceLock::new();
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    pub(crate) fn slice_mut<T: Element>(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(self.bytes_mut())
    }
}

impl fmt::Debug for ChunkData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkData").field("len", &self.len).finish()
    }
}

impl Drop for ChunkData {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.words));
        }
    }
}

/// Recycles chunk buffers of a store's full chunk size, so that copy-on-write writes into
/// memory that is already mapped instead of paying a page fault per 4 KiB.
// Invariant: every pooled buffer has exactly `words` words; the total stays within
// `cap_bytes`; `words * 8` fits in `usize` (the store makes no pool for a `chunk_bytes`
// above `isize::MAX`).
pub(crate) struct Pool {
    words: usize,
    cap_bytes: usize,
    free: Mutex<Vec<Vec<u64>>>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("buffer_bytes", &self.buffer_bytes())
            .field("pooled_bytes", &self.pooled_bytes())
            .finish()
    }
}

impl Pool {
    pub(crate) fn new(chunk_bytes: usize, cap_bytes: usize) -> Arc<Pool> {
        Arc::new(Pool {
            words: chunk_bytes.div_ceil(8),
            cap_bytes,
            free: Mutex::new(Vec::new()),
        })
    }

    /// Bytes of one pooled buffer (a full chunk rounded up to whole words).
    fn buffer_bytes(&self) -> usize {
        self.words.saturating_mul(8)
    }

    pub(crate) fn pooled_bytes(&self) -> usize {
        self.buffers().saturating_mul(self.buffer_bytes())
    }

    /// Number of pooled buffers.
    pub(crate) fn buffers(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }

    /// Drop pooled buffers beyond the first `keep`, returning their memory to the
    /// allocator (buffers freed by a save's eviction leave the process, not the pool).
    pub(crate) fn truncate(&self, keep: usize) {
        if let Ok(mut free) = self.free.lock() {
            if free.len() > keep {
                free.truncate(keep);
                free.shrink_to_fit();
            }
        }
    }

    /// Drop every pooled buffer, returning its memory to the allocator.
    pub(crate) fn clear(&self) {
        if let Ok(mut free) = self.free.lock() {
            free.clear();
            free.shrink_to_fit();
        }
    }

    fn give_back(&self, buf: Vec<u64>) {
        if buf.len() != self.words || self.cap_bytes < self.buffer_bytes() {
            return;
        }
        if let Ok(mut free) = self.free.lock() {
            if (free.len() + 1).saturating_mul(self.buffer_bytes()) <= self.cap_bytes {
                free.push(buf);
            }
        }
    }

    fn take(&self) -> Option<Vec<u64>> {
        self.free.lock().ok()?.pop()
    }
}

/// Bytes in a buffer that goes back to its pool (if any) when dropped.
struct PooledBuf {
    words: Vec<u64>,
    len: usize,
    pool: Weak<Pool>,
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.words));
        }
    }
}

impl crate::codec::Out for Alloc {
    fn filled(&self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Bytes {
        self.bytes_with(len, fill)
    }
}

/// Where new chunk buffers come from: a store's pool when there is one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Alloc {
    pool: Option<Arc<Pool>>,
}

impl Alloc {
    pub(crate) fn new(pool: Option<Arc<Pool>>) -> Alloc {
        Alloc { pool }
    }

    /// The pool, without keeping it alive (what outlives the store holds this).
    pub(crate) fn pool_weak(&self) -> Weak<Pool> {
        self.pool.as_ref().map_or_else(Weak::new, Arc::downgrade)
    }

    /// A buffer for `len` bytes whose contents are unspecified (old data from the pool, or
    /// zeros).
    fn buffer(&self, len: usize) -> (Vec<u64>, Weak<Pool>) {
        let need = len.div_ceil(8);
        if let Some(pool) = &self.pool {
            // Buffers of more than half a full chunk come from (and go back to) the pool.
            if need <= pool.words && need * 2 > pool.words {
                let buf = pool.take().unwrap_or_else(|| vec![0u64; pool.words]);
                return (buf, Arc::downgrade(pool));
            }
        }
        (vec![0u64; need], Weak::new())
    }

    /// `len` bytes written by `fill` (which must write every byte) as [`Bytes`], in a
    /// buffer of the pool where the pool holds buffers of that length; the buffer goes
    /// back to the pool when the last handle drops it. Decoded chunks are written here:
    /// a buffer from the pool is mapped already, where a fresh one costs page faults
    /// and, freed, the allocator's unmapping (measured on restores of a 64 MiB version
    /// held as deltas, on 2 threads: about half the decode's CPU time went to the
    /// allocator's heap growth and the unmaps' TLB shootdowns).
    pub(crate) fn bytes_with(&self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Bytes {
        let (mut words, pool) = self.buffer(len);
        fill(&mut bytemuck::cast_slice_mut(&mut words)[..len]);
        Bytes::new(Arc::new(PooledBuf { words, len, pool }))
    }

    /// A chunk holding a copy of `bytes`.
    pub(crate) fn chunk_from_bytes(&self, bytes: &[u8]) -> Chunk {
        self.chunk_with(bytes.len(), |dst| dst.copy_from_slice(bytes))
    }

    /// A chunk holding a copy of `src`'s bytes (same hash).
    pub(crate) fn copy_of(&self, src: &Chunk) -> Chunk {
        let c = self.chunk_from_bytes(src.data());
        if let Some(h) = src.cached_hash() {
            let _ = c.0.hash.set(h);
        }
        c
    }

    /// A chunk of `len` bytes filled by `fill` (which must write every byte).
    pub(crate) fn chunk_with(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Chunk {
        let mut data = self.data(len);
        fill(&mut bytemuck::cast_slice_mut(&mut data.words)[..len]);
        Chunk::from_data(data)
    }

    /// A typed chunk of `n` elements filled by `fill` (which must write every element).
    pub(crate) fn chunk_typed<T: Element>(&self, n: usize, fill: impl FnOnce(&mut [T])) -> Chunk {
        self.chunk_with(n * std::mem::size_of::<T>(), |b| {
            fill(bytemuck::cast_slice_mut(b))
        })
    }

    /// Uninitialized-by-contract chunk data of `len` bytes, to be filled by the caller.
    pub(crate) fn data(&self, len: usize) -> ChunkData {
        let (words, pool) = self.buffer(len);
        ChunkData {
            words,
            len,
            hash: OnceLock::new(),
            pool,
            stored: None,
        }
    }
}
