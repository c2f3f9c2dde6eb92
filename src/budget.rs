//! The memory budget: when the history holds more than [`Config::memory_budget`],
//! the oldest versions' chunks are held encoded ([`crate::encoded`]), in the
//! background, so that a dense history costs a fraction of its deep copies. This module
//! is the store's side: what to encode (the plan), when (after a commit, or at once),
//! and swapping the encoded chunks into the history.
//!
//! [`Config::memory_budget`]: crate::Config::memory_budget

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::chunk::{Chunk, WeakChunk};
use crate::encoded::{
    encoded_of, memory_of, run, BaseRef, Done, EncodedChunk, Item, Ledger, Memory, Plan,
    DELTA_ANCHOR_EVERY, DELTA_SPAN,
};
use crate::history::Vars;
use crate::store::Store;
use crate::version::VersionId;

/// The raw chunks in `hot` of `vars` if nothing in them is left to encode: every chunk
/// encoded or in a repository and not loaded, or raw and in `hot`, or raw and in
/// `kept_raw` (coding does not shrink it); `None` otherwise.
fn settled_chunks(
    vars: &Vars,
    hot: &HashSet<usize>,
    kept_raw: &HashMap<usize, WeakChunk>,
) -> Option<Vec<usize>> {
    let mut raw = Vec::new();
    for c in vars.values().flat_map(|t| t.chunks()) {
        if c.len_bytes() == 0 || (c.source().is_some() && c.is_unloaded()) {
            continue;
        }
        let a = c.addr();
        if c.source().is_some() {
            return None;
        }
        if hot.contains(&a) {
            raw.push(a);
        } else if !kept_raw.contains_key(&a) {
            return None;
        }
    }
    raw.sort_unstable();
    raw.dedup();
    Some(raw)
}

/// The budget's record of the live versions held in memory, kept so that a commit costs
/// the budget time in what it added, not in the length of the history: each version's
/// chunks counted once in a [`Ledger`] (what the history holds, without walking it), and
/// which versions are *settled*: nothing in them left to encode (every chunk encoded or
/// in a repository and not loaded, or raw and, when it settled, held by the working
/// state or HEAD, or raw and found by a pass not to shrink by coding: an optimizer's
/// step counter, noise). A plan walks only the versions that are not settled.
///
/// A version is counted again when its variables were replaced (their stamp changed) or
/// it is gone; a settled version is unsettled when one of its raw chunks is no longer
/// in the working state or HEAD at a plan. Loading a stored chunk's bytes into its
/// handle changes what the handle holds without changing any variables: when any was
/// loaded in the process since the record was made ([`crate::chunk::loads`]), it is
/// made again.
#[derive(Debug, Default)]
pub(crate) struct Record {
    versions: HashMap<VersionId, Counted>,
    /// (chunk address, version): the raw chunks of the settled versions.
    raw_in: BTreeSet<(usize, VersionId)>,
    /// The chunks of the working state and HEAD at the last plan.
    hot: HashSet<usize>,
    /// Raw chunks a pass found that coding does not shrink (an optimizer's step
    /// counter, noise), by address: they stay raw and settled, and no pass codes them
    /// again. A weak handle keeps the address from being reused while the entry lives;
    /// entries of dead chunks are dropped as they accumulate.
    kept_raw: HashMap<usize, WeakChunk>,
    /// Entries in `kept_raw` after its last sweep of dead chunks.
    kept_raw_swept: usize,
    ledger: Ledger,
    loads: u64,
}

#[derive(Debug)]
struct Counted {
    /// The stamp of the version's variables when counted.
    stamp: u64,
    /// Its chunks' addresses, each once.
    addrs: Vec<usize>,
    /// While settled: its raw chunks' addresses.
    settled: Option<Vec<usize>>,
}

impl Record {
    fn forget(&mut self, id: VersionId) {
        self.unsettle(id);
        if let Some(c) = self.versions.remove(&id) {
            for a in c.addrs {
                self.ledger.remove(a);
            }
        }
    }

    fn unsettle(&mut self, id: VersionId) {
        if let Some(c) = self.versions.get_mut(&id) {
            for a in c.settled.take().unwrap_or_default() {
                self.raw_in.remove(&(a, id));
            }
        }
    }

    fn settle(&mut self, id: VersionId, raw: Vec<usize>) {
        if let Some(c) = self.versions.get_mut(&id) {
            for &a in &raw {
                self.raw_in.insert((a, id));
            }
            c.settled = Some(raw);
        }
    }

    /// Remember the raw chunks a pass could not shrink; sweep out the dead ones when the
    /// entries doubled since the last sweep (amortized O(1) per entry).
    fn keep_raw(&mut self, chunks: &[Chunk]) {
        for c in chunks {
            self.kept_raw.insert(c.addr(), c.downgrade());
        }
        if self.kept_raw.len() > 2 * self.kept_raw_swept + 64 {
            self.kept_raw.retain(|_, w| w.is_alive());
            self.kept_raw_swept = self.kept_raw.len();
        }
    }

