//! Model-based property test of the version history: random sequences of working-state
//! edits and history operations are applied to a [`Store`] with 64-byte chunks and to a
//! naive model that deep-copies every version. After every step the working state, HEAD,
//! the refs, the versions, their parents, children and contents, the errors and
//! `verify()` must agree with the model, and a call that fails must change nothing (see
//! `model/driver.rs`). `TH_PROPTEST_CASES` sets the number of cases.

use crate::common;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use crate::model::driver::{
    run, run_with_budget, Op, LOSSES, REF_NAMES, SHAPES, STRATEGIES, VAR_NAMES, WEIGHTS,
};
use crate::model::VALUES;

fn ref_name() -> impl Strategy<Value = usize> {
    prop_oneof![9 => 0..4usize, 1 => 4..REF_NAMES.len()]
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..VAR_NAMES.len();
    let id = 0..64usize;
    prop_oneof![
        2 => (name.clone(), 0..SHAPES.len(), 0..5usize)
            .prop_map(|(name, shape, seed)| Op::Insert { name, shape, seed }),
        1 => name.clone().prop_map(|name| Op::Remove { name }),
        5 => (name.clone(), 0..64usize, 0..4usize, 0..VALUES.len(), any::<bool>(),
              prop::bool::weighted(0.05))
            .prop_map(|(name, start, len, val, add, out_of_bounds)| Op::Update {
                name, start, len, val, add, out_of_bounds,
            }),
        2 => (name.clone(), prop::bool::weighted(0.3), 0..SHAPES.len(), 0..64usize)
            .prop_map(|(name, fresh, shape, seed)| Op::Write { name, fresh, shape, seed }),
        6 => (0..LOSSES.len()).prop_map(|loss| Op::Commit { loss }),
        2 => (id.clone(), any::<bool>()).prop_map(|(id, tip)| Op::Restore { id, tip }),
        1 => Just(Op::Discard),
        3 => Just(Op::Undo),
        2 => Just(Op::Redo),
        2 => (ref_name(), id.clone()).prop_map(|(name, id)| Op::Branch { name, id }),
        1 => (ref_name(), id.clone()).prop_map(|(name, id)| Op::Tag { name, id }),
        2 => ref_name().prop_map(|name| Op::Checkout { name }),
        1 => id.clone().prop_map(|id| Op::CheckoutDetached { id }),
        1 => ref_name().prop_map(|name| Op::DeleteBranch { name }),
        1 => ref_name().prop_map(|name| Op::DeleteTag { name }),
        1 => Just(Op::Detach),
        3 => (id.clone(), prop::bool::weighted(0.7), 0..STRATEGIES.len())
            .prop_map(|(id, tip, strategy)| Op::Merge { id, tip, strategy }),
        1 => (
            prop::collection::vec(id.clone(), 1..4),
            prop::bool::weighted(0.05),
            prop::option::weighted(0.5, prop::collection::vec(0..WEIGHTS.len(), 4)),
            prop::bool::weighted(0.1),
        )
            .prop_map(|(mut ids, no_ids, weights, wrong_len)| {
                if no_ids {
                    ids.clear();
                }
                // Mostly one weight per version, sometimes one too many.
                let n = ids.len() + usize::from(wrong_len);
                let weights = weights.map(|w| w[..n].to_vec());
                Op::Average { ids, weights }
            }),
        3 => (id.clone(), name.clone(), 0..64usize, 1..VALUES.len())
            .prop_map(|(id, name, start, val)| Op::Fork { id, name, start, val }),
        2 => (
            prop::option::of(1..4usize),
            prop::option::weighted(0.3, 2..4usize),
            any::<bool>(),
            prop::option::weighted(0.5, (0..5usize, any::<bool>())),
        )
            .prop_map(|(last, every, unreachable, best)| Op::Prune { last, every, unreachable, best }),
    ]
}

/// Operations weighted towards diverging lines of history and merging them (conflicts,
/// every strategy), with undo, restore and pruning in between.
fn merge_op() -> impl Strategy<Value = Op> {
    let name = 0..2usize;
    let id = 0..64usize;
    prop_oneof![
        5 => (name.clone(), 0..64usize, 1..4usize, 0..VALUES.len(), any::<bool>())
            .prop_map(|(name, start, len, val, add)| Op::Update {
                name, start, len, val, add, out_of_bounds: false,
            }),
        1 => (name.clone(), 0..SHAPES.len(), 0..64usize)
            .prop_map(|(name, shape, seed)| Op::Write { name, fresh: true, shape, seed }),
        1 => (name.clone(), 0..SHAPES.len(), 0..5usize)
            .prop_map(|(name, shape, seed)| Op::Insert { name, shape, seed }),
        1 => name.clone().prop_map(|name| Op::Remove { name }),
        4 => (0..LOSSES.len()).prop_map(|loss| Op::Commit { loss }),
        4 => (id.clone(), name.clone(), 0..64usize, 1..VALUES.len())
            .prop_map(|(id, name, start, val)| Op::Fork { id, name, start, val }),
        5 => (id.clone(), prop::bool::weighted(0.9), 0..STRATEGIES.len())
            .prop_map(|(id, tip, strategy)| Op::Merge { id, tip, strategy }),
        1 => (prop::collection::vec(id.clone(), 2..4), prop::option::of(prop::collection::vec(0..3usize, 4)))
            .prop_map(|(ids, weights)| {
                let weights = weights.map(|w| w[..ids.len()].to_vec());
                Op::Average { ids, weights }
            }),
        1 => Just(Op::Undo),
        1 => Just(Op::Discard),
        1 => (prop::option::of(2..5usize), any::<bool>())
            .prop_map(|(last, unreachable)| Op::Prune { last, every: None, unreachable, best: None }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::cases(128),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/history_model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn store_matches_deep_copy_model(ops in prop::collection::vec(op(), 1..40)) {
        run(None, &ops)?;
    }

    #[test]
    fn merges_match_deep_copy_model(ops in prop::collection::vec(merge_op(), 1..40)) {
        run(None, &ops)?;
    }

    #[test]
    fn store_under_a_memory_budget_matches_deep_copy_model(
        budget in prop_oneof![Just(0usize), 0..2048usize],
        max in prop::option::of(1..4usize),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run_with_budget(max, Some(budget), &ops)?;
    }

    #[test]
    fn store_with_max_versions_matches_deep_copy_model(
        max in 1..4usize,
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(Some(max), &ops)?;
    }
}
