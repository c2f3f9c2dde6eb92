//! Sizes at the edge of `usize`: every size computation is checked, and overflow is a
//! typed error or a documented clamp, never a panic or a wrapped number.

use ndarray::{Array1, ArrayD, IxDyn};
use tensor_history::{Config, DType, Error, Retention, Store, Tensor};

#[test]
fn inserting_a_broadcast_view_larger_than_memory_is_a_typed_error() {
    let one = Array1::from_elem(1, 1.0f64);
    let huge = one.broadcast(1usize << 60).unwrap();
    let mut s = Store::new();
    let err = s.insert("x", &huge).unwrap_err();
    assert!(matches!(
        err,
        Error::TooLarge { ref shape, dtype: DType::F64 } if shape == &[1usize << 60]
    ));
    assert!(!s.contains("x"));
    assert!(matches!(
        Tensor::from_array(&huge, 1 << 16),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn zero_size_tensor_with_a_huge_inner_axis_has_no_row_blocks_and_no_overflow() {
    let a = ArrayD::<f64>::zeros(IxDyn(&[0, 1 << 61]));
    let mut s = Store::new();
    s.insert("z", &a).unwrap();
    let t = s.tensor("z").unwrap();
    assert_eq!((t.len(), t.nbytes(), t.num_chunks()), (0, 0, 0));
    assert!(matches!(
        t.row_blocks::<f64>().map(|_| ()),
        Err(Error::NotRowAligned {
            row_bytes: usize::MAX
        })
    ));
    assert_eq!(t.chunk_range(0), 0..0);
    s.commit("z").unwrap();
    s.verify().unwrap();
}

#[test]
fn chunk_range_past_the_end_is_empty_for_any_index() {
    let t = Tensor::from_array(&Array1::from_elem(10, 1u8), 4).unwrap();
    assert_eq!(t.chunk_range(2), 8..10);
    for i in [3, 1 << 40, usize::MAX / 4, usize::MAX] {
        assert_eq!(t.chunk_range(i), 10..10, "chunk {i}");
    }
}

#[test]
fn chunk_bytes_of_usize_max_is_one_chunk_and_debug_prints() {
    let mut s = Store::with_config(Config {
        chunk_bytes: usize::MAX,
        recycle_bytes: usize::MAX,
        ..Config::default()
    })
    .unwrap();
    s.insert("x", &Array1::from_elem(100, 2u8)).unwrap();
    let t = s.tensor("x").unwrap();
    assert_eq!(t.num_chunks(), 1);
    assert_eq!(t.chunk_range(0), 0..100);
    assert_eq!(t.chunk_range(1), 100..100);
    s.update::<u8>("x", |_, xs| xs[0] = 7).unwrap();
    s.commit("one").unwrap();
    assert!(format!("{s:?}").contains("chunk_bytes"));
    assert_eq!(s.pooled_bytes(), 0);
    s.verify().unwrap();
}

#[test]
fn a_pool_with_a_cap_of_usize_max_counts_without_overflow() {
    let mut s = Store::with_config(Config {
        chunk_bytes: 64,
        recycle_bytes: usize::MAX,
        ..Config::default()
    })
    .unwrap();
    s.insert("x", &Array1::from_elem(64, 1.0f32)).unwrap();
    s.commit("a").unwrap();
    s.update_map::<f32>("x", |x| x + 1.0).unwrap();
    s.commit("b").unwrap();
    s.prune(&Retention::keep_last(1)).unwrap();
    assert_eq!(s.pooled_bytes() % 64, 0);
    assert!(s.pooled_bytes() > 0);
    assert!(format!("{s:?}").contains("pooled_bytes"));
}

#[test]
fn prune_with_every_zero_is_an_error_and_changes_nothing() {
    let mut s = Store::new();
    s.insert("x", &Array1::from_elem(4, 1.0f32)).unwrap();
    for _ in 0..4 {
        s.commit("c").unwrap();
    }
    let before = s.versions();
    let mut policy = Retention::keep_last(1).drop_unreachable(true);
    policy.every = Some(0);
    assert!(matches!(
        s.prune(&policy),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(s.versions(), before);
    // The same through deserialization, which bypasses the builder.
    let policy: Retention =
        serde_json::from_str(r#"{"last":1,"every":0,"unreachable":false}"#).unwrap();
    assert!(matches!(
        s.prune(&policy),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(s.versions(), before);
}

#[test]
fn huge_retention_windows_keep_everything() {
    let mut s = Store::new();
    s.insert("x", &Array1::from_elem(4, 1.0f32)).unwrap();
    for _ in 0..5 {
        s.commit("c").unwrap();
    }
    let mut policy = Retention::keep_last(usize::MAX).drop_unreachable(true);
    policy.every = Some(usize::MAX);
    assert!(s.prune(&policy).unwrap().dropped.is_empty());
}
