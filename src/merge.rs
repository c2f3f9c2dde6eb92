//! Three-way merges at chunk level, and weighted averages of versions (model soups).

use half::{bf16, f16};
use rayon::prelude::*;

use crate::chunk::{Alloc, Chunk};
use crate::element::{DType, Element};
use crate::error::{Conflict, Error, Result};
use crate::history::Vars;
use crate::meta::Meta;
use crate::store::{load_vars, Store};
use crate::tensor::{ChunkVec, Tensor};
use crate::version::VersionId;

/// How [`Store::merge`] resolves chunks changed on both sides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MergeStrategy {
    /// A chunk changed on both sides is a conflict: the merge fails with
    /// [`Error::MergeConflict`] and changes nothing.
    #[default]
    Fail,
    /// Take HEAD's side of every conflict.
    Ours,
    /// Take the other side of every conflict.
    Theirs,
    /// Take the elementwise mean of the two sides, `0.5·a + 0.5·b` computed in `f64` and
    /// rounded once (float dtypes only). A variable removed on one side and changed on the
    /// other still conflicts.
    Mean,
}

/// Run `$body` with `$t` bound to the float type of `$dtype`.
macro_rules! with_float {
    ($dtype:expr, $t:ident => $body:expr, else $other:expr) => {
        match $dtype {
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::F16 => {
                type $t = f16;
                $body
            }
            DType::BF16 => {
                type $t = bf16;
                $body
            }
            _ => $other,
        }
    };
}

/// The weights divided by their sum, with the terms whose weight is 0 left out, as
/// `(index, w_i / Σw)` pairs. A sum that overflows `f64` (`[1e308, 1e308]`) is taken after
/// scaling every weight by the same power of two, which is exact, so the result is the
/// same as with unbounded range. The caller checked that the weights are finite,
/// non-negative and not all zero.
fn normalized_weights(weights: &[f64]) -> Vec<(usize, f64)> {
    let mut total: f64 = weights.iter().sum();
    let mut scale = 1.0;
    if !total.is_finite() {
        // n weights of at most f64::MAX each sum to at most f64::MAX / 2 once scaled by
        // 2^-(ceil(log2 n) + 1).
        let k = weights.len().next_power_of_two().trailing_zeros() + 1;
        scale = 0.5f64.powi(k as i32);
        total = weights.iter().map(|w| w * scale).sum();
    }
    weights
        .iter()
        .enumerate()
        .filter(|(_, w)| **w != 0.0)
        .map(|(i, w)| (i, w * scale / total))
        .collect()
}

/// Weighted mean of chunks of one float type: `Σ (w_i / Σw) · x_i` in `f64` over the
/// `weights` from [`normalized_weights`], rounded once to `T`. Normalizing first keeps the
/// sum finite for any finite inputs (`(a + b) / 2` would overflow for `f64` values above
/// half of `f64::MAX`), and a version of weight 0 does not contribute, even a NaN.
fn mean_chunk<T: Element>(parts: &[&Chunk], weights: &[(usize, f64)], alloc: &Alloc) -> Chunk {
    let slices: Vec<(&[T], f64)> = weights
        .iter()
        .map(|&(i, w)| (parts[i].as_slice::<T>(), w))
        .collect();
    alloc.chunk_typed::<T>(parts[0].len_bytes() / std::mem::size_of::<T>(), |out| {
        for (j, o) in out.iter_mut().enumerate() {
            let s: f64 = slices.iter().map(|(x, w)| x[j].to_f64() * w).sum();
            *o = T::from_f64(s);
        }
    })
}

fn unsupported(name: &str, dtype: DType, operation: &'static str) -> Error {
    Error::UnsupportedDType {
        name: name.to_owned(),
        dtype,
        operation,
    }
}

/// Weighted mean of same-layout float tensors (`weights` from [`normalized_weights`]),
/// chunk by chunk in parallel; chunks equal on every side stay shared. The caller checked
/// that the dtype is a float.
fn mean_tensor(parts: &[&Tensor], weights: &[(usize, f64)], alloc: &Alloc) -> Tensor {
    let first = parts[0];
    let dtype = first.dtype();
    let cols: Vec<Vec<&Chunk>> = (0..first.num_chunks())
        .map(|i| parts.iter().filter_map(|t| t.chunk(i)).collect())
        .collect();
    let chunks: Vec<Chunk> = crate::parallel::install(|| {
        cols.par_iter()
            .map(|col| {
                if col.iter().all(|c| c.same_content(col[0])) {
                    return col[0].clone();
                }
                with_float!(dtype, F => mean_chunk::<F>(col, weights, alloc), else col[0].clone())
            })
            .collect()
    });
    first.with_chunks(chunks.into_iter().collect())
}

