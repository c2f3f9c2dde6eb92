//! The driver of the model-based tests: operations on the version history, applied to a
//! [`Store`] and to the deep-copy [`Model`] and compared after every step. Used by the
//! property tests (`tests/oracles/history_model.rs`, which generate operations with proptest), by
//! the fuzz target `fuzz/fuzz_targets/store_actions.rs` (which decodes them from bytes
//! with `arbitrary`) and by the replay of its corpus (`tests/oracles/fuzz_replay.rs`).

use arbitrary::Arbitrary;
use ndarray::ArrayD;
use proptest::prelude::*;
use tensor_history::{
    Config, Error, Goal, MergeStrategy, Meta, Ref, Retention, Store, Value, VersionId,
};

use super::{
    bits_eq, diff_model, var_unknown, vid, Arr, MHead, MResult, MVars, Model, CHUNK_BYTES, VALUES,
};

pub const VAR_NAMES: [&str; 3] = ["a", "b", "c"];
/// Scalars, empty, one chunk, one chunk plus one, several chunks, whole rows per chunk
/// (5 per row: 15 elements per chunk) and rows split across chunks (20 per row).
pub const SHAPES: &[&[usize]] = &[&[], &[0], &[5], &[16], &[17], &[40], &[3, 5], &[2, 20]];
/// The first four are valid ref names, the rest are not (`v1` reads as a version id).
pub const REF_NAMES: [&str; 8] = ["main", "dev", "exp", "t", "v1", "", "HEAD", "a b"];
/// Losses recorded by commits: none, numbers (with ties, an integer and NaN, which never
/// ranks) and values that are not numbers.
pub const LOSSES: [Option<Value>; 9] = [
    None,
    Some(Value::Float(0.5)),
    Some(Value::Float(0.25)),
    Some(Value::Float(0.25)),
    Some(Value::Int(1)),
    Some(Value::Float(-2.0)),
    Some(Value::Float(f64::NAN)),
    Some(Value::Bool(true)),
    Some(Value::Float(3.0)),
];
pub const WEIGHTS: [f64; 4] = [1.0, 2.0, 0.5, 0.0];
pub const STRATEGIES: [MergeStrategy; 4] = [
    MergeStrategy::Fail,
    MergeStrategy::Ours,
    MergeStrategy::Theirs,
    MergeStrategy::Mean,
];

// ---- operations --------------------------------------------------------------------

#[derive(Clone, Debug, Arbitrary)]
pub enum Op {
    Insert {
        name: usize,
        shape: usize,
        seed: usize,
    },
    Remove {
        name: usize,
    },
    /// `update_range` of a few elements: set them to a value or add it.
    Update {
        name: usize,
        start: usize,
        len: usize,
        val: usize,
        add: bool,
        out_of_bounds: bool,
    },
    /// `write` of the current contents with one element changed, or of a fresh array of
    /// some shape (possibly the wrong one).
    Write {
        name: usize,
        fresh: bool,
        shape: usize,
        seed: usize,
    },
    /// `commit_with` a `loss` from [`LOSSES`] (or none) and the step number.
    Commit {
        loss: usize,
    },
    /// `tip` picks among the tips of the tree, else any id.
    Restore {
        id: usize,
        tip: bool,
    },
    Discard,
    Undo,
    Redo,
    Branch {
        name: usize,
        id: usize,
    },
    Tag {
        name: usize,
        id: usize,
    },
    Checkout {
        name: usize,
    },
    CheckoutDetached {
        id: usize,
    },
    DeleteBranch {
        name: usize,
    },
    DeleteTag {
        name: usize,
    },
    Detach,
    Merge {
        id: usize,
        tip: bool,
        strategy: usize,
    },
    Average {
        ids: Vec<usize>,
        weights: Option<Vec<usize>>,
    },
    Prune {
        last: Option<usize>,
        every: Option<usize>,
        unreachable: bool,
        /// Keep the best N by `loss`; `true` for [`Goal::Min`].
        best: Option<(usize, bool)>,
    },
    /// Restore some version, change a few elements and commit: a new fork of the tree,
    /// so that merges are often true three-way merges. Runs as those three steps.
    Fork {
        id: usize,
        name: usize,
        start: usize,
        val: usize,
    },
}

