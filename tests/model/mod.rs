//! A naive model of a store's history for the model-based tests: every version is a deep
//! copy (`BTreeMap<String, Vec<f32> + shape>`), with its own parent links, refs, HEAD,
//! redo stack and pruned set, and each documented operation written out plainly from the
//! contract (the crate docs and DESIGN.md), not from the store's code: retention decides
//! version by version, merges apply one three-way rule to variables and chunks.
#![allow(dead_code)]

pub mod driver;

use std::collections::{BTreeMap, BTreeSet};

use ndarray::{ArrayD, IxDyn};
use tensor_history::{
    Conflict, Diff, Error, Goal, MergeStrategy, Meta, Ref, RefKind, TensorDiff, VarDiff, VersionId,
};

/// 16 `f32` elements per chunk.
pub const CHUNK_BYTES: usize = 64;
/// Few distinct values, so that equal chunks written independently are common.
pub const VALUES: [f32; 5] = [0.0, 1.0, 2.0, 3.0, -1.0];

/// A deep copy of one `f32` tensor.
#[derive(Clone, Debug)]
pub struct Arr {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// The chunk size the store's tensor was made with: [`CHUNK_BYTES`] (the store's
    /// config), or [`DENSE_CHUNK_BYTES`] for a tensor inserted with its own layout.
    pub chunk_bytes: usize,
}

/// Chunk size of the dense tensor some tests insert with a layout of its own: an XOR
/// delta of a dense step codes to about a third of a 1 KiB chunk, where a
/// [`CHUNK_BYTES`] chunk never pays for a delta's header.
pub const DENSE_CHUNK_BYTES: usize = 1024;

impl Arr {
    pub fn ramp(shape: &[usize], seed: usize) -> Arr {
        let n: usize = shape.iter().product();
        Arr {
            shape: shape.to_vec(),
            data: (0..n)
                .map(|i| VALUES[(i / 7 + seed) % VALUES.len()])
                .collect(),
            chunk_bytes: CHUNK_BYTES,
        }
    }

    /// A dense tensor of `elems` elements in [`DENSE_CHUNK_BYTES`] chunks at training
    /// step `step`: element `i` is a fixed float with `step * (1 + i % 3)` added to its
    /// bits, so two steps differ in every element (and in every chunk, at any chunk
    /// size), while near steps differ only in the low mantissa bits, as a small dense
    /// training step does: a save stores them as XOR deltas.
    pub fn dense(elems: usize, step: usize) -> Arr {
        let data = (0..elems)
            .map(|i| {
                let mut h = (i as u32).wrapping_mul(0x9e37_79b9);
                h = (h ^ (h >> 16)).wrapping_mul(0x85eb_ca6b);
                h = (h ^ (h >> 13)).wrapping_mul(0xc2b2_ae35);
                h ^= h >> 16;
                // Sign and exponent from `i` (magnitudes 2^-4 to 2^3), mantissa from the
                // hash; the step moves the low bits.
                let sign = (i as u32 & 1) << 31;
                let exp = (123 + (i as u32 / 2) % 8) << 23;
                let bits = sign | exp | (h >> 9);
                f32::from_bits(bits + step as u32 * (1 + i as u32 % 3))
            })
            .collect();
        Arr {
            shape: vec![elems],
            data,
            chunk_bytes: DENSE_CHUNK_BYTES,
        }
    }

    /// Equal dtype, shape and bytes (bitwise, as the store compares).
    pub fn same(&self, other: &Arr) -> bool {
        self.shape == other.shape && bits_eq(&self.data, &other.data)
    }

    /// Elements per chunk, as documented: whole rows of the outermost axis when a row
    /// fits in a chunk, else as many elements as fit.
    pub fn chunk_elems(&self) -> usize {
        let per = self.chunk_bytes / 4;
        if let Some((_, rest)) = self.shape.split_first() {
            let row: usize = rest.iter().product();
            if row > 0 && row <= per {
                return per / row * row;
            }
        }
        per
    }

