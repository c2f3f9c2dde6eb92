//! The memory budget: old versions' chunks held encoded (XOR deltas, byte planes), in
//! the background, so that a dense history costs a fraction of its deep copies.
//!
//! An encoded chunk is a [`Chunk`] whose source is an [`EncodedChunk`]: its encoded form
//! and, for a delta, the encoded form of its base (the same variable's chunk at the same
//! index in the parent version), held by `Arc`. Reading it decodes the chain (at most
//! [`MAX_DELTA_CHAIN`] deltas on a full chunk) in one pass ([`codec::decode_chain`]:
//! one decompression per link, one hash check of the chunk's own bytes); the decoded
//! bytes are kept by that handle until the next encoding pass drops them. While some
//! handle keeps a chunk's decoded bytes, a delta on it starts from them instead of
//! decoding the chain below (reading versions one after another decodes each link
//! once). A base stays alive while a delta needs it, also after the version that held
//! it was pruned.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::buffer::{Bytes, WeakBytes};
use crate::chunk::{Chunk, ChunkSource};
use crate::codec::{self, Method};
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::Vars;
use crate::store::Store;
use crate::version::VersionId;

/// The most deltas on one chain: a chunk whose base is this deep is encoded in full
/// (byte planes) instead, so that reading any encoded chunk decodes at most this many
/// deltas plus one full chunk.
pub const MAX_DELTA_CHAIN: usize = 8;

/// A chunk's encoded form held in memory, and the base it is a delta against.
// Invariant: `depth` is 0 without a base, else the base's depth + 1, at most
// `MAX_DELTA_CHAIN`; `bytes` decodes (with the base's bytes) to the chunk's bytes.
#[derive(Debug)]
pub(crate) struct EncodedChunk {
    bytes: Box<[u8]>,
    base: Option<Base>,
    depth: usize,
    /// The decoded bytes, while a chunk handle keeps them (checked against the id when
    /// decoded): deltas on this chunk start from them.
    decoded: Mutex<Option<WeakBytes>>,
}

#[derive(Debug)]
struct Base {
    src: Arc<EncodedChunk>,
}

impl EncodedChunk {
    fn new(bytes: Box<[u8]>, base: Option<Base>) -> EncodedChunk {
        let depth = base.as_ref().map_or(0, |b| b.src.depth + 1);
        EncodedChunk {
            bytes,
            base,
            depth,
            decoded: Mutex::new(None),
        }
    }

    /// The decoded bytes some handle still keeps.
    fn cached(&self) -> Option<Bytes> {
        self.decoded.lock().ok()?.as_ref()?.upgrade()
    }

