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
//! writer of a background save) runs on a second pool. A parallel loop on the caller's
//! thread (the compare and copy of a `keep()`, the write-back of a revert) then never
//! queues behind theirs: rayon's workers finish the jobs of the loop they are in before
//! they take a job injected from outside, so one shared pool made a 30 MiB revert wait
//! for a whole encoding pass (hundreds of milliseconds) while it needed about 5.

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
        builder
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
