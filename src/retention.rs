//! Retention policies: which versions `prune` keeps.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::{Head, Ref};
use crate::meta::Meta;
use crate::store::Store;
use crate::version::VersionId;

/// Which versions [`Store::prune`] keeps. HEAD, branch tips, tagged versions, the
/// redo path and the versions in the [`reflog`](Store::reflog) are always kept.
///
/// The policies combine as a union: a version is kept when any of them keeps it. Versions
/// are dropped only when [`last`](Retention::last) or [`best`](Retention::best) is set
/// (each keeps a bounded set and drops the rest), or, with
/// [`unreachable`](Retention::unreachable), when no ref reaches them.
///
/// ```
/// use tensor_history::{Goal, Retention};
/// // the last 5 versions of every branch, plus every 10th version:
/// let policy = Retention::keep_last(5).keep_every(10);
/// // the 3 versions with the lowest recorded `loss`, plus the last 2 of every branch:
/// let policy = Retention::keep_last(2).keep_best(3, "loss", Goal::Min);
/// # let _ = policy;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Keep the last N versions on the first-parent line of each branch tip and of HEAD;
    /// every version outside these windows (and not kept otherwise) is dropped, including
    /// versions reachable only by id. `None` keeps every version reachable from a ref.
    pub last: Option<usize>,
    /// Also keep every version whose id is a multiple of k (every k-th commit); `Some(0)`
    /// is refused by [`Store::prune`].
    pub every: Option<usize>,
    /// Also drop versions that no branch, tag, HEAD, the redo path or the reflog reaches
    /// (for example the old future after an undo and a new commit, once it has left the
    /// reflog).
    pub unreachable: bool,
    /// Also keep the best N live versions by a metric recorded in their
    /// [`Meta`](crate::Meta) (see [`KeepBest`]).
    pub best: Option<KeepBest>,
}

/// Whether lower or higher values of a metric are better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Goal {
    /// Lower is better (a loss, an error rate).
    Min,
    /// Higher is better (an accuracy, a reward).
    Max,
}

/// "Keep the best `n` versions by `metric`", like the `best_fn` of checkpoint managers.
///
/// The candidates are the live versions whose metadata holds `metric` as a number
/// ([`Meta::number`](crate::Meta::number): an `Int` or a non-NaN `Float`); versions
/// without it, or with text, a flag or NaN there, are never among the best. They are
/// ranked by value (ascending for [`Goal::Min`], descending for [`Goal::Max`]), ties
/// going to the older version, and the first `n` are kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeepBest {
    /// How many versions to keep.
    pub n: usize,
    /// The metadata key ranked by.
    pub metric: String,
    /// Which direction is better.
    pub goal: Goal,
}

impl Retention {
    /// Keep the last `n` versions per branch (and HEAD).
    #[must_use]
    pub fn keep_last(n: usize) -> Retention {
        Retention {
            last: Some(n),
            ..Retention::default()
        }
    }

    /// Also keep every `k`-th version (by id); `0` is ignored.
    #[must_use]
    pub fn keep_every(mut self, k: usize) -> Retention {
        self.every = (k > 0).then_some(k);
        self
    }

    /// Also drop versions no ref reaches.
    #[must_use]
    pub fn drop_unreachable(mut self, yes: bool) -> Retention {
        self.unreachable = yes;
        self
    }

    /// Also keep the best `n` live versions by `metric` (see [`KeepBest`]). Alone
    /// (`Retention::default().keep_best(..)`) it drops every other version that HEAD, a
    /// ref or the redo path does not hold.
    #[must_use]
    pub fn keep_best(mut self, n: usize, metric: &str, goal: Goal) -> Retention {
        self.best = Some(KeepBest {
            n,
            metric: metric.to_owned(),
            goal,
        });
        self
    }
}

impl KeepBest {
    /// The ids of the best `n` versions among `candidates` (id, metadata), best first.
    /// O(candidates · log candidates).
    pub(crate) fn select<'a>(
        &self,
        candidates: impl Iterator<Item = (VersionId, &'a Meta)>,
    ) -> Vec<VersionId> {
        let mut ranked: Vec<(f64, VersionId)> = candidates
            .filter_map(|(id, meta)| meta.number(&self.metric).map(|x| (x, id)))
            .collect();
        ranked.sort_by(|(xa, ia), (xb, ib)| {
            let by_value = match self.goal {
                Goal::Min => xa.total_cmp(xb),
                Goal::Max => xb.total_cmp(xa),
            };
            by_value.then(ia.cmp(ib))
        });
        ranked.into_iter().take(self.n).map(|(_, id)| id).collect()
    }
}