impl Op {
    /// The steps an operation runs as (one, except for [`Op::Fork`]).
    pub fn steps(&self) -> Vec<Op> {
        match *self {
            Op::Fork {
                id,
                name,
                start,
                val,
            } => vec![
                Op::Restore { id, tip: false },
                Op::Update {
                    name,
                    start,
                    len: 2,
                    val,
                    add: true,
                    out_of_bounds: false,
                },
                Op::Commit { loss: start },
            ],
            _ => vec![self.clone()],
        }
    }
}

/// A version id: most often one that exists or existed, sometimes the next (unknown) one.
pub fn pick_id(raw: usize, model: &Model) -> u64 {
    (raw % (model.nodes.len() + 1)) as u64
}

/// A version that is not an ancestor of HEAD, preferably a tip (a likely merge partner),
/// else as [`pick_id`].
pub fn pick_tip(raw: usize, model: &Model) -> u64 {
    let ancestors = model
        .head_id()
        .map(|h| model.ancestors(h))
        .unwrap_or_default();
    let mut tips: Vec<u64> = model
        .live()
        .into_iter()
        .filter(|v| !ancestors.contains(v))
        .collect();
    if raw.is_multiple_of(2) {
        let only_tips: Vec<u64> = tips
            .iter()
            .copied()
            .filter(|v| model.children(*v).is_empty())
            .collect();
        if !only_tips.is_empty() {
            tips = only_tips;
        }
    }
    if tips.is_empty() {
        pick_id(raw, model)
    } else {
        tips[raw % tips.len()]
    }
}

pub fn same_error(got: &Error, want: &Error) -> bool {
    match (got, want) {
        // The reason text is free prose; the kind is what the contract fixes.
        (Error::InvalidArgument { .. }, Error::InvalidArgument { .. }) => true,
        _ => got == want,
    }
}

/// Both succeeded with equal values, or both failed with the same error.
pub fn agree<T: PartialEq + std::fmt::Debug>(
    op: &Op,
    got: Result<T, Error>,
    want: MResult<T>,
) -> Result<bool, TestCaseError> {
    match (&got, &want) {
        (Ok(g), Ok(w)) => prop_assert_eq!(g, w, "{:?}", op),
        (Err(g), Err(w)) => prop_assert!(
            same_error(g, w),
            "{:?}: store error {:?}, model error {:?}",
            op,
            g,
            w
        ),
        _ => prop_assert!(false, "{:?}: store {:?}, model {:?}", op, got, want),
    }
    Ok(got.is_err())
}

