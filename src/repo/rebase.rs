//! gc's re-basing (`GcOptions::rebase`): chunks stored whole (raw or byte planes) are
//! coded again as deltas (the repository format's: XOR in format 2, difference in 3)
//! against the chunk at the same index of the same variable in their version's first
//! parent, where that is smaller, and their packs rewritten.
//!
//! What stores chunks whole: repositories saved before the codec (format 1 upgraded is
//! not done: they are left alone), writers with no parent to take deltas against
//! (`Store::write_part`, so every DCP save of a dense change), and saves from stores that
//! held no earlier version. A dense history written that way costs a model per version;
//! re-based, it costs what a save with deltas would have written.
//!
//! The plan is made from metadata only (versions, manifests, index entries); then pack by
//! pack the candidates are decoded, checked against their ids, coded against their
//! bases, and a pack is rewritten only if that shrinks it to at most
//! [`REBASE_BELOW`] of its bytes (rewriting a 32 MiB pack to save a few chunks would
//! cost more than it gives). Dropping a planned delta is always safe: nothing else
//! depends on it.
//!
//! Rules that keep every chain readable and bounded:
//! - only a chunk that no stored entry names as a base (and no other planned delta) is
//!   re-based, so no existing chain grows;
//! - its base's chain, with the planned deltas, is shorter than `MAX_DELTA_CHAIN` and
//!   does not pass through the chunk (no cycle, also when versions share chunks);
//! - the base is live (a chunk of a live version); from then on gc keeps it live as the
//!   base of a live delta.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::backend::Backend;
use super::chunks::MAX_READ_CHAIN;
use super::format::{corrupt, pack_key, Manifest};
use super::pack::{read_stored, Loc, MAX_DELTA_CHAIN};
use crate::buffer::Bytes;
use crate::codec::{self, MIN_SAVING_DIVISOR};
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// A pack is rewritten to re-base chunks only if its rewrite (its live chunks, the
/// re-based ones as deltas) is at most this fraction of its bytes.
pub const REBASE_BELOW: f64 = 0.9;

/// One live version as gc's mark read it: its first parent (a live version, through
/// prune markers) and its variables' manifests by name.
pub(crate) struct GraphVersion {
    pub(crate) id: ContentHash,
    pub(crate) first_parent: Option<ContentHash>,
    pub(crate) vars: Vec<(String, ContentHash)>,
}

/// The live versions and their manifests, kept by gc's mark when re-basing.
#[derive(Default)]
pub(crate) struct Graph {
    pub(crate) versions: Vec<GraphVersion>,
    pub(crate) manifests: HashMap<ContentHash, Manifest>,
    /// A pruned version's first parent (the prune marker's), to see through markers.
    pub(crate) pruned_parent: HashMap<ContentHash, Option<ContentHash>>,
}

/// A planned delta: the base's id, the chunk's raw length and element width.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planned {
    pub(crate) base: ContentHash,
    pub(crate) len: usize,
    pub(crate) width: usize,
}

impl Graph {
    /// The nearest live ancestor along first parents (through at most 64 pruned
    /// versions).
    fn live_first_parent(
        &self,
        v: &GraphVersion,
        live: &HashSet<ContentHash>,
    ) -> Option<ContentHash> {
        let mut at = v.first_parent?;
        for _ in 0..64 {
            if live.contains(&at) {
                return Some(at);
            }
            at = (*self.pruned_parent.get(&at)?)?;
        }
        None
    }

    /// The versions, parents before children, each with its nearest live first parent
    /// (indexes into `versions`; a version without one comes where the listing put it).
    /// O(versions).
    fn parents_first(&self) -> Vec<(usize, Option<usize>)> {
        let live: HashSet<ContentHash> = self.versions.iter().map(|v| v.id).collect();
        let at: HashMap<ContentHash, usize> = self
            .versions
            .iter()
            .enumerate()
            .map(|(i, v)| (v.id, i))
            .collect();
        let parent: Vec<Option<usize>> = self
            .versions
            .iter()
            .map(|v| {
                self.live_first_parent(v, &live)
                    .and_then(|p| at.get(&p).copied())
            })
            .collect();
        let mut order = Vec::with_capacity(self.versions.len());
        // Each version is walked over once: `seen` marks it when a walk reaches it.
        let mut seen = vec![false; self.versions.len()];
        for start in 0..self.versions.len() {
            // Walk up to the first version seen (or the root), then place downwards.
            let mut path = Vec::new();
            let mut cur = Some(start);
            while let Some(i) = cur.filter(|&i| !seen[i]) {
                seen[i] = true;
                path.push(i);
                cur = parent[i];
            }
            order.extend(path.iter().rev().map(|&i| (i, parent[i])));
        }
        order
    }

