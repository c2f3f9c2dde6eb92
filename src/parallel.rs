//! The thread pool of the crate's parallel work, safe across `fork()`.
//!
//! Every parallel loop of the crate runs inside [`install`], on a pool of its own rather
//! than rayon's global pool. A forked child has only the thread that called `fork()`: a
//! pool built before the fork has no workers there, and rayon's global pool cannot be
//! rebuilt, so a child's first parallel loop on it would wait forever (Python's
//! `os.fork()` and `multiprocessing` fork pools, the way PyTorch's `DataLoader` workers
//! start on Linux). The pool here remembers the id of the process that built it; a call
//! from another process builds a new pool for that process (the old one is left alone:
//! its threads do not exist there).
//!
//! Work of the crate's own background threads (the memory budget's encoding pass, the
//! writer of a background save) runs on a second pool, of one thread fewer than the
//! machine has cores (at least one), so that it leaves a core to the caller's thread.
//! A parallel loop on the caller's thread (the compare and copy of a `keep()`, the
//! write-back of a revert) then never queues behind theirs: rayon's workers finish the
//! jobs of the loop they are in before they take a job injected from outside, so one
//! shared pool made a 30 MiB revert wait for a whole encoding pass (hundreds of
//! milliseconds) while it needed about 5.

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, Ordering};

use rayon::{ThreadPool, ThreadPoolBuilder};

/// A pool and the process that built it. Leaked on purpose: a forked child must not drop
/// its parent's pool, and a process builds one pool per generation of forks.
struct Pool {
    pid: u32,
    pool: ThreadPool,
}

static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

/// The pool of background work (see the module docs), built the same way.
static BACKGROUND_POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// Whether this thread does background work: set by [`background`] on the crate's
    /// background threads and on the background pool's workers.
    static BACKGROUND: Cell<bool> = const { Cell::new(false) };
}

/// Mark the calling thread as one of the crate's background threads for the rest of its
/// life: its parallel loops (and those nested in them) run on the background pool.
pub(crate) fn background() {
    BACKGROUND.with(|b| b.set(true));
}

/// The pool of the current process for foreground (`false`) or background (`true`)
/// work, built on first use (`None` if no thread could be started).
fn pool(background: bool) -> Option<&'static ThreadPool> {
    let slot = if background { &BACKGROUND_POOL } else { &POOL };
    let pid = std::process::id();
    let cur = slot.load(Ordering::Acquire);
    // SAFETY: a non-null pointer in `POOL` comes from `Box::leak` below and is never
    // freed, so it is valid for the rest of the process (and of any forked child).
    #[allow(unsafe_code)]
    if let Some(p) = unsafe { cur.as_ref() } {
        if p.pid == pid {
            return Some(&p.pool);
        }
    }
    let builder = ThreadPoolBuilder::new();
    let builder = if background {
        // One core fewer than the machine has (at least one thread): background work
        // (the budget's encoding, a background save) leaves a core to the thread that
        // trains, instead of taking turns with it on every core.
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        builder
            .num_threads(cores.saturating_sub(1).max(1))
            .thread_name(|i| format!("tensor-history-bg-{i}"))
            .start_handler(|_| self::background())
    } else {
        builder.thread_name(|i| format!("tensor-history-{i}"))
    };
    let pool = builder.build().ok()?;
    let new: &'static mut Pool = Box::leak(Box::new(Pool { pid, pool }));
    match slot.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(&new.pool),
        Err(other) => {
            // Another thread of this process installed its pool first: use that one.
            // SAFETY: `new` was leaked above and never published, so this is its only
            // reference; `other` is a published, never-freed pool (see above).
            #[allow(unsafe_code)]
            unsafe {
                drop(Box::from_raw(new as *mut Pool));
                match other.as_ref() {
                    Some(p) if p.pid == pid => Some(&p.pool),
                    _ => None,
                }
            }
        }
    }
}

/// Run `f` on the crate's thread pool: rayon parallel iterators inside `f` use that pool,
/// never rayon's global one (on a background thread of the crate, the background pool:
/// see the module docs). After a `fork()`, the child gets a pool of its own. (If the
/// operating system refuses to start threads, `f` runs on the calling thread with rayon's
/// defaults.)
pub fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    match pool(BACKGROUND.with(Cell::get)) {
        Some(p) => p.install(f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rayon::prelude::*;

    use super::*;

    /// A parallel loop on the caller's thread finishes while a background loop holds
    /// every worker of its pool: the background loop's jobs wait for the foreground one
    /// to end (up to a deadline), so on one shared pool the foreground job would sit
    /// behind them until the deadline.
    #[test]
    fn a_foreground_loop_does_not_wait_for_background_work() {
        let fg_done = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs(30);
        let (d, s) = (Arc::clone(&fg_done), Arc::clone(&started));
        let bg = std::thread::spawn(move || {
            background();
            install(|| {
                (0..64).into_par_iter().with_min_len(1).for_each(|_| {
                    s.fetch_add(1, Ordering::SeqCst);
                    while !d.load(Ordering::SeqCst) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
            });
        });
        while started.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let sum: u64 = install(|| {
            (0..1000u32)
                .into_par_iter()
                .with_min_len(1)
                .map(u64::from)
                .sum()
        });
        let in_time = Instant::now() < deadline;
        fg_done.store(true, Ordering::SeqCst);
        bg.join().unwrap();
        assert_eq!(sum, 499_500);
        assert!(
            in_time,
            "the foreground loop waited for the background loop's jobs"
        );
    }
}
