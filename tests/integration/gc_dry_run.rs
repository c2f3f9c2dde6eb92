//! `GcOptions::dry_run`: a dry run writes and deletes nothing, and reports what a real
//! run with the same options then deletes.

use std::path::Path;

use ndarray::Array1;
use tensor_history::{GcOptions, Retention, Store};

fn files(dir: &Path) -> Vec<(String, u64)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, u64)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let len = p.metadata().unwrap().len();
                out.push((p.strip_prefix(root).unwrap().display().to_string(), len));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A repository with ten versions of a 64 KiB tensor, each rewriting all of it, pruned
/// down to the last one (so most packs are dead).
fn pruned_repo(dir: &Path) -> Store {
    let mut store = Store::new();
    store.insert("w", &Array1::<f32>::zeros(16 * 1024)).unwrap();
    for i in 0..10 {
        store.update_map::<f32>("w", |x| x + 1.0).unwrap();
        store.commit(&format!("step {i}")).unwrap();
        store.save_as(dir).unwrap_or_else(|_| store.save().unwrap());
    }
    store.prune(&Retention::keep_last(1)).unwrap();
    store.save().unwrap();
    store
}

fn options(grace_zero: bool, dry_run: bool) -> GcOptions {
    let mut o = if grace_zero {
        GcOptions::immediate()
    } else {
        GcOptions::default()
    };
    o.dry_run = dry_run;
    o
}

#[test]
fn dry_run_changes_no_file_and_predicts_an_immediate_gc() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut store = pruned_repo(dir.path());
    let before = files(dir.path());
    let dry = store.gc_with(&options(true, true)).unwrap();
    assert_eq!(
        files(dir.path()),
        before,
        "a dry run writes and deletes nothing"
    );
    assert!(dry.objects_deleted > 0, "{dry:?}");
    let real = store.gc_with(&options(true, false)).unwrap();
    assert_eq!(dry.objects_deleted, real.objects_deleted);
    assert_eq!(dry.bytes_deleted, real.bytes_deleted);
    assert_eq!(dry.versions_live, real.versions_live);
    assert_eq!(dry.chunks_live, real.chunks_live);
    store.verify().unwrap();
}

#[test]
fn dry_run_with_a_grace_period_deletes_nothing_new() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut store = pruned_repo(dir.path());
    let before = files(dir.path());
    let dry = store.gc_with(&options(false, true)).unwrap();
    assert_eq!(files(dir.path()), before);
    // Nothing was recorded an hour ago: the only files a run deletes are the index files
    // it merges into one (the repository has more than MERGE_INDEXES_ABOVE).
    assert_eq!(dry.objects_deleted, dry.indexes_merged, "{dry:?}");
    assert!(dry.candidates_recorded > 0, "{dry:?}");
    let real = store.gc_with(&options(false, false)).unwrap();
    assert_eq!(real.objects_deleted, real.indexes_merged, "{real:?}");
    assert_eq!(real.indexes_merged, dry.indexes_merged);
    assert_eq!(real.candidates_recorded, dry.candidates_recorded);
    store.verify().unwrap();
}