/// How one variable of a merge comes out, decided before any chunk is computed, so that
/// a merge that fails (a conflict, a `Mean` of integers) allocates nothing.
enum Plan {
    /// The variable as it is on one side (`None`: absent in the result).
    Take(Option<Tensor>),
    /// The elementwise mean of the two sides (a float dtype, same layout).
    Mean(Tensor, Tensor),
    /// Chunk by chunk, in the layout of the tensor given.
    Chunks(Tensor, Vec<Pick>),
}

/// One chunk of a [`Plan::Chunks`].
enum Pick {
    Take(Chunk),
    Mean(Chunk, Chunk),
}

impl Plan {
    /// Compute the planned tensor. O(bytes of the chunks averaged).
    fn run(self, alloc: &Alloc) -> Option<Tensor> {
        let halves = normalized_weights(&[1.0, 1.0]);
        match self {
            Plan::Take(t) => t,
            Plan::Mean(o, t) => Some(mean_tensor(&[&o, &t], &halves, alloc)),
            Plan::Chunks(o, picks) => {
                let dtype = o.dtype();
                let chunks: ChunkVec = picks
                    .into_iter()
                    .map(|p| match p {
                        Pick::Take(c) => c,
                        Pick::Mean(a, b) => with_float!(
                            dtype,
                            F => mean_chunk::<F>(&[&a, &b], &halves, alloc),
                            else a
                        ),
                    })
                    .collect();
                Some(o.with_chunks(chunks))
            }
        }
    }
}

fn same(a: Option<&Tensor>, b: Option<&Tensor>) -> Result<bool> {
    match (a, b) {
        (None, None) => Ok(true),
        (Some(a), Some(b)) => a.content_eq(b),
        _ => Ok(false),
    }
}

/// Plan the merge of one variable (no chunk is computed here).
fn merge_var(
    name: &str,
    ours: Option<&Tensor>,
    theirs: Option<&Tensor>,
    base: Option<&Tensor>,
    strategy: MergeStrategy,
    conflicts: &mut Vec<Conflict>,
) -> Result<Plan> {
    if same(ours, theirs)? || same(theirs, base)? {
        return Ok(Plan::Take(ours.cloned()));
    }
    if same(ours, base)? {
        return Ok(Plan::Take(theirs.cloned()));
    }
    // Both sides changed the variable, differently.
    let whole = |conflicts: &mut Vec<Conflict>| {
        conflicts.push(Conflict {
            variable: name.to_owned(),
            chunks: None,
        })
    };
    let (o, t) = match (ours, theirs) {
        (Some(o), Some(t)) if o.same_layout(t) => (o, t),
        _ => {
            return Ok(Plan::Take(match strategy {
                MergeStrategy::Ours => ours.cloned(),
                MergeStrategy::Theirs => theirs.cloned(),
                _ => {
                    whole(conflicts);
                    ours.cloned()
                }
            }))
        }
    };
    let mean_ok = || {
        if o.dtype().is_float() {
            Ok(())
        } else {
            Err(unsupported(name, o.dtype(), "a Mean merge"))
        }
    };
    let Some(b) = base.filter(|b| b.same_layout(o)) else {
        return Ok(match strategy {
            MergeStrategy::Ours => Plan::Take(Some(o.clone())),
            MergeStrategy::Theirs => Plan::Take(Some(t.clone())),
            MergeStrategy::Mean => {
                mean_ok()?;
                Plan::Mean(o.clone(), t.clone())
            }
            _ => {
                whole(conflicts);
                Plan::Take(Some(o.clone()))
            }
        });
    };
    let mut picks: Vec<Pick> = Vec::with_capacity(o.num_chunks());
    let mut clashing = Vec::new();
    for (i, ((co, ct), cb)) in o.chunks().zip(t.chunks()).zip(b.chunks()).enumerate() {
        let pick = if co.same_content(ct) || ct.same_content(cb) {
            Pick::Take(co.clone())
        } else if co.same_content(cb) {
            Pick::Take(ct.clone())
        } else {
            match strategy {
                MergeStrategy::Ours => Pick::Take(co.clone()),
                MergeStrategy::Theirs => Pick::Take(ct.clone()),
                MergeStrategy::Mean => {
                    mean_ok()?;
                    Pick::Mean(co.clone(), ct.clone())
                }
                _ => {
                    clashing.push(i);
                    Pick::Take(co.clone())
                }
            }
        };
        picks.push(pick);
    }
    if !clashing.is_empty() {
        conflicts.push(Conflict {
            variable: name.to_owned(),
            chunks: Some(clashing),
        });
    }
    Ok(Plan::Chunks(o.clone(), picks))
}

