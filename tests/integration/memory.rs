//! Memory held by a long history of sparse changes, and memory freed by pruning.

use ndarray::Array1;
use tensor_history::{Retention, Store, WeakChunk};

const MIB: usize = 1 << 20;

/// 100 commits of a 64 MiB `f32` tensor, each changing one element of a different chunk,
/// hold the tensor once plus one chunk per commit; pruning to the last 5 versions frees
/// every chunk only the dropped versions held.
#[test]
fn sparse_commits_share_unchanged_chunks_and_pruning_frees_the_rest() {
    let mut store = Store::new();
    let chunk_bytes = store.config().chunk_bytes;
    let len = 64 * MIB / 4;
    store.insert("w", &Array1::<f32>::zeros(len)).unwrap();
    let t = store.tensor("w").unwrap();
    let (chunk_elems, num_chunks) = (t.chunk_elems(), t.num_chunks());
    assert!(num_chunks >= 100, "the test needs a chunk per commit");
    // Commit i changes one element of chunk `at(i)`: 100 different chunks.
    let at = |i: usize| i * (num_chunks / 100);
    let mut ids = Vec::new();
    let mut weak_originals: Vec<WeakChunk> = Vec::new();
    for i in 0..100 {
        let pos = at(i) * chunk_elems + i % chunk_elems;
        store
            .update_range::<f32>("w", pos..pos + 1, |_, xs| xs[0] = 1.0 + i as f32)
            .unwrap();
        ids.push(store.commit(&format!("step {i}")).unwrap());
        if i == 0 {
            // Every original chunk is still in version 0 but for the one just changed:
            // watch the originals of the chunks later commits change.
            let snap = store.snapshot(ids[0]).unwrap();
            let t = snap.tensor("w").unwrap();
            weak_originals = (1..100)
                .map(|j| t.chunk(at(j)).unwrap().downgrade())
                .collect();
        }
    }
    let stats = store.stats();
    assert_eq!(stats.versions, 100);
    assert!(
        stats.unique_bytes < 65 * MIB + 100 * chunk_bytes,
        "{} bytes held",
        stats.unique_bytes
    );
    // Exactly: the tensor once, plus the original of each chunk changed after v0.
    assert_eq!(stats.unique_bytes, 64 * MIB + 99 * chunk_bytes);
    assert_eq!(stats.logical_bytes, 100 * 64 * MIB);

    // Watch the chunks changed by the first and the last commit, as the last version
    // holds them.
    let snap = store.snapshot(ids[99]).unwrap();
    let t = snap.tensor("w").unwrap();
    let weak_changed: Vec<WeakChunk> = (0..100)
        .map(|j| t.chunk(at(j)).unwrap().downgrade())
        .collect();
    drop(snap);
    assert!(weak_originals.iter().all(WeakChunk::is_alive));

    let pruned = store.prune(&Retention::keep_last(5)).unwrap();
    assert_eq!(pruned.dropped, ids[..95].to_vec());
    assert_eq!(pruned.kept, 5);
    let stats = store.stats();
    assert_eq!(stats.versions, 5);
    assert_eq!(store.versions(), ids[95..].to_vec());
    // The kept versions 95..=99 hold the tensor once, plus the originals of the chunks
    // versions 96..=99 changed (version 95 still holds them).
    assert_eq!(stats.unique_bytes, 64 * MIB + 4 * chunk_bytes);
    assert!(stats.unique_bytes <= 64 * MIB + 5 * chunk_bytes);
    assert_eq!(pruned.bytes_before, 64 * MIB + 99 * chunk_bytes);
    assert_eq!(pruned.bytes_after, stats.unique_bytes);
    // Originals that only pruned versions held are freed; those of chunks changed by
    // versions 96..=99 are still held by version 95 and later.
    for (j, weak) in (1..100).zip(&weak_originals) {
        assert_eq!(weak.is_alive(), j >= 96, "original of chunk {}", at(j));
    }
    // Every changed chunk is in the last version.
    assert!(weak_changed.iter().all(WeakChunk::is_alive));
    // The freed full-size buffers went to the pool (within its cap), not counted as held;
    // release_pooled returns them to the allocator.
    assert_eq!(stats.pooled_bytes, 95 * chunk_bytes);
    store.release_pooled();
    assert_eq!(store.stats().pooled_bytes, 0);
    assert_eq!(store.stats().unique_bytes, stats.unique_bytes);
    assert_eq!(
        store.get::<f32>("w").unwrap()[at(99) * chunk_elems + 99],
        100.0
    );
}