    /// Decode the chain down to a full chunk, or to the first base whose decoded bytes
    /// a handle still keeps, in one pass, checking the bytes against `id` once.
    /// O(len · links decoded).
    fn decode(&self, id: &ContentHash, len: usize) -> Result<Bytes> {
        if let Some(b) = self.cached() {
            return Ok(b);
        }
        let mut links: Vec<&[u8]> = vec![&self.bytes];
        let mut at = self.base.as_ref();
        let mut kept = None;
        while let Some(b) = at {
            if let Some(d) = b.src.cached() {
                kept = Some(d);
                break;
            }
            links.push(&b.src.bytes);
            at = b.src.base.as_ref();
        }
        let bytes =
            codec::decode_chain(&links, kept.as_deref(), id, len).map_err(|e| Error::Corrupt {
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

/// The encoded form behind an encoded chunk.
fn encoded_of(c: &Chunk) -> Option<Arc<EncodedChunk>> {
    let src: Arc<dyn ChunkSource> = Arc::clone(c.source()?);
    let any: Arc<dyn std::any::Any + Send + Sync> = src;
    any.downcast::<EncodedChunk>().ok()
}

/// Memory held by chunks, by kind (see [`Store::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Memory {
    /// Buffers of raw chunks on the heap.
    pub(crate) raw_held: usize,
    /// Raw length of the encoded chunks.
    pub(crate) encoded_raw: usize,
    /// Encoded forms (with the bases only deltas hold) and decoded bytes kept.
    pub(crate) encoded_held: usize,
}

/// Memory held by `chunks` (each given once): raw buffers on the heap, and encoded forms
/// (each form once, with the bases that only deltas hold) and their decoded bytes.
/// Chunks in a repository count nothing. O(chunks + chain lengths).
pub(crate) fn memory_of<'a>(chunks: impl Iterator<Item = &'a Chunk>) -> Memory {
    let mut m = Memory::default();
    let mut forms = HashSet::new();
    for c in chunks {
        if !c.is_encoded() {
            m.raw_held += c.held_bytes();
            continue;
        }
        m.encoded_raw += c.len_bytes();
        if !c.is_unloaded() {
            m.encoded_held += c.len_bytes();
        }
        let mut src = encoded_of(c);
        while let Some(s) = src {
            if !forms.insert(Arc::as_ptr(&s) as usize) {
                break;
            }
            m.encoded_held += s.bytes.len();
            src = s.base.as_ref().map(|b| Arc::clone(&b.src));
        }
    }
    m
}

/// Where the chunk to encode finds its base.
enum BaseRef {
    None,
    /// Encoded by an earlier pass.
    Encoded(Chunk, Arc<EncodedChunk>),
    /// Encoded by this pass, before (the raw chunk's address).
    InPass(usize),
}

struct Item {
    raw: Chunk,
    width: usize,
    base: BaseRef,
}

/// The chunks one pass encodes: per version, oldest first.
struct Plan {
    versions: Vec<Vec<Item>>,
}

/// What a finished pass gives back: raw chunk address -> (the raw chunk, its encoded
/// replacement).
type Done = HashMap<usize, (Chunk, Chunk)>;

/// A pass running on its own thread.
#[derive(Debug)]
struct Job {
    pid: u32,
    done: Arc<Mutex<Option<Done>>>,
}

/// The store's encoding state.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    job: Option<Job>,
}

fn encode_item(it: &Item, done: &Done) -> Option<(usize, Chunk, Chunk)> {
    let raw = it.raw.data();
    let base: Option<(ContentHash, Bytes, Arc<EncodedChunk>)> = match &it.base {
        BaseRef::None => None,
        BaseRef::InPass(a) => done.get(a).and_then(|(r, e)| {
            let src = encoded_of(e)?;
            Some((r.hash(), crate::buffer::AlignedBuf::bytes_of(r.data()), src))
        }),
        BaseRef::Encoded(c, src) => src
            .decode(&c.hash(), c.len_bytes())
            .ok()
            .map(|b| (c.hash(), b, Arc::clone(src))),
    };
    let base = base.filter(|(_, b, src)| b.len() == raw.len() && src.depth < MAX_DELTA_CHAIN);
    let e = codec::encode(raw, it.width, base.as_ref().map(|(id, b, _)| (id, &b[..])));
    let (bytes, base) = match e.method() {
        Method::Raw => return None,
        Method::XorPlanes => {
            let (_, _, src) = base.expect("a delta has a base");
            (e.into_bytes(), Some(Base { src }))
        }
        _ => (e.into_bytes(), None),
    };
    let enc = Arc::new(EncodedChunk::new(bytes.into_boxed_slice(), base));
    let chunk = Chunk::stored(it.raw.hash(), it.raw.len_bytes(), enc);
    Some((it.raw.addr(), it.raw.clone(), chunk))
}

fn run(plan: Plan) -> Done {
    let mut done = Done::new();
    for items in plan.versions {
        let out: Vec<_> = crate::parallel::install(|| {
            items
                .par_iter()
                .with_min_len(1)
                .filter_map(|it| encode_item(it, &done))
                .collect()
        });
        for (a, raw, enc) in out {
            done.insert(a, (raw, enc));
        }
    }
    done
}

impl Store {
    /// Memory the chunks of the working state and the live versions held in memory
    /// hold (see [`memory_of`]). O(chunks).
    pub(crate) fn memory(&self) -> Memory {
        let mut seen = HashSet::new();
        let chunks = std::iter::once(&self.working)
            .chain(self.hist.live().filter_map(|(_, n)| n.vars.loaded()))
            .flat_map(|v| v.values().flat_map(|t| t.chunks()))
            .filter(|c| seen.insert(c.addr()));
        memory_of(chunks)
    }