    fn is_settled(&self, id: VersionId) -> bool {
        self.versions.get(&id).is_some_and(|c| c.settled.is_some())
    }

    /// The chunks in `hot` now: unsettle each settled version holding a raw chunk that
    /// was hot at the last plan and is not now. O(hot chunks).
    fn set_hot(&mut self, hot: &HashSet<usize>) {
        let left: Vec<VersionId> = self
            .hot
            .difference(hot)
            .flat_map(|&a| {
                self.raw_in
                    .range((a, VersionId(0))..=(a, VersionId(u64::MAX)))
                    .map(|&(_, id)| id)
            })
            .collect();
        for id in left {
            self.unsettle(id);
        }
        self.hot.clone_from(hot);
    }
}

impl Store {
    /// Bring the record of the live versions up to date (see [`Record`]). O(versions)
    /// and O(chunks) of the versions new or changed since the last call.
    fn update_record(&mut self) {
        let r = &mut self.record;
        let loads = crate::chunk::loads();
        if loads != r.loads {
            // What coding does not shrink stays so: only the counts are made again.
            *r = Record {
                loads,
                kept_raw: std::mem::take(&mut r.kept_raw),
                kept_raw_swept: r.kept_raw_swept,
                ..Record::default()
            };
        }
        let hist = &self.hist;
        let stale: Vec<VersionId> = r
            .versions
            .iter()
            .filter(|(id, c)| hist.node(**id).map_or(true, |n| n.vars.stamp() != c.stamp))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            r.forget(id);
        }
        for (id, node) in hist.live() {
            if r.versions.contains_key(&id) {
                continue;
            }
            let Some(vars) = node.vars.loaded() else {
                continue;
            };
            let mut seen = HashSet::new();
            let mut addrs = Vec::new();
            for c in vars.values().flat_map(|t| t.chunks()) {
                if seen.insert(c.addr()) {
                    r.ledger.add(c);
                    addrs.push(c.addr());
                }
            }
            r.versions.insert(
                id,
                Counted {
                    stamp: node.vars.stamp(),
                    addrs,
                    settled: None,
                },
            );
        }
    }

    /// What [`memory`](Store::memory) gives, from the record: O(versions) and O(chunks)
    /// of the working state and of the versions new or changed since the last call.
    fn memory_now(&mut self) -> Memory {
        self.update_record();
        let mut seen = HashSet::new();
        let working = self
            .working
            .values()
            .flat_map(|t| t.chunks())
            .filter(|c| seen.insert(c.addr()));
        let m = self.record.ledger.memory_with(working);
        if cfg!(debug_assertions) {
            // Unless a chunk was loaded meanwhile (a snapshot read on another thread).
            let full = self.memory();
            if crate::chunk::loads() == self.record.loads {
                assert_eq!(m, full, "the budget's record of the memory held");
            }
        }
        m
    }

    /// The live versions a plan walks: those not settled.
    fn unsettled(&self) -> Vec<VersionId> {
        self.hist
            .live()
            .map(|(id, _)| id)
            .filter(|id| !self.record.is_settled(*id))
            .collect()
    }

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
    /// state's), and the decoded bytes that encoded chunks keep are dropped at once
    /// (after the plan took its bases: a base whose decoded bytes were kept stays
    /// decoded for this pass, held by the plan).
    fn plan(&mut self, held: usize, budget: usize) -> Plan {
        let mut hot: HashSet<usize> = HashSet::new();
        let head = self.hist.head_id();
        let head_vars = head.and_then(|h| self.hist.node(h).ok()?.vars.loaded().cloned());
        for v in std::iter::once(&self.working).chain(head_vars.as_ref()) {
            hot.extend(v.values().flat_map(|t| t.chunks().map(Chunk::addr)));
        }
        self.record.set_hot(&hot);
        let want = held.saturating_sub(budget).saturating_mul(2);
        // Versions in the repository, or that a background save is writing, are left
        // raw: the save's end evicts their chunks (they are read back from the
        // repository), which costs nothing, where encoding them would code the same
        // bytes a second time.
        let (saved, captured) = match (&self.repo, &self.bg.inflight) {
            (Some(b), _) => (Some(&b.saved), None),
            (None, Some(f)) => (Some(&f.saved), Some(&f.captured)),
            (None, None) => (None, None),
        };
        let ids: Vec<VersionId> = self
            .unsettled()
            .into_iter()
            .filter(|id| Some(*id) != head)
            .collect();
        let mut settle = Vec::new();
        // The chunks this pass plans, by address: their position in their group and
        // where their group's key is.
        let mut planned: HashMap<usize, (usize, BaseRef)> = HashMap::new();
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
            if let Some(raw) = settled_chunks(vars, &hot, &self.record.kept_raw) {
                settle.push((id, raw));
                continue;
            }
            if saved.is_some_and(|s| s.contains_key(&id))
                || captured.is_some_and(|c| c.contains(&id))
            {
                continue;
            }
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
                        || planned.contains_key(&c.addr())
                        || self.record.kept_raw.contains_key(&c.addr())
                    {
                        continue;
                    }
                    // The parent's chunk: its position and its group's key, and how to
                    // reach it as a base.
                    let prev = pt.and_then(|pt| pt.chunks().nth(i)).and_then(|b| {
                        if b.ptr_eq(c) {
                            return None;
                        }
                        if let Some((pos, key)) = planned.get(&b.addr()) {
                            return Some((*pos, key.clone(), BaseRef::InPass(b.addr())));
                        }
                        let src = encoded_of(b)?;
                        let (kid, k) = EncodedChunk::key(b.hash(), &src);
                        let key = BaseRef::Encoded {
                            id: kid,
                            src: k,
                            _holds: None,
                        };
                        let parent = BaseRef::Encoded {
                            id: b.hash(),
                            src: Arc::clone(&src),
                            _holds: Some(b.clone()),
                        };
                        Some((src.pos, key, parent))
                    });
                    let (pos, base, key) = match prev {
                        Some((p, key, parent)) if p < DELTA_SPAN => {
                            let pos = p + 1;
                            let base = if pos.is_multiple_of(DELTA_ANCHOR_EVERY) {
                                key.clone()
                            } else {
                                parent
                            };
                            (pos, base, key)
                        }
                        _ => (0, BaseRef::None, BaseRef::InPass(c.addr())),
                    };
                    planned.insert(c.addr(), (pos, key));
                    bytes += c.len_bytes();
                    items.push(Item {
                        raw: c.clone(),
                        width: t.dtype().size(),
                        base,
                        pos,
                    });
                }
            }
            if !items.is_empty() {
                versions.push(items);
            }
        }
        for (id, raw) in settle {
            self.record.settle(id, raw);
        }
        self.drop_decoded(&hot);
        Plan {
            versions,
            pool: self.alloc.pool_weak(),
        }
    }

    /// Replace encoded chunks that keep decoded bytes (and are not `hot`) by handles
    /// without them, in every live version. Raw buffers this frees (those an encoding
    /// pass left as the decoded bytes of its newest version) go back to the pool as
    /// [`apply`](Store::apply) lets them.
    fn drop_decoded(&mut self, hot: &HashSet<usize>) {
        let pooled_before = self.pool().map(|p| p.buffers());
        self.drop_decoded_handles(hot);
        self.trim_pool(pooled_before);
    }

    /// Keep at most as many pooled buffers as the working state has chunks, or as the
    /// pool held before (`before`) if more.
    fn trim_pool(&self, before: Option<usize>) {
        let working_chunks: usize = self.working.values().map(|t| t.num_chunks()).sum();
        if let (Some(pool), Some(before)) = (self.pool(), before) {
            pool.truncate(before.max(working_chunks));
        }
    }

    fn drop_decoded_handles(&mut self, hot: &HashSet<usize>) {
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

    /// In every live version held in memory that is not settled (see [`Record`]),
    /// replace each chunk `f` gives a replacement for: what the budget replaces (a raw
    /// chunk a pass encoded, an encoded chunk that keeps its decoded bytes) is in no
    /// settled version. O(chunks of those versions).
    fn replace_chunks(&mut self, f: impl FnMut(&Chunk) -> Option<Chunk>) {
        let ids = self.unsettled();
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
                // A tensor's chunks are collected anew only from its first replaced one.
                let mut chunks: Option<crate::tensor::ChunkVec> = None;
                for (i, c) in t.chunks().enumerate() {
                    match (f(c), chunks.as_mut()) {
                        (Some(n), Some(v)) => v.push_back(n),
                        (Some(n), None) => {
                            let mut v: crate::tensor::ChunkVec =
                                t.chunks().take(i).cloned().collect();
                            v.push_back(n);
                            chunks = Some(v);
                        }
                        (None, Some(v)) => v.push_back(c.clone()),
                        (None, None) => {}
                    }
                }
                if let Some(chunks) = chunks {
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

    /// Swap the encoded chunks of a finished pass in. Of the raw buffers freed, the pool
    /// keeps as many as the working state has chunks (what the next dense commit copies
    /// into: it then pays no page fault), the rest leave the process; the pool never
    /// drops below what it held before. So a history under the budget holds about the
    /// budget plus one working state.
    fn apply(&mut self, done: Done) {
        self.record.keep_raw(done.kept_raw());
        if done.is_empty() {
            return;
        }
        let pooled_before = self.pool().map(|p| p.buffers());
        self.replace_chunks(|c| done.get(&c.addr()).map(|(_, e)| e.clone()));
        drop(done);
        self.trim_pool(pooled_before);
    }

    /// Take in the result of a finished background pass (a pass started in another
    /// process, before a `fork`, is given up).
    fn collect_pass(&mut self) {
        if let Some(Some(done)) = self.budget.finished() {
            self.apply(done);
        }
    }

    /// After a commit: take in a finished pass, start one if the held bytes passed the
    /// budget, and when what the history would hold with every old version encoded
    /// passes it too, spill or let go of the oldest versions (see
    /// [`over_budget`](Store::over_budget)). O(chunks) pointer walk; encoding runs on
    /// another thread.
    ///
    /// Back-pressure: while a pass runs, commits go on without waiting until the bytes
    /// held (raw and encoded, working state and HEAD included) pass the budget plus one
    /// working state (the model in flight); the commit that finds them past it waits for
    /// the pass and runs the next one itself. So commits faster than the encoder cannot
    /// make the history grow past the budget by more than the model being committed.
    pub(crate) fn budget_after_commit(&mut self) {
        let Some(budget) = self.config.memory_budget else {
            return;
        };
        self.collect_pass();
        let mut m = self.memory_now();
        let limit = budget.saturating_add(self.working_bytes());
        let behind = self.budget.running();
        if behind {
            if m.raw_held + m.encoded_held <= limit {
                return;
            }
            if let Some(done) = self.budget.wait() {
                self.apply(done);
            }
            m = self.memory_now();
        }
        let held = m.raw_held + m.encoded_held;
        if held <= budget {
            return;
        }
        let plan = self.plan(held, budget);
        if !plan.versions.is_empty() {
            if behind || held > limit {
                // Commits ran ahead of the encoder (or this commit brought the history
                // past the budget plus a model) and this one waits anyway: the pass runs
                // here, on the foreground pool (every core, this thread's too), rather
                // than on the background pool (one core fewer) while this thread idles.
                let done = run(plan);
                self.apply(done);
            } else {
                self.budget.start(plan);
            }
        }
        self.over_budget(budget, limit);
    }

    /// Bytes of the working state's chunks (what one commit of it adds at most). O(variables).
    fn working_bytes(&self) -> usize {
        self.working
            .values()
            .map(|t| t.chunks().map(Chunk::len_bytes).sum::<usize>())
            .sum()
    }

    /// What the history would hold if every chunk the budget may encode were encoded:
    /// what it holds encoded, plus the raw chunks of the working state and HEAD (which
    /// stay raw). Encoding never makes a chunk larger than raw, so past the budget this
    /// says that encoding alone cannot bring the history under it. O(chunks of the
    /// working state and HEAD).
    fn held_when_encoded(&mut self) -> usize {
        let m = self.memory_now();
        let head = self.hist.head_id();
        let head_vars = head.and_then(|h| self.hist.node(h).ok()?.vars.loaded().cloned());
        let mut seen = HashSet::new();
        let hot = memory_of(
            std::iter::once(&self.working)
                .chain(head_vars.as_ref())
                .flat_map(|v| v.values().flat_map(|t| t.chunks()))
                .filter(|c| seen.insert(c.addr())),
        );
        m.encoded_held + hot.raw_held
    }

    /// The history holds more than the budget even with its old versions encoded: with
    /// a repository, spill them there (a background save: saved versions' chunks leave
    /// memory when it ends, read back on use); without one, let the oldest versions that
    /// no branch, tag, HEAD, the redo path or the reflog holds go, oldest first, as
    /// [`Config::max_versions`](crate::Config::max_versions) does (reading one then
    /// gives [`Error::PrunedVersion`](crate::Error::PrunedVersion)), until what it holds
    /// is within the budget. While a spill is in flight and the history holds more than
    /// `limit`, the commit waits for it.
    fn over_budget(&mut self, budget: usize, limit: usize) {
        if self.held_when_encoded() <= budget {
            return;
        }
        if self.bg.inflight.is_some() {
            // A save a caller started evicts what it writes when it ends: the commit
            // does not wait for it (its caller may be holding it back). A spill is
            // waited for once the history is past the budget plus a model.
            if !self.bg.spill || self.held() <= limit {
                return;
            }
            self.end_spill(budget);
            if self.held_when_encoded() <= budget {
                return;
            }
        }
        if self.repo.is_some() {
            // A save that failed and was not reported yet keeps its error (another spill
            // would hide it): memory stays over the budget until the next save, refresh
            // or close reports it.
            if self.bg.has_unreported() || self.save_in_background().is_err() {
                return;
            }
            // Its error, if any, is reported by the next save, refresh or close (nobody
            // waits for this one).
            self.bg.spill = true;
            if self.held() > limit {
                // Past the budget plus a model: this commit waits for the spill.
                self.end_spill(budget);
            }
            return;
        }
        self.shed_oldest(budget);
    }

    /// The bytes the history holds now, raw and encoded. O(versions) and the chunks of
    /// the versions new since the last count (see [`Record`]).
    fn held(&mut self) -> usize {
        let m = self.memory_now();
        m.raw_held + m.encoded_held
    }

    /// Wait for the spill in flight (what it saved leaves memory), then encode what
    /// was committed while it ran, before the next spill captures it raw.
    fn end_spill(&mut self, budget: usize) {
        self.settle_save(true);
        let held = self.held();
        if held <= budget {
            return;
        }
        if let Some(done) = self.budget.wait() {
            self.apply(done);
        }
        let plan = self.plan(held, budget);
        if !plan.versions.is_empty() {
            let done = run(plan);
            self.apply(done);
        }
    }

    /// Without a repository: drop the oldest live versions that nothing protects (see
    /// [`over_budget`](Store::over_budget)) until the history would hold at most
    /// `budget` with its old versions encoded. O(versions dropped × versions).
    fn shed_oldest(&mut self, budget: usize) {
        #[cfg(test)]
        if self.budget_keeps_versions {
            return;
        }
        let hist = &self.hist;
        let mut protected: HashSet<VersionId> = hist.refs.values().map(|r| r.target()).collect();
        protected.extend(hist.head_id());
        protected.extend(hist.reflog.iter().map(|(_, v)| *v));
        protected.extend(hist.redo.iter().copied());
        let oldest: Vec<VersionId> = hist
            .live()
            .map(|(id, _)| id)
            .filter(|id| !protected.contains(id))
            .collect();
        for id in oldest {
            if self.held_when_encoded() <= budget {
                break;
            }
            self.hist.remove(id);
        }
    }

    /// Set [`Config::memory_budget`] (`None`: no budget). The next commit, or
    /// [`enforce_memory_budget`](Store::enforce_memory_budget), holds the history to it;
    /// nothing is encoded or let go here. O(1).
    ///
    /// [`Config::memory_budget`]: crate::Config::memory_budget
    pub fn set_memory_budget(&mut self, budget: Option<usize>) {
        self.config.memory_budget = budget;
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
        if let Some(done) = self.budget.wait() {
            self.apply(done);
        }
        // The record in the loop, where it saves a walk per pass; a full walk for the
        // result, after the last plan (which settled what it could).
        let held = |m: Memory| m.raw_held + m.encoded_held;
        let Some(budget) = self.config.memory_budget else {
            return held(self.memory());
        };
        loop {
            let now = held(self.memory_now());
            if now <= budget {
                return now;
            }
            let plan = self.plan(now, budget);
            if plan.versions.is_empty() {
                return held(self.memory());
            }
            let done = run(plan);
            let encoded = !done.is_empty();
            self.apply(done);
            if !encoded {
                return held(self.memory());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array1;

    use super::*;
    use crate::config::Config;
    use crate::encoded::{MAX_DELTA_CHAIN, RAW_KEY_MIN_BYTES};
    use crate::retention::Retention;

    /// A store with `config` whose budget encodes but lets no version go: these tests
    /// are of the encoding (the versions the budget lets go are `tests/integration/memory_budget.rs`'s).
    fn encoding_store(config: Config) -> Store {
        let mut s = Store::with_config(config).unwrap();
        s.budget_keeps_versions = true;
        s
    }

    #[test]
    fn groups_are_a_raw_key_then_deltas_with_anchors_on_the_key() {
        let mut s = encoding_store(Config {
            memory_budget: Some(0),
            ..Config::default()
        });
        // One chunk of RAW_KEY_MIN_BYTES: keys held raw.
        s.insert(
            "w",
            &Array1::from_shape_fn(RAW_KEY_MIN_BYTES / 4, |i| (i as f32 * 0.1).cos()),
        )
        .unwrap();
        s.commit("0").unwrap();
        let mut copies = vec![s.get::<f32>("w").unwrap()];
        let versions = 2 * (DELTA_SPAN + 1) + 4;
        for step in 1..versions {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.commit(&step.to_string()).unwrap();
            copies.push(s.get::<f32>("w").unwrap());
        }
        s.enforce_memory_budget();
        let chunks = first_chunks(&s);
        // HEAD stays raw.
        assert!(encoded_of(chunks.last().unwrap()).is_none());
        let forms: Vec<Arc<EncodedChunk>> = chunks[..versions - 1]
            .iter()
            .map(|c| encoded_of(c).expect("every version but HEAD encoded"))
            .collect();
        for (v, e) in forms.iter().enumerate() {
            // Version v is at position v mod (span + 1) of its group; its key is the
            // version at position 0.
            let pos = v % (DELTA_SPAN + 1);
            let key = v - pos;
            assert_eq!(e.pos, pos, "version {v}");
            let base = e.base_id();
            if pos == 0 {
                assert_eq!(base, None, "version {v} is a key");
                assert!(e.is_raw(), "a key is held raw");
                assert_eq!(e.depth, 0);
                continue;
            }
            // An anchor (a position that is a multiple of DELTA_ANCHOR_EVERY) is a delta
            // on the key, any other position a delta on the version before.
            let want = if pos.is_multiple_of(DELTA_ANCHOR_EVERY) {
                key
            } else {
                v - 1
            };
            assert_eq!(base, Some(chunks[want].hash()), "version {v}'s base");
            let deltas = pos % DELTA_ANCHOR_EVERY + usize::from(pos >= DELTA_ANCHOR_EVERY);
            assert_eq!(e.depth, deltas, "version {v}");
            assert!(e.depth <= MAX_DELTA_CHAIN);
        }
        drop((chunks, forms));
        // Every version reads back bit for bit, with nothing kept decoded.
        s.drop_decoded(&HashSet::new());
        for (k, copy) in copies.iter().enumerate() {
            let id = s.hist.live().nth(k).unwrap().0;
            assert_eq!(&s.snapshot(id).unwrap().get::<f32>("w").unwrap(), copy);
        }
    }

    /// Versions the budget's record has not settled (HEAD among them).
    fn unsettled_count(s: &Store) -> usize {
        s.record
            .versions
            .values()
            .filter(|c| c.settled.is_none())
            .count()
    }

    /// After a pass: only HEAD and the version the last pass encoded last (it keeps its
    /// decoded bytes for the next pass to start from) are left unsettled, and the
    /// record's count of the memory held is the full walk's.
    fn assert_only_the_newest_unsettled(s: &mut Store, step: impl std::fmt::Display) {
        assert!(
            unsettled_count(s) <= 2,
            "{} after commit {step}",
            unsettled_count(s)
        );
        assert_eq!(s.memory_now(), s.memory(), "after commit {step}");
    }

    /// Every chunk of every live version is encoded, or raw and held by HEAD or the
    /// working state: nothing left for the budget to encode.
    fn assert_nothing_left_to_encode(s: &Store) {
        let head = s
            .hist
            .head_id()
            .map(|h| s.hist.node(h).unwrap().vars.get().unwrap());
        let hot: HashSet<usize> = std::iter::once(&s.working)
            .chain(head)
            .flat_map(|v| v.values().flat_map(|t| t.chunks().map(Chunk::addr)))
            .collect();
        for (id, n) in s.hist.live() {
            for c in n.vars.get().unwrap().values().flat_map(|t| t.chunks()) {
                assert!(
                    c.is_encoded() || hot.contains(&c.addr()),
                    "version {id} holds a raw chunk that HEAD does not"
                );
            }
        }
    }

    #[test]
    fn dense_commits_leave_only_the_newest_versions_for_a_pass_to_walk() {
        let mut s = pooled_store(f32::cos);
        s.commit("0").unwrap();
        let mut copies = vec![s.get::<f32>("w").unwrap()];
        for step in 1..40 {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.commit(&step.to_string()).unwrap();
            copies.push(s.get::<f32>("w").unwrap());
            s.enforce_memory_budget();
            // Every older version settled. (Checked first: a chunk loaded by a test on
            // another thread makes the record's next update count every version again.)
            assert_only_the_newest_unsettled(&mut s, step);
            assert_nothing_left_to_encode(&s);
        }
        for (k, copy) in copies.iter().enumerate() {
            let id = s.hist.live().nth(k).unwrap().0;
            assert_eq!(&s.snapshot(id).unwrap().get::<f32>("w").unwrap(), copy);
        }
    }

    #[test]
    fn chunks_that_coding_does_not_shrink_settle_and_are_not_coded_again() {
        // Beside `w`, what an optimizer keeps: a step counter (one element, which no
        // coding shrinks) and a tensor of noise (a different random chunk every step).
        let mut s = pooled_store(f32::cos);
        let noise = |step: u64| {
            Array1::from_shape_fn(4096, |i| {
                let mut z = (step << 32 | i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                z ^= z >> 29;
                f32::from_bits(z.wrapping_mul(0xbf58_476d_1ce4_e5b9) as u32)
            })
        };
        s.insert("step", &Array1::from_elem(1, 0.0f32)).unwrap();
        s.insert("noise", &noise(0)).unwrap();
        s.commit("0").unwrap();
        let mut copies = vec![["w", "step", "noise"].map(|n| s.get::<f32>(n).unwrap())];
        for step in 1..30u64 {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.write("step", &Array1::from_elem(1, step as f32)).unwrap();
            s.write("noise", &noise(step)).unwrap();
            s.commit(&step.to_string()).unwrap();
            copies.push(["w", "step", "noise"].map(|n| s.get::<f32>(n).unwrap()));
            s.enforce_memory_budget();
            // As with dense commits alone, every older version settled (its step counter
            // and noise held raw), so a pass walks and codes only what is new whatever
            // the history's length.
            assert_only_the_newest_unsettled(&mut s, step);
        }
        // Encoded `w`, raw counter and noise: every version reads back as committed.
        for (k, copy) in copies.iter().enumerate() {
            let id = s.hist.live().nth(k).unwrap().0;
            let got = s.snapshot(id).unwrap();
            for (name, want) in ["w", "step", "noise"].iter().zip(copy) {
                let have = got.get::<f32>(name).unwrap();
                assert!(
                    want.iter()
                        .zip(&have)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name} of version {k}"
                );
            }
        }
    }

    #[test]
    fn the_record_follows_chunks_leaving_head_reads_restores_and_prunes() {
        // Each commit changes one chunk of `w`'s 8; `f` stays as it is (old versions
        // settle holding its raw chunks, which HEAD holds too) until commit 20 changes
        // it: then they hold raw chunks that HEAD does not, to be encoded.
        let mut s = pooled_store(f32::sin);
        s.insert("f", &Array1::from_shape_fn(8 * 4096, |i| (i as f32).sqrt()))
            .unwrap();
        s.commit("0").unwrap();
        let mut copies = vec![s.get::<f32>("w").unwrap()];
        // After the budget is enforced (its last plan settled what it could): first
        // `settled`, on the record as that plan left it (a chunk loaded by a test on
        // another thread makes the record's next update count every version again).
        let check_then = |s: &mut Store, what: &str, settled: &dyn Fn(&Store)| {
            s.enforce_memory_budget();
            settled(s);
            assert_eq!(s.memory_now(), s.memory(), "{what}");
            assert_nothing_left_to_encode(s);
        };
        let check = |s: &mut Store, what: &str| check_then(s, what, &|_| {});
        for step in 1..30 {
            let c = step % 8;
            s.update_range::<f32>("w", c * 4096..(c + 1) * 4096, |_, xs| {
                for x in xs {
                    *x *= 1.0 + 1e-6;
                }
            })
            .unwrap();
            if step == 20 {
                s.update_map::<f32>("f", |x| x + 1.0).unwrap();
            }
            s.commit(&step.to_string()).unwrap();
            copies.push(s.get::<f32>("w").unwrap());
            check_then(&mut s, &format!("commit {step}"), &|s| {
                if step == 19 {
                    assert!(
                        s.record
                            .versions
                            .values()
                            .any(|c| c.settled.as_ref().is_some_and(|raw| !raw.is_empty())),
                        "versions settled holding raw chunks of HEAD"
                    );
                }
            });
        }
        // Read an old version (its chunks' handles load their bytes), restore another.
        let ids: Vec<VersionId> = s.hist.live().map(|(id, _)| id).collect();
        assert_eq!(
            &s.snapshot(ids[3]).unwrap().get::<f32>("w").unwrap(),
            &copies[3]
        );
        check(&mut s, "a read");
        s.restore(ids[10]).unwrap();
        assert_eq!(s.get::<f32>("w").unwrap(), copies[10]);
        check(&mut s, "a restore");
        s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
        let tip = s.commit("after the restore").unwrap();
        let tip_copy = s.get::<f32>("w").unwrap();
        check(&mut s, "a commit after the restore");
        // Drop all but the last 5 versions of the line.
        s.prune(&Retention {
            last: Some(5),
            every: None,
            unreachable: true,
            best: None,
        })
        .unwrap();
        check(&mut s, "a prune");
        let live: Vec<VersionId> = s.hist.live().map(|(id, _)| id).collect();
        assert!(live.len() < ids.len());
        for id in live {
            let want = if id == tip {
                &tip_copy
            } else {
                &copies[ids.iter().position(|i| *i == id).unwrap()]
            };
            assert_eq!(
                &s.snapshot(id).unwrap().get::<f32>("w").unwrap(),
                want,
                "{id}"
            );
        }
    }

    /// A store with a budget of 0 and 16 KiB chunks (so that its buffer pool takes
    /// them), holding `w`: 8 full chunks of `f(i * 0.1)`.
    fn pooled_store(f: fn(f32) -> f32) -> Store {
        let mut s = encoding_store(Config {
            memory_budget: Some(0),
            chunk_bytes: 16 << 10,
            ..Config::default()
        });
        s.insert("w", &Array1::from_shape_fn(8 * 4096, |i| f(i as f32 * 0.1)))
            .unwrap();
        s
    }

    #[test]
    fn decoded_chunks_are_written_into_pooled_buffers_and_given_back() {
        let mut s = pooled_store(f32::cos);
        let v0 = s.commit("0").unwrap();
        let want = s.get::<f32>("w").unwrap();
        for step in 1..6 {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.commit(&step.to_string()).unwrap();
        }
        s.enforce_memory_budget();
        let v2 = s.hist.live().nth(2).unwrap().0;
        s.release_pooled();
        assert_eq!(s.pooled_bytes(), 0);
        // Version 2 (deltas) decoded, then dropped: its 8 buffers go back to the pool.
        let snap = s.snapshot(v2).unwrap();
        let got = snap.get::<f32>("w").unwrap();
        drop(snap);
        s.enforce_memory_budget();
        let pooled = s.pooled_bytes();
        assert_eq!(
            pooled,
            8 * (16 << 10),
            "every decoded buffer back in the pool"
        );
        // The next decode takes them (and reads the right bytes from reused memory).
        let snap = s.snapshot(v2).unwrap();
        assert_eq!(snap.get::<f32>("w").unwrap(), got);
        // At most one left: a chunk whose chain holds a difference delta decodes its
        // base into a pooled buffer first, given back once the chunk is decoded (and
        // taken by the next chunk's decode).
        assert!(
            s.pooled_bytes() <= 16 << 10,
            "the decode took the pooled buffers: {} bytes left",
            s.pooled_bytes()
        );
        drop(snap);
        assert_eq!(s.snapshot(v0).unwrap().get::<f32>("w").unwrap(), want);
    }

    #[test]
    fn a_snapshot_outliving_its_store_decodes_without_keeping_the_pool() {
        let mut s = pooled_store(f32::sin);
        s.commit("0").unwrap();
        s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
        s.commit("1").unwrap();
        let want = s.get::<f32>("w").unwrap();
        s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
        s.commit("2").unwrap();
        s.enforce_memory_budget();
        let v1 = s.hist.live().nth(1).unwrap().0;
        let snap = s.snapshot(v1).unwrap();
        let pool = s.alloc.pool_weak();
        assert!(pool.upgrade().is_some());
        drop(s);
        assert!(
            pool.upgrade().is_none(),
            "the encoded chunks do not keep the pool"
        );
        assert_eq!(snap.get::<f32>("w").unwrap(), want);
    }

    #[test]
    fn small_chunks_are_held_in_fewer_bytes_than_raw_and_keys_coded_in_planes() {
        let mut s = encoding_store(Config {
            memory_budget: Some(0),
            ..Config::default()
        });
        // Small tensors (a bias, a norm): one chunk each, far under RAW_KEY_MIN_BYTES.
        for (k, n) in [64usize, 300, 1024].into_iter().enumerate() {
            s.insert(
                &format!("b{k}"),
                &Array1::from_shape_fn(n, |i| (i as f32 * 0.37).sin() * 0.02),
            )
            .unwrap();
        }
        let mut copies = Vec::new();
        for step in 0..7 {
            if step > 0 {
                for k in 0..3 {
                    s.update_map::<f32>(&format!("b{k}"), |x| x * (1.0 - 1e-5))
                        .unwrap();
                }
            }
            let id = s.commit(&step.to_string()).unwrap();
            copies.push((
                id,
                (0..3)
                    .map(|k| s.get::<f32>(&format!("b{k}")).unwrap())
                    .collect::<Vec<_>>(),
            ));
        }
        s.enforce_memory_budget();
        let st = s.stats();
        assert!(st.encoded_bytes > 0, "old versions encoded");
        assert!(
            st.encoded_held_bytes < st.encoded_bytes,
            "encoding holds fewer bytes than raw: {st:?}"
        );
        let first = s.hist.live().next().unwrap().1.vars.loaded().unwrap()["b2"]
            .chunks()
            .next()
            .unwrap()
            .clone();
        let key = encoded_of(&first).expect("the oldest version encoded");
        assert_eq!(key.pos, 0);
        assert!(!key.is_raw(), "a small key is coded in planes");
        drop((first, key));
        for (id, want) in copies {
            let snap = s.snapshot(id).unwrap();
            for (k, w) in want.iter().enumerate() {
                assert_eq!(&snap.get::<f32>(&format!("b{k}")).unwrap(), w);
            }
        }
    }

    /// The first chunk of `w` in every live version, oldest first.
    fn first_chunks(s: &Store) -> Vec<Chunk> {
        s.hist
            .live()
            .map(|(_, n)| {
                n.vars.loaded().unwrap()["w"]
                    .chunks()
                    .next()
                    .unwrap()
                    .clone()
            })
            .collect()
    }

    #[test]
    fn a_pass_leaves_its_newest_version_decoded_for_the_next_pass_to_start_from() {
        let mut s = Store::new();
        s.insert(
            "w",
            &Array1::from_shape_fn(4096, |i| (i as f32 * 0.1).sin()),
        )
        .unwrap();
        s.commit("0").unwrap();
        let mut copies = vec![s.get::<f32>("w").unwrap()];
        for step in 1..4 {
            s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
            s.commit(&step.to_string()).unwrap();
            copies.push(s.get::<f32>("w").unwrap());
        }
        // Passes of one version each (held just past the budget: the plan stops after
        // the first version), as commits start them.
        let pass = |s: &mut Store| {
            let plan = s.plan(1_000_001, 1_000_000);
            assert_eq!(plan.versions.len(), 1);
            run(plan)
        };
        let done = pass(&mut s);
        s.apply(done);
        let c = first_chunks(&s);
        let v0 = encoded_of(&c[0]).expect("version 0 encoded");
        assert!(
            v0.cached().is_some(),
            "the pass's newest version keeps its bytes"
        );
        drop(c);
        // The next plan drops decoded bytes from the history, but its base (version 0)
        // stays decoded while the plan holds it: version 1 is coded against those bytes.
        let plan = s.plan(1_000_001, 1_000_000);
        assert!(
            first_chunks(&s)[0].is_unloaded(),
            "the history keeps no bytes"
        );
        assert!(
            v0.cached().is_some(),
            "the plan's base keeps its decoded bytes"
        );
        let done = run(plan);
        s.apply(done);
        let c = first_chunks(&s);
        let v1 = encoded_of(&c[1]).expect("version 1 encoded");
        assert_eq!(v1.depth, 1, "a delta on version 0");
        assert!(v1.cached().is_some());
        assert!(
            v0.cached().is_none(),
            "version 0's bytes left with the pass"
        );
        // Every version reads back bit for bit, from a store that keeps nothing decoded.
        s.drop_decoded(&HashSet::new());
        for (k, copy) in copies.iter().enumerate() {
            let id = s.hist.live().nth(k).unwrap().0;
            assert_eq!(&s.snapshot(id).unwrap().get::<f32>("w").unwrap(), copy);
        }
    }

    #[test]
    fn a_delta_starts_from_its_base_while_a_handle_keeps_the_base_decoded() {
        let mut s = encoding_store(Config {
            memory_budget: Some(0),
            ..Config::default()
        });
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