    pub fn num_chunks(&self) -> usize {
        self.data.len().div_ceil(self.chunk_elems())
    }

    pub fn chunk(&self, i: usize) -> &[f32] {
        let ce = self.chunk_elems();
        &self.data[i * ce..((i + 1) * ce).min(self.data.len())]
    }

    pub fn with_chunks(&self, chunks: &[Vec<f32>]) -> Arr {
        Arr {
            shape: self.shape.clone(),
            data: chunks.concat(),
            chunk_bytes: self.chunk_bytes,
        }
    }

    pub fn to_array(&self) -> ArrayD<f32> {
        ArrayD::from_shape_vec(IxDyn(&self.shape), self.data.clone()).unwrap()
    }
}

pub fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub type MVars = BTreeMap<String, Arr>;

pub fn vars_same(a: &MVars, b: &MVars) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, ta), (kb, tb))| ka == kb && ta.same(tb))
}

pub fn opt_same(a: Option<&Arr>, b: Option<&Arr>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.same(b),
        _ => false,
    }
}

/// The documented diff of two variable maps: per variable added, removed, unchanged, or
/// changed with the chunk indices whose bytes differ (every chunk when the shape changed),
/// their element ranges (adjacent ones merged) and bytes.
pub fn diff_model(a: &MVars, b: &MVars) -> Diff {
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let vars = names
        .into_iter()
        .map(|name| {
            let d = match (a.get(name), b.get(name)) {
                (Some(_), None) => VarDiff::Removed,
                (None, Some(_)) => VarDiff::Added,
                (Some(x), Some(y)) => {
                    let layout_changed = x.shape != y.shape;
                    let chunks: Vec<usize> = (0..y.num_chunks())
                        .filter(|&i| layout_changed || !bits_eq(x.chunk(i), y.chunk(i)))
                        .collect();
                    if chunks.is_empty() && !layout_changed {
                        VarDiff::Unchanged
                    } else {
                        let ce = y.chunk_elems();
                        let mut elements: Vec<std::ops::Range<usize>> = Vec::new();
                        for &i in &chunks {
                            let r = i * ce..((i + 1) * ce).min(y.data.len());
                            match elements.last_mut() {
                                Some(last) if last.end == r.start => last.end = r.end,
                                _ => elements.push(r),
                            }
                        }
                        let bytes = elements.iter().map(|r| r.len() * 4).sum();
                        VarDiff::Changed(TensorDiff {
                            chunks,
                            elements,
                            bytes,
                            layout_changed,
                        })
                    }
                }
                (None, None) => unreachable!(),
            };
            (name.clone(), d)
        })
        .collect();
    Diff { vars }
}

/// Weighted mean of equal-length slices, `Σ (w_i / Σw) · x_i` in `f64`, rounded once;
/// terms of weight 0 are left out (a NaN of weight 0 does not count), and a sum of
/// weights that overflows is taken over the weights halved often enough.
pub fn mean_of(parts: &[&[f32]], weights: &[f64]) -> Vec<f32> {
    let mut scale = 1.0;
    while !weights.iter().map(|w| w * scale).sum::<f64>().is_finite() {
        scale *= 0.5;
    }
    let total: f64 = weights.iter().map(|w| w * scale).sum();
    (0..parts[0].len())
        .map(|j| {
            let s: f64 = parts
                .iter()
                .zip(weights)
                .filter(|(_, w)| **w != 0.0)
                .map(|(x, w)| f64::from(x[j]) * (w * scale / total))
                .sum();
            s as f32
        })
        .collect()
}

/// Chunk-wise mean; chunks equal in every part are taken as they are.
pub fn mean_arr(parts: &[&Arr], weights: &[f64]) -> Arr {
    let chunks: Vec<Vec<f32>> = (0..parts[0].num_chunks())
        .map(|i| {
            let col: Vec<&[f32]> = parts.iter().map(|p| p.chunk(i)).collect();
            if col.iter().all(|c| bits_eq(c, col[0])) {
                col[0].to_vec()
            } else {
                mean_of(&col, weights)
            }
        })
        .collect();
    parts[0].with_chunks(&chunks)
}

