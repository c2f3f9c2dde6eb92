//! Pinned properties of the public handles: auto traits, `Copy`, sizes, the text and serde
//! forms of `ContentHash`, and chunk lifetimes.

use std::collections::HashSet;

use crate::common::{ramp, small_store};
use tensor_history::{Chunk, ContentHash, Snapshot, Store, Tensor, VersionId, WeakChunk};

fn assert_send_sync<T: Send + Sync>() {}
fn assert_copy<T: Copy>() {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<Tensor>();
    assert_send_sync::<Snapshot>();
    assert_send_sync::<Store>();
    assert_send_sync::<Chunk>();
    assert_send_sync::<WeakChunk>();
    assert_send_sync::<ContentHash>();
    assert_send_sync::<VersionId>();
    assert_send_sync::<tensor_history::Error>();
    assert_send_sync::<tensor_history::PendingSave>();
}

#[test]
fn ids_and_hashes_are_copy_and_small() {
    assert_copy::<VersionId>();
    assert_copy::<ContentHash>();
    assert_eq!(std::mem::size_of::<VersionId>(), 8);
    assert_eq!(std::mem::size_of::<ContentHash>(), 32);
}

#[test]
fn tensors_and_snapshots_can_be_read_from_other_threads() {
    let mut store = small_store();
    let a = ramp(&[7, 2, 3], 1.0);
    store.insert("x", &a).unwrap();
    let v = store.commit("c").unwrap();
    let snap = store.snapshot(v).unwrap();
    let t = store.tensor("x").unwrap().clone();
    let (from_snap, from_tensor) = std::thread::scope(|s| {
        let h1 = s.spawn(|| snap.get::<f32>("x").unwrap());
        let h2 = s.spawn(move || t.to_array::<f32>().unwrap());
        (h1.join().unwrap(), h2.join().unwrap())
    });
    assert_eq!(from_snap, a);
    assert_eq!(from_tensor, a);
    // The store itself can move to another thread and keep working there.
    let back = std::thread::spawn(move || {
        store.update_map::<f32>("x", |x| x + 1.0).unwrap();
        store
    })
    .join()
    .unwrap();
    assert_eq!(back.get::<f32>("x").unwrap(), a.mapv(|x| x + 1.0));
}

#[test]
fn content_hash_displays_as_64_lower_case_hex_digits_and_parses_back() {
    let h = ContentHash::of_bytes(b"tensor-history");
    let text = h.to_string();
    assert_eq!(text.len(), 64);
    assert!(text
        .chars()
        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    let want: String = h.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(text, want);
    assert_eq!(text.parse::<ContentHash>().unwrap(), h);
    assert_eq!(format!("{h:?}"), format!("ContentHash({text})"));
    assert_eq!(h.as_bytes(), &h.0);
    assert_eq!(h, ContentHash(*blake3::hash(b"tensor-history").as_bytes()));
}

#[test]
fn content_hash_serde_round_trips_as_a_hex_string() {
    let t = Tensor::from_array(&ramp(&[5, 3], 0.0), 64).unwrap();
    let h = t.content_hash();
    let json = serde_json::to_string(&h).unwrap();
    assert_eq!(json, format!("\"{h}\""));
    assert_eq!(serde_json::from_str::<ContentHash>(&json).unwrap(), h);
    let many = vec![h, ContentHash::of_bytes(b""), ContentHash([0xff; 32])];
    let json = serde_json::to_string(&many).unwrap();
    assert_eq!(
        serde_json::from_str::<Vec<ContentHash>>(&json).unwrap(),
        many
    );
    assert!(serde_json::from_str::<ContentHash>("\"abc\"").is_err());
    assert!(serde_json::from_str::<ContentHash>("42").is_err());
}

#[test]
fn content_hashes_order_and_hash_by_their_bytes() {
    let a = ContentHash([0; 32]);
    let mut b_bytes = [0; 32];
    b_bytes[31] = 1;
    let b = ContentHash(b_bytes);
    assert!(a < b);
    let set: HashSet<ContentHash> = [a, b, a].into_iter().collect();
    assert_eq!(set.len(), 2);
}

#[test]
fn version_ids_show_as_v_and_a_number() {
    let mut store = small_store();
    store.insert("x", &ramp(&[1], 0.0)).unwrap();
    let v0 = store.commit("a").unwrap();
    let v1 = store.commit("b").unwrap();
    assert!(v0 < v1);
    assert_eq!(v1.to_string(), format!("v{}", v1.0));
    assert_eq!(v1.to_string().parse::<VersionId>().unwrap(), v1);
}

#[test]
fn weak_chunk_dies_when_the_last_holder_drops() {
    let mut store = small_store();
    store.insert("x", &ramp(&[40], 0.0)).unwrap();
    let v = store.commit("base").unwrap();
    let weak = store.tensor("x").unwrap().chunk(0).unwrap().downgrade();
    let other = store.tensor("x").unwrap().chunk(1).unwrap().downgrade();
    assert!(weak.is_alive());

    // The working state moves off chunk 0; the version and a snapshot still hold it.
    store
        .update_range::<f32>("x", 0..1, |_, xs| xs[0] = -1.0)
        .unwrap();
    let snap = store.snapshot(v).unwrap();
    let held = snap.tensor("x").unwrap().chunk(0).unwrap().clone();
    drop(store);
    assert!(weak.is_alive(), "the snapshot still holds the chunk");
    assert!(other.is_alive());
    drop(snap);
    assert!(weak.is_alive(), "a cloned chunk handle still holds it");
    drop(held);
    assert!(!weak.is_alive(), "the last holder dropped");
    assert!(!other.is_alive(), "the store and snapshot are gone");
}

#[test]
fn overwritten_uncommitted_chunk_is_freed() {
    let mut store = small_store();
    store.insert("x", &ramp(&[40], 0.0)).unwrap();
    let first = store.tensor("x").unwrap().chunk(2).unwrap().downgrade();
    store.commit("c").unwrap();
    store
        .update_range::<f32>("x", 39..40, |_, xs| xs[0] = 5.0)
        .unwrap();
    let written = store.tensor("x").unwrap().chunk(2).unwrap().downgrade();
    assert!(first.is_alive() && written.is_alive());
    store.discard().unwrap();
    assert!(!written.is_alive(), "discarded copy is freed");
    assert!(first.is_alive(), "the committed chunk is kept");
    store.remove("x").unwrap();
    assert!(first.is_alive(), "the version still holds it");
}
