//! Chunks held encoded in memory (deltas against a base, byte planes) and the
//! encoding pass that makes them, below the store: what the memory budget
//! ([`crate::budget`]) plans and swaps in.
//!
//! An encoded chunk is a [`Chunk`] whose source is an [`EncodedChunk`]: its encoded form
//! and, for a delta, the encoded form of its base, held by `Arc`. The chunks of one
//! variable's chunk index along a line of versions form *groups*: a full chunk (held raw:
//! the *key*), then up to [`DELTA_SPAN`] deltas, at positions 1, 2, ... after it. A
//! delta at a position that is a multiple of [`DELTA_ANCHOR_EVERY`] (an *anchor*) is
//! taken against the key; any other against the position before it (the same
//! variable's chunk at the same index in the parent version). A key of fewer than
//! [`RAW_KEY_MIN_BYTES`] is coded in byte planes where that saves. A chunk that coding
//! does not shrink stays raw, outside any group, and no later pass codes it again (nor
//! walks the version holding it: a history with one such chunk per version costs a
//! pass what is new, not its length). Reading an encoded chunk decodes at
//! most [`MAX_DELTA_CHAIN`] deltas on the key, in one pass
//! ([`codec::decode_chain`]: one decompression per link, one hash check of the chunk's
//! own bytes); the decoded bytes are kept by that handle until the next encoding pass
//! drops them. While some handle keeps a chunk's decoded bytes, a delta on it starts
//! from them instead of decoding the chain below. A base stays alive while a delta
//! needs it, also after the version that held it was pruned.
//!
//! Why this shape (measured with 256 KiB f32 chunks, one core, on 17 consecutive
//! all-MiniLM-L6-v2 AdamW checkpoints and on the synthetic dense steps of
//! `bench_report`): a plain chain of 8 deltas on a byte-plane coded chunk held 0.650
//! (MiniLM) and 0.437 (synthetic) of the raw bytes and decoded a version in 507 and
//! 433 us on average (0.52 and 0.61 GB/s); anchors every 4 positions in groups of 16
//! deltas on a raw key hold 0.656 and 0.441 and decode in 234 and 231 us (1.12 and
//! 1.14 GB/s). A raw key costs 1% more bytes than a coded one, and makes encoding an
//! anchor need no decoding (its base's bytes are the key's form), and the key nothing
//! to encode.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use rayon::prelude::*;

use crate::buffer::{Bytes, WeakBytes};
use crate::chunk::{Alloc, Chunk, ChunkSource, Pool};
use crate::codec::{self, Method};
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// Deltas in a group after its key (a full chunk): the chunk after the last one starts
/// a new group with a key.
pub const DELTA_SPAN: usize = 16;

/// A delta at a position (in its group) that is a multiple of this is taken against the
/// group's key, any other against the position before it.
pub const DELTA_ANCHOR_EVERY: usize = 4;

/// A key (a group's full chunk) of at least this many bytes is held raw; a smaller one is
/// coded in byte planes where that saves, as any chunk without a base. On a large chunk
/// a raw key costs 1% of a group's bytes and saves the encoder the key's coding and an
/// anchor's decoding of its base; on a small one the codec's 12-byte header and the
/// coding lost are what count.
pub const RAW_KEY_MIN_BYTES: usize = 64 << 10;

/// The most deltas on one chain (position `4k + 3`: three deltas down to the anchor at
/// `4k`, a delta on the key): reading any encoded chunk decodes at most this many deltas
/// on a full chunk. A base this deep is never taken: the chunk becomes a key instead.
pub const MAX_DELTA_CHAIN: usize = DELTA_ANCHOR_EVERY;

/// A chunk's encoded form held in memory, and the base it is a delta against.
// Invariant: `depth` is 0 without a base, else the base's depth + 1, at most
// `MAX_DELTA_CHAIN`; `pos` is 0 without a base, else at most `DELTA_SPAN`; `bytes`
// decodes (with the base's bytes) to the chunk's bytes; `raw` is whether `bytes` is the
// codec's raw form (the header, then the chunk's bytes).
#[derive(Debug)]
pub(crate) struct EncodedChunk {
    bytes: Box<[u8]>,
    base: Option<Base>,
    pub(crate) depth: usize,
    /// Position in its group: 0 for a key (a full chunk), else the versions since it.
    pub(crate) pos: usize,
    raw: bool,
    /// Where decoded bytes are written: the store's buffer pool while the store lives
    /// (not kept alive by the chunk: a snapshot that outlives its store decodes into
    /// fresh buffers, and gives them back to nobody).
    pool: Weak<Pool>,
    /// The decoded bytes, while a chunk handle keeps them (checked against the id when
    /// decoded): deltas on this chunk start from them.
    decoded: Mutex<Option<WeakBytes>>,
}