/// Apply `op` to the store and the model and compare the results; returns whether the
/// store's call failed.
pub fn apply(
    store: &mut Store,
    model: &mut Model,
    op: &Op,
    step: usize,
) -> Result<bool, TestCaseError> {
    let mut failed = false;
    match op {
        Op::Insert { name, shape, seed } => {
            let name = VAR_NAMES[*name];
            let arr = Arr::ramp(SHAPES[*shape], *seed);
            let want = if model.working.contains_key(name) {
                Err(Error::VariableExists {
                    name: name.to_owned(),
                })
            } else {
                model.working.insert(name.to_owned(), arr.clone());
                Ok(())
            };
            failed = agree(op, store.insert(name, &arr.to_array()), want)?;
        }
        Op::Remove { name } => {
            let name = VAR_NAMES[*name];
            let want = model
                .working
                .remove(name)
                .map(|_| ())
                .ok_or_else(|| var_unknown(name));
            failed = agree(op, store.remove(name).map(|_| ()), want)?;
        }
        Op::Update {
            name,
            start,
            len,
            val,
            add,
            out_of_bounds,
        } => {
            let name = VAR_NAMES[*name];
            let val = VALUES[*val];
            let f = |x: &mut f32| {
                if *add {
                    *x += val;
                } else {
                    *x = val;
                }
            };
            let (range, want) = match model.working.get_mut(name) {
                None => (0..1, Err(var_unknown(name))),
                Some(arr) => {
                    let n = arr.data.len();
                    let s = start % (n + 1);
                    if *out_of_bounds {
                        let range = s..n + 1;
                        let err = Error::RangeOutOfBounds {
                            name: name.to_owned(),
                            range: range.clone(),
                            len: n,
                        };
                        (range, Err(err))
                    } else {
                        let range = s..(s + len).min(n);
                        arr.data[range.clone()].iter_mut().for_each(f);
                        (range, Ok(()))
                    }
                }
            };
            let got = store.update_range::<f32>(name, range, |_, xs| xs.iter_mut().for_each(f));
            failed = agree(op, got.map(|_| ()), want)?;
        }
        Op::Write {
            name,
            fresh,
            shape,
            seed,
        } => {
            let name = VAR_NAMES[*name];
            let arr = match model.working.get(name) {
                Some(cur) if !fresh => {
                    let mut arr = cur.clone();
                    if !arr.data.is_empty() {
                        let i = seed % arr.data.len();
                        arr.data[i] = VALUES[seed % VALUES.len()];
                    }
                    arr
                }
                _ => Arr::ramp(SHAPES[*shape], *seed),
            };
            let want = match model.working.get_mut(name) {
                None => Err(var_unknown(name)),
                Some(cur) if cur.shape != arr.shape => Err(Error::ShapeMismatch {
                    name: name.to_owned(),
                    expected: cur.shape.clone(),
                    found: arr.shape.clone(),
                }),
                Some(cur) => {
                    let changed = (0..cur.num_chunks())
                        .filter(|&i| !bits_eq(cur.chunk(i), arr.chunk(i)))
                        .count();
                    *cur = arr.clone();
                    Ok(changed)
                }
            };
            let got = store.write(name, &arr.to_array());
            failed = agree(op, got.map(|s| s.chunks_changed), want)?;
        }
        Op::Commit { loss } => {
            let message = format!("step {step}");
            let mut meta = Meta::new().with("step", step as i64);
            if let Some(v) = &LOSSES[*loss % LOSSES.len()] {
                meta.insert("loss", v.clone());
            }
            let parents = model.head_id().into_iter().collect();
            let vars = model.working.clone();
            let want = model.record(parents, message.clone(), meta.clone(), vars);
            failed = agree(op, store.commit_with(&message, meta), Ok(vid(want)))?;
        }
        Op::Restore { id, tip } => {
            let id = if *tip {
                pick_tip(*id, model)
            } else {
                pick_id(*id, model)
            };
            let want = model.restore(id);
            failed = agree(op, store.restore(vid(id)), want)?;
        }
        Op::Discard => {
            model.working = model.head_vars();
            failed = agree(op, store.discard(), Ok(()))?;
        }
        Op::Undo => {
            let want = model.undo().map(vid);
            failed = agree(op, store.undo(), want)?;
        }
        Op::Redo => {
            let want = model.redo().map(vid);
            failed = agree(op, store.redo(), want)?;
        }
        Op::Branch { name, id } => {
            let (name, id) = (REF_NAMES[*name], pick_id(*id, model));
            let want = model.new_ref(name, Ref::Branch(vid(id)));
            failed = agree(op, store.branch(name, vid(id)), want)?;
        }
        Op::Tag { name, id } => {
            let (name, id) = (REF_NAMES[*name], pick_id(*id, model));
            let want = model.new_ref(name, Ref::Tag(vid(id)));
            failed = agree(op, store.tag(name, vid(id)), want)?;
        }
        Op::Checkout { name } => {
            let name = REF_NAMES[*name];
            let want = model.checkout(name);
            failed = agree(op, store.checkout(name), want)?;
        }
        Op::CheckoutDetached { id } => {
            let id = pick_id(*id, model);
            let want = model.checkout_detached(id);
            failed = agree(op, store.checkout_detached(vid(id)), want)?;
        }
        Op::DeleteBranch { name } => {
            let name = REF_NAMES[*name];
            let want = model.delete_ref(name, true);
            failed = agree(op, store.delete_branch(name), want)?;
        }
        Op::DeleteTag { name } => {
            let name = REF_NAMES[*name];
            let want = model.delete_ref(name, false);
            failed = agree(op, store.delete_tag(name), want)?;
        }
        Op::Detach => {
            if let Some(h) = model.head_id() {
                model.head = MHead::Detached(h);
            }
            store.detach();
        }
        Op::Merge { id, tip, strategy } => {
            let id = if *tip {
                pick_tip(*id, model)
            } else {
                pick_id(*id, model)
            };
            let strategy = STRATEGIES[*strategy];
            let want = model.merge(id, strategy).map(vid);
            failed = agree(op, store.merge(vid(id), strategy), want)?;
        }
        Op::Average { ids, weights } => {
            let ids: Vec<u64> = ids.iter().map(|i| pick_id(*i, model)).collect();
            let weights: Option<Vec<f64>> = weights
                .as_ref()
                .map(|w| w.iter().map(|i| WEIGHTS[*i]).collect());
            let want = model.average(&ids, weights.as_deref()).map(vid);
            let ids: Vec<VersionId> = ids.into_iter().map(vid).collect();
            failed = agree(op, store.average(&ids, weights.as_deref()), want)?;
        }
        Op::Fork { .. } => unreachable!("runs as its steps"),
        Op::Prune {
            last,
            every,
            unreachable,
            best,
        } => {
            let mut policy = Retention::default().drop_unreachable(*unreachable);
            policy.last = *last;
            if let Some(k) = every {
                policy = policy.keep_every(*k);
            }
            let best = best.map(|(n, min)| (n, if min { Goal::Min } else { Goal::Max }));
            if let Some((n, goal)) = best {
                policy = policy.keep_best(n, "loss", goal);
            }
            let want = model.prune(*last, *every, *unreachable, best);
            let got = store.prune(&policy);
            let got = got.map(|s| {
                (
                    s.dropped.iter().map(|v| v.0).collect::<Vec<_>>(),
                    s.kept,
                    s.bytes_after <= s.bytes_before,
                )
            });
            failed = agree(op, got, Ok((want, model.live().len(), true)))?;
        }
    }
    Ok(failed)
}

