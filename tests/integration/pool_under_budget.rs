//! The buffer pool under a memory budget: the raw buffers an encoding pass frees refill
//! the pool up to one working state, so the next dense commit copies into mapped memory.

use ndarray::Array1;
use tensor_history::{Config, Store, DEFAULT_CHUNK_BYTES};

const CHUNKS: usize = 4;

fn store_with_dense_history(versions: usize) -> Store {
    let mut s = Store::with_config(Config {
        memory_budget: Some(0),
        ..Config::default()
    })
    .unwrap();
    let n = CHUNKS * DEFAULT_CHUNK_BYTES / 4;
    s.insert("w", &Array1::from_shape_fn(n, |i| (i as f32 * 0.01).sin()))
        .unwrap();
    // Each version tagged: a budget of 0 lets every version go that no ref holds.
    let v = s.commit("0").unwrap();
    s.tag("t0", v).unwrap();
    for step in 1..versions {
        s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
        let v = s.commit(&step.to_string()).unwrap();
        s.tag(&format!("t{step}"), v).unwrap();
    }
    s
}

#[test]
fn an_encoding_pass_leaves_one_working_state_of_buffers_in_the_pool() {
    let mut s = store_with_dense_history(6);
    s.enforce_memory_budget();
    let st = s.stats();
    assert!(st.encoded_bytes > 0, "nothing was encoded: {st:?}");
    // Five older versions of four chunks were encoded: twenty buffers freed, four kept.
    assert_eq!(s.pooled_bytes(), CHUNKS * DEFAULT_CHUNK_BYTES, "{st:?}");
    // The next dense change copies into the pooled buffers.
    let before = s.get::<f32>("w").unwrap();
    s.update_map::<f32>("w", |x| x * (1.0 + 1e-6)).unwrap();
    assert_eq!(s.pooled_bytes(), 0);
    let v = s.commit("next").unwrap();
    let after = s.get::<f32>("w").unwrap();
    assert!(before
        .iter()
        .zip(after.iter())
        .any(|(a, b)| a.to_bits() != b.to_bits()));
    s.verify().unwrap();
    assert_eq!(s.snapshot(v).unwrap().get::<f32>("w").unwrap(), after);
}

#[test]
fn without_a_budget_the_pool_stays_empty_while_every_version_is_held() {
    let mut s = Store::new();
    let n = CHUNKS * DEFAULT_CHUNK_BYTES / 4;
    s.insert("w", &Array1::from_shape_fn(n, |i| i as f32))
        .unwrap();
    s.commit("0").unwrap();
    for step in 1..4 {
        s.update_map::<f32>("w", |x| x + 1.0).unwrap();
        s.commit(&step.to_string()).unwrap();
    }
    s.enforce_memory_budget();
    assert_eq!(s.pooled_bytes(), 0);
}