#[derive(Debug)]
struct Base {
    /// The base chunk's id.
    id: ContentHash,
    src: Arc<EncodedChunk>,
}

impl EncodedChunk {
    fn new(
        bytes: Box<[u8]>,
        base: Option<Base>,
        pos: usize,
        raw: bool,
        pool: Weak<Pool>,
    ) -> EncodedChunk {
        let depth = base.as_ref().map_or(0, |b| b.src.depth + 1);
        let pos = if base.is_some() { pos } else { 0 };
        EncodedChunk {
            bytes,
            base,
            depth,
            pos,
            raw,
            pool,
            decoded: Mutex::new(None),
        }
    }

    /// The chunk's bytes without a copy, for a chunk held in the codec's raw form (a
    /// key).
    fn raw_bytes(this: &Arc<EncodedChunk>) -> Option<Bytes> {
        this.raw
            .then(|| Bytes::new(Arc::new(RawForm(Arc::clone(this)))))
    }

    /// The key of the group `this` (whose id is `id`) is in: the full chunk its chain of
    /// bases ends at, with its id.
    pub(crate) fn key(
        id: ContentHash,
        this: &Arc<EncodedChunk>,
    ) -> (ContentHash, Arc<EncodedChunk>) {
        let (mut id, mut at) = (id, this);
        while let Some(b) = at.base.as_ref() {
            (id, at) = (b.id, &b.src);
        }
        (id, Arc::clone(at))
    }

    /// The encoded form, and the id of the base for a delta (`None`: byte planes), as
    /// [`codec::encode`] wrote them: what a pack stores for this chunk. `None` for a
    /// key held raw (a pack stores the chunk's bytes as a save chooses).
    pub(crate) fn form(&self) -> Option<(&[u8], Option<ContentHash>)> {
        (!self.raw).then(|| (&self.bytes[..], self.base.as_ref().map(|b| b.id)))
    }

    /// Whether the chunk is held in the codec's raw form (a key).
    #[cfg(test)]
    pub(crate) fn is_raw(&self) -> bool {
        self.raw
    }

    /// The id of the base of a delta.
    #[cfg(test)]
    pub(crate) fn base_id(&self) -> Option<ContentHash> {
        self.base.as_ref().map(|b| b.id)
    }

    /// Let deltas on this chunk start from `bytes` (its decoded bytes) while a handle
    /// keeps them.
    fn keep(&self, bytes: &Bytes) {
        if let Ok(mut g) = self.decoded.lock() {
            *g = Some(bytes.downgrade());
        }
    }

    /// The decoded bytes some handle still keeps.
    pub(crate) fn cached(&self) -> Option<Bytes> {
        self.decoded.lock().ok()?.as_ref()?.upgrade()
    }

    /// Decode the chain down to a full chunk, or to the first base whose decoded bytes
    /// a handle still keeps, in one pass, checking the bytes against `id` once.
    /// O(len · links decoded).
    pub(crate) fn decode(&self, id: &ContentHash, len: usize) -> Result<Bytes> {
        if let Some(b) = self.cached() {
            return Ok(b);
        }
        let mut links: Vec<&[u8]> = vec![&self.bytes];
        let mut at = self.base.as_ref();
        let mut kept = None;
        while let Some(b) = at {
            if let Some(d) = b.src.cached().or_else(|| EncodedChunk::raw_bytes(&b.src)) {
                kept = Some(d);
                break;
            }
            links.push(&b.src.bytes);
            at = b.src.base.as_ref();
        }
        let bytes = codec::decode_chain_in(
            &links,
            kept.as_deref(),
            id,
            len,
            &Alloc::new(self.pool.upgrade()),
        )
        .map_err(|e| Error::Corrupt {
            reason: format!("encoded chunk {id} in memory: {e}"),
        })?;
        if let Ok(mut g) = self.decoded.lock() {
            *g = Some(bytes.downgrade());
        }
        Ok(bytes)
    }
}

impl ChunkSource for EncodedChunk {
    fn load(&self, id: &ContentHash, len: usize) -> Result<Bytes> {
        self.decode(id, len)
    }

    fn in_memory(&self) -> bool {
        true
    }
}

/// The encoded form behind an encoded chunk, borrowed.
pub(crate) fn encoded_ref(c: &Chunk) -> Option<&EncodedChunk> {
    let src: &dyn ChunkSource = &**c.source()?;
    let any: &(dyn std::any::Any + Send + Sync) = src;
    any.downcast_ref::<EncodedChunk>()
}

