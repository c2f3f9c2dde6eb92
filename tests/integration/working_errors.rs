//! Every error of the working state and of tensors, each reached by a test that also checks
//! that the failing call changed nothing (names, values, sharing, `is_dirty()`, `head()`).

use std::ops::Range;

use crate::common::{ramp, small_store, CHUNK_BYTES};
use ndarray::{ArrayD, IxDyn};
use tensor_history::{Config, ContentHash, DType, Error, Result, Store, Tensor, VersionId};

/// Everything observable about a store's working state and history position.
#[derive(Debug, PartialEq)]
struct State {
    names: Vec<String>,
    vars: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    dirty: bool,
    head: Option<VersionId>,
    versions: Vec<VersionId>,
    branch: Option<String>,
}

struct Captured {
    state: State,
    tensors: Vec<Tensor>,
}

fn capture(store: &Store) -> Captured {
    let names = store.names();
    let tensors: Vec<Tensor> = names
        .iter()
        .map(|n| store.tensor(n).unwrap().clone())
        .collect();
    let vars = names
        .iter()
        .zip(&tensors)
        .map(|(n, t)| {
            let bytes = t
                .chunks()
                .flat_map(|c| c.bytes().unwrap().iter().copied())
                .collect();
            (n.clone(), t.dtype(), t.shape().to_vec(), bytes)
        })
        .collect();
    Captured {
        state: State {
            names,
            vars,
            dirty: store.is_dirty(),
            head: store.head(),
            versions: store.versions(),
            branch: store.current_branch().map(str::to_owned),
        },
        tensors,
    }
}

fn assert_unchanged(store: &Store, before: &Captured, what: &str) {
    let after = capture(store);
    assert_eq!(after.state, before.state, "{what} changed the store");
    for (a, b) in after.tensors.iter().zip(&before.tensors) {
        assert!(a.ptr_eq(b), "{what} replaced chunks of a variable");
    }
    store.verify().unwrap();
}

/// Run `op` on `store`, expect an error accepted by `expected`, and check that nothing
/// changed.
fn refused<R: std::fmt::Debug>(
    store: &mut Store,
    what: &str,
    op: impl FnOnce(&mut Store) -> Result<R>,
    expected: impl Fn(&Error) -> bool,
) {
    let before = capture(store);
    match op(store) {
        Ok(r) => panic!("{what} succeeded with {r:?}"),
        Err(e) => assert!(expected(&e), "{what}: unexpected error {e:?}"),
    }
    assert_unchanged(store, &before, what);
}

/// Stores to run every error case on: empty, freshly filled (no commit), committed and
/// clean, and committed with uncommitted changes.
fn fixtures() -> Vec<(&'static str, Store)> {
    let fill = |store: &mut Store| {
        store.insert("w", &ramp(&[3, 20], 0.0)).unwrap();
        let n = ArrayD::from_shape_vec(IxDyn(&[5, 3]), (0..15).collect::<Vec<i32>>()).unwrap();
        store.insert("n", &n).unwrap();
        store
            .insert("s", &ArrayD::from_elem(IxDyn(&[]), 2.5f64))
            .unwrap();
    };
    let empty = small_store();
    let mut uncommitted = small_store();
    fill(&mut uncommitted);
    let mut clean = small_store();
    fill(&mut clean);
    clean.commit("base").unwrap();
    let mut dirty = small_store();
    fill(&mut dirty);
    dirty.commit("base").unwrap();
    dirty
        .update_range::<f32>("w", 30..31, |_, xs| xs[0] = -1.0)
        .unwrap();
    assert!(dirty.is_dirty() && !clean.is_dirty() && uncommitted.is_dirty());
    vec![
        ("empty", empty),
        ("uncommitted", uncommitted),
        ("clean", clean),
        ("dirty", dirty),
    ]
}

fn filled_fixtures() -> Vec<(&'static str, Store)> {
    fixtures()
        .into_iter()
        .filter(|(k, _)| *k != "empty")
        .collect()
}

