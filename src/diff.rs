//! Diffs between versions: which variables and chunks changed.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::history::Vars;
use crate::snapshot::Snapshot;
use crate::store::Store;
use crate::tensor::Tensor;
use crate::version::VersionId;

/// How one variable differs between two states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VarDiff {
    /// Only in the second state.
    Added,
    /// Only in the first state.
    Removed,
    /// In both, with different contents.
    Changed(TensorDiff),
    /// In both, with equal contents.
    Unchanged,
}

/// The changed part of a variable present in both states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDiff {
    /// Indices of the chunks whose bytes differ (all of them when the layout changed).
    pub chunks: Vec<usize>,
    /// The flat element ranges those chunks cover (adjacent chunks merged), in the
    /// second state's layout.
    pub elements: Vec<Range<usize>>,
    /// Bytes in the changed chunks.
    pub bytes: usize,
    /// The dtype, shape or chunk size differs, so chunks were not compared one by one
    /// (a variable re-cut into chunks of another size is reported so even when its values
    /// are equal).
    pub layout_changed: bool,
}

/// Per-variable differences between two states, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diff {
    /// Every variable of either state.
    pub vars: BTreeMap<String, VarDiff>,
}

impl Diff {
    /// The entry for one variable.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&VarDiff> {
        self.vars.get(name)
    }

    /// Whether the two states are equal.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.vars.values().all(|d| *d == VarDiff::Unchanged)
    }

    /// Names of variables that were added, removed or changed.
    #[must_use]
    pub fn changed_names(&self) -> Vec<&str> {
        self.vars
            .iter()
            .filter(|(_, d)| **d != VarDiff::Unchanged)
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Total chunks changed over the variables present in both states.
    #[must_use]
    pub fn changed_chunks(&self) -> usize {
        self.tensor_diffs().map(|t| t.chunks.len()).sum()
    }

    /// Total bytes in changed chunks over the variables present in both states.
    #[must_use]
    pub fn changed_bytes(&self) -> usize {
        self.tensor_diffs().map(|t| t.bytes).sum()
    }

    fn tensor_diffs(&self) -> impl Iterator<Item = &TensorDiff> {
        self.vars.values().filter_map(|d| match d {
            VarDiff::Changed(t) => Some(t),
            _ => None,
        })
    }
}

/// Compare one tensor present in both states.
pub(crate) fn diff_tensor(a: &Tensor, b: &Tensor) -> VarDiff {
    if !a.same_layout(b) {
        // Even with equal values, another chunk size is another content hash: a change,
        // as `Store::is_dirty` sees it.
        let chunks: Vec<usize> = (0..b.num_chunks()).collect();
        return VarDiff::Changed(TensorDiff {
            elements: merge_ranges(b, &chunks),
            chunks,
            bytes: b.nbytes(),
            layout_changed: true,
        });
    }
    let chunks = a.changed_chunks(b);
    if chunks.is_empty() {
        return VarDiff::Unchanged;
    }
    let bytes = chunks
        .iter()
        .map(|&i| b.chunk_range(i).len() * b.dtype().size())
        .sum();
    VarDiff::Changed(TensorDiff {
        elements: merge_ranges(b, &chunks),
        chunks,
        bytes,
        layout_changed: false,
    })
}

fn merge_ranges(t: &Tensor, chunks: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &i in chunks {
        let r = t.chunk_range(i);
        match out.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => out.push(r),
        }
    }
    out
}

pub(crate) fn diff_vars(a: &Vars, b: &Vars) -> Diff {
    let mut vars = BTreeMap::new();
    if a.ptr_eq(b) {
        for k in a.keys() {
            vars.insert(k.clone(), VarDiff::Unchanged);
        }
        return Diff { vars };
    }
    for (k, ta) in a.iter() {
        let d = match b.get(k) {
            None => VarDiff::Removed,
            Some(tb) => diff_tensor(ta, tb),
        };
        vars.insert(k.clone(), d);
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            vars.insert(k.clone(), VarDiff::Added);
        }
    }
    Diff { vars }
}

impl Store {
    /// What changed from version `a` to version `b`, per variable. Pointer-equal chunks
    /// are skipped without reading data; the others are compared by content (cached
    /// hashes when both are known, else bytes, in parallel), so independently written
    /// equal chunks count as unchanged.
    ///
    /// O(chunks) pointer compares + O(bytes of chunks not shared).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`](crate::Error::UnknownVersion),
    /// [`Error::PrunedVersion`](crate::Error::PrunedVersion).
    pub fn diff(&self, a: VersionId, b: VersionId) -> Result<Diff> {
        let va = self.hist.node(a)?.vars.get()?;
        let vb = self.hist.node(b)?.vars.get()?;
        Ok(diff_vars(va, vb))
    }

    /// What the working state changed since HEAD (everything is added before the first
    /// commit). Same cost as [`diff`](Store::diff).
    #[must_use]
    pub fn diff_working(&self) -> Diff {
        // HEAD's variables are in memory: every move of HEAD reads them into the working
        // state.
        let head = self.hist.head_id().and_then(|h| self.hist.node(h).ok());
        match head.and_then(|node| node.vars.get().ok()) {
            Some(vars) => diff_vars(vars, &self.working),
            None => diff_vars(&Vars::new(), &self.working),
        }
    }
}

impl Snapshot {
    /// What changed from `self` to `other`; works across stores and unrelated lineages.
    /// Same cost as [`Store::diff`].
    #[must_use]
    pub fn diff(&self, other: &Snapshot) -> Diff {
        diff_vars(self.vars(), other.vars())
    }
}
