//! A process forked while a background save runs: the writer thread stays in the
//! parent, so the child's copy of the store must not wait for it (Python's `os.fork()`,
//! `multiprocessing` and PyTorch's `DataLoader` workers fork training processes).
#![cfg(unix)]

use crate::common::{in_child, Ended};

use std::sync::Arc;
use std::time::{Duration, Instant};

use ndarray::{ArrayD, IxDyn};
use tensor_history::{Backend, Config, Error, MemoryBackend, Store};

#[test]
fn a_forked_child_neither_waits_for_nor_uses_the_parents_background_save() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = Store::with_config(Config {
        chunk_bytes: 64 << 10,
        ..Config::default()
    })
    .unwrap();
    s.save_to(backend.clone()).unwrap();
    // 32 MiB: the writer is still at work when the process forks.
    let n = 8 << 20;
    let a = ArrayD::from_shape_vec(IxDyn(&[n]), (0..n).map(|i| i as f32).collect()).unwrap();
    s.insert("w", &a.view()).unwrap();
    s.commit("big").unwrap();
    let pending = s.save_in_background().unwrap();
    let status = in_child(|| {
        // Neither the pending save nor the store's next save waits for the writer.
        let started = Instant::now();
        let waited = matches!(pending.wait(), Err(Error::InvalidArgument { .. }));
        let saved = matches!(s.save(), Err(Error::InvalidArgument { .. }));
        // The store works on in memory; it has no repository any more.
        let committed = s.commit("in child").is_ok() && s.location().is_none();
        drop(s);
        waited && saved && committed && started.elapsed() < Duration::from_secs(30)
    });
    assert_eq!(status, Ended::Exited(0), "the forked child hung or failed");
}

#[test]
fn the_parent_saves_as_usual_after_a_fork() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let mut s = Store::new();
    s.save_to(backend.clone()).unwrap();
    let a = ArrayD::from_shape_vec(IxDyn(&[1 << 20]), vec![2.0f32; 1 << 20]).unwrap();
    s.insert("w", &a.view()).unwrap();
    s.commit("c").unwrap();
    let pending = s.save_in_background().unwrap();
    assert_eq!(in_child(|| true), Ended::Exited(0));
    assert_eq!(pending.wait().unwrap().versions_written, 1);
    let r = Store::open_backend(backend, Config::default()).unwrap();
    assert_eq!(r.versions().len(), 1);
}