fn unknown(e: &Error) -> bool {
    matches!(e, Error::UnknownVariable { name } if name == "nope")
}

#[test]
fn unknown_variable_is_refused_by_every_working_call_and_changes_nothing() {
    for (kind, mut store) in fixtures() {
        let g = ramp(&[3, 20], 1.0);
        let mut called = false;
        let s = &mut store;
        refused(s, kind, |s| s.get::<f32>("nope"), unknown);
        refused(s, kind, |s| s.tensor("nope").cloned(), unknown);
        refused(s, kind, |s| s.remove("nope"), unknown);
        refused(
            s,
            kind,
            |s| s.update::<f32>("nope", |_, _| called = true),
            unknown,
        );
        refused(
            s,
            kind,
            |s| s.update_range::<f32>("nope", 0..0, |_, _| called = true),
            unknown,
        );
        refused(
            s,
            kind,
            |s| s.update_map::<f32>("nope", |x| x + 1.0),
            unknown,
        );
        refused(s, kind, |s| s.zip_update("nope", &g, |x, y| x + y), unknown);
        refused(s, kind, |s| s.write("nope", &g), unknown);
        assert!(!called, "{kind}: a closure ran for an unknown variable");
        assert!(!s.contains("nope"));
        let snap = s.working_snapshot();
        assert!(unknown(&snap.get::<f32>("nope").unwrap_err()));
        assert!(unknown(&snap.tensor("nope").unwrap_err()));
    }
}

#[test]
fn removed_variable_is_unknown_afterwards() {
    for (kind, mut store) in filled_fixtures() {
        store.remove("n").unwrap();
        let err = store.get::<i32>("n").unwrap_err();
        assert!(
            matches!(err, Error::UnknownVariable { ref name } if name == "n"),
            "{kind}"
        );
        refused(
            &mut store,
            kind,
            |s| s.remove("n"),
            |e| matches!(e, Error::UnknownVariable { name } if name == "n"),
        );
    }
}

#[test]
fn variable_exists_is_refused_by_insert_and_insert_tensor_and_changes_nothing() {
    for (kind, mut store) in filled_fixtures() {
        let taken = |e: &Error| matches!(e, Error::VariableExists { name } if name == "w");
        let s = &mut store;
        refused(s, kind, |s| s.insert("w", &ramp(&[3, 20], 9.0)), taken);
        refused(s, kind, |s| s.insert("w", &ramp(&[2], 9.0)), taken);
        refused(
            s,
            kind,
            |s| s.insert("w", &ArrayD::<u8>::zeros(IxDyn(&[4]))),
            taken,
        );
        let other = Tensor::from_array(&ramp(&[7], 0.0), CHUNK_BYTES).unwrap();
        refused(s, kind, |s| s.insert_tensor("w", other.clone()), taken);
        let n = s.tensor("n").unwrap().clone();
        refused(s, kind, |s| s.insert_tensor("w", n), taken);
    }
}