/// What [`Store::prune`] dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneStats {
    /// The versions dropped, oldest first.
    pub dropped: Vec<VersionId>,
    /// Live versions left.
    pub kept: usize,
    /// Unique chunk bytes held by the store before and after (see
    /// [`Stats::unique_bytes`](crate::Stats::unique_bytes)).
    pub bytes_before: usize,
    /// Unique chunk bytes held after pruning.
    pub bytes_after: usize,
}

impl Store {
    /// Drop versions by `policy`. Children of a dropped version are re-parented to its
    /// parents, so `parent` and `log` skip it; its id then gives
    /// [`Error::PrunedVersion`](crate::Error::PrunedVersion). Chunks that no remaining
    /// version, snapshot or working state holds are freed (their buffers may be kept for
    /// reuse, see [`Config::recycle_bytes`](crate::Config::recycle_bytes)).
    ///
    /// O(versions + refs · N) + O(versions · log versions) with
    /// [`best`](Retention::best) + O(freed chunks); the byte counts in the result cost
    /// O(chunks).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for `every: Some(0)`
    /// (the fields are public and the type deserializes, so the builder's check is not
    /// enough); nothing is pruned then.
    pub fn prune(&mut self, policy: &Retention) -> Result<PruneStats> {
        if policy.every == Some(0) {
            return Err(Error::InvalidArgument {
                reason: "Retention::every must be at least 1 (keep every k-th version)".into(),
            });
        }
        let bytes_before = self.unique_bytes();
        let dropped = self.prune_quiet(policy);
        Ok(PruneStats {
            kept: self.hist.live().count(),
            dropped,
            bytes_before,
            bytes_after: self.unique_bytes(),
        })
    }

    /// Auto-retention after a commit: with [`Config::max_versions`](crate::Config::max_versions)
    /// set to `n`, keep the last `n` versions per branch and drop unreachable ones.
    pub(crate) fn auto_retain(&mut self) {
        if let Some(n) = self.config.max_versions {
            self.prune_quiet(&Retention::keep_last(n).drop_unreachable(true));
        }
    }

    /// Prune without computing byte counts (used by auto-retention on every commit).
    pub(crate) fn prune_quiet(&mut self, policy: &Retention) -> Vec<VersionId> {
        let hist = &self.hist;
        let mut anchors: Vec<VersionId> = hist.refs.values().map(|r| r.target()).collect();
        if let Some(h) = hist.head_id() {
            anchors.push(h);
        }
        anchors.extend(hist.reflog.iter().map(|(_, v)| *v));
        let mut keep: HashSet<VersionId> = anchors.iter().copied().collect();
        keep.extend(hist.redo.iter().copied());
        let mut roots: Vec<VersionId> = anchors.clone();
        roots.extend(hist.redo.iter().copied());
        let reachable: HashSet<VersionId> = roots
            .iter()
            .flat_map(|r| hist.ancestors(*r).unwrap_or_default())
            .collect();
        if let Some(n) = policy.last {
            let mut tips: Vec<VersionId> = hist
                .refs
                .values()
                .filter_map(|r| match r {
                    Ref::Branch(v) => Some(*v),
                    Ref::Tag(_) => None,
                })
                .collect();
            if let Head::Detached(v) = hist.head {
                tips.push(v);
            }
            for tip in tips {
                let mut cur = Some(tip);
                for _ in 0..n {
                    let Some(v) = cur else { break };
                    keep.insert(v);
                    cur = hist.node(v).ok().and_then(|n| n.parents.first().copied());
                }
            }
        }
        if let Some(best) = &policy.best {
            keep.extend(best.select(hist.live().map(|(id, n)| (id, &*n.meta))));
        }
        let mut dropped = Vec::new();
        let live: Vec<VersionId> = hist.live().map(|(id, _)| id).collect();
        for id in live {
            if keep.contains(&id) {
                continue;
            }
            if policy
                .every
                .is_some_and(|k| k > 0 && id.0.is_multiple_of(k as u64))
            {
                continue;
            }
            let outside_window = policy.last.is_some() || policy.best.is_some();
            let unreachable = !reachable.contains(&id);
            if outside_window || (policy.unreachable && unreachable) {
                dropped.push(id);
            }
        }
        for id in &dropped {
            self.hist.remove(*id);
        }
        dropped
    }
}
