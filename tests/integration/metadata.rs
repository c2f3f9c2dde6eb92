//! Version metadata: recorded with commits, merges and averages, read back from the store
//! and from snapshots, shown by `log_graph` and `to_dot` (and `to_dot_from`), and ranked by
//! `keep_best`.

use ndarray::array;
use tensor_history::{Error, Goal, MergeStrategy, Meta, Retention, Store, Value, VersionId};

fn store_with_w() -> Store {
    let mut store = Store::new();
    store.insert("w", &array![1.0f32, 2.0]).unwrap();
    store
}

/// Commit `losses` in a line on the current branch, one step each; returns their ids.
fn commit_losses(store: &mut Store, losses: &[f64]) -> Vec<VersionId> {
    losses
        .iter()
        .enumerate()
        .map(|(step, loss)| {
            store.update_map::<f32>("w", |x| x + 1.0).unwrap();
            let meta = Meta::new().with("step", step as i64).with("loss", *loss);
            store.commit_with(&format!("step {step}"), meta).unwrap()
        })
        .collect()
}

#[test]
fn commit_with_records_metadata_read_back_from_store_and_snapshot() {
    let mut store = store_with_w();
    let meta = Meta::new()
        .with("step", 3)
        .with("loss", 0.12)
        .with("optimizer", "adam")
        .with("warm", true);
    let v0 = store.commit_with("step 3", meta.clone()).unwrap();
    assert_eq!(store.metadata(v0).unwrap(), &meta);
    let snap = store.snapshot(v0).unwrap();
    assert_eq!(snap.metadata(), &meta);
    assert_eq!(
        snap.metadata().get("optimizer"),
        Some(&Value::Str("adam".into()))
    );
    assert_eq!(snap.metadata().number("loss"), Some(0.12));
    assert_eq!(snap.metadata().number("optimizer"), None);
    assert_eq!(
        snap.metadata().get("warm").and_then(Value::as_bool),
        Some(true)
    );
}

#[test]
fn plain_commit_has_empty_metadata() {
    let mut store = store_with_w();
    let v0 = store.commit("init").unwrap();
    assert!(store.metadata(v0).unwrap().is_empty());
    assert!(store.working_snapshot().metadata().is_empty());
}

#[test]
fn snapshot_keeps_metadata_after_its_version_is_pruned() {
    let mut store = store_with_w();
    let ids = commit_losses(&mut store, &[0.9, 0.8, 0.7]);
    let snap = store.snapshot(ids[0]).unwrap();
    store.prune(&Retention::keep_last(1)).unwrap();
    assert_eq!(
        store.metadata(ids[0]),
        Err(Error::PrunedVersion { id: ids[0] })
    );
    assert_eq!(snap.metadata().number("loss"), Some(0.9));
}

#[test]
fn metadata_of_unknown_version_is_an_error() {
    let store = store_with_w();
    assert_eq!(
        store.metadata(VersionId(7)),
        Err(Error::UnknownVersion { id: VersionId(7) })
    );
}

#[test]
fn bad_metadata_keys_are_refused_and_change_nothing() {
    for key in ["", "a b", "a=b", "tab\t", "quo\"te", "new\nline"] {
        let mut store = store_with_w();
        let v0 = store.commit("init").unwrap();
        let err = store
            .commit_with("bad", Meta::new().with(key, 1))
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{key:?}: {err}"
        );
        assert_eq!(store.head(), Some(v0), "{key:?}");
        assert_eq!(store.versions(), vec![v0], "{key:?}");
        store.update_map::<f32>("w", |x| x * 2.0).unwrap();
        let err = store
            .commit_with("bad", Meta::new().with("ok", 1).with(key, 2))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }));
        assert!(store.is_dirty(), "the working state is kept");
    }
}

#[test]
fn log_graph_shows_metadata_after_the_message_and_escapes_text() {
    let mut store = store_with_w();
    store
        .commit_with("init", Meta::new().with("step", 0).with("loss", 1.0))
        .unwrap();
    store
        .commit_with(
            "tune",
            Meta::new()
                .with("note", "two words\nand \"a newline\"")
                .with("lr", 1e-4),
        )
        .unwrap();
    store.commit("plain").unwrap();
    let graph = store.log_graph();
    assert_eq!(
        graph,
        "* v2 (HEAD -> main) plain\n\
         * v1 tune [lr=0.0001 note=\"two words\\nand \\\"a newline\\\"\"]\n\
         * v0 init [loss=1.0 step=0]\n"
    );
    assert!(!graph.trim_end().lines().any(|l| l.contains('\t')));
}