impl Store {
    /// Three-way merge of HEAD and `other` at chunk level against their merge base: a
    /// chunk changed on one side only comes from that side; a chunk changed on both sides
    /// is a conflict unless `strategy` resolves it. Records a version with two parents
    /// (HEAD, `other`), makes it the working state and moves HEAD (and an attached branch)
    /// there. Returns its id.
    ///
    /// O(chunks) pointer compares + O(bytes of chunks not shared).
    ///
    /// # Errors
    ///
    /// [`Error::UncommittedChanges`], [`Error::NoCommits`], [`Error::UnknownVersion`],
    /// [`Error::PrunedVersion`], [`Error::InvalidArgument`] when `other` is HEAD,
    /// [`Error::MergeConflict`] listing every variable and chunk in conflict,
    /// [`Error::UnsupportedDType`] for a `Mean` of integers. Nothing changes on error.
    pub fn merge(&mut self, other: VersionId, strategy: MergeStrategy) -> Result<VersionId> {
        self.merge_with(other, strategy, Meta::new())
    }

    /// Like [`merge`](Store::merge), recording `meta` with the merge version. Metadata is
    /// not merged implicitly (a loss measured on either side says nothing of the merged
    /// weights): the caller says what the merge keeps, for example the step of one side
    /// from [`metadata`](Store::metadata) and a loss measured after merging.
    ///
    /// The cost of [`merge`](Store::merge) plus O(keys).
    ///
    /// # Errors
    ///
    /// As for [`merge`](Store::merge), and [`Error::InvalidArgument`] for a bad key (see
    /// [`Meta`]).
    pub fn merge_with(
        &mut self,
        other: VersionId,
        strategy: MergeStrategy,
        meta: Meta,
    ) -> Result<VersionId> {
        meta.validate()?;
        let head = self.hist.head_id().ok_or(Error::NoCommits)?;
        let theirs = self.hist.node(other)?.vars.get()?.clone();
        if other == head {
            return Err(Error::InvalidArgument {
                reason: format!("cannot merge {other} into itself"),
            });
        }
        if self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        let ours = self.hist.node(head)?.vars.get()?.clone();
        let base = match self.hist.merge_base(head, other)? {
            Some(b) => self.hist.node(b)?.vars.get()?.clone(),
            None => Vars::new(),
        };
        for vars in [&ours, &theirs, &base] {
            load_vars(vars)?;
        }
        let mut names: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
        names.sort();
        names.dedup();
        // Plan every variable first: a merge that fails computes (and allocates) nothing.
        let mut plans = Vec::with_capacity(names.len());
        let mut conflicts = Vec::new();
        for name in names {
            let plan = merge_var(
                name,
                ours.get(name),
                theirs.get(name),
                base.get(name),
                strategy,
                &mut conflicts,
            )?;
            plans.push((name, plan));
        }
        if !conflicts.is_empty() {
            return Err(Error::MergeConflict { conflicts });
        }
        let mut merged = Vars::new();
        for (name, plan) in plans {
            if let Some(t) = plan.run(&self.alloc) {
                merged.insert(name.clone(), t);
            }
        }
        let message = format!("merge {other} into {head}");
        self.commit_vars(vec![head, other], &message, meta, merged)
    }