#[test]
fn dtype_mismatch_is_refused_by_typed_calls_and_changes_nothing() {
    for (kind, mut store) in filled_fixtures() {
        let f32_not = |found: DType| {
            move |e: &Error| {
                matches!(e, Error::DTypeMismatch { name, expected: DType::F32, found: f }
                    if name == "w" && *f == found)
            }
        };
        let mut called = false;
        let s = &mut store;
        refused(s, kind, |s| s.get::<f64>("w"), f32_not(DType::F64));
        refused(s, kind, |s| s.get::<u32>("w"), f32_not(DType::U32));
        refused(
            s,
            kind,
            |s| s.update::<i32>("w", |_, _| called = true),
            f32_not(DType::I32),
        );
        refused(
            s,
            kind,
            |s| s.update_range::<u8>("w", 0..1, |_, _| called = true),
            f32_not(DType::U8),
        );
        refused(
            s,
            kind,
            |s| s.update_map::<f64>("w", |x| x + 1.0),
            f32_not(DType::F64),
        );
        let g64 = ArrayD::<f64>::zeros(IxDyn(&[3, 20]));
        refused(
            s,
            kind,
            |s| s.zip_update("w", &g64, |x, y| x + y),
            f32_not(DType::F64),
        );
        refused(s, kind, |s| s.write("w", &g64), f32_not(DType::F64));
        let h = ArrayD::from_elem(IxDyn(&[3, 20]), half::f16::ZERO);
        refused(s, kind, |s| s.write("w", &h), f32_not(DType::F16));
        assert!(!called, "{kind}: a closure ran despite the dtype mismatch");

        let i32_not_f32 = |e: &Error| {
            matches!(e, Error::DTypeMismatch { name, expected: DType::I32, found: DType::F32 }
                if name == "n")
        };
        refused(s, kind, |s| s.get::<f32>("n"), i32_not_f32);
        refused(s, kind, |s| s.write("n", &ramp(&[5, 3], 0.0)), i32_not_f32);
        refused(s, kind, |s| s.update_map::<f32>("n", |x| x), i32_not_f32);
    }
}

#[test]
fn dtype_mismatch_is_refused_by_tensor_reads_and_leaves_the_output_untouched() {
    let t = Tensor::from_array(&ramp(&[4, 4], 0.0), CHUNK_BYTES).unwrap();
    let wrong = |e: &Error| {
        matches!(
            e,
            Error::DTypeMismatch {
                expected: DType::F32,
                found: DType::F64,
                ..
            }
        )
    };
    assert!(wrong(&t.to_array::<f64>().unwrap_err()));
    assert!(wrong(&t.chunk_slices::<f64>().err().unwrap()));
    assert!(wrong(&t.row_blocks::<f64>().err().unwrap()));
    let mut out = ArrayD::from_elem(IxDyn(&[4, 4]), 3.0f64);
    assert!(wrong(&t.copy_into(&mut out).unwrap_err()));
    assert!(out.iter().all(|&v| v == 3.0));
    let known = Tensor::from_array(&ramp(&[4, 4], 1.0), CHUNK_BYTES).unwrap();
    for k in [&t, &known] {
        assert!(wrong(&t.copy_changed_into(&mut out, k).unwrap_err()));
        assert!(out.iter().all(|&v| v == 3.0));
    }
    assert_eq!(t.to_array::<f32>().unwrap(), ramp(&[4, 4], 0.0));
}

fn shape_err(found: &'static [usize]) -> impl Fn(&Error) -> bool {
    move |e| {
        matches!(e, Error::ShapeMismatch { name, expected, found: f }
            if name == "w" && expected == &[3, 20] && f == found)
    }
}

#[test]
fn shape_mismatch_is_refused_by_write_and_zip_update_and_changes_nothing() {
    for (kind, mut store) in filled_fixtures() {
        let s = &mut store;
        // Same number of elements, other shape: still refused.
        refused(
            s,
            kind,
            |s| s.write("w", &ramp(&[20, 3], 0.0)),
            shape_err(&[20, 3]),
        );
        refused(
            s,
            kind,
            |s| s.write("w", &ramp(&[60], 0.0)),
            shape_err(&[60]),
        );
        refused(
            s,
            kind,
            |s| s.write("w", &ramp(&[3, 21], 0.0)),
            shape_err(&[3, 21]),
        );
        refused(s, kind, |s| s.write("w", &ramp(&[], 0.0)), shape_err(&[]));
        let transposed = ramp(&[3, 20], 0.0).reversed_axes();
        refused(s, kind, |s| s.write("w", &transposed), shape_err(&[20, 3]));
        refused(
            s,
            kind,
            |s| s.zip_update("w", &ramp(&[20, 3], 0.0), |x, y| x + y),
            shape_err(&[20, 3]),
        );
        refused(
            s,
            kind,
            |s| s.zip_update("w", &ramp(&[3, 19], 0.0), |x, y| x + y),
            shape_err(&[3, 19]),
        );
    }
}