#[test]
fn meta_display_quotes_only_text_that_needs_it() {
    let meta = Meta::new()
        .with("a", "plain")
        .with("b", "")
        .with("c", "x=y")
        .with("d", f64::NAN)
        .with("e", -3)
        .with("f", 2.5e-7)
        .with("g", false);
    assert_eq!(
        meta.to_string(),
        r#"a=plain b="" c="x=y" d=NaN e=-3 f=2.5e-7 g=false"#
    );
}

#[test]
fn float_values_compare_bitwise_so_nan_round_trips() {
    assert_eq!(Value::Float(f64::NAN), Value::Float(f64::NAN));
    assert_ne!(Value::Float(0.0), Value::Float(-0.0));
    assert_ne!(Value::Float(1.0), Value::Int(1));
    let meta = Meta::new().with("loss", f64::NAN);
    assert_eq!(meta.number("loss"), None);
    assert_eq!(meta, meta.clone());
}

#[test]
fn metadata_serializes_as_a_plain_map() {
    let meta = Meta::new()
        .with("step", 3)
        .with("loss", 0.5)
        .with("tag", "x");
    let json = serde_json::to_string(&meta).unwrap();
    assert_eq!(
        json,
        r#"{"loss":{"Float":0.5},"step":{"Int":3},"tag":{"Str":"x"}}"#
    );
    let back: Meta = serde_json::from_str(&json).unwrap();
    assert_eq!(back, meta);
}

#[test]
fn to_dot_labels_versions_with_their_metadata() {
    let mut store = store_with_w();
    store
        .commit_with("init", Meta::new().with("note", "say \"hi\""))
        .unwrap();
    let dot = store.to_dot();
    assert!(
        dot.contains(r#"0 [label="v0\ninit\nnote=\"say \\\"hi\\\"\""];"#),
        "{dot}"
    );
}

#[test]
fn merge_with_and_average_with_record_the_callers_metadata() {
    let mut store = store_with_w();
    let v0 = store
        .commit_with("init", Meta::new().with("step", 0))
        .unwrap();
    store.update::<f32>("w", |_, xs| xs[0] = 5.0).unwrap();
    let v1 = store
        .commit_with("a", Meta::new().with("loss", 0.5))
        .unwrap();
    store.branch("b", v0).unwrap();
    store.checkout("b").unwrap();
    store.update::<f32>("w", |_, xs| xs[0] = 7.0).unwrap();
    let v2 = store
        .commit_with("b", Meta::new().with("loss", 0.3))
        .unwrap();
    let merged = store
        .merge_with(v1, MergeStrategy::Mean, Meta::new().with("loss", 0.2))
        .unwrap();
    assert_eq!(
        store.metadata(merged).unwrap(),
        &Meta::new().with("loss", 0.2)
    );
    let plain = store.average(&[v1, v2], None).unwrap();
    assert!(store.metadata(plain).unwrap().is_empty());
    let soup = store
        .average_with(&[v1, v2], None, Meta::new().with("soup", true))
        .unwrap();
    assert_eq!(
        store.metadata(soup).unwrap().get("soup"),
        Some(&Value::Bool(true))
    );
    // A bad key fails before anything is merged.
    let head = store.head();
    let err = store
        .merge_with(v1, MergeStrategy::Mean, Meta::new().with("", 1))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }));
    let err = store
        .average_with(&[v1, v2], None, Meta::new().with("a b", 1))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }));
    assert_eq!(store.head(), head);
}

#[test]
fn keep_best_min_keeps_the_lowest_losses_and_the_refs() {
    let mut store = store_with_w();
    let ids = commit_losses(&mut store, &[0.9, 0.4, 0.7, 0.2, 0.8, 0.6]);
    let stats = store
        .prune(&Retention::default().keep_best(2, "loss", Goal::Min))
        .unwrap();
    // v1 (0.4) and v3 (0.2) are the best two; v5 is the branch tip.
    assert_eq!(store.versions(), vec![ids[1], ids[3], ids[5]]);
    assert_eq!(stats.dropped, vec![ids[0], ids[2], ids[4]]);
}