pub fn check_contents(
    what: &str,
    names: Vec<String>,
    get: impl Fn(&str) -> Result<ArrayD<f32>, Error>,
    want: &MVars,
) -> Result<(), TestCaseError> {
    let want_names: Vec<String> = want.keys().cloned().collect();
    prop_assert_eq!(names, want_names, "{}: names", what);
    for (name, arr) in want {
        let got = get(name).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        prop_assert_eq!(got.shape(), &arr.shape[..], "{}: shape of {}", what, name);
        let flat: Vec<f32> = got.iter().copied().collect();
        prop_assert!(
            bits_eq(&flat, &arr.data),
            "{}: `{}` is {:?}, model has {:?}",
            what,
            name,
            flat,
            arr.data
        );
    }
    Ok(())
}

/// Everything observable about the store equals the model.
pub fn check(store: &Store, model: &Model) -> Result<(), TestCaseError> {
    check_contents(
        "working state",
        store.names(),
        |n| store.get::<f32>(n),
        &model.working,
    )?;
    prop_assert_eq!(store.head(), model.head_id().map(vid));
    prop_assert_eq!(store.current_branch(), model.head_branch());
    let refs: Vec<(String, Ref)> = model.refs.iter().map(|(k, v)| (k.clone(), *v)).collect();
    prop_assert_eq!(store.refs(), refs);
    let reflog: Vec<(String, VersionId)> = model
        .reflog
        .iter()
        .rev()
        .map(|(name, v)| (name.clone(), vid(*v)))
        .collect();
    prop_assert_eq!(store.reflog(), reflog);
    let live = model.live();
    prop_assert_eq!(
        store.versions(),
        live.iter().map(|v| vid(*v)).collect::<Vec<_>>()
    );
    let tips: Vec<VersionId> = live
        .iter()
        .filter(|v| model.children(**v).is_empty())
        .map(|v| vid(*v))
        .collect();
    prop_assert_eq!(store.tips(), tips);
    prop_assert_eq!(store.is_dirty(), model.dirty());
    prop_assert_eq!(
        store.diff_working(),
        diff_model(&model.head_vars(), &model.working)
    );
    for id in 0..=model.nodes.len() as u64 {
        match model.node(id) {
            Ok(node) => {
                let snap = store
                    .snapshot(vid(id))
                    .map_err(|e| TestCaseError::fail(format!("snapshot v{id}: {e}")))?;
                prop_assert_eq!(snap.id(), Some(vid(id)));
                prop_assert_eq!(snap.message(), node.message.as_str());
                prop_assert_eq!(snap.metadata(), &node.meta, "v{}", id);
                prop_assert_eq!(store.metadata(vid(id)).ok(), Some(&node.meta), "v{}", id);
                check_contents(
                    &format!("v{id}"),
                    snap.names(),
                    |n| snap.get::<f32>(n),
                    &node.vars,
                )?;
                let parents: Vec<VersionId> = node.parents.iter().map(|p| vid(*p)).collect();
                prop_assert_eq!(store.parents(vid(id)).ok(), Some(parents), "v{}", id);
                let children: Vec<VersionId> = model.children(id).into_iter().map(vid).collect();
                prop_assert_eq!(store.children(vid(id)).ok(), Some(children), "v{}", id);
            }
            Err(want) => {
                let got = store.snapshot(vid(id)).map(|_| ());
                prop_assert_eq!(got, Err(want));
            }
        }
    }
    if let Some(h) = model.head_id() {
        let log: Vec<VersionId> = model.ancestors(h).into_iter().rev().map(vid).collect();
        prop_assert_eq!(store.log(vid(h)).ok(), Some(log));
        let head = model.node(h).unwrap();
        if let Some(&p) = head.parents.first() {
            let want = diff_model(&model.node(p).unwrap().vars, &head.vars);
            prop_assert_eq!(store.diff(vid(p), vid(h)).ok(), Some(want));
        }
        for v in &live {
            let want = model.merge_base(h, *v).map(vid);
            prop_assert_eq!(store.merge_base(vid(h), vid(*v)).ok(), Some(want), "v{}", v);
        }
    }
    if let Err(e) = store.verify() {
        prop_assert!(false, "verify failed: {}", e);
    }
    Ok(())
}