/// Which side a three-way merge takes.
enum Side {
    Ours,
    Theirs,
    /// Both changed it, differently.
    Both,
}

/// The three-way rule, the same for a variable and for a chunk: a side equal to the base
/// did not change it, so the other side is taken; sides equal to each other are taken as
/// they are; otherwise both changed it.
fn three_way<T: Copy>(ours: T, theirs: T, base: T, same: impl Fn(T, T) -> bool) -> Side {
    if same(ours, theirs) {
        Side::Ours
    } else if same(ours, base) {
        Side::Theirs
    } else if same(theirs, base) {
        Side::Ours
    } else {
        Side::Both
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum MHead {
    Branch(String),
    Detached(u64),
}

#[derive(Clone, Debug)]
pub struct MNode {
    pub parents: Vec<u64>,
    pub message: String,
    pub meta: Meta,
    pub vars: MVars,
}

#[derive(Clone, Debug)]
pub struct Model {
    /// `None` once pruned.
    pub nodes: Vec<Option<MNode>>,
    pub refs: BTreeMap<String, Ref>,
    pub head: MHead,
    pub redo: Vec<u64>,
    pub working: MVars,
    pub max_versions: Option<usize>,
    /// Versions HEAD left while no ref pointed at them, with HEAD's branch (or `HEAD`),
    /// oldest first, each version once, at most `reflog_cap`.
    pub reflog: Vec<(String, u64)>,
    pub reflog_cap: usize,
}

pub type MResult<T> = Result<T, Error>;

pub fn vid(id: u64) -> VersionId {
    VersionId(id)
}

pub fn var_unknown(name: &str) -> Error {
    Error::UnknownVariable {
        name: name.to_owned(),
    }
}

pub fn invalid_arg() -> Error {
    Error::InvalidArgument {
        reason: String::new(),
    }
}

impl Model {
    pub fn new(max_versions: Option<usize>) -> Model {
        Model {
            nodes: Vec::new(),
            refs: BTreeMap::new(),
            head: MHead::Branch("main".into()),
            redo: Vec::new(),
            working: MVars::new(),
            max_versions,
            reflog: Vec::new(),
            reflog_cap: tensor_history::DEFAULT_REFLOG_ENTRIES,
        }
    }

    /// Note that HEAD (on branch `name`, or `HEAD`) left `from`, unless something holds it.
    pub fn log_left(&mut self, from: Option<u64>, name: String) {
        let Some(from) = from else { return };
        if self.head_id() == Some(from) || self.refs.values().any(|r| r.target().0 == from) {
            return;
        }
        self.reflog.retain(|(_, v)| *v != from);
        self.reflog.push((name, from));
        if self.reflog.len() > self.reflog_cap {
            let extra = self.reflog.len() - self.reflog_cap;
            self.reflog.drain(..extra);
        }
    }

    fn head_name(&self) -> String {
        self.head_branch().unwrap_or("HEAD").to_owned()
    }

    /// Move HEAD (and its branch) to `id`, noting what it left in the reflog.
    pub fn move_head_logged(&mut self, id: u64) {
        let (from, name) = (self.head_id(), self.head_name());
        self.move_head(id);
        self.log_left(from, name);
    }

    pub fn checkout_detached(&mut self, id: u64) -> MResult<()> {
        self.working = self.node(id)?.vars.clone();
        let (from, name) = (self.head_id(), self.head_name());
        self.head = MHead::Detached(id);
        self.log_left(from, name);
        self.redo.clear();
        Ok(())
    }

    pub fn node(&self, id: u64) -> MResult<&MNode> {
        match self.nodes.get(id as usize) {
            Some(Some(n)) => Ok(n),
            Some(None) => Err(Error::PrunedVersion { id: vid(id) }),
            None => Err(Error::UnknownVersion { id: vid(id) }),
        }
    }

    pub fn live(&self) -> Vec<u64> {
        (0..self.nodes.len() as u64)
            .filter(|&i| self.nodes[i as usize].is_some())
            .collect()
    }

    pub fn children(&self, id: u64) -> Vec<u64> {
        self.live()
            .into_iter()
            .filter(|&c| self.node(c).unwrap().parents.contains(&id))
            .collect()
    }

    pub fn head_id(&self) -> Option<u64> {
        match &self.head {
            MHead::Branch(b) => self.refs.get(b).map(|r| r.target().0),
            MHead::Detached(v) => Some(*v),
        }
    }

    pub fn head_branch(&self) -> Option<&str> {
        match &self.head {
            MHead::Branch(b) => Some(b),
            MHead::Detached(_) => None,
        }
    }

    pub fn move_head(&mut self, id: u64) {
        match &self.head {
            MHead::Branch(b) => {
                self.refs.insert(b.clone(), Ref::Branch(vid(id)));
            }
            MHead::Detached(_) => self.head = MHead::Detached(id),
        }
    }

    pub fn head_vars(&self) -> MVars {
        match self.head_id() {
            Some(h) => self.node(h).unwrap().vars.clone(),
            None => MVars::new(),
        }
    }

    pub fn dirty(&self) -> bool {
        match self.head_id() {
            None => !self.working.is_empty(),
            Some(h) => !vars_same(&self.working, &self.node(h).unwrap().vars),
        }
    }

    pub fn ancestors(&self, id: u64) -> BTreeSet<u64> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![id];
        while let Some(v) = stack.pop() {
            if seen.insert(v) {
                stack.extend(self.node(v).unwrap().parents.iter().copied());
            }
        }
        seen
    }

    /// The newest common ancestor.
    pub fn merge_base(&self, a: u64, b: u64) -> Option<u64> {
        let from_a = self.ancestors(a);
        self.ancestors(b)
            .into_iter()
            .rev()
            .find(|v| from_a.contains(v))
    }

    /// Record a version, make it the working state and HEAD, clear redo, auto-retain.
    pub fn record(&mut self, parents: Vec<u64>, message: String, meta: Meta, vars: MVars) -> u64 {
        let id = self.nodes.len() as u64;
        self.nodes.push(Some(MNode {
            parents,
            message,
            meta,
            vars: vars.clone(),
        }));
        self.working = vars;
        self.move_head(id);
        self.redo.clear();
        if let Some(n) = self.max_versions {
            self.prune(Some(n), None, true, None);
        }
        id
    }

    /// Drop a version; its children take its parents in its place.
    pub fn remove(&mut self, id: u64) {
        let node = self.nodes[id as usize].take().unwrap();
        for c in self.live() {
            let cn = self.nodes[c as usize].as_mut().unwrap();
            if !cn.parents.contains(&id) {
                continue;
            }
            let mut parents = Vec::new();
            for p in &cn.parents {
                let replacement = if *p == id {
                    node.parents.clone()
                } else {
                    vec![*p]
                };
                for q in replacement {
                    if !parents.contains(&q) {
                        parents.push(q);
                    }
                }
            }
            cn.parents = parents;
        }
        self.redo.retain(|r| *r != id);
    }

    /// The best `n` live versions by their numeric, non-NaN `loss`, written naively: a
    /// version is among them when fewer than `n` others beat it (a better value, or an
    /// equal value and an older id).
    pub fn best_by_loss(&self, n: usize, goal: Goal) -> BTreeSet<u64> {
        let scored: Vec<(u64, f64)> = self
            .live()
            .into_iter()
            .filter_map(|id| {
                let v = self.node(id).unwrap().meta.get("loss")?.as_f64()?;
                (!v.is_nan()).then_some((id, v))
            })
            .collect();
        scored
            .iter()
            .filter(|(id, v)| {
                let beaten_by = scored
                    .iter()
                    .filter(|(oid, ov)| {
                        let better = match goal {
                            Goal::Min => ov < v,
                            Goal::Max => ov > v,
                        };
                        better || (ov == v && oid < id)
                    })
                    .count();
                beaten_by < n
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The versions on the first-parent line of `tip`: `tip`, its first parent, that one's
    /// first parent, ..., oldest last.
    fn first_parent_line(&self, tip: u64) -> Vec<u64> {
        let mut line = vec![tip];
        while let Some(p) = self.node(*line.last().unwrap()).unwrap().parents.first() {
            line.push(*p);
        }
        line
    }

    /// `Store::prune` as `Retention`'s docs state it, version by version: HEAD, branch
    /// tips, tagged versions, the redo path and the reflog are always kept; a version is
    /// kept when any policy keeps it (`last`: among the last N of the first-parent line of
    /// a branch tip or of HEAD; `every`: its id a multiple of k; `best`: among the best N
    /// by `loss`); the others are dropped when `last` or `best` is set, or, with
    /// `unreachable`, when no branch, tag, HEAD, redo entry or reflog entry reaches them.
    /// Children of a dropped version take its parents.
    pub fn prune(
        &mut self,
        last: Option<usize>,
        every: Option<usize>,
        unreachable: bool,
        best: Option<(usize, Goal)>,
    ) -> Vec<u64> {
        let mut anchors: Vec<u64> = Vec::new();
        anchors.extend(self.head_id());
        anchors.extend(self.refs.values().map(|r| r.target().0));
        anchors.extend(self.redo.iter().copied());
        anchors.extend(self.reflog.iter().map(|(_, v)| *v));
        let mut tips: Vec<u64> = Vec::new();
        tips.extend(self.head_id());
        for r in self.refs.values() {
            if let Ref::Branch(v) = r {
                tips.push(v.0);
            }
        }
        let best_set = best.map(|(n, goal)| self.best_by_loss(n, goal));
        let drop_it = |id: u64| -> bool {
            let anchored = anchors.contains(&id);
            let in_a_window = last.is_some_and(|n| {
                tips.iter()
                    .any(|&t| self.first_parent_line(t).iter().take(n).any(|&v| v == id))
            });
            let every_kth = every.is_some_and(|k| k > 0 && id.is_multiple_of(k as u64));
            let among_best = best_set.as_ref().is_some_and(|b| b.contains(&id));
            if anchored || in_a_window || every_kth || among_best {
                return false;
            }
            if last.is_some() || best.is_some() {
                return true;
            }
            unreachable && !anchors.iter().any(|&a| self.ancestors(a).contains(&id))
        };
        let dropped: Vec<u64> = self.live().into_iter().filter(|&id| drop_it(id)).collect();
        for id in &dropped {
            self.remove(*id);
        }
        dropped
    }

    pub fn check_ref_name(name: &str) -> MResult<()> {
        let digits = name.strip_prefix('v').unwrap_or(name);
        let version_like = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit());
        if name.is_empty()
            || name == "HEAD"
            || version_like
            || name.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            Err(Error::InvalidRefName {
                name: name.to_owned(),
            })
        } else {
            Ok(())
        }
    }

    pub fn new_ref(&mut self, name: &str, r: Ref) -> MResult<()> {
        Self::check_ref_name(name)?;
        if self.refs.contains_key(name) || self.head_branch() == Some(name) {
            return Err(Error::RefExists {
                name: name.to_owned(),
            });
        }
        self.node(r.target().0)?;
        self.refs.insert(name.to_owned(), r);
        Ok(())
    }

    pub fn delete_ref(&mut self, name: &str, branch: bool) -> MResult<()> {
        let is_branch = match self.refs.get(name) {
            None => {
                return Err(Error::UnknownRef {
                    name: name.to_owned(),
                })
            }
            Some(r) => matches!(r, Ref::Branch(_)),
        };
        if is_branch != branch {
            return Err(Error::WrongRefKind {
                name: name.to_owned(),
                expected: if branch {
                    RefKind::Branch
                } else {
                    RefKind::Tag
                },
            });
        }
        if self.head_branch() == Some(name) {
            return Err(Error::BranchCheckedOut {
                name: name.to_owned(),
            });
        }
        self.refs.remove(name);
        Ok(())
    }

    pub fn checkout(&mut self, name: &str) -> MResult<()> {
        match self.refs.get(name) {
            None => Err(Error::UnknownRef {
                name: name.to_owned(),
            }),
            Some(Ref::Tag(_)) => Err(Error::WrongRefKind {
                name: name.to_owned(),
                expected: RefKind::Branch,
            }),
            Some(Ref::Branch(v)) => {
                self.working = self.node(v.0)?.vars.clone();
                let (from, left) = (self.head_id(), self.head_name());
                self.head = MHead::Branch(name.to_owned());
                self.log_left(from, left);
                self.redo.clear();
                Ok(())
            }
        }
    }

    pub fn restore(&mut self, id: u64) -> MResult<()> {
        self.working = self.node(id)?.vars.clone();
        self.move_head_logged(id);
        self.redo.clear();
        Ok(())
    }

    pub fn undo(&mut self) -> MResult<u64> {
        if self.dirty() {
            return Err(Error::UncommittedChanges);
        }
        let head = self.head_id().ok_or(Error::NothingToUndo)?;
        let parent = *self
            .node(head)?
            .parents
            .first()
            .ok_or(Error::NothingToUndo)?;
        self.working = self.node(parent)?.vars.clone();
        self.move_head_logged(parent);
        self.redo.push(head);
        Ok(parent)
    }

    pub fn redo(&mut self) -> MResult<u64> {
        if self.dirty() {
            return Err(Error::UncommittedChanges);
        }
        let next = self.redo.pop().ok_or(Error::NothingToRedo)?;
        self.working = self.node(next)?.vars.clone();
        self.move_head_logged(next);
        Ok(next)
    }

    /// Three-way merge of one variable, as `Store::merge`, `MergeStrategy` and `Conflict`
    /// document it: a side that left the variable as the base had it gives way to the
    /// other side; two sides that agree give what they agree on; two sides that changed
    /// it differently are merged chunk by chunk when both have the base's shape (a chunk
    /// follows the same rule, and a chunk changed differently on both sides is resolved
    /// by the strategy or listed), and otherwise conflict as a whole variable (added on
    /// both sides, removed on one side and changed on the other, or reshaped), which
    /// `Ours` and `Theirs` resolve, and `Mean` too when both sides hold one shape.
    pub fn merge_var(
        name: &str,
        ours: Option<&Arr>,
        theirs: Option<&Arr>,
        base: Option<&Arr>,
        strategy: MergeStrategy,
        conflicts: &mut Vec<Conflict>,
    ) -> Option<Arr> {
        match three_way(ours, theirs, base, opt_same) {
            Side::Ours => return ours.cloned(),
            Side::Theirs => return theirs.cloned(),
            Side::Both => {}
        }
        let chunk_level = match (ours, theirs, base) {
            (Some(o), Some(t), Some(b)) => o.shape == b.shape && t.shape == b.shape,
            _ => false,
        };
        if !chunk_level {
            return match (strategy, ours, theirs) {
                (MergeStrategy::Ours, _, _) => ours.cloned(),
                (MergeStrategy::Theirs, _, _) => theirs.cloned(),
                (MergeStrategy::Mean, Some(o), Some(t)) if o.shape == t.shape => {
                    Some(mean_arr(&[o, t], &[1.0, 1.0]))
                }
                _ => {
                    conflicts.push(Conflict {
                        variable: name.to_owned(),
                        chunks: None,
                    });
                    ours.cloned()
                }
            };
        }
        let (o, t, b) = (ours.unwrap(), theirs.unwrap(), base.unwrap());
        let mut clashing = Vec::new();
        let mut chunks: Vec<Vec<f32>> = Vec::new();
        for i in 0..o.num_chunks() {
            let (co, ct, cb) = (o.chunk(i), t.chunk(i), b.chunk(i));
            chunks.push(match three_way(co, ct, cb, bits_eq) {
                Side::Ours => co.to_vec(),
                Side::Theirs => ct.to_vec(),
                Side::Both => match strategy {
                    MergeStrategy::Ours => co.to_vec(),
                    MergeStrategy::Theirs => ct.to_vec(),
                    MergeStrategy::Mean => mean_of(&[co, ct], &[1.0, 1.0]),
                    _ => {
                        clashing.push(i);
                        co.to_vec()
                    }
                },
            });
        }
        if !clashing.is_empty() {
            conflicts.push(Conflict {
                variable: name.to_owned(),
                chunks: Some(clashing),
            });
        }
        Some(o.with_chunks(&chunks))
    }

    pub fn merge(&mut self, other: u64, strategy: MergeStrategy) -> MResult<u64> {
        let head = self.head_id().ok_or(Error::NoCommits)?;
        let theirs = self.node(other)?.vars.clone();
        if other == head {
            return Err(invalid_arg());
        }
        if self.dirty() {
            return Err(Error::UncommittedChanges);
        }
        let ours = self.node(head)?.vars.clone();
        let base = match self.merge_base(head, other) {
            Some(b) => self.node(b)?.vars.clone(),
            None => MVars::new(),
        };
        let names: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
        let mut merged = MVars::new();
        let mut conflicts = Vec::new();
        for name in names {
            let v = Self::merge_var(
                name,
                ours.get(name),
                theirs.get(name),
                base.get(name),
                strategy,
                &mut conflicts,
            );
            if let Some(v) = v {
                merged.insert(name.clone(), v);
            }
        }
        if !conflicts.is_empty() {
            return Err(Error::MergeConflict { conflicts });
        }
        let message = format!("merge v{other} into v{head}");
        Ok(self.record(vec![head, other], message, Meta::new(), merged))
    }

    pub fn average(&mut self, ids: &[u64], weights: Option<&[f64]>) -> MResult<u64> {
        if ids.is_empty() {
            return Err(invalid_arg());
        }
        let weights: Vec<f64> = match weights {
            None => vec![1.0; ids.len()],
            Some(w) if w.len() != ids.len() => return Err(invalid_arg()),
            Some(w) => w.to_vec(),
        };
        if weights.iter().any(|w| *w < 0.0) || weights.iter().sum::<f64>() <= 0.0 {
            return Err(invalid_arg());
        }
        let versions: Vec<MVars> = ids
            .iter()
            .map(|id| self.node(*id).map(|n| n.vars.clone()))
            .collect::<MResult<_>>()?;
        if self.dirty() {
            return Err(Error::UncommittedChanges);
        }
        let mut out = MVars::new();
        for (name, first) in &versions[0] {
            let mut parts = Vec::new();
            for v in &versions {
                let t = v.get(name).ok_or_else(|| var_unknown(name))?;
                if t.shape != first.shape {
                    return Err(Error::ShapeMismatch {
                        name: name.clone(),
                        expected: first.shape.clone(),
                        found: t.shape.clone(),
                    });
                }
                parts.push(t);
            }
            out.insert(name.clone(), mean_arr(&parts, &weights));
        }
        let mut parents: Vec<u64> = self.head_id().into_iter().collect();
        for id in ids {
            if !parents.contains(id) {
                parents.push(*id);
            }
        }
        let list: Vec<String> = ids.iter().map(|i| format!("v{i}")).collect();
        let message = format!("average of {}", list.join(", "));
        Ok(self.record(parents, message, Meta::new(), out))
    }
}