#[test]
fn keep_best_max_keeps_the_highest_values() {
    let mut store = store_with_w();
    let ids = commit_losses(&mut store, &[0.9, 0.4, 0.7, 0.2, 0.8, 0.6]);
    store
        .prune(&Retention::default().keep_best(2, "loss", Goal::Max))
        .unwrap();
    assert_eq!(store.versions(), vec![ids[0], ids[4], ids[5]]);
}

#[test]
fn keep_best_ties_go_to_the_older_version_and_nan_or_text_never_rank() {
    let mut store = store_with_w();
    let v0 = store
        .commit_with("nan", Meta::new().with("loss", f64::NAN))
        .unwrap();
    let v1 = store
        .commit_with("text", Meta::new().with("loss", "low"))
        .unwrap();
    let v2 = store
        .commit_with("a", Meta::new().with("loss", 0.5))
        .unwrap();
    let v3 = store
        .commit_with("b", Meta::new().with("loss", 0.5))
        .unwrap();
    let v4 = store.commit_with("none", Meta::new()).unwrap();
    let v5 = store
        .commit_with("int", Meta::new().with("loss", 2))
        .unwrap();
    let _tip = store.commit("tip").unwrap();
    store
        .prune(&Retention::default().keep_best(1, "loss", Goal::Min))
        .unwrap();
    assert!(store.versions().contains(&v2));
    for gone in [v0, v1, v3, v4, v5] {
        assert!(!store.versions().contains(&gone), "{gone}");
    }
}

#[test]
fn keep_best_combines_with_keep_last_as_a_union() {
    let mut store = store_with_w();
    let ids = commit_losses(&mut store, &[0.1, 0.9, 0.8, 0.7, 0.6, 0.5]);
    store
        .prune(&Retention::keep_last(2).keep_best(1, "loss", Goal::Min))
        .unwrap();
    assert_eq!(store.versions(), vec![ids[0], ids[4], ids[5]]);
}

#[test]
fn keep_best_of_a_missing_metric_keeps_only_what_refs_hold() {
    let mut store = store_with_w();
    let ids = commit_losses(&mut store, &[0.3, 0.2, 0.1]);
    store.tag("first", ids[0]).unwrap();
    store
        .prune(&Retention::default().keep_best(5, "accuracy", Goal::Max))
        .unwrap();
    assert_eq!(store.versions(), vec![ids[0], ids[2]]);
}

#[test]
fn f32_values_are_recorded_by_their_shortest_decimal_form() {
    assert_eq!(Value::from(0.1f32), Value::Float(0.1));
    assert_eq!(Value::from(3.0e-4f32), Value::Float(3.0e-4));
    assert_eq!(Value::from(f32::INFINITY), Value::Float(f64::INFINITY));
    assert!(matches!(Value::from(f32::NAN), Value::Float(x) if x.is_nan()));
    assert_eq!(Meta::new().with("lr", 0.05f32).to_string(), "lr=0.05");
}

#[test]
fn to_dot_from_shows_only_one_ancestry_and_its_refs() {
    let mut store = store_with_w();
    let v0 = store.commit("init").unwrap();
    let v1 = store.commit("a").unwrap();
    store.branch("side", v0).unwrap();
    store.checkout("side").unwrap();
    let v2 = store.commit("b").unwrap();
    let dot = store.to_dot_from(v1).unwrap();
    assert!(dot.contains(&format!("  {} -> {};", v1.0, v0.0)), "{dot}");
    assert!(!dot.contains(&format!("  {} [label", v2.0)), "{dot}");
    assert!(
        dot.contains("ref:main") && !dot.contains("ref:side"),
        "{dot}"
    );
    assert!(!dot.contains("HEAD"), "HEAD is on `side`: {dot}");
    assert_eq!(
        store.to_dot_from(VersionId(9)),
        Err(Error::UnknownVersion { id: VersionId(9) })
    );
    assert_eq!(store.to_dot_from(v2).unwrap().matches("[label").count(), 2);
}