    /// What a pass should encode to bring the held bytes from `held` to `budget`: the
    /// unshared raw chunks of the oldest versions first (not HEAD's, not the working
    /// state's), and the decoded bytes that encoded chunks keep are dropped at once.
    fn plan(&mut self, held: usize, budget: usize) -> Plan {
        let mut hot: HashSet<usize> = HashSet::new();
        let head = self.hist.head_id();
        let head_vars = head.and_then(|h| self.hist.node(h).ok()?.vars.loaded().cloned());
        for v in std::iter::once(&self.working).chain(head_vars.as_ref()) {
            hot.extend(v.values().flat_map(|t| t.chunks().map(Chunk::addr)));
        }
        self.drop_decoded(&hot);
        let want = held.saturating_sub(budget).saturating_mul(2);
        let ids: Vec<VersionId> = self
            .hist
            .live()
            .map(|(id, _)| id)
            .filter(|id| Some(*id) != head)
            .collect();
        let mut planned: HashSet<usize> = HashSet::new();
        let mut versions = Vec::new();
        let mut bytes = 0usize;
        for id in ids {
            if bytes >= want {
                break;
            }
            let Ok(node) = self.hist.node(id) else {
                continue;
            };
            let Some(vars) = node.vars.loaded() else {
                continue;
            };
            let parent: Option<&Vars> = node
                .parents
                .first()
                .and_then(|p| self.hist.node(*p).ok()?.vars.loaded());
            let mut items = Vec::new();
            for (name, t) in vars.iter() {
                let pt = parent
                    .and_then(|p| p.get(name))
                    .filter(|pt| pt.dtype() == t.dtype() && pt.num_chunks() == t.num_chunks());
                for (i, c) in t.chunks().enumerate() {
                    if c.is_stored()
                        || c.is_encoded()
                        || c.len_bytes() == 0
                        || hot.contains(&c.addr())
                    {
                        continue;
                    }
                    if !planned.insert(c.addr()) {
                        continue;
                    }
                    let base = match pt.and_then(|pt| pt.chunks().nth(i)) {
                        Some(b) if planned.contains(&b.addr()) && !b.ptr_eq(c) => {
                            BaseRef::InPass(b.addr())
                        }
                        Some(b) => match encoded_of(b) {
                            Some(src) => BaseRef::Encoded(b.clone(), src),
                            None => BaseRef::None,
                        },
                        None => BaseRef::None,
                    };
                    bytes += c.len_bytes();
                    items.push(Item {
                        raw: c.clone(),
                        width: t.dtype().size(),
                        base,
                    });
                }
            }
            if !items.is_empty() {
                versions.push(items);
            }
        }
        Plan { versions }
    }

    /// Replace encoded chunks that keep decoded bytes (and are not `hot`) by handles
    /// without them, in every live version.
    fn drop_decoded(&mut self, hot: &HashSet<usize>) {
        let mut fresh: HashMap<usize, Chunk> = HashMap::new();
        self.replace_chunks(|c| {
            if !c.is_encoded() || c.is_unloaded() || hot.contains(&c.addr()) {
                return None;
            }
            let src = Arc::clone(c.source()?);
            Some(
                fresh
                    .entry(c.addr())
                    .or_insert_with(|| Chunk::stored(c.hash(), c.len_bytes(), src))
                    .clone(),
            )
        });
    }

    /// In every live version held in memory, replace each chunk `f` gives a replacement
    /// for. O(chunks).
    fn replace_chunks(&mut self, f: impl FnMut(&Chunk) -> Option<Chunk>) {
        let ids: Vec<VersionId> = self.hist.live().map(|(id, _)| id).collect();
        self.replace_chunks_in(ids, f);
    }

