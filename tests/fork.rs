//! A forked child process does parallel work after its parent did: the crate's thread
//! pool does not survive `fork()`, so the child must get a pool of its own (a pool whose
//! workers stayed in the parent would make the child wait forever).
#![cfg(unix)]

use std::time::{Duration, Instant};

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

/// Fork; the child runs `child` and exits 0 if it returns true. The parent waits up to
/// 60 s and returns the child's exit status (`None`: it hung and was killed).
#[allow(unsafe_code)]
fn in_child(child: impl FnOnce() -> bool) -> Option<i32> {
    // SAFETY: the child only runs `child` and `_exit`s; the test is alone in this binary.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: ends the child without running the parent's destructors or test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut status = 0;
    loop {
        // SAFETY: plain system calls on the child's pid.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if Instant::now() > deadline {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
        ok &= in_child(|| s.verify().is_ok()) == Some(0);
        ok
    });
    assert_eq!(status, Some(0), "the forked child hung (None) or failed");
}