/// The first actions of every run: two variables (several chunks each) so that most
/// edits hit something.
pub const SETUP: [Op; 2] = [
    Op::Insert {
        name: 0,
        shape: 5,
        seed: 0,
    },
    Op::Insert {
        name: 1,
        shape: 7,
        seed: 1,
    },
];

pub fn run(max_versions: Option<usize>, ops: &[Op]) -> Result<(), TestCaseError> {
    run_with_budget(max_versions, None, ops)
}

/// [`run`] with `Config::memory_budget` set to `budget`: after every step the budget is
/// also enforced at once (old versions encoded), and the store checked again. Versions
/// the budget let go leave the model too (see [`follow_budget`]).
pub fn run_with_budget(
    max_versions: Option<usize>,
    budget: Option<usize>,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut store = Store::with_config(Config {
        chunk_bytes: CHUNK_BYTES,
        max_versions,
        memory_budget: budget,
        ..Config::default()
    })
    .unwrap();
    let mut model = Model::new(max_versions);
    let steps: Vec<Op> = SETUP.iter().chain(ops).flat_map(Op::steps).collect();
    for (step, op) in steps.iter().enumerate() {
        let before = Fingerprint::of(&store);
        if apply(&mut store, &mut model, op, step)? {
            prop_assert_eq!(
                &Fingerprint::of(&store),
                &before,
                "{:?} failed and changed the store",
                op
            );
        }
        if budget.is_some() {
            follow_budget(&store, &mut model)?;
        }
        check(&store, &model)?;
        if budget.is_some() {
            store.enforce_memory_budget();
            follow_budget(&store, &mut model)?;
            check(&store, &model)?;
        }
    }
    Ok(())
}

/// Versions the memory budget let go: when even encoded the history holds more than the
/// budget, a commit drops versions that no ref, HEAD, the reflog or the redo path holds
/// (as auto-retention does). Each version the store dropped must be one of those; the
/// model drops it too (its reads then give `PrunedVersion` in both).
fn follow_budget(store: &Store, model: &mut Model) -> Result<(), TestCaseError> {
    let live: Vec<VersionId> = store.versions();
    for id in model.live() {
        if live.contains(&vid(id)) {
            continue;
        }
        let protected = model.refs.values().any(|r| r.target() == vid(id))
            || model.head_id() == Some(id)
            || model.reflog.iter().any(|(_, v)| *v == id)
            || model.redo.contains(&id);
        prop_assert!(
            !protected,
            "the memory budget dropped v{}, which is protected",
            id
        );
        model.remove(id);
    }
    Ok(())
}

/// Everything a failing call must leave as it was, including what the model does not
/// track (the buffer pool, the text of the graph).
#[derive(Debug, PartialEq)]
pub struct Fingerprint {
    graph: String,
    head: Option<VersionId>,
    branch: Option<String>,
    refs: Vec<(String, Ref)>,
    versions: Vec<VersionId>,
    reflog: Vec<(String, VersionId)>,
    pooled_bytes: usize,
    dirty: bool,
    working: Vec<(String, Vec<usize>, Vec<u8>)>,
}

impl Fingerprint {
    /// The same without the buffer pool: a save that reports a conflict has written the
    /// versions and released their heap chunks (into the pool), which is not a change of
    /// anything the store holds.
    pub fn without_pool(self) -> Fingerprint {
        Fingerprint {
            pooled_bytes: 0,
            ..self
        }
    }