/// The encoded form behind an encoded chunk.
pub(crate) fn encoded_of(c: &Chunk) -> Option<Arc<EncodedChunk>> {
    let src: Arc<dyn ChunkSource> = Arc::clone(c.source()?);
    let any: Arc<dyn std::any::Any + Send + Sync> = src;
    any.downcast::<EncodedChunk>().ok()
}

/// Memory held by chunks, by kind (see `Store::memory`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Memory {
    /// Buffers of raw chunks on the heap.
    pub(crate) raw_held: usize,
    /// Raw length of the encoded chunks.
    pub(crate) encoded_raw: usize,
    /// Encoded forms (with the bases only deltas hold) and decoded bytes kept.
    pub(crate) encoded_held: usize,
}

impl Memory {
    fn add(&mut self, o: Memory) {
        self.raw_held += o.raw_held;
        self.encoded_raw += o.encoded_raw;
        self.encoded_held += o.encoded_held;
    }

    fn sub(&mut self, o: Memory) {
        self.raw_held -= o.raw_held;
        self.encoded_raw -= o.encoded_raw;
        self.encoded_held -= o.encoded_held;
    }
}

/// What chunk `c` holds by itself: its raw buffer on the heap, or for an encoded chunk
/// its raw length and the decoded bytes it keeps (its encoded forms apart; a chunk in
/// a repository holds nothing here).
fn own_memory(c: &Chunk) -> Memory {
    if !c.is_encoded() {
        return Memory {
            raw_held: c.held_bytes(),
            ..Memory::default()
        };
    }
    Memory {
        raw_held: 0,
        encoded_raw: c.len_bytes(),
        encoded_held: if c.is_unloaded() { 0 } else { c.len_bytes() },
    }
}

/// Memory held by `chunks` (each given once): raw buffers on the heap, and encoded forms
/// (each form once, with the bases that only deltas hold) and their decoded bytes.
/// Chunks in a repository count nothing. O(chunks + chain lengths).
pub(crate) fn memory_of<'a>(chunks: impl Iterator<Item = &'a Chunk>) -> Memory {
    Ledger::default().memory_with(chunks)
}

/// Chunks counted once each, with the encoded forms they hold: the memory a set of
/// versions holds, kept up to date as versions come and go (each chunk counted while
/// at least one of them holds it, each form while one counted chunk's chain reaches
/// it). What a chunk added is taken off as it was added.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// By chunk address: how many holders, what it added, the forms of its chain.
    chunks: HashMap<usize, (usize, Memory, Vec<usize>)>,
    /// By form address: how many counted chunks reach it, and its bytes.
    forms: HashMap<usize, (usize, usize)>,
    total: Memory,
}

impl Ledger {
    /// Count one more holder of chunk `c` (the chunk itself at most once). O(chain).
    pub(crate) fn add(&mut self, c: &Chunk) {
        if let Some(e) = self.chunks.get_mut(&c.addr()) {
            e.0 += 1;
            return;
        }
        let own = own_memory(c);
        self.total.add(own);
        let mut chain = Vec::new();
        let mut src = encoded_ref(c);
        while let Some(s) = src {
            let p = std::ptr::from_ref(s) as usize;
            chain.push(p);
            let f = self.forms.entry(p).or_insert((0, s.bytes.len()));
            if f.0 == 0 {
                self.total.encoded_held += f.1;
            }
            f.0 += 1;
            src = s.base.as_ref().map(|b| &*b.src);
        }
        self.chunks.insert(c.addr(), (1, own, chain));
    }

    /// Count one holder fewer of the chunk at `addr` (counted by [`add`](Ledger::add)):
    /// the last one takes off what it added. O(chain).
    pub(crate) fn remove(&mut self, addr: usize) {
        let Some(e) = self.chunks.get_mut(&addr) else {
            return;
        };
        e.0 -= 1;
        if e.0 > 0 {
            return;
        }
        let Some((_, own, chain)) = self.chunks.remove(&addr) else {
            return;
        };
        self.total.sub(own);
        for p in chain {
            if let Some(f) = self.forms.get_mut(&p) {
                f.0 -= 1;
                if f.0 == 0 {
                    self.total.encoded_held -= f.1;
                    self.forms.remove(&p);
                }
            }
        }
    }

