//! A forked child process does parallel work after its parent did: the crate's thread
//! pool does not survive `fork()`, so the child must get a pool of its own (a pool whose
//! workers stayed in the parent would make the child wait forever).
#![cfg(unix)]

use crate::common::{in_child, Ended};

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Config, Store};

/// A store of 64 chunks of 64 KiB, committed: `verify` hashes them in parallel.
fn store() -> Store {
    let mut s = Store::with_config(Config {
        chunk_bytes: 64 << 10,
        ..Config::default()
    })
    .unwrap();
    let n = 64 * (64 << 10) / 4;
    let a = ArrayD::from_shape_vec(IxDyn(&[n]), (0..n).map(|i| i as f32).collect()).unwrap();
    s.insert("w", &a.view()).unwrap();
    s.commit("init").unwrap();
    s
}

#[test]
fn forked_child_finishes_parallel_work_after_the_parent_used_the_pool() {
    let mut s = store();
    s.verify().unwrap();
    let status = in_child(move || {
        let mut ok = s.verify().is_ok();
        // A dense write of every chunk (parallel above the size threshold), then a
        // second generation: a grandchild forked from the child.
        let n = s.tensor("w").unwrap().len();
        let b = ArrayD::from_shape_vec(IxDyn(&[n]), vec![1.0f32; n]).unwrap();
        ok &= s.write("w", &b.view()).is_ok();
        ok &= s.commit("in child").is_ok();
        ok &= in_child(|| s.verify().is_ok()) == Ended::Exited(0);
        ok
    });
    assert_eq!(status, Ended::Exited(0), "the forked child hung or failed");
}
