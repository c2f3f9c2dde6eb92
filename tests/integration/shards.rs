//! Sharded tensors (variables `<name>@<offsets>`, as the DCP storage layer stores a
//! shard) assembled into whole ones by `Snapshot::whole_tensors`: against the whole
//! tensor cut by a random grid (model-based), through a repository and a safetensors
//! export, and typed errors for shards that do not make one tensor.

use half::bf16;
use ndarray::{ArrayD, IxDyn, SliceInfoElem};
use proptest::prelude::*;
use tensor_history::{Config, Error, Store, DCP_METADATA};

fn config() -> Config {
    Config {
        chunk_bytes: 64,
        ..Config::default()
    }
}

/// The slice of `whole` at `offsets` of `sizes`, as an owned array.
fn cut<T: Clone>(whole: &ArrayD<T>, offsets: &[usize], sizes: &[usize]) -> ArrayD<T> {
    let info: Vec<SliceInfoElem> = offsets
        .iter()
        .zip(sizes)
        .map(|(&o, &n)| SliceInfoElem::Slice {
            start: o as isize,
            end: Some((o + n) as isize),
            step: 1,
        })
        .collect();
    whole.slice(info.as_slice()).to_owned()
}

fn shard_name(name: &str, offsets: &[usize]) -> String {
    let o: Vec<String> = offsets.iter().map(ToString::to_string).collect();
    format!("{name}@{}", o.join(","))
}

/// Every cell of the grid that `cuts` (the split points of each axis) makes of `shape`:
/// (offsets, sizes).
fn grid(shape: &[usize], cuts: &[Vec<usize>]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut cells = vec![(vec![], vec![])];
    for (d, &n) in shape.iter().enumerate() {
        let mut points: Vec<usize> = cuts[d].iter().map(|c| c % (n + 1)).collect();
        points.push(0);
        points.push(n);
        points.sort_unstable();
        points.dedup();
        let mut next = Vec::new();
        for (o, s) in &cells {
            for w in points.windows(2) {
                let (mut o, mut s): (Vec<usize>, Vec<usize>) = (o.clone(), s.clone());
                o.push(w[0]);
                s.push(w[1] - w[0]);
                next.push((o, s));
            }
        }
        cells = next;
    }
    cells
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn shards_of_any_grid_assemble_into_the_whole(
        shape in prop::collection::vec(1usize..7, 1..4),
        cuts in prop::collection::vec(prop::collection::vec(0usize..8, 0..3), 3),
        saved in any::<bool>(),
    ) {
        let n: usize = shape.iter().product();
        let whole = ArrayD::from_shape_vec(IxDyn(&shape), (0..n).map(|i| i as f32 * 0.5 - 3.0).collect()).unwrap();
        let mut s = Store::with_config(config()).unwrap();
        for (o, sz) in grid(&shape, &cuts) {
            s.insert(&shard_name("w", &o), &cut(&whole, &o, &sz)).unwrap();
        }
        s.insert("plain", &whole).unwrap();
        let v = s.commit("sharded").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let snap = if saved {
            s.save_as(dir.path()).unwrap();
            Store::open(dir.path()).unwrap().snapshot(v).unwrap()
        } else {
            s.snapshot(v).unwrap()
        };
        let got = snap.whole_tensors().unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        prop_assert_eq!(names, vec!["plain", "w"]);
        for (_, t) in &got {
            prop_assert_eq!(t.to_array::<f32>().unwrap(), whole.clone());
        }
    }
}

