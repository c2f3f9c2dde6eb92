//! Three-way merges at chunk level, and weighted averages of versions (model soups).

use half::{bf16, f16};
use rayon::prelude::*;

use crate::chunk::{Alloc, Chunk};
use crate::element::{DType, Element};
use crate::error::{Conflict, Error, Result};
use crate::history::{Vars, VersionId};
use crate::meta::Meta;
use crate::store::Store;
use crate::tensor::{ChunkVec, Tensor};

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

/// Weighted mean of chunks of one float type: `Σ (w_i / Σw) · x_i` in `f64`, rounded once
/// to `T`. Normalizing the weights first keeps the sum finite for any finite inputs
/// (`(a + b) / 2` would overflow for `f64` values above half of `f64::MAX`).
fn mean_chunk<T: Element>(parts: &[&Chunk], weights: &[f64], alloc: &Alloc) -> Chunk {
    let total: f64 = weights.iter().sum();
    let norm: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let slices: Vec<&[T]> = parts.iter().map(|c| c.as_slice::<T>()).collect();
    alloc.chunk_typed::<T>(slices[0].len(), |out| {
        for (j, o) in out.iter_mut().enumerate() {
            let s: f64 = slices
                .iter()
                .zip(&norm)
                .map(|(x, w)| x[j].to_f64() * w)
                .sum();
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

/// Weighted mean of same-layout float tensors, chunk by chunk in parallel; chunks equal on
/// every side stay shared.
fn mean_tensor(
    name: &str,
    parts: &[&Tensor],
    weights: &[f64],
    alloc: &Alloc,
    operation: &'static str,
) -> Result<Tensor> {
    let first = parts[0];
    let dtype = first.dtype();
    if !dtype.is_float() {
        return Err(unsupported(name, dtype, operation));
    }
    let cols: Vec<Vec<&Chunk>> = (0..first.num_chunks())
        .map(|i| parts.iter().filter_map(|t| t.chunk(i)).collect())
        .collect();
    let chunks: Vec<Chunk> = cols
        .par_iter()
        .map(|col| {
            if col.iter().all(|c| c.same_content(col[0])) {
                return col[0].clone();
            }
            with_float!(dtype, F => mean_chunk::<F>(col, weights, alloc), else col[0].clone())
        })
        .collect();
    Ok(first.with_chunks(chunks.into_iter().collect()))
}

fn same(a: Option<&Tensor>, b: Option<&Tensor>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.content_eq(b),
        _ => false,
    }
}

/// Merge one variable; `Ok(None)` in the outer option means "absent in the result".
fn merge_var(
    name: &str,
    ours: Option<&Tensor>,
    theirs: Option<&Tensor>,
    base: Option<&Tensor>,
    strategy: MergeStrategy,
    alloc: &Alloc,
    conflicts: &mut Vec<Conflict>,
) -> Result<Option<Tensor>> {
    if same(ours, theirs) || same(theirs, base) {
        return Ok(ours.cloned());
    }
    if same(ours, base) {
        return Ok(theirs.cloned());
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
            return Ok(match strategy {
                MergeStrategy::Ours => ours.cloned(),
                MergeStrategy::Theirs => theirs.cloned(),
                _ => {
                    whole(conflicts);
                    ours.cloned()
                }
            })
        }
    };
    let Some(b) = base.filter(|b| b.same_layout(o)) else {
        return Ok(Some(match strategy {
            MergeStrategy::Ours => o.clone(),
            MergeStrategy::Theirs => t.clone(),
            MergeStrategy::Mean => mean_tensor(name, &[o, t], &[1.0, 1.0], alloc, "a Mean merge")?,
            _ => {
                whole(conflicts);
                o.clone()
            }
        }));
    };
    let mut chunks: Vec<Chunk> = Vec::with_capacity(o.num_chunks());
    let mut clashing = Vec::new();
    for (i, ((co, ct), cb)) in o.chunks().zip(t.chunks()).zip(b.chunks()).enumerate() {
        let pick = if co.same_content(ct) || ct.same_content(cb) {
            co.clone()
        } else if co.same_content(cb) {
            ct.clone()
        } else {
            match strategy {
                MergeStrategy::Ours => co.clone(),
                MergeStrategy::Theirs => ct.clone(),
                MergeStrategy::Mean => {
                    let dtype = o.dtype();
                    with_float!(
                        dtype,
                        F => mean_chunk::<F>(&[co, ct], &[1.0, 1.0], alloc),
                        else return Err(unsupported(name, dtype, "a Mean merge"))
                    )
                }
                _ => {
                    clashing.push(i);
                    co.clone()
                }
            }
        };
        chunks.push(pick);
    }
    if !clashing.is_empty() {
        conflicts.push(Conflict {
            variable: name.to_owned(),
            chunks: Some(clashing),
        });
    }
    Ok(Some(
        o.with_chunks(chunks.into_iter().collect::<ChunkVec>()),
    ))
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
        let theirs = self.hist.node(other)?.vars.clone();
        if other == head {
            return Err(Error::InvalidArgument {
                reason: format!("cannot merge {other} into itself"),
            });
        }
        if self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        let ours = self.hist.node(head)?.vars.clone();
        let base = match self.hist.merge_base(head, other)? {
            Some(b) => self.hist.node(b)?.vars.clone(),
            None => Vars::new(),
        };
        let mut names: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
        names.sort();
        names.dedup();
        let mut merged = Vars::new();
        let mut conflicts = Vec::new();
        for name in names {
            let t = merge_var(
                name,
                ours.get(name),
                theirs.get(name),
                base.get(name),
                strategy,
                &self.alloc,
                &mut conflicts,
            )?;
            if let Some(t) = t {
                merged.insert(name.clone(), t);
            }
        }
        if !conflicts.is_empty() {
            return Err(Error::MergeConflict { conflicts });
        }
        let message = format!("merge {other} into {head}");
        self.commit_vars(vec![head, other], &message, meta, merged)
    }

    /// Record a version whose float variables are the weighted mean of the same variables
    /// in `ids` (a model soup): `Σ (w_i / Σw) · x_i` computed in `f64` and rounded once;
    /// `weights` default to equal. Every version must hold the
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
            .map(|id| self.hist.node(*id).map(|n| n.vars.clone()))
            .collect::<Result<_>>()?;
        if self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        let mut out = Vars::new();
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
            let t = if first.dtype().is_float() {
                mean_tensor(name, &parts, &weights, &self.alloc, "average")?
            } else if parts.iter().all(|t| t.content_eq(first)) {
                first.clone()
            } else {
                return Err(unsupported(name, first.dtype(), "average"));
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
