//! `Store::save_in_background`: the save protocol on a writer thread of its own, while
//! the store stays usable.
//!
//! The caller's thread captures what the save writes: a copy of the history (versions,
//! refs, HEAD; O(versions), every chunk shared, no tensor data copied) and the store's
//! [`RepoLink`], which moves to the writer thread. The store keeps what reads need
//! without the link: stored chunks reach their bytes through the shared chunk index,
//! and the store keeps its location, its backend and the content addresses of the
//! versions saved before. The writer runs the same protocol as `save` (hashing,
//! packs and manifests, index, versions, barrier, refs, HEAD) on the copy and hands back,
//! through a shared slot, the link, the versions the save forgot (collected by another
//! process's gc) and whether it succeeded. The store takes them back at the next call
//! that needs the link (or at a commit, if the save is finished by then), and then lets
//! the saved versions' chunks go from the heap as a save does.
//!
//! The copy holds every chunk of the versions it captured, so a version pruned by the
//! store meanwhile stays readable to the writer until the save ends (then its memory
//! is freed).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::backend::Backend;
use super::format::version_key;
use super::save::{save_into, SaveStats};
use super::RepoLink;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::History;
use crate::store::Store;
use crate::version::VersionId;

/// What a finished writer hands back to the store.
struct Finished {
    link: Box<RepoLink>,
    /// Versions the save forgot in its copy of the history (another process pruned
    /// them and a gc collected them).
    forgotten: Vec<VersionId>,
    /// Whether the save succeeded: the store then lets the chunks of the versions it
    /// saved go from the heap (those the working state does not hold).
    evict: bool,
}

/// The state a writer thread and its waiters share.
#[derive(Default)]
struct SlotState {
    /// Taken by the store when it takes the link back.
    finished: Option<Finished>,
    /// The save's outcome, set with `finished`; never taken (a waiter gets a clone).
    outcome: Option<Result<SaveStats>>,
    /// Whether the outcome reached a caller (through `wait`, or a failure through a
    /// later call of the store).
    reported: bool,
}

/// A background save's shared slot.
struct Slot {
    /// The process that started the writer: in a forked child the writer thread does
    /// not exist, and the slot (whose lock it may have held at the fork) is not touched.
    pid: u32,
    state: Mutex<SlotState>,
    done: Condvar,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            pid: std::process::id(),
            state: Mutex::new(SlotState::default()),
            done: Condvar::new(),
        }
    }

    /// A slot holding a failure that no writer produced (a save lost in a fork).
    fn failed(e: Error) -> Slot {
        let slot = Slot::new();
        slot.lock().outcome = Some(Err(e));
        slot
    }

    fn in_this_process(&self) -> bool {
        self.pid == std::process::id()
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Block until the writer has filled the slot.
    fn wait_done(&self) -> MutexGuard<'_, SlotState> {
        let mut g = self.lock();
        while g.outcome.is_none() {
            g = self.done.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g
    }

    fn fill(&self, finished: Finished, outcome: Result<SaveStats>) {
        let mut g = self.lock();
        g.finished = Some(finished);
        g.outcome = Some(outcome);
        drop(g);
        self.done.notify_all();
    }
}

/// The error of a background save whose writer thread stayed in the parent process.
fn lost_in_fork(location: &str) -> Error {
    Error::InvalidArgument {
        reason: format!(
            "a background save to `{location}` was running when this process was forked; \
             its writer thread stayed in the parent, so this copy of the store has no \
             repository: open the repository again, or use save_as"
        ),
    }
}

/// A save running on a writer thread, returned by
/// [`Store::save_in_background`](crate::Store::save_in_background).
///
/// Dropping it does not stop the save, and does not lose its error: if nobody called
/// [`wait`](PendingSave::wait), the store's next [`save`](crate::Store::save),
/// [`save_in_background`](crate::Store::save_in_background),
/// [`save_as`](crate::Store::save_as), [`refresh`](crate::Store::refresh) or
/// [`close`](crate::Store::close) returns it.
#[must_use = "a background save's outcome comes from wait() (or from the store's next save)"]
pub struct PendingSave {
    slot: Arc<Slot>,
    location: String,
}

impl fmt::Debug for PendingSave {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingSave")
            .field("location", &self.location)
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl PendingSave {
    /// Block until the save ended; its [`SaveStats`], or its error. The store may go on
    /// being used meanwhile (from the thread that owns it). O(1) after the save ended.
    ///
    /// # Errors
    ///
    /// As for [`Store::save`](crate::Store::save). In a process forked while the save
    /// ran, [`Error::InvalidArgument`] at once (the writer thread is in the parent).
    pub fn wait(self) -> Result<SaveStats> {
        if !self.slot.in_this_process() {
            return Err(lost_in_fork(&self.location));
        }
        let mut g = self.slot.wait_done();
        g.reported = true;
        g.outcome
            .clone()
            .expect("a finished slot holds its outcome")
    }

    /// Whether the save ended (successfully or not): [`wait`](PendingSave::wait) then
    /// returns at once. O(1). In a process forked while the save ran: `true`.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        !self.slot.in_this_process() || self.slot.lock().outcome.is_some()
    }
}