    /// In each of versions `ids` that is held in memory, replace each chunk `f` gives a
    /// replacement for (a version not read from a repository yet holds nothing).
    /// O(chunks).
    pub(crate) fn replace_chunks_in(
        &mut self,
        ids: Vec<VersionId>,
        mut f: impl FnMut(&Chunk) -> Option<Chunk>,
    ) {
        for id in ids {
            let Ok(node) = self.hist.node_mut(id) else {
                continue;
            };
            let Some(held) = node.vars.loaded() else {
                continue;
            };
            let mut updates = Vec::new();
            for (name, t) in held.iter() {
                let mut changed = false;
                let chunks = t
                    .chunks()
                    .map(|c| match f(c) {
                        Some(n) => {
                            changed = true;
                            n
                        }
                        None => c.clone(),
                    })
                    .collect();
                if changed {
                    updates.push((name.clone(), t.with_chunks(chunks)));
                }
            }
            if updates.is_empty() {
                continue;
            }
            let mut vars = held.clone();
            for (name, t) in updates {
                vars.insert(name, t);
            }
            node.vars.set(vars);
        }
    }

    /// Swap the encoded chunks of a finished pass in. The raw buffers freed leave the
    /// process rather than fill the pool (the pool keeps what it held before).
    fn apply(&mut self, done: Done) {
        if done.is_empty() {
            return;
        }
        let pooled_before = self.pool().map(|p| p.buffers());
        self.replace_chunks(|c| done.get(&c.addr()).map(|(_, e)| e.clone()));
        drop(done);
        if let (Some(pool), Some(keep)) = (self.pool(), pooled_before) {
            pool.truncate(keep);
        }
    }

    /// Take in the result of a finished background pass (a pass started in another
    /// process, before a `fork`, is given up).
    fn collect_pass(&mut self) {
        let Some(job) = &self.budget.job else {
            return;
        };
        let taken = if job.pid == std::process::id() {
            match job.done.lock() {
                Ok(mut g) => g.take().map(Some),
                Err(_) => Some(None),
            }
        } else {
            Some(None)
        };
        match taken {
            None => {} // still running
            Some(done) => {
                self.budget.job = None;
                if let Some(done) = done {
                    self.apply(done);
                }
            }
        }
    }

    /// After a commit: take in a finished pass, and start one if the held bytes passed
    /// the budget. O(chunks) pointer walk; encoding runs on another thread.
    pub(crate) fn budget_after_commit(&mut self) {
        let Some(budget) = self.config.memory_budget else {
            return;
        };
        self.collect_pass();
        if self.budget.job.is_some() {
            return;
        }
        let m = self.memory();
        let held = m.raw_held + m.encoded_held;
        if held <= budget {
            return;
        }
        let plan = self.plan(held, budget);
        if plan.versions.is_empty() {
            return;
        }
        let done = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&done);
        let spawned = std::thread::Builder::new()
            .name("tensor-history-encode".into())
            .spawn(move || {
                let r = run(plan);
                if let Ok(mut g) = slot.lock() {
                    *g = Some(r);
                }
            });
        if spawned.is_ok() {
            self.budget.job = Some(Job {
                pid: std::process::id(),
                done,
            });
        }
    }