    pub fn of(store: &Store) -> Fingerprint {
        Fingerprint {
            graph: store.log_graph(),
            head: store.head(),
            branch: store.current_branch().map(str::to_owned),
            refs: store.refs(),
            versions: store.versions(),
            reflog: store.reflog(),
            pooled_bytes: store.pooled_bytes(),
            dirty: store.is_dirty(),
            working: store
                .names()
                .into_iter()
                .map(|n| {
                    let t = store.tensor(&n).expect("a listed name");
                    let bytes = t
                        .chunks()
                        .flat_map(|c| c.bytes().unwrap().to_vec())
                        .collect();
                    (n, t.shape().to_vec(), bytes)
                })
                .collect(),
        }
    }
}

/// What the fuzz target decodes from its bytes: a retention setting and the operations.
#[derive(Clone, Debug, Arbitrary)]
pub struct Input {
    pub max_versions: Option<u8>,
    pub ops: Vec<Op>,
}

impl Op {
    /// The operation with every index and count brought into the range the property
    /// tests generate (fuzzed values are arbitrary `usize`s).
    pub fn normalized(&self) -> Op {
        let id = |i: usize| i % 64;
        let name = |i: usize| i % VAR_NAMES.len();
        let refn = |i: usize| i % REF_NAMES.len();
        match self.clone() {
            Op::Insert {
                name: n,
                shape,
                seed,
            } => Op::Insert {
                name: name(n),
                shape: shape % SHAPES.len(),
                seed: seed % 64,
            },
            Op::Remove { name: n } => Op::Remove { name: name(n) },
            Op::Update {
                name: n,
                start,
                len,
                val,
                add,
                out_of_bounds,
            } => Op::Update {
                name: name(n),
                start: start % 64,
                len: len % 5,
                val: val % VALUES.len(),
                add,
                out_of_bounds,
            },
            Op::Write {
                name: n,
                fresh,
                shape,
                seed,
            } => Op::Write {
                name: name(n),
                fresh,
                shape: shape % SHAPES.len(),
                seed: seed % 64,
            },
            Op::Commit { loss } => Op::Commit {
                loss: loss % LOSSES.len(),
            },
            Op::Restore { id: i, tip } => Op::Restore { id: id(i), tip },
            Op::Branch { name: n, id: i } => Op::Branch {
                name: refn(n),
                id: id(i),
            },
            Op::Tag { name: n, id: i } => Op::Tag {
                name: refn(n),
                id: id(i),
            },
            Op::Checkout { name: n } => Op::Checkout { name: refn(n) },
            Op::CheckoutDetached { id: i } => Op::CheckoutDetached { id: id(i) },
            Op::DeleteBranch { name: n } => Op::DeleteBranch { name: refn(n) },
            Op::DeleteTag { name: n } => Op::DeleteTag { name: refn(n) },
            Op::Merge {
                id: i,
                tip,
                strategy,
            } => Op::Merge {
                id: id(i),
                tip,
                strategy: strategy % STRATEGIES.len(),
            },
            Op::Average { ids, weights } => Op::Average {
                ids: ids.into_iter().take(4).map(id).collect(),
                weights: weights
                    .map(|w| w.into_iter().take(5).map(|i| i % WEIGHTS.len()).collect()),
            },
            Op::Prune {
                last,
                every,
                unreachable,
                best,
            } => Op::Prune {
                last: last.map(|n| n % 5),
                every: every.map(|k| k % 3 + 1),
                unreachable,
                best: best.map(|(n, min)| (n % 4, min)),
            },
            Op::Fork {
                id: i,
                name: n,
                start,
                val,
            } => Op::Fork {
                id: id(i),
                name: name(n),
                start: start % 64,
                val: 1 + val % (VALUES.len() - 1),
            },
            op @ (Op::Discard | Op::Undo | Op::Redo | Op::Detach) => op,
        }
    }
}

/// Run a decoded fuzz input (at most 64 operations, normalized) against the model.
///
/// # Errors
///
/// The first divergence from the model, or a failing call that changed the store.
pub fn run_input(input: &Input) -> Result<(), TestCaseError> {
    let ops: Vec<Op> = input.ops.iter().take(64).map(Op::normalized).collect();
    let max_versions = input.max_versions.map(|m| usize::from(m % 4) + 1);
    run(max_versions, &ops)
}
