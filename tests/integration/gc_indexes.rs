//! gc merges index files: every save writes one, and opening a repository reads them all
//! (one request each on object storage), so a run that finds more than
//! `MERGE_INDEXES_ABOVE` replaces them with one listing what they listed, whatever its
//! grace period.

use std::sync::Arc;

use tensor_history::{Backend, Config, GcOptions, MemoryBackend, Store, MERGE_INDEXES_ABOVE};

use crate::common::{ramp, CHUNK_BYTES};

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

fn index_files(b: &dyn Backend) -> usize {
    b.list("index/").unwrap().len()
}

/// A repository of `saves` saves, each changing one element of `w` (version `i` holds
/// `-(i as f32)` at element `i`), one index file each.
fn saved_many_times(b: &Arc<dyn Backend>, saves: usize) -> Store {
    let mut s = Store::open_backend(b.clone(), config()).unwrap();
    s.insert("w", &ramp(&[400], 0.5)).unwrap();
    for i in 0..saves {
        s.update::<f32>("w", |_, xs| xs[i] = -(i as f32)).unwrap();
        s.commit(&format!("v{i}")).unwrap();
        s.save().unwrap();
    }
    s
}

fn check_versions(s: &Store, saves: usize) {
    s.verify().unwrap();
    let log = s.log(s.head().unwrap()).unwrap();
    assert_eq!(log.len(), saves);
    for (i, v) in log.iter().rev().enumerate() {
        let w = s.snapshot(*v).unwrap().get::<f32>("w").unwrap();
        for j in 0..saves {
            let want = if j <= i {
                -(j as f32)
            } else {
                ramp(&[400], 0.5)[[j]]
            };
            assert_eq!(w[[j]].to_bits(), want.to_bits(), "v{i}[{j}]");
        }
    }
}

#[test]
fn a_gc_merges_many_index_files_into_one_even_with_its_grace_period() {
    let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let saves = MERGE_INDEXES_ABOVE + 4;
    let mut s = saved_many_times(&b, saves);
    assert_eq!(index_files(&*b), saves);
    // A store that read the old index files before the merge.
    let mut early = Store::open_backend(b.clone(), config()).unwrap();

    let stats = s.gc().unwrap();
    assert_eq!(stats.indexes_merged, saves, "{stats:?}");
    assert_eq!(
        stats.objects_deleted, saves,
        "only the merged indexes: {stats:?}"
    );
    assert_eq!(index_files(&*b), 1);
    check_versions(&s, saves);
    check_versions(&Store::open_backend(b.clone(), config()).unwrap(), saves);

    // The early store reads every version, then takes in a save made after the merge.
    check_versions(&early, saves);
    s.update::<f32>("w", |_, xs| xs[saves] = -(saves as f32))
        .unwrap();
    s.commit("after").unwrap();
    s.save().unwrap();
    early.refresh().unwrap();
    check_versions(&early, saves + 1);

    // Below the threshold, a run leaves the index files alone.
    let again = s.gc().unwrap();
    assert_eq!(again.indexes_merged, 0, "{again:?}");
    assert_eq!(index_files(&*b), 2);
}

#[test]
fn a_dry_run_counts_the_merge_and_writes_nothing() {
    let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let saves = MERGE_INDEXES_ABOVE + 1;
    let mut s = saved_many_times(&b, saves);
    let mut dry = GcOptions::default();
    dry.dry_run = true;
    let before = b.list("").unwrap();
    let stats = s.gc_with(&dry).unwrap();
    assert_eq!(stats.indexes_merged, saves, "{stats:?}");
    let after = b.list("").unwrap();
    assert_eq!(
        before.iter().map(|o| &o.key).collect::<Vec<_>>(),
        after.iter().map(|o| &o.key).collect::<Vec<_>>()
    );
}