/// A save in flight, as the store sees it.
pub(crate) struct InFlight {
    slot: Arc<Slot>,
    /// What reads need while the link is with the writer.
    pub(crate) location: String,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) saved: HashMap<VersionId, ContentHash>,
    /// The versions the store held unsaved when the save started (the save writes those
    /// a ref or HEAD reaches): the memory budget leaves them raw, since the save stores
    /// them and its end evicts them, rather than encode them twice.
    pub(crate) captured: HashSet<VersionId>,
}

impl InFlight {
    /// The content addresses of the saved versions once this save is done: waits for
    /// the writer (in this process) and takes what it saved, which may name parents
    /// that the store pruned since the save captured its history. O(saved versions).
    pub(crate) fn saved_when_done(&self) -> HashMap<VersionId, ContentHash> {
        if self.slot.in_this_process() {
            if let Some(f) = &self.slot.wait_done().finished {
                return f.link.saved.clone();
            }
        }
        self.saved.clone()
    }
}

/// A store's background save state.
#[derive(Default)]
pub(crate) struct Background {
    pub(crate) inflight: Option<InFlight>,
    /// A finished save that failed and whose error no caller has seen yet.
    unreported: Option<Arc<Slot>>,
    /// Whether the save in flight is a spill the memory budget started (a commit may
    /// wait for it), not one a caller asked for.
    pub(crate) spill: bool,
}

impl Background {
    /// Whether a finished save failed and no caller has seen its error yet.
    pub(crate) fn has_unreported(&self) -> bool {
        self.unreported.is_some()
    }
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("in_flight", &self.inflight.is_some())
            .field("unreported_error", &self.unreported.is_some())
            .finish()
    }
}

/// The writer thread's work: the save protocol on `hist`, then what the store takes back.
fn write(mut hist: History, mut link: Box<RepoLink>) -> (Finished, Result<SaveStats>) {
    let mut forgotten = Vec::new();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        save_into(&mut hist, &mut link, None, &mut forgotten)
    }));
    let (evict, outcome) = match run {
        Ok(Ok(saved)) => (true, saved.into_result()),
        Ok(Err(e)) => (false, Err(e)),
        Err(_) => (
            false,
            Err(Error::Internal {
                reason: "the background save panicked; nothing was lost in memory, save again"
                    .into(),
            }),
        ),
    };
    // The copy's chunks are let go before anyone learns that the save ended.
    drop(hist);
    (
        Finished {
            link,
            forgotten,
            evict,
        },
        outcome,
    )
}

impl Store {
    /// Start a [`save`](Store::save) on a writer thread and return at once: the store
    /// captures what the save writes (the versions every branch, tag and HEAD reach,
    /// the refs and HEAD, as they are now) and the writer does the rest with the same
    /// protocol, order and crash safety as `save`. Uncommitted changes are not saved.
    ///
    /// While it runs the store stays fully usable: insert, write, commit, restore,
    /// branch, prune, diff. What changes meanwhile goes into the next save. Versions the
    /// save captured stay readable to it when pruned meanwhile (their chunks are held,
    /// not copied; their memory is freed when the save ends). After a successful save,
    /// chunks that only saved versions hold (not the working state as it is then) leave
    /// the heap, as after `save`, when the store takes the save's result back: at the
    /// next call that needs the repository or at a commit after the save ended.
    ///
    /// One save at a time: a second `save_in_background`, a [`save`](Store::save),
    /// [`save_as`](Store::save_as), [`refresh`](Store::refresh), [`gc`](Store::gc) or
    /// [`close`](Store::close) called while a save runs first waits for it to end (the
    /// saves are not merged: each one writes what it captured). Dropping the store also
    /// waits for it (in a process forked while it ran, nothing waits: the writer thread
    /// is in the parent, and the child's copy of the store has no repository).
    ///
    /// A failed save's error comes from [`PendingSave::wait`]; if nobody waited for it,
    /// the next `save`, `save_in_background`, `save_as`, `refresh` or `close` returns it
    /// (and does nothing else; call it again to go on). Dropping the store loses such an
    /// error: use [`close`](Store::close) to see it.
    ///
    /// On the caller's thread: O(versions + saved versions) to capture (no tensor data
    /// copied, nothing hashed), plus the wait for a save still running. On the writer
    /// thread: what [`save`](Store::save) costs.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] without a repository; the error of an earlier
    /// background save that nobody waited for; [`Error::Io`] if no thread could be
    /// started. Nothing is started then, and nothing changes.
    pub fn save_in_background(&mut self) -> Result<PendingSave> {
        self.settle_save(true);
        self.take_unreported()?;
        let link = self.repo.take().ok_or_else(|| Error::InvalidArgument {
            reason: "this store has no repository: use save_as or open".into(),
        })?;
        let slot = Arc::new(Slot::new());
        let captured = self
            .hist
            .live()
            .map(|(id, _)| id)
            .filter(|id| !link.saved.contains_key(id))
            .collect();
        let inflight = InFlight {
            slot: Arc::clone(&slot),
            location: link.location.clone(),
            backend: link.backend.clone(),
            saved: link.saved.clone(),
            captured,
        };
        let job = Arc::new(Mutex::new(Some((self.hist.clone(), link))));
        let (writer_job, writer_slot) = (Arc::clone(&job), Arc::clone(&slot));
        let spawned = std::thread::Builder::new()
            .name("tensor-history-save".into())
            .spawn(move || {
                crate::parallel::background();
                let taken = writer_job.lock().map(|mut g| g.take()).ok().flatten();
                if let Some((hist, link)) = taken {
                    let (finished, outcome) = write(hist, link);
                    writer_slot.fill(finished, outcome);
                }
            });
        if let Err(e) = spawned {
            // The closure never ran: the link is still in `job`.
            let taken = job.lock().map(|mut g| g.take()).ok().flatten();
            if let Some((_, link)) = taken {
                self.repo = Some(link);
            }
            return Err(Error::Io {
                path: inflight.location,
                kind: e.kind(),
                message: format!("cannot start the background save's thread: {e}"),
            });
        }
        let location = inflight.location.clone();
        self.bg.inflight = Some(inflight);
        self.bg.spill = false;
        Ok(PendingSave { slot, location })
    }