#[test]
fn shape_mismatch_is_refused_by_copy_into_and_leaves_the_output_untouched() {
    let a = ramp(&[3, 20], 0.0);
    let t = Tensor::from_array(&a, CHUNK_BYTES).unwrap();
    let wrong = |e: &Error| {
        matches!(e, Error::ShapeMismatch { expected, found, .. }
            if expected == &[3, 20] && found == &[20, 3])
    };
    let mut out = ArrayD::from_elem(IxDyn(&[20, 3]), -5.0f32);
    assert!(wrong(&t.copy_into(&mut out).unwrap_err()));
    assert!(out.iter().all(|&v| v == -5.0));

    // copy_changed_into refuses the shape whether `known` is the same tensor, another
    // tensor of the same layout, or a tensor of another layout.
    let same_layout = Tensor::from_array(&ramp(&[3, 20], 1.0), CHUNK_BYTES).unwrap();
    let other_layout = Tensor::from_array(&a, 32).unwrap();
    for known in [&t, &same_layout, &other_layout] {
        assert!(wrong(&t.copy_changed_into(&mut out, known).unwrap_err()));
        assert!(out.iter().all(|&v| v == -5.0));
    }
    let mut flat = ArrayD::from_elem(IxDyn(&[60]), -5.0f32);
    assert!(matches!(
        t.copy_into(&mut flat).unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    assert!(flat.iter().all(|&v| v == -5.0));
}

#[test]
fn range_out_of_bounds_is_refused_by_update_range_and_changes_nothing() {
    for (kind, mut store) in filled_fixtures() {
        let bad: [Range<usize>; 5] = [
            Range { start: 0, end: 61 },
            Range { start: 60, end: 61 },
            Range { start: 61, end: 61 },
            Range { start: 5, end: 3 },
            Range {
                start: usize::MAX,
                end: 0,
            },
        ];
        for r in bad {
            let mut called = false;
            let want = r.clone();
            refused(
                &mut store,
                kind,
                |s| s.update_range::<f32>("w", r, |_, _| called = true),
                |e| {
                    matches!(e, Error::RangeOutOfBounds { name, range, len: 60 }
                        if name == "w" && *range == want)
                },
            );
            assert!(!called, "{kind}: closure ran for {want:?}");
        }
        // The scalar has one element: 0..1 is fine, 1..2 is not.
        store
            .update_range::<f64>("s", 0..1, |_, xs| xs[0] = 2.5)
            .unwrap();
        refused(
            &mut store,
            kind,
            |s| s.update_range::<f64>("s", 1..2, |_, _| {}),
            |e| matches!(e, Error::RangeOutOfBounds { len: 1, .. }),
        );
    }
}

#[test]
fn not_row_aligned_is_reported_for_split_rows_and_scalars_without_changes() {
    for (kind, mut store) in filled_fixtures() {
        refused(
            &mut store,
            kind,
            |s| s.tensor("w")?.row_blocks::<f32>().map(|b| b.count()),
            |e| matches!(e, Error::NotRowAligned { row_bytes: 80 }),
        );
        refused(
            &mut store,
            kind,
            |s| s.tensor("s")?.row_blocks::<f64>().map(|b| b.count()),
            |e| matches!(e, Error::NotRowAligned { .. }),
        );
        // Whole rows fit for `n`: row blocks work.
        assert_eq!(
            store
                .tensor("n")
                .unwrap()
                .row_blocks::<i32>()
                .unwrap()
                .count(),
            1
        );
    }
}

#[test]
fn invalid_config_is_refused_by_with_config() {
    let zero = Config {
        chunk_bytes: 0,
        ..Config::default()
    };
    assert!(matches!(
        Store::with_config(zero.clone()).unwrap_err(),
        Error::InvalidConfig { .. }
    ));
    assert!(matches!(
        zero.validate().unwrap_err(),
        Error::InvalidConfig { .. }
    ));
    let keep_none = Config {
        max_versions: Some(0),
        ..Config::default()
    };
    assert!(matches!(
        Store::with_config(keep_none).unwrap_err(),
        Error::InvalidConfig { .. }
    ));
    let keep_one = Config {
        max_versions: Some(1),
        ..Config::default()
    };
    assert!(Store::with_config(keep_one).is_ok());
    assert!(Config::default().validate().is_ok());
}

#[test]
fn chunks_smaller_than_one_element_refuse_the_insert_and_change_nothing() {
    let mut store = Store::with_config(Config {
        chunk_bytes: 2,
        ..Config::default()
    })
    .unwrap();
    // Elements of one or two bytes fit.
    let a16 = ArrayD::from_shape_vec(IxDyn(&[5]), vec![1i16, -2, 3, -4, 5]).unwrap();
    store.insert("h", &a16).unwrap();
    store
        .insert("b", &ArrayD::from_elem(IxDyn(&[3]), 7u8))
        .unwrap();
    assert_eq!(store.tensor("h").unwrap().num_chunks(), 5);
    store.commit("small").unwrap();
    store.update_map::<u8>("b", |x| x + 1).unwrap();
    for kind in ["clean", "dirty"] {
        if kind == "clean" {
            store.discard().unwrap();
        } else {
            store.update_map::<u8>("b", |x| x + 1).unwrap();
        }
        let too_small = |e: &Error| matches!(e, Error::InvalidConfig { .. });
        let f64s = ArrayD::from_elem(IxDyn(&[2]), 1.0f64);
        refused(&mut store, kind, |s| s.insert("d", &f64s), too_small);
        refused(
            &mut store,
            kind,
            |s| s.insert("f", &ramp(&[4], 0.0)),
            too_small,
        );
        let scalar = ArrayD::from_elem(IxDyn(&[]), 1u32);
        refused(&mut store, kind, |s| s.insert("u", &scalar), too_small);
        // An empty tensor of a too-large dtype is refused too: the config, not the data,
        // is wrong.
        let empty = ArrayD::<u64>::zeros(IxDyn(&[0]));
        refused(&mut store, kind, |s| s.insert("e", &empty), too_small);
    }
}

#[test]
fn invalid_chunk_size_is_refused_by_tensor_from_array() {
    let a = ramp(&[4], 0.0);
    for chunk_bytes in [0, 1, 3] {
        let err = Tensor::from_array(&a, chunk_bytes).unwrap_err();
        assert!(
            matches!(err, Error::InvalidConfig { .. }),
            "chunk_bytes {chunk_bytes}: {err:?}"
        );
    }
    let t = Tensor::from_array(&a, 4).unwrap();
    assert_eq!(t.num_chunks(), 4);
    let empty = ArrayD::<f64>::zeros(IxDyn(&[0]));
    assert!(matches!(
        Tensor::from_array(&empty, 0).unwrap_err(),
        Error::InvalidConfig { .. }
    ));
}

#[test]
fn invalid_hash_text_is_refused_by_from_str() {
    let good = ContentHash::of_bytes(b"x").to_string();
    let mut wrong_digit = good.clone();
    wrong_digit.replace_range(10..11, "g");
    let bad = [
        String::new(),
        "zz".into(),
        good[..63].to_owned(),
        format!("{good}0"),
        wrong_digit,
        format!("0x{}", &good[2..]),
        format!(" {}", &good[1..]),
        format!("{}é", &good[..62]),
        "-".repeat(64),
    ];
    for text in bad {
        let err: Error = text.parse::<ContentHash>().unwrap_err().into();
        assert!(
            matches!(err, Error::InvalidHash { text: ref t } if *t == text),
            "{text:?}: {err:?}"
        );
    }
    assert_eq!(
        good.to_uppercase().parse::<ContentHash>().unwrap(),
        good.parse::<ContentHash>().unwrap()
    );
}
