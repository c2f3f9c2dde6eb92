//! Statistics and dirty state that agree with their docs.

use ndarray::{array, Array1, Array2};
use tensor_history::{Config, Store};

fn store() -> Store {
    Store::with_config(Config {
        chunk_bytes: 64,
        ..Config::default()
    })
    .unwrap()
}

#[test]
fn an_identity_update_of_owned_chunks_reports_nothing_changed() {
    let mut s = store();
    s.insert("x", &Array1::from_elem(40, 1.0f32)).unwrap();
    s.commit("a").unwrap();
    s.write("x", &Array1::from_elem(40, 2.0f32)).unwrap(); // every chunk now owned
    let stats = s.update_map::<f32>("x", |x| x).unwrap();
    assert_eq!((stats.chunks_changed, stats.bytes_copied), (0, 0));
    let g = Array1::from_elem(40, 0.0f32);
    let stats = s.zip_update::<f32, _, _>("x", &g, |x, g| x - g).unwrap();
    assert_eq!((stats.chunks_changed, stats.bytes_copied), (0, 0));
    // A change in one owned chunk counts that chunk only.
    s.update::<f32>("x", |off, xs| {
        if off == 16 {
            xs[0] = -1.0;
        }
    })
    .unwrap();
    let stats = s
        .update_map::<f32>("x", |x| if x < 0.0 { 1.0 } else { x })
        .unwrap();
    assert_eq!((stats.chunks_changed, stats.bytes_copied), (1, 0));
}

#[test]
fn reinserting_with_another_chunk_size_is_a_change_to_commit() {
    let mut s = store();
    let a = Array1::from_iter((0..40).map(|i| i as f32));
    s.insert("x", &a).unwrap();
    let v0 = s.commit("a").unwrap();
    let before = s.tensor("x").unwrap().content_hash();
    s.remove("x").unwrap();
    s.insert_chunked("x", &a, 32).unwrap();
    assert_ne!(s.tensor("x").unwrap().content_hash(), before);
    assert!(s.is_dirty());
    assert_eq!(s.diff_working().changed_names(), vec!["x"]);
    assert!(
        s.undo().is_err(),
        "undo must not drop the re-chunking silently"
    );
    let v1 = s.commit("rechunked").unwrap();
    assert!(!s.diff(v0, v1).unwrap().is_empty());
    assert_eq!(s.tensor("x").unwrap().chunk_elems(), 8);
    s.verify().unwrap();
}

#[test]
fn held_bytes_counts_full_pool_buffers_behind_short_chunks() {
    let mut s = store();
    // Rows of 5 f32 (20 bytes): a chunk holds 3 rows, 60 of its 64 bytes.
    s.insert("x", &Array2::from_elem((6, 5), 1.0f32)).unwrap();
    s.commit("a").unwrap();
    s.update_map::<f32>("x", |x| x + 1.0).unwrap();
    let stats = s.stats();
    assert_eq!(stats.unique_bytes, 2 * 6 * 5 * 4);
    assert!(stats.held_bytes >= stats.unique_bytes);
    // Each of the four 60-byte chunks (two inserted, two copied) has a 64-byte buffer.
    assert_eq!(stats.held_bytes, 4 * 64);
    let mut tiny = store();
    tiny.insert("b", &array![1u8, 2, 3]).unwrap();
    let st = tiny.stats();
    assert_eq!((st.unique_bytes, st.held_bytes), (3, 8));
}