    /// Record a version whose float variables are the weighted mean of the same variables
    /// in `ids` (a model soup): `Σ (w_i / Σw) · x_i` computed in `f64` and rounded once;
    /// `weights` default to equal. A version of weight 0 does not contribute (not even a
    /// NaN it holds), and weights whose sum overflows `f64` (`[1e308, 1e308]`) give the
    /// same mean as `[1.0, 1.0]`. Every version must hold the
    /// variables of the first with the same dtype and shape; integer variables must be
    /// equal in all of them. The new version's parents are HEAD and the `ids` (without
    /// repeats); it becomes the working state and HEAD moves there. Chunks equal in every
    /// version stay shared.
    ///
    /// O(chunks) + O(bytes of chunks that differ), parallel over chunks.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list, weights of another length, negative,
    /// non-finite or all zero; [`Error::UncommittedChanges`]; [`Error::UnknownVersion`],
    /// [`Error::PrunedVersion`]; [`Error::UnknownVariable`], [`Error::DTypeMismatch`],
    /// [`Error::ShapeMismatch`] for a variable missing or different in some version;
    /// [`Error::UnsupportedDType`] for integer variables that differ.
    pub fn average(&mut self, ids: &[VersionId], weights: Option<&[f64]>) -> Result<VersionId> {
        self.average_with(ids, weights, Meta::new())
    }

    /// Like [`average`](Store::average), recording `meta` with the new version (nothing is
    /// carried over from the averaged versions unless the caller puts it in `meta`).
    ///
    /// The cost of [`average`](Store::average) plus O(keys).
    ///
    /// # Errors
    ///
    /// As for [`average`](Store::average), and [`Error::InvalidArgument`] for a bad key
    /// (see [`Meta`]).
    pub fn average_with(
        &mut self,
        ids: &[VersionId],
        weights: Option<&[f64]>,
        meta: Meta,
    ) -> Result<VersionId> {
        meta.validate()?;
        let invalid = |reason: String| Error::InvalidArgument { reason };
        if ids.is_empty() {
            return Err(invalid("average of no versions".into()));
        }
        let weights: Vec<f64> = match weights {
            None => vec![1.0; ids.len()],
            Some(w) if w.len() != ids.len() => {
                return Err(invalid(format!(
                    "{} weights for {} versions",
                    w.len(),
                    ids.len()
                )))
            }
            Some(w) => w.to_vec(),
        };
        if weights.iter().any(|w| !w.is_finite() || *w < 0.0) || weights.iter().sum::<f64>() <= 0.0
        {
            return Err(invalid(format!(
                "weights must be finite, non-negative and not all zero: {weights:?}"
            )));
        }
        let versions: Vec<Vars> = ids
            .iter()
            .map(|id| self.hist.node(*id).and_then(|n| n.vars.get().cloned()))
            .collect::<Result<_>>()?;
        if self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        for vars in &versions {
            load_vars(vars)?;
        }
        // Check every variable before computing any: a call that fails allocates nothing.
        let mut planned = Vec::with_capacity(versions[0].len());
        for (name, first) in versions[0].iter() {
            let mut parts = Vec::with_capacity(versions.len());
            for v in &versions {
                let t = v
                    .get(name)
                    .ok_or_else(|| Error::UnknownVariable { name: name.clone() })?;
                if t.dtype() != first.dtype() {
                    return Err(Error::DTypeMismatch {
                        name: name.clone(),
                        expected: first.dtype(),
                        found: t.dtype(),
                    });
                }
                first.check_shape(name, t.shape())?;
                if !t.same_layout(first) {
                    return Err(invalid(format!(
                        "`{name}` is chunked differently in some version"
                    )));
                }
                parts.push(t);
            }
            if !first.dtype().is_float() {
                for t in &parts {
                    if !t.content_eq(first)? {
                        return Err(unsupported(name, first.dtype(), "average"));
                    }
                }
            }
            planned.push((name, parts));
        }
        let weights = normalized_weights(&weights);
        let mut out = Vars::new();
        for (name, parts) in planned {
            let t = if parts[0].dtype().is_float() {
                mean_tensor(&parts, &weights, &self.alloc)
            } else {
                parts[0].clone()
            };
            out.insert(name.clone(), t);
        }
        let mut parents: Vec<VersionId> = self.hist.head_id().into_iter().collect();
        for id in ids {
            if !parents.contains(id) {
                parents.push(*id);
            }
        }
        let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let message = format!("average of {}", list.join(", "));
        self.commit_vars(parents, &message, meta, out)
    }
}