    /// Plan the deltas (see the module doc). `served` is each live chunk's stored form
    /// (where gc reads it); `bases` every id that some index entry names as a base.
    /// O(live chunks of the versions · chain bound).
    pub(crate) fn plan(
        &self,
        served: &HashMap<ContentHash, Loc>,
        bases: &HashSet<ContentHash>,
    ) -> HashMap<ContentHash, Planned> {
        let mut planned: HashMap<ContentHash, Planned> = HashMap::new();
        let mut used: HashSet<ContentHash> = HashSet::new();
        // Links of `id`'s chain (its own included) with the planned deltas, and whether
        // it passes through `avoid`; `None` if a link is not served or too deep.
        let chain =
            |planned: &HashMap<ContentHash, Planned>, id: ContentHash, avoid: ContentHash| {
                let mut cur = id;
                for n in 1..=MAX_READ_CHAIN {
                    if cur == avoid {
                        return None;
                    }
                    let next = match planned.get(&cur) {
                        Some(p) => Some(p.base),
                        None => served.get(&cur)?.span.base(),
                    };
                    match next {
                        Some(b) => cur = b,
                        None => return Some(n),
                    }
                }
                None
            };
        for (i, parent) in self.parents_first() {
            let (v, Some(parent)) = (&self.versions[i], parent.map(|p| &self.versions[p])) else {
                continue;
            };
            let parent_vars: HashMap<&str, &ContentHash> =
                parent.vars.iter().map(|(n, m)| (n.as_str(), m)).collect();
            for (name, m) in &v.vars {
                let Some(pm) = parent_vars.get(name.as_str()) else {
                    continue;
                };
                if *pm == m {
                    continue;
                }
                let (Some(cur), Some(prev)) = (self.manifests.get(m), self.manifests.get(pm))
                else {
                    continue;
                };
                if cur.dtype != prev.dtype
                    || cur.chunk_elems != prev.chunk_elems
                    || cur.chunks.len() != prev.chunks.len()
                {
                    continue;
                }
                for (k, (&c, &base)) in cur.chunks.iter().zip(&prev.chunks).enumerate() {
                    let len = cur.chunk_len(k);
                    let whole = served
                        .get(&c)
                        .is_some_and(|l| l.span.base().is_none() && l.span.raw_len() == len as u64);
                    if c == base
                        || !whole
                        || planned.contains_key(&c)
                        || bases.contains(&c)
                        || used.contains(&c)
                        || prev.chunk_len(k) != len
                        || len == 0
                    {
                        continue;
                    }
                    let Some(links) = chain(&planned, base, c) else {
                        continue;
                    };
                    if links >= MAX_DELTA_CHAIN {
                        continue;
                    }
                    planned.insert(
                        c,
                        Planned {
                            base,
                            len,
                            width: cur.dtype.size(),
                        },
                    );
                    used.insert(base);
                }
            }
        }
        planned
    }
}

/// The raw bytes of live chunk `id` (`len` bytes), read through its served form's chain
/// and checked against the id. O(len · links).
fn load_raw(
    backend: &dyn Backend,
    served: &HashMap<ContentHash, Loc>,
    id: ContentHash,
    len: usize,
) -> Result<Bytes> {
    let mut stored: Vec<(ContentHash, Loc, Bytes)> = Vec::new();
    let mut cur = id;
    loop {
        if stored.len() >= MAX_READ_CHAIN {
            return Err(corrupt(
                &pack_key(&stored[0].1.pack),
                format!("chunk {id}: delta chain longer than {MAX_READ_CHAIN}"),
            ));
        }
        let loc = *served.get(&cur).ok_or_else(|| Error::CorruptObject {
            path: format!("chunk {cur}"),
            reason: format!("base of live chunk {id} is in no pack gc read"),
        })?;
        let bytes = read_stored(backend, &cur, &loc)?;
        let next = loc.span.base();
        stored.push((cur, loc, bytes));
        match next {
            Some(b) => cur = b,
            None => break,
        }
    }
    let key = pack_key(&stored[0].1.pack);
    let (last_id, last_loc, last) = stored.last().expect("one link at least");
    let (links, base): (Vec<&[u8]>, Option<&[u8]>) = if last_loc.span.form.is_plain() {
        if *last_id == id {
            let raw = super::pack::check_raw(&key, &id, &last_loc.span, last.clone())?;
            return Ok(raw);
        }
        (
            stored[..stored.len() - 1]
                .iter()
                .map(|s| &s.2[..])
                .collect(),
            Some(&last[..]),
        )
    } else {
        (stored.iter().map(|s| &s.2[..]).collect(), None)
    };
    codec::decode_chain(&links, base, &id, len)
        .map_err(|e| corrupt(&key, format!("chunk {id}: {e}")))
}

/// A chunk coded as a delta: its base's id and the encoded bytes.
pub(crate) type Delta = (ContentHash, Vec<u8>);

/// Code the planned chunks of one pack as deltas against their bases, in parallel: each
/// chunk whose delta is at least 1/[`MIN_SAVING_DIVISOR`] smaller than its stored form,
/// with its base and that delta's encoded bytes (`delta`: the one the repository's
/// format stores). A chunk or base that cannot be read is an error (gc then deletes
/// nothing).
pub(crate) fn code_pack(
    backend: &dyn Backend,
    served: &HashMap<ContentHash, Loc>,
    planned: &HashMap<ContentHash, Planned>,
    chunks: &[ContentHash],
    delta: codec::Delta,
) -> Result<HashMap<ContentHash, Delta>> {
    let jobs: Vec<(ContentHash, Planned, u64)> = chunks
        .iter()
        .filter_map(|c| Some((*c, *planned.get(c)?, served.get(c)?.span.stored_len())))
        .collect();
    let coded: Vec<Option<(ContentHash, Delta)>> = crate::parallel::install(|| {
        jobs.par_iter()
            .map(
                |(c, p, stored_len)| -> Result<Option<(ContentHash, Delta)>> {
                    let raw = load_raw(backend, served, *c, p.len)?;
                    let base = load_raw(backend, served, p.base, p.len)?;
                    let e = codec::encode_as(delta.method(), &raw, p.width, Some((&p.base, &base)));
                    let limit = stored_len - stored_len / MIN_SAVING_DIVISOR as u64;
                    Ok((e.method().is_delta() && e.len() as u64 <= limit)
                        .then(|| (*c, (p.base, e.into_bytes()))))
                },
            )
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(coded.into_iter().flatten().collect())
}