    /// Wait for the background save (if any), then give its error if it failed and
    /// nobody waited for it. The store is unusable afterwards in name only: `close`
    /// consumes it. O(1) plus the wait.
    ///
    /// # Errors
    ///
    /// The error of a background save that nobody waited for (see
    /// [`save_in_background`](Store::save_in_background)).
    pub fn close(mut self) -> Result<()> {
        self.settle_save(true);
        self.take_unreported()
    }

    /// Whether a background save started by this store has not been taken back yet
    /// (it may have ended). O(1).
    #[must_use]
    pub fn save_in_flight(&self) -> bool {
        self.bg.inflight.is_some()
    }

    /// Take back a background save's link and apply what it changed, if it ended (or,
    /// with `wait`, after it ends). In a process forked while it ran, the link is lost:
    /// the store gets no repository, and the next call that reports errors says so.
    pub(crate) fn settle_save(&mut self, wait: bool) {
        let Some(inflight) = &self.bg.inflight else {
            return;
        };
        if !inflight.slot.in_this_process() {
            let location = inflight.location.clone();
            self.bg.inflight = None;
            self.bg.unreported = Some(Arc::new(Slot::failed(lost_in_fork(&location))));
            return;
        }
        let slot = Arc::clone(&inflight.slot);
        let taken = {
            let mut g = if wait { slot.wait_done() } else { slot.lock() };
            g.finished.take().map(|f| {
                let failed_unseen = !g.reported && matches!(g.outcome, Some(Err(_)));
                (f, failed_unseen)
            })
        };
        let Some((finished, failed_unseen)) = taken else {
            return; // still running
        };
        self.bg.inflight = None;
        self.take_back(finished);
        if failed_unseen {
            self.bg.unreported = Some(slot);
        }
    }

    /// The error of a finished background save that no caller has seen, once.
    pub(crate) fn take_unreported(&mut self) -> Result<()> {
        let Some(slot) = self.bg.unreported.take() else {
            return Ok(());
        };
        let mut g = slot.lock();
        if g.reported {
            return Ok(());
        }
        g.reported = true;
        match &g.outcome {
            Some(Err(e)) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// Apply a finished save: its link comes back, versions it forgot leave the history
    /// (unless the store names one again: then the repository lacks it, and the next save
    /// writes it again), and the chunks it may evict that the working state does not hold
    /// leave the heap.
    fn take_back(&mut self, f: Finished) {
        let mut link = f.link;
        let mut named: HashSet<VersionId> = self.hist.refs.values().map(|r| r.target()).collect();
        named.extend(self.hist.head_id());
        for id in f.forgotten {
            if self.hist.node(id).is_err() {
                continue;
            }
            if named.contains(&id) {
                if let Some(h) = link.saved.get(&id) {
                    link.gone.insert(version_key(h));
                }
            } else {
                self.hist.remove(id);
                self.hist.reflog.retain(|(_, v)| *v != id);
            }
        }
        if f.evict {
            self.evict(&mut link);
        }
        self.repo = Some(link);
    }
}

impl Drop for Store {
    /// Waits for a background save this store started (not in a process forked while it
    /// ran); its error, if nobody waited for it, is lost: [`Store::close`] returns it.
    fn drop(&mut self) {
        if self.bg.inflight.is_some() {
            self.settle_save(true);
        }
    }
}
