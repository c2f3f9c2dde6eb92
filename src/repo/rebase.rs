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
use super::pack::{read_stored, Form, Loc, MAX_DELTA_CHAIN};
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

/// A chunk planned to be coded again: its base's id (none: stored whole), its raw
/// length and element width, and whether it must be (`required`: an unchained chunk,
/// whose stored form needs a chunk that only pruned versions hold) or only where the
/// delta saves at least 1/[`MIN_SAVING_DIVISOR`] of its stored form (re-basing).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planned {
    pub(crate) base: Option<ContentHash>,
    pub(crate) len: usize,
    pub(crate) width: usize,
    pub(crate) required: bool,
}

/// Links of `id`'s chain (its own included) with the planned forms, or `None` if it
/// passes through `avoid` or a `blocked` chunk, a link is not served, or it is longer
/// than readers follow.
fn chain_links(
    planned: &HashMap<ContentHash, Planned>,
    served: &HashMap<ContentHash, Loc>,
    id: ContentHash,
    avoid: ContentHash,
    blocked: impl Fn(&ContentHash) -> bool,
) -> Option<usize> {
    let mut cur = id;
    for n in 1..=MAX_READ_CHAIN {
        if cur == avoid || blocked(&cur) {
            return None;
        }
        let next = match planned.get(&cur) {
            Some(p) => p.base,
            None => served.get(&cur)?.span.base(),
        };
        match next {
            Some(b) => cur = b,
            None => return Some(n),
        }
    }
    None
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

    /// Plan the coding of the `stranded` chunks (live chunks of live versions whose
    /// every stored form needs a chunk of `base_only`, which only pruned versions hold
    /// and which gc keeps only as a base): each is coded again against the chunk at the
    /// same index of the same variable in its version's nearest live first parent, or
    /// whole where it has none or where that base's chain (planned forms included)
    /// already has [`MAX_DELTA_CHAIN`] links or passes through a chunk not yet planned.
    /// Parents come first, so a chain of live versions becomes a chain of deltas
    /// between them. O(live chunks of the versions · chain bound).
    pub(crate) fn unchain(
        &self,
        served: &HashMap<ContentHash, Loc>,
        stranded: &HashSet<ContentHash>,
        base_only: &HashSet<ContentHash>,
    ) -> HashMap<ContentHash, Planned> {
        let mut planned: HashMap<ContentHash, Planned> = HashMap::new();
        if stranded.is_empty() {
            return planned;
        }
        for (i, parent) in self.parents_first() {
            let v = &self.versions[i];
            let parent_vars: HashMap<&str, &ContentHash> = parent
                .map(|p| &self.versions[p])
                .into_iter()
                .flat_map(|p| p.vars.iter().map(|(n, m)| (n.as_str(), m)))
                .collect();
            for (name, m) in &v.vars {
                let Some(cur) = self.manifests.get(m) else {
                    continue;
                };
                let prev = parent_vars
                    .get(name.as_str())
                    .and_then(|pm| self.manifests.get(pm))
                    .filter(|p| {
                        p.dtype == cur.dtype
                            && p.chunk_elems == cur.chunk_elems
                            && p.chunks.len() == cur.chunks.len()
                    });
                for (k, &c) in cur.chunks.iter().enumerate() {
                    if !stranded.contains(&c) || planned.contains_key(&c) {
                        continue;
                    }
                    let len = cur.chunk_len(k);
                    let base = prev
                        .filter(|p| p.chunk_len(k) == len && len > 0)
                        .map(|p| p.chunks[k])
                        .filter(|&b| {
                            let blocked = |x: &ContentHash| {
                                base_only.contains(x)
                                    || (stranded.contains(x) && !planned.contains_key(x))
                            };
                            chain_links(&planned, served, b, c, blocked)
                                .is_some_and(|links| links < MAX_DELTA_CHAIN)
                        });
                    planned.insert(
                        c,
                        Planned {
                            base,
                            len,
                            width: cur.dtype.size(),
                            required: true,
                        },
                    );
                }
            }
        }
        // Every live chunk is a chunk of a live version; any other is stored whole.
        for c in stranded {
            if let (false, Some(loc)) = (planned.contains_key(c), served.get(c)) {
                let len = usize::try_from(loc.span.raw_len).unwrap_or(usize::MAX);
                planned.insert(
                    *c,
                    Planned {
                        base: None,
                        len,
                        width: 1,
                        required: true,
                    },
                );
            }
        }
        planned
    }

    /// Plan the deltas (see the module doc). `served` is each live chunk's stored form
    /// (where gc reads it); `bases` every id that some index entry names as a base.
    /// O(live chunks of the versions · chain bound).
    pub(crate) fn plan(
        &self,
        served: &HashMap<ContentHash, Loc>,
        bases: &HashSet<ContentHash>,
        mut planned: HashMap<ContentHash, Planned>,
    ) -> HashMap<ContentHash, Planned> {
        let mut used: HashSet<ContentHash> = planned.values().filter_map(|p| p.base).collect();
        let chain =
            |planned: &HashMap<ContentHash, Planned>, id: ContentHash, avoid: ContentHash| {
                chain_links(planned, served, id, avoid, |_| false)
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
                            base: Some(base),
                            len,
                            width: cur.dtype.size(),
                            required: false,
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

/// Every stored form of the live chunks: the packs holding each and where.
pub(crate) type Forms = HashMap<ContentHash, Vec<Loc>>;

/// For each chunk of `version_live` (the chunks of live versions), a stored form that
/// needs no chunk of `base_only` (a *free* form: stored whole, or a delta whose base is
/// a chunk of a live version with a free form; a whole form where there is one), or
/// `None` if it has none (it is *stranded*). Chains longer than readers follow, and
/// cycles through chunks stored in two forms, count as not free.
/// O(forms · chain bound).
pub(crate) fn free_forms(
    forms: &Forms,
    version_live: &HashSet<ContentHash>,
    base_only: &HashSet<ContentHash>,
) -> HashMap<ContentHash, Option<Loc>> {
    fn free(
        c: ContentHash,
        depth: usize,
        forms: &Forms,
        base_only: &HashSet<ContentHash>,
        memo: &mut HashMap<ContentHash, Option<Loc>>,
    ) -> Option<Loc> {
        if let Some(known) = memo.get(&c) {
            return *known;
        }
        if depth >= MAX_READ_CHAIN || base_only.contains(&c) {
            return None;
        }
        // In progress: a cycle through `c` is not free.
        memo.insert(c, None);
        let mut found = None;
        for loc in forms.get(&c).into_iter().flatten() {
            let ok = match loc.span.base() {
                None => true,
                Some(b) => free(b, depth + 1, forms, base_only, memo).is_some(),
            };
            if ok {
                found = Some(*loc);
                if loc.span.base().is_none() {
                    break;
                }
            }
        }
        memo.insert(c, found);
        found
    }
    let mut memo: HashMap<ContentHash, Option<Loc>> = HashMap::new();
    for c in version_live {
        free(*c, 0, forms, base_only, &mut memo);
    }
    memo.retain(|c, _| version_live.contains(c));
    memo
}

/// A planned chunk as coded: its stored form and bytes.
pub(crate) struct Coded {
    pub(crate) form: Form,
    pub(crate) bytes: Bytes,
    pub(crate) required: bool,
}

/// Code the planned chunks of one pack, in parallel: each required one (unchained) in
/// the smallest form [`codec::encode_with`] finds against its planned base (or whole),
/// each other one as a delta against its base where that is at least
/// 1/[`MIN_SAVING_DIVISOR`] smaller than its stored form (`delta`: the one the
/// repository's format stores). A chunk or base that cannot be read is an error (gc
/// then deletes nothing).
pub(crate) fn code_pack(
    backend: &dyn Backend,
    served: &HashMap<ContentHash, Loc>,
    planned: &HashMap<ContentHash, Planned>,
    chunks: &[ContentHash],
    delta: codec::Delta,
) -> Result<HashMap<ContentHash, Coded>> {
    let jobs: Vec<(ContentHash, Planned, u64)> = chunks
        .iter()
        .filter_map(|c| Some((*c, *planned.get(c)?, served.get(c)?.span.stored_len())))
        .collect();
    let coded: Vec<Option<(ContentHash, Coded)>> = crate::parallel::install(|| {
        jobs.par_iter()
            .map(
                |(c, p, stored_len)| -> Result<Option<(ContentHash, Coded)>> {
                    let raw = load_raw(backend, served, *c, p.len)?;
                    let base = match p.base {
                        Some(b) => Some((b, load_raw(backend, served, b, p.len)?)),
                        None => None,
                    };
                    let base = base.as_ref().map(|(h, bytes)| (h, &bytes[..]));
                    if p.required {
                        let e = codec::encode_with(&raw, p.width, base, delta);
                        let (form, bytes) = match Form::of(&e) {
                            Form::Raw => (Form::Raw, raw),
                            form => (form, Bytes::from(e.into_bytes())),
                        };
                        return Ok(Some((
                            *c,
                            Coded {
                                form,
                                bytes,
                                required: true,
                            },
                        )));
                    }
                    let Some((b, _)) = base else {
                        return Ok(None);
                    };
                    let e = codec::encode_as(delta.method(), &raw, p.width, base);
                    let limit = stored_len - stored_len / MIN_SAVING_DIVISOR as u64;
                    Ok((e.method().is_delta() && e.len() as u64 <= limit).then(|| {
                        let coded = Coded {
                            form: Form::Delta(b.0),
                            bytes: Bytes::from(e.into_bytes()),
                            required: false,
                        };
                        (*c, coded)
                    }))
                },
            )
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(coded.into_iter().flatten().collect())
}