#[test]
fn a_dcp_version_exports_whole_tensors_of_every_dtype_and_leaves_the_metadata_out() {
    let mut s = Store::with_config(config()).unwrap();
    let w = ArrayD::from_shape_fn(IxDyn(&[6, 10]), |ix| (ix[0] * 10 + ix[1]) as f32);
    for (o, sz) in [([0, 0], [3, 4]), ([0, 4], [3, 6]), ([3, 0], [3, 10])] {
        s.insert(&shard_name("layer.weight", &o), &cut(&w, &o, &sz))
            .unwrap();
    }
    let b = ArrayD::from_shape_fn(IxDyn(&[9]), |ix| bf16::from_f32(ix[0] as f32 - 4.0));
    s.insert("layer.bias@0", &cut(&b, &[0], &[5])).unwrap();
    s.insert("layer.bias@5", &cut(&b, &[5], &[4])).unwrap();
    // A dtype kept as raw bytes: one more axis (the element's 2 bytes), covered whole.
    let raw = ArrayD::from_shape_fn(IxDyn(&[4, 2]), |ix| (ix[0] * 2 + ix[1]) as u8);
    s.insert("mask@0", &cut(&raw, &[0, 0], &[1, 2])).unwrap();
    s.insert("mask@1", &cut(&raw, &[1, 0], &[3, 2])).unwrap();
    s.insert("step", &ArrayD::from_elem(IxDyn(&[]), 7i64))
        .unwrap();
    s.insert(DCP_METADATA, &ArrayD::from_elem(IxDyn(&[5]), 1u8))
        .unwrap();
    let v = s.commit("dcp").unwrap();
    let snap = s.snapshot(v).unwrap();
    assert!(snap.is_dcp());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("whole.safetensors");
    snap.write_whole_safetensors(&file).unwrap();
    let mut back = Store::new();
    let names = back.import_safetensors(&file).unwrap();
    assert_eq!(names, ["layer.bias", "layer.weight", "mask", "step"]);
    assert_eq!(back.get::<f32>("layer.weight").unwrap(), w);
    assert_eq!(back.get::<bf16>("layer.bias").unwrap(), b);
    assert_eq!(back.get::<u8>("mask").unwrap(), raw);
    assert_eq!(back.get::<i64>("step").unwrap()[[]], 7);
}

/// The error of assembling a snapshot of `shards` (name, f32 array of that shape).
fn assemble_err(shards: &[(&str, &[usize])]) -> Error {
    let mut s = Store::new();
    for (name, shape) in shards {
        s.insert(name, &ArrayD::<f32>::zeros(IxDyn(shape))).unwrap();
    }
    let v = s.commit("bad").unwrap();
    s.snapshot(v).unwrap().whole_tensors().unwrap_err()
}

#[test]
fn shards_that_do_not_make_one_tensor_are_a_typed_error() {
    for (why, shards) in [
        (
            "overlap",
            vec![("w@0,0", &[2usize, 2][..]), ("w@1,0", &[2, 2])],
        ),
        ("gap", vec![("w@0", &[2][..]), ("w@3", &[2])]),
        ("ranks", vec![("w@0", &[2][..]), ("w@2", &[2, 1])]),
        ("offsets", vec![("w@0,0,0", &[2][..])]),
        ("name clash", vec![("w@0", &[2][..]), ("w", &[2])]),
        ("overflow", vec![("w@18446744073709551615", &[2][..])]),
    ] {
        let err = assemble_err(&shards);
        assert!(
            matches!(&err, Error::InvalidArgument { reason } if reason.contains("`w`")),
            "{why}: {err:?}"
        );
    }
    // Shards of different dtypes.
    let mut s = Store::new();
    s.insert("w@0", &ArrayD::<f32>::zeros(IxDyn(&[2]))).unwrap();
    s.insert("w@2", &ArrayD::<f64>::zeros(IxDyn(&[2]))).unwrap();
    let v = s.commit("dtypes").unwrap();
    assert!(matches!(
        s.snapshot(v).unwrap().whole_tensors(),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn names_with_an_at_sign_that_are_not_shards_stay_as_they_are() {
    let mut s = Store::new();
    for name in ["user@host", "w@", "x@1,a"] {
        s.insert(name, &ArrayD::<f32>::ones(IxDyn(&[2]))).unwrap();
    }
    let v = s.commit("plain").unwrap();
    let got = s.snapshot(v).unwrap().whole_tensors().unwrap();
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["user@host", "w@", "x@1,a"]);
}

#[test]
fn write_safetensors_refuses_a_name_given_twice_and_writes_nothing() {
    let mut s = Store::new();
    s.insert("a", &ArrayD::<f32>::ones(IxDyn(&[2]))).unwrap();
    s.insert("b", &ArrayD::<f64>::ones(IxDyn(&[2]))).unwrap();
    let (a, b) = (s.tensor("a").unwrap(), s.tensor("b").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.safetensors");
    let err = tensor_history::write_safetensors([("w", a), ("w", b)], &file).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument { reason } if reason.contains("`w`")));
    assert!(!file.exists());
    tensor_history::write_safetensors([("w", a), ("v", b)], &file).unwrap();
    let mut back = Store::new();
    assert_eq!(back.import_safetensors(&file).unwrap(), ["v", "w"]);
}
