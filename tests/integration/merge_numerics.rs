//! Averages and `Mean` merges: extreme weights, zero weights over NaN, and failures that
//! must leave everything, the buffer pool included, as it was.

use ndarray::{array, Array1};
use tensor_history::{Config, Error, MergeStrategy, Retention, Store, VersionId};

fn store() -> Store {
    Store::with_config(Config {
        chunk_bytes: 64,
        ..Config::default()
    })
    .unwrap()
}

/// Two versions of `x` (f64).
fn two(a: &[f64], b: &[f64]) -> (Store, VersionId, VersionId) {
    let mut s = store();
    s.insert("x", &Array1::from_vec(a.to_vec())).unwrap();
    let va = s.commit("a").unwrap();
    s.write("x", &Array1::from_vec(b.to_vec())).unwrap();
    let vb = s.commit("b").unwrap();
    (s, va, vb)
}

#[test]
fn average_with_weights_whose_sum_overflows_is_the_plain_mean() {
    let (mut s, va, vb) = two(&[2.0, -4.0, 1e300], &[4.0, 8.0, 1e300]);
    s.average(&[va, vb], Some(&[1e308, 1e308])).unwrap();
    assert_eq!(
        s.get::<f64>("x").unwrap(),
        array![3.0, 2.0, 1e300].into_dyn()
    );
    s.average(&[va, vb], Some(&[f64::MAX, f64::MAX / 3.0]))
        .unwrap();
    let got = s.get::<f64>("x").unwrap();
    assert!((got[0] - 2.5).abs() < 1e-12, "{got:?}");
}

#[test]
fn a_version_of_weight_zero_does_not_contribute_even_nan() {
    let (mut s, va, vb) = two(&[1.0, 2.0], &[f64::NAN, f64::INFINITY]);
    s.average(&[va, vb], Some(&[1.0, 0.0])).unwrap();
    assert_eq!(s.get::<f64>("x").unwrap(), array![1.0, 2.0].into_dyn());
    // f32 too, and -0.0 counts as a zero weight.
    let mut s = store();
    s.insert("y", &array![1.5f32, -2.0]).unwrap();
    let va = s.commit("a").unwrap();
    s.write("y", &array![f32::NAN, f32::NAN]).unwrap();
    let vb = s.commit("b").unwrap();
    s.average(&[vb, va], Some(&[-0.0, 3.0])).unwrap();
    assert_eq!(s.get::<f32>("y").unwrap(), array![1.5f32, -2.0].into_dyn());
}

/// A store whose pool holds some buffers, with versions `f` (float `w` and integer `n`)
/// and two children that change both on both sides.
fn pooled_fork() -> (Store, VersionId, VersionId) {
    let mut s = store();
    s.insert("w", &Array1::from_elem(64, 1.0f32)).unwrap();
    s.insert("n", &Array1::from_elem(16, 1i32)).unwrap();
    let base = s.commit("base").unwrap();
    // Fill the pool: copy every chunk once, then prune the copies away.
    s.update_map::<f32>("w", |x| x + 1.0).unwrap();
    s.commit("tmp").unwrap();
    s.restore(base).unwrap();
    s.clear_reflog();
    s.prune(&Retention::keep_last(1).drop_unreachable(true))
        .unwrap();
    assert!(s.pooled_bytes() > 0);
    s.update_map::<f32>("w", |x| x * 3.0).unwrap();
    s.update_map::<i32>("n", |x| x + 1).unwrap();
    let ours = s.commit("ours").unwrap();
    s.branch("side", base).unwrap();
    s.checkout("side").unwrap();
    s.update_map::<f32>("w", |x| x * 5.0).unwrap();
    s.update_map::<i32>("n", |x| x + 2).unwrap();
    let theirs = s.commit("theirs").unwrap();
    s.checkout("main").unwrap();
    (s, ours, theirs)
}

#[test]
fn a_mean_merge_that_fails_on_integers_leaves_the_pool_as_it_was() {
    let (mut s, _, theirs) = pooled_fork();
    let (pooled, versions, graph) = (s.pooled_bytes(), s.versions(), s.log_graph());
    let err = s.merge(theirs, MergeStrategy::Mean).unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { ref name, .. } if name == "n"));
    assert_eq!(s.pooled_bytes(), pooled);
    assert_eq!((s.versions(), s.log_graph()), (versions, graph));
    s.verify().unwrap();
}

#[test]
fn an_average_that_fails_on_integers_leaves_the_pool_as_it_was() {
    let (mut s, ours, theirs) = pooled_fork();
    let (pooled, versions) = (s.pooled_bytes(), s.versions());
    let err = s.average(&[ours, theirs], None).unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { ref name, .. } if name == "n"));
    assert_eq!(s.pooled_bytes(), pooled);
    assert_eq!(s.versions(), versions);
    assert_eq!(s.head(), Some(ours));
    s.verify().unwrap();
}