    /// What the counted chunks hold and, beside them, `chunks` (each given once) that
    /// are not counted, as [`memory_of`] counts them all. O(`chunks` + chain lengths).
    pub(crate) fn memory_with<'a>(&self, chunks: impl Iterator<Item = &'a Chunk>) -> Memory {
        let mut m = self.total;
        let mut forms = HashSet::new();
        for c in chunks {
            if self.chunks.contains_key(&c.addr()) {
                continue;
            }
            m.add(own_memory(c));
            let mut src = encoded_ref(c);
            while let Some(s) = src {
                let p = std::ptr::from_ref(s) as usize;
                if self.forms.contains_key(&p) || !forms.insert(p) {
                    // Counted already, and with it the rest of its chain.
                    break;
                }
                m.encoded_held += s.bytes.len();
                src = s.base.as_ref().map(|b| &*b.src);
            }
        }
        m
    }
}

/// Where the chunk to encode finds its base.
#[derive(Clone)]
pub(crate) enum BaseRef {
    /// None: the chunk is a key (held raw).
    None,
    /// Encoded by an earlier pass: its id, its form, and the chunk handle the plan took
    /// it from (which keeps its decoded bytes, if it has them, while the pass runs).
    Encoded {
        id: ContentHash,
        src: Arc<EncodedChunk>,
        _holds: Option<Chunk>,
    },
    /// Encoded by this pass, before (the raw chunk's address).
    InPass(usize),
}

pub(crate) struct Item {
    pub(crate) raw: Chunk,
    pub(crate) width: usize,
    pub(crate) base: BaseRef,
    /// The chunk's position in its group (0 with [`BaseRef::None`]).
    pub(crate) pos: usize,
}

/// The chunks one pass encodes: per version, oldest first.
pub(crate) struct Plan {
    pub(crate) versions: Vec<Vec<Item>>,
    /// The store's buffer pool, where the encoded chunks write their decoded bytes.
    pub(crate) pool: Weak<Pool>,
}

/// What a finished pass gives back: raw chunk address -> (the raw chunk, its encoded
/// replacement).
pub(crate) struct Done {
    chunks: HashMap<usize, (Chunk, Chunk)>,
    /// The raw chunks that coding did not shrink (they stay as they are).
    kept_raw: Vec<Chunk>,
    /// The plan the pass ran, dropped with the result: its bases may hold the decoded
    /// bytes (raw buffers) of the previous pass's newest version, and those buffers are
    /// freed where the result is applied, which bounds the buffer pool.
    _plan: Plan,
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Done")
            .field("chunks", &self.chunks.len())
            .field("kept_raw", &self.kept_raw.len())
            .finish_non_exhaustive()
    }
}

impl Done {
    /// The encoded replacement of the raw chunk at address `addr`, with that chunk.
    pub(crate) fn get(&self, addr: &usize) -> Option<&(Chunk, Chunk)> {
        self.chunks.get(addr)
    }

    /// Whether the pass encoded nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The raw chunks the pass found that coding does not shrink.
    pub(crate) fn kept_raw(&self) -> &[Chunk] {
        &self.kept_raw
    }
}

/// A pass running on its own thread.
#[derive(Debug)]
struct Job {
    pid: u32,
    done: Arc<Mutex<Option<Done>>>,
}

/// The store's encoding state: the background pass in flight, if any.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    job: Option<Job>,
}

impl Budget {
    /// Whether a pass is in flight.
    pub(crate) fn running(&self) -> bool {
        self.job.is_some()
    }