    /// Bring the memory the history holds within [`Config::memory_budget`] now, on this
    /// thread (and the crate's pool): wait for a background pass, then encode the oldest
    /// versions' chunks until the held bytes are within the budget or nothing more can
    /// be encoded (HEAD and the working state stay raw). What commits start in the
    /// background, done at once: for a pause in training, tests and benchmarks. Without
    /// a budget it does nothing. Returns the bytes held after (as
    /// [`Stats::held_bytes`](crate::Stats::held_bytes)).
    ///
    /// O(size of the chunks encoded), in parallel; reads no chunk of HEAD.
    ///
    /// [`Config::memory_budget`]: crate::Config::memory_budget
    pub fn enforce_memory_budget(&mut self) -> usize {
        if let Some(job) = self.budget.job.take() {
            if job.pid == std::process::id() {
                // Wait for the running pass: it holds the slot until it is done.
                loop {
                    let taken = job.done.lock().ok().and_then(|mut g| g.take());
                    if let Some(done) = taken {
                        self.apply(done);
                        break;
                    }
                    if Arc::strong_count(&job.done) == 1 {
                        break; // the thread ended without a result
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
        let held = |s: &Store| {
            let m = s.memory();
            m.raw_held + m.encoded_held
        };
        let Some(budget) = self.config.memory_budget else {
            return held(self);
        };
        loop {
            let now = held(self);
            if now <= budget {
                return now;
            }
            let plan = self.plan(now, budget);
            if plan.versions.is_empty() {
                return held(self);
            }
            let done = run(plan);
            if done.is_empty() {
                return held(self);
            }
            self.apply(done);
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array1;

    use super::*;
    use crate::config::Config;

    /// The depth of every encoded chunk of `w`, oldest version first.
    fn depths(s: &Store) -> Vec<Option<usize>> {
        s.hist
            .live()
            .map(|(_, n)| {
                let c = n.vars.loaded().unwrap()["w"]
                    .chunks()
                    .next()
                    .unwrap()
                    .clone();
                encoded_of(&c).map(|e| e.depth)
            })
            .collect()
    }

    #[test]
    fn a_chain_at_its_bound_starts_again_with_a_full_chunk() {
        let mut s = Store::with_config(Config {
            memory_budget: Some(0),
            ..Config::default()
        })
        .unwrap();
        s.insert(
            "w",
            &Array1::from_shape_fn(4096, |i| (i as f32 * 0.1).cos()),
        )
        .unwrap();
        s.commit("0").unwrap();
        for step in 1..2 * MAX_DELTA_CHAIN + 4 {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.commit(&step.to_string()).unwrap();
        }
        s.enforce_memory_budget();
        let d = depths(&s);
        // HEAD stays raw; before it, chains of full + MAX_DELTA_CHAIN deltas.
        assert_eq!(d.last(), Some(&None));
        let want: Vec<Option<usize>> = (0..d.len() - 1)
            .map(|i| Some(i % (MAX_DELTA_CHAIN + 1)))
            .chain([None])
            .collect();
        assert_eq!(d, want);
    }

    #[test]
    fn a_delta_starts_from_its_base_while_a_handle_keeps_the_base_decoded() {
        let mut s = Store::with_config(Config {
            memory_budget: Some(0),
            ..Config::default()
        })
        .unwrap();
        s.insert(
            "w",
            &Array1::from_shape_fn(4096, |i| (i as f32 * 0.1).sin()),
        )
        .unwrap();
        s.commit("0").unwrap();
        let mut copies = vec![s.get::<f32>("w").unwrap()];
        for step in 1..6 {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.commit(&step.to_string()).unwrap();
            copies.push(s.get::<f32>("w").unwrap());
        }
        s.enforce_memory_budget();
        let chunks: Vec<Chunk> = s
            .hist
            .live()
            .map(|(_, n)| {
                n.vars.loaded().unwrap()["w"]
                    .chunks()
                    .next()
                    .unwrap()
                    .clone()
            })
            .collect();
        let (c2, c3) = (&chunks[2], &chunks[3]);
        let (e2, e3) = (encoded_of(c2).unwrap(), encoded_of(c3).unwrap());
        assert_eq!((e2.depth, e3.depth), (2, 3));
        assert!(e2.cached().is_none());
        // Reading version 2 keeps its bytes in the handle: version 3 starts from them.
        c2.load().unwrap();
        assert!(e2
            .cached()
            .is_some_and(|b| b.as_ptr() == c2.data().as_ptr()));
        let b3 = e3.decode(&c3.hash(), c3.len_bytes()).unwrap();
        let want: Vec<u8> = copies[3].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(&*b3, &want[..]);
        drop(b3);
        assert!(e3.cached().is_none(), "only the caller held those bytes");
        // Once no handle keeps version 2's bytes (the next pass drops them), the chain is
        // decoded from its full chunk again.
        let id3 = c3.hash();
        drop(chunks);
        s.enforce_memory_budget();
        assert!(e2.cached().is_none());
        let b3 = e3.decode(&id3, 4096 * 4).unwrap();
        assert_eq!(&*b3, &want[..]);
    }
}