    /// Run `plan` on a thread of its own. A thread that cannot be spawned starts
    /// nothing (the next commit tries again).
    pub(crate) fn start(&mut self, plan: Plan) {
        let done = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&done);
        let spawned = std::thread::Builder::new()
            .name("tensor-history-encode".into())
            .spawn(move || {
                crate::parallel::background();
                let r = run(plan);
                if let Ok(mut g) = slot.lock() {
                    *g = Some(r);
                }
            });
        if spawned.is_ok() {
            self.job = Some(Job {
                pid: std::process::id(),
                done,
            });
        }
    }

    /// The result of a finished pass: `None` while it runs (or with none in flight),
    /// `Some(None)` for a pass given up (started in another process, before a `fork`,
    /// or whose thread failed).
    pub(crate) fn finished(&mut self) -> Option<Option<Done>> {
        let job = self.job.as_ref()?;
        let taken = if job.pid == std::process::id() {
            match job.done.lock() {
                Ok(mut g) => g.take().map(Some),
                Err(_) => Some(None),
            }
        } else {
            Some(None)
        };
        if taken.is_some() {
            self.job = None;
        }
        taken
    }

    /// Wait for the pass in flight and take its result (`None` without one, or for a
    /// pass given up).
    pub(crate) fn wait(&mut self) -> Option<Done> {
        let job = self.job.take()?;
        if job.pid != std::process::id() {
            return None;
        }
        // The running pass holds the slot until it is done.
        loop {
            if let Some(done) = job.done.lock().ok().and_then(|mut g| g.take()) {
                return Some(done);
            }
            if Arc::strong_count(&job.done) == 1 {
                return None; // the thread ended without a result
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// A raw chunk's bytes as [`Bytes`], without a copy: the decoded bytes an encoded chunk
/// keeps when its raw buffer is at hand.
struct RawBytes(Chunk);

impl AsRef<[u8]> for RawBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.data()
    }
}

/// The bytes of a chunk held in the codec's raw form, without a copy.
struct RawForm(Arc<EncodedChunk>);

impl AsRef<[u8]> for RawForm {
    fn as_ref(&self) -> &[u8] {
        &self.0.bytes[codec::HEADER_LEN..]
    }
}

/// Encode one planned chunk: its address, the raw chunk and its encoded replacement, or
/// (`Err`) the raw chunk when coding does not shrink it. With `keep`, the encoded handle
/// keeps the raw bytes as its decoded bytes (no copy), so that a delta on it in the next
/// pass needs no decoding.
fn encode_item(
    it: &Item,
    done: &HashMap<usize, (Chunk, Chunk)>,
    keep: bool,
    pool: &Weak<Pool>,
) -> std::result::Result<(usize, Chunk, Chunk), Chunk> {
    let raw = it.raw.data();
    let base: Option<(ContentHash, Bytes, Arc<EncodedChunk>)> = match &it.base {
        BaseRef::None => None,
        BaseRef::InPass(a) => done.get(a).and_then(|(r, e)| {
            let src = encoded_of(e)?;
            Some((r.hash(), Bytes::new(Arc::new(RawBytes(r.clone()))), src))
        }),
        BaseRef::Encoded { id, src, .. } => src
            .decode(id, raw.len())
            .ok()
            .map(|b| (*id, b, Arc::clone(src))),
    };
    let base = base.filter(|(_, b, src)| b.len() == raw.len() && src.depth < MAX_DELTA_CHAIN);
    let big = raw.len() >= RAW_KEY_MIN_BYTES;
    let e = match &base {
        Some((id, b, _)) => codec::encode(raw, it.width, Some((id, &b[..]))),
        // A key of a large chunk is held raw (see the module's documentation).
        None if big => codec::encode_as(Method::Raw, raw, it.width, None),
        None => codec::encode(raw, it.width, None),
    };
    let method = e.method();
    if method == Method::Raw && !(big && base.is_none()) {
        // Coding saves nothing: the chunk stays as it is.
        return Err(it.raw.clone());
    }
    let (bytes, base) = if method.is_delta() {
        let (id, _, src) = base.expect("a delta has a base");
        (e.into_bytes(), Some(Base { id, src }))
    } else {
        (e.into_bytes(), None)
    };
    let enc = Arc::new(EncodedChunk::new(
        bytes.into_boxed_slice(),
        base,
        it.pos,
        method == Method::Raw,
        pool.clone(),
    ));
    let chunk = if keep {
        let decoded = Bytes::new(Arc::new(RawBytes(it.raw.clone())));
        enc.keep(&decoded);
        Chunk::stored_loaded(it.raw.hash(), enc, decoded)
    } else {
        Chunk::stored(it.raw.hash(), it.raw.len_bytes(), enc)
    };
    Ok((it.raw.addr(), it.raw.clone(), chunk))
}

/// Encode `plan` on this thread (and the crate's pool), version by version, oldest
/// first: a delta may take a chunk encoded earlier in the same pass as its base. The
/// newest version's encoded chunks keep their raw bytes as decoded bytes: the next
/// pass encodes its child against them without decoding their chains (a dense history
/// that commits faster than it is encoded would otherwise decode up to
/// [`MAX_DELTA_CHAIN`] links per chunk for every version it encodes).
pub(crate) fn run(plan: Plan) -> Done {
    let mut done = HashMap::new();
    let mut kept_raw = Vec::new();
    let last = plan.versions.len().saturating_sub(1);
    for (v, items) in plan.versions.iter().enumerate() {
        let keep = v == last;
        let out: Vec<_> = crate::parallel::install(|| {
            items
                .par_iter()
                .with_min_len(1)
                .map(|it| encode_item(it, &done, keep, &plan.pool))
                .collect()
        });
        for r in out {
            match r {
                Ok((a, raw, enc)) => {
                    done.insert(a, (raw, enc));
                }
                Err(raw) => kept_raw.push(raw),
            }
        }
    }
    Done {
        chunks: done,
        kept_raw,
        _plan: plan,
    }
}
