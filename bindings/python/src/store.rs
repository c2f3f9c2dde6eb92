//! `Store`: the core store behind a mutex, every call made without the GIL.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensor_history::{
    Error, MergeStrategy, Meta, Ref, Retention, Snapshot, Store, VersionId, WriteStats,
};

use crate::arrays::{self, on_view, View, ViewMut};
use crate::errors::{self, OrPy};
use crate::persist::{
    self, PyGcStats, PyOpenFallback, PyPartStats, PyPendingSave, PyRefreshStats, PySaveStats,
};
use crate::snapshot::PySnapshot;
use crate::types::{
    diff_dict, log_rows, meta_dict, meta_from_py, PyLogEntry, PyPruneStats, PyStats, PyVersion,
    PyWriteStats, RefArg,
};
use crate::writeback::{
    check_targets, raw_mapping, read_mapping, sync, sync_undoable, undo_sync, write_mapping,
    write_targets, Undo,
};

/// The state behind the lock.
pub(crate) struct Inner {
    pub(crate) store: Store,
    /// Set by `close()`: every later call raises `StoreClosed`.
    closed: bool,
}

impl Inner {
    fn new(store: Store) -> Inner {
        Inner {
            store,
            closed: false,
        }
    }
}

/// Named arrays with their full version history, in memory.
///
/// Thread-safe: every call takes an internal lock with the GIL released, so several
/// Python threads may share one store. Arrays must not be mutated by another thread while
/// a call that reads or writes them runs.
#[pyclass(frozen, weakref, module = "tensor_history", name = "Store")]
pub(crate) struct PyStore {
    inner: Arc<Mutex<Inner>>,
    /// The copy `commit_later` runs on another thread, and the commit that follows it.
    /// Every call settles it first (see `settle`), holding this lock until it is done.
    pending: Mutex<Option<Pending>>,
}

impl Drop for PyStore {
    /// A store dropped with a `commit_later` in flight waits for its copy (which reads
    /// arrays the pending commit keeps alive until then); the commit is not made.
    fn drop(&mut self) {
        let slot = self
            .pending
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = slot.take() {
            if p.pid == std::process::id() {
                // With the GIL released: the copy thread may be waiting for it to call
                // `ready`.
                let _ = Python::attach(|py| py.detach(|| p.copy.join()));
            }
        }
    }
}

/// A rayon pool of one thread, where `commit_later` copies (`None` if it cannot be made:
/// the copy then runs on the global pool).
fn one_thread_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "th-commit-later-copy".into())
            .build()
            .ok()
    })
    .as_ref()
}

thread_local! {
    /// Set while this thread runs a `commit_later` check.
    static IN_CHECK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A `commit_later` in flight.
struct Pending {
    /// Copies the arrays into the working state (holding the store's lock meanwhile);
    /// returns what that replaced, to put back if the commit is given up.
    copy: std::thread::JoinHandle<Result<Undo, Error>>,
    /// Called once the copy ended, with whether it succeeded: returns normally to commit
    /// (after a failed copy: to raise the copy's error), raises to give the commit up.
    check: Py<PyAny>,
    message: String,
    meta: Meta,
    /// The id the commit gets, given to the caller of `commit_later`.
    id: VersionId,
    /// The arrays being read, kept alive until the copy ended.
    _arrays: Vec<Py<PyAny>>,
    /// What the `ready` callable raised on the copy thread (the copy was then not made).
    ready_err: Arc<Mutex<Option<PyErr>>>,
    /// The process that started the copy (a forked child has no such thread).
    pid: u32,
}

pub(crate) type Written = Vec<(String, WriteStats)>;

pub(crate) fn stats_dict<'py>(py: Python<'py>, stats: Written) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, s) in stats {
        d.set_item(name, Py::new(py, PyWriteStats::from(s))?)?;
    }
    Ok(d)
}

fn head_or_err(s: &Store) -> Result<VersionId, Error> {
    s.head().ok_or(Error::NoCommits)
}

fn resolve_opt(s: &Store, r: &Option<RefArg>) -> Result<VersionId, Error> {
    match r {
        Some(r) => r.resolve(s),
        None => head_or_err(s),
    }
}

pub(crate) fn known_snapshot(s: &Store, known: &Option<RefArg>) -> Result<Option<Snapshot>, Error> {
    match known {
        Some(k) => Ok(Some(s.snapshot(k.resolve(s)?)?)),
        None => Ok(None),
    }
}

impl PyStore {
    /// Run `f` on the locked state with the GIL released: heavy work never blocks other
    /// Python threads, and waiting for the lock cannot deadlock against the GIL.
    /// Raises `StoreClosed` after `close()`.
    pub(crate) fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> R + Send,
    ) -> PyResult<R> {
        self.settle_pending(py)?;
        py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if g.closed {
                return None;
            }
            Some(f(&mut g))
        })
        .ok_or_else(errors::store_closed)
    }

    /// The pending slot, locked; waits for another thread's settle without the GIL (which
    /// that settle may need for its check).
    /// Raises `InvalidArgument` when called from a `commit_later` check (which must not
    /// call the store it checks for).
    fn pending_slot(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, Option<Pending>>> {
        if IN_CHECK.with(std::cell::Cell::get) {
            return Err(errors::invalid_argument(
                "the check of commit_later called the store; it must not",
            ));
        }
        loop {
            match self.pending.try_lock() {
                Ok(g) => return Ok(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Ok(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {
                    py.detach(|| std::thread::sleep(std::time::Duration::from_micros(100)));
                }
            }
        }
    }

    fn with_inner(store: Store) -> PyStore {
        PyStore {
            inner: Arc::new(Mutex::new(Inner::new(store))),
            pending: Mutex::new(None),
        }
    }

    /// Finish a `commit_later` in flight: wait for its copy, call its check, then commit
    /// (or, if the copy failed or the check raised, put back what the copy replaced and
    /// raise that error). Holds the pending slot throughout, so that no other call runs
    /// between the copy and the commit.
    fn settle_pending(&self, py: Python<'_>) -> PyResult<()> {
        let mut slot = self.pending_slot(py)?;
        let Some(p) = slot.take() else {
            return Ok(());
        };
        if p.pid != std::process::id() {
            // Started before a fork: the copy thread is in the parent.
            return Err(errors::invalid_argument(
                "a commit_later of this store was in flight when the process forked; \
                 the child cannot finish it",
            ));
        }
        let copied = py.detach(|| p.copy.join()).unwrap_or_else(|_| {
            Err(Error::Internal {
                reason: "the thread of commit_later panicked".into(),
            })
        });
        drop(p._arrays);
        let ready_err = p
            .ready_err
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        IN_CHECK.with(|c| c.set(true));
        let checked = p.check.call1(py, (copied.is_ok(),)).map(|_| ());
        IN_CHECK.with(|c| c.set(false));
        let (message, meta, id) = (p.message, p.meta, p.id);
        let ok = checked.is_ok();
        let outcome = py.detach(move || -> Result<Result<(), Error>, ()> {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let store = &mut g.store;
            match (copied, ok) {
                (Ok(_), true) => Ok(match store.commit_with(&message, meta) {
                    Ok(got) if got == id => Ok(()),
                    Ok(got) => Err(Error::Internal {
                        reason: format!("commit_later promised {id}, the commit made {got}"),
                    }),
                    Err(e) => Err(e),
                }),
                (Ok(undo), false) => {
                    undo_sync(store, undo);
                    Err(())
                }
                (Err(e), true) => Ok(Err(e)),
                (Err(_), false) => Err(()),
            }
        });
        drop(slot);
        match outcome {
            // The copy was not made because `ready` raised: its exception.
            Ok(Err(_)) if ready_err.is_some() => Err(ready_err.expect("checked")),
            Ok(r) => r.or_py(),
            // the check's own exception
            Err(()) => match checked {
                Err(e) => Err(e),
                Ok(()) => unreachable!("given up only when the check raised"),
            },
        }
    }
}

#[pymethods]
impl PyStore {
    /// An empty store. `chunk_bytes`: largest chunk (default 256 KiB); `max_versions`:
    /// keep at most this many versions per branch (default: all); `recycle_bytes`: freed
    /// chunk buffers kept for reuse; `memory_budget`: bytes of history held in memory
    /// past which old versions are kept encoded (lossless deltas, default: none).
    #[new]
    #[pyo3(signature = (*, chunk_bytes = None, max_versions = None, recycle_bytes = None, memory_budget = None))]
    fn new(
        chunk_bytes: Option<usize>,
        max_versions: Option<usize>,
        recycle_bytes: Option<usize>,
        memory_budget: Option<usize>,
    ) -> PyResult<Self> {
        let c = persist::config(chunk_bytes, max_versions, recycle_bytes, memory_budget);
        let store = Store::with_config(c).or_py()?;
        Ok(PyStore::with_inner(store))
    }

    /// Open the repository at `path` (a directory, created if absent, or a URL): refs,
    /// HEAD and every version come back as saved, the working state is HEAD. Chunk data
    /// is not read here: it is mapped and checked against its hash on first use. Keyword
    /// arguments as for `Store()`. O(versions + tensors) objects read, GIL released.
    ///
    /// `create=False`: the repository must exist; where there is none, `NoRepository`
    /// is raised and nothing is created at `path` (for code that only reads).
    ///
    /// If HEAD's version does not read (a damaged pack, index or manifest), the store
    /// starts detached at the nearest older version that does, warns
    /// (`OpenFallbackWarning`) and says so in `open_fallback`.
    ///
    /// Raises `StorageError`, `UnsupportedFormat` (another format, or a non-empty
    /// directory that is not a repository), `CorruptObject`, `NoRepository`.
    #[staticmethod]
    #[pyo3(signature = (path, *, chunk_bytes = None, max_versions = None, recycle_bytes = None, memory_budget = None, create = true))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        chunk_bytes: Option<usize>,
        max_versions: Option<usize>,
        recycle_bytes: Option<usize>,
        memory_budget: Option<usize>,
        create: bool,
    ) -> PyResult<Self> {
        let c = persist::config(chunk_bytes, max_versions, recycle_bytes, memory_budget);
        let store = py.detach(|| persist::open(&path, c, create)).or_py()?;
        if let Some(f) = store.open_fallback() {
            let msg = PyOpenFallback::from(f).message(store.location().unwrap_or_default());
            let category = py
                .import("tensor_history._errors")?
                .getattr("OpenFallbackWarning")?;
            PyErr::warn(py, &category, &std::ffi::CString::new(msg)?, 1)?;
        }
        Ok(PyStore::with_inner(store))
    }

    /// `None` when `open` started at HEAD as saved; else an `OpenFallback`: HEAD's
    /// version did not read (a damaged or missing pack, index or manifest), and the
    /// store started detached at an older version that does (the branch still points at
    /// the damaged one, which raises `CorruptObject` when read). `open` also warned
    /// (`OpenFallbackWarning`). Check it before resuming work from an opened store. O(1).
    #[getter]
    fn open_fallback(&self, py: Python<'_>) -> PyResult<Option<PyOpenFallback>> {
        self.run(py, |i| i.store.open_fallback().map(PyOpenFallback::from))
    }

    /// Where this store saves (`None` before `open` or `save_as`).
    #[getter]
    fn location(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.run(py, |i| i.store.location().map(str::to_owned))
    }

    /// Write every version a branch, tag or HEAD reaches that the repository lacks (only
    /// the chunks it lacks), then move the refs; crash-safe. Uncommitted changes are not
    /// saved. Afterwards chunks only saved versions hold leave memory (read back from
    /// disk on use). O(new chunks) written, GIL released.
    ///
    /// Raises `InvalidArgument` without a repository (use `save_as`), `StorageError`
    /// (nothing in memory is lost), `BranchMoved` if a branch moved in the repository
    /// since this store saw it (every other ref is saved; `BranchMoved.theirs` names the
    /// repository's version; `refresh`, merge, save again).
    ///
    /// `background=True`: return a `PendingSave` at once and save on a writer thread
    /// (what the save writes is captured first: no tensor data is copied). The store
    /// stays usable meanwhile; a later save, `refresh`, `gc` or `close` first waits for
    /// it. `PendingSave.wait()` returns the `SaveStats` or raises the save's error; if
    /// nobody waited, the next `save`, `save_as`, `refresh` or `close` raises it.
    #[pyo3(signature = (*, background = false))]
    fn save(&self, py: Python<'_>, background: bool) -> PyResult<Py<PyAny>> {
        if background {
            let pending = self.run(py, |i| i.store.save_in_background()).or_py()?;
            return Ok(Py::new(py, PyPendingSave::new(pending))?.into_any());
        }
        let stats: PySaveStats = self.run(py, |i| i.store.save()).or_py()?.into();
        Ok(Py::new(py, stats)?.into_any())
    }

    /// Bind the store to the repository at `path` (created if absent) and `save` there.
    /// On error the store keeps its previous repository. O(all chunks) the first time.
    ///
    /// Onto a repository with a history of its own, nothing of that history is lost: its
    /// refs that this store does not have stay as they are, and a ref this store has too
    /// must be a fast-forward of the repository's (unless this store saw exactly that
    /// state of it), else `BranchMoved` (naming the ref and `BranchMoved.theirs`) is raised
    /// before any ref is written and the store stays bound where it was. To keep both,
    /// save under another branch name.
    fn save_as(&self, py: Python<'_>, path: PathBuf) -> PyResult<PySaveStats> {
        self.run(py, |i| i.store.save_as(&path))
            .or_py()
            .map(Into::into)
    }

    /// Write every variable of the working state into the repository at `location` as
    /// one writer's part of a version several writers make (the ranks of a distributed
    /// checkpoint): the chunks the repository lacks into packs of this writer, then the
    /// manifests, durably. Writes no version or ref; this store stays unbound (it may be
    /// a throwaway in-memory store). Give `PartStats.items` to the coordinator's
    /// `commit_parts`. What is never committed is garbage that `gc` deletes after its
    /// grace period. O(new chunks) written, GIL released.
    ///
    /// With `compress` false the new chunks are stored as they are (no encoding on
    /// write, no decoding on read); by default they are byte-plane coded where that
    /// saves at least 4%.
    ///
    /// Raises `StorageError`, `UnsupportedFormat`.
    #[pyo3(signature = (location, compress = true))]
    fn write_part(
        &self,
        py: Python<'_>,
        location: String,
        compress: bool,
    ) -> PyResult<PyPartStats> {
        let how = if compress {
            tensor_history::PartChunks::Coded
        } else {
            tensor_history::PartChunks::Raw
        };
        self.run(py, |i| i.store.write_part_as(&location, how))
            .or_py()
            .map(Into::into)
    }

    /// Commit one version onto `branch` whose variables are every tensor of `parts`
    /// (each a list of `(name, manifest id)`, `PartStats.items` of `write_part` into this
    /// store's repository), parent the branch's tip, then publish it with `save()`. No
    /// tensor data is read. HEAD stays where it is unless it is attached to `branch` or
    /// the store has no version yet. Keyword arguments are the version's metadata.
    /// O(tensors) manifests read, GIL released.
    ///
    /// Raises `InvalidArgument` (no repository, a name two parts give different
    /// manifests, a malformed id), `InvalidRefName`, `WrongRefKind` (a tag),
    /// `UncommittedChanges`, `CorruptObject` (a part that is not in the repository).
    /// Nothing changes on error.
    #[pyo3(signature = (branch, parts, message = "", **metadata))]
    fn commit_parts(
        &self,
        py: Python<'_>,
        branch: &str,
        parts: Vec<Vec<(String, String)>>,
        message: &str,
        metadata: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyVersion> {
        let meta = meta_from_py(metadata)?;
        let parts = persist::parts_from_py(parts).or_py()?;
        let id = self
            .run(py, |i| i.store.commit_parts(branch, &parts, message, meta))
            .or_py()?;
        Ok(id.into())
    }

    /// Take in the refs and versions other processes saved since this store opened or
    /// last refreshed. A ref this store did not move follows the repository, and so does
    /// one it moved when nothing is lost (it deleted it, or another ref reaches its
    /// version); a branch moved on both sides keeps this store's target (reported in
    /// `diverged`, the repository's version in `theirs`); a branch the repository
    /// deleted while this store moved it is kept and written again by the next save.
    /// Uncommitted changes are kept. Raises `InvalidArgument` without a repository.
    fn refresh(&self, py: Python<'_>) -> PyResult<PyRefreshStats> {
        self.run(py, |i| i.store.refresh()).or_py().map(Into::into)
    }

    /// Delete repository objects no saved ref or HEAD reaches, in two phases: a run
    /// records candidates, a run `grace` seconds later (default 3600) deletes them, so a
    /// concurrent save never loses data (`grace=0` only with a single writer). Packs with
    /// less than `repack_below` (default 0.5) live bytes are rewritten. `dry_run`: write
    /// and delete nothing, report what would be done. `delete_within` (seconds, default
    /// 30): how long the run may go on deleting once it announced its deletions; a save
    /// that writes again what the run may delete waits until the run is done or past
    /// this deadline. `rebase`: also store chunks that were saved whole (DCP saves,
    /// parts) as deltas against their parent version's chunks where that is smaller,
    /// rewriting their packs (not tried by a dry run). `unchain` (default true): code
    /// again the chunks of live versions whose delta chains need chunks that only
    /// pruned versions hold, so that those go (a later run, this one with `grace=0`).
    /// GIL released.
    #[pyo3(signature = (*, grace = None, repack_below = None, dry_run = false, delete_within = None, rebase = false, unchain = true))]
    // Each of Python's keyword arguments is a parameter here.
    #[allow(clippy::too_many_arguments)]
    fn gc(
        &self,
        py: Python<'_>,
        grace: Option<f64>,
        repack_below: Option<f64>,
        dry_run: bool,
        delete_within: Option<f64>,
        rebase: bool,
        unchain: bool,
    ) -> PyResult<PyGcStats> {
        let o = persist::gc_options(grace, repack_below, dry_run, delete_within, rebase, unchain)
            .or_py()?;
        self.run(py, |i| i.store.gc_with(&o))
            .or_py()
            .map(Into::into)
    }

    /// The content address of version `ref` (64 hex digits): the same in every process
    /// and repository; `resolve` takes any unique prefix of 4 or more digits once the
    /// version is saved or loaded. O(1) when saved, else hashes its unsaved chunks.
    fn version_hash(&self, py: Python<'_>, r#ref: RefArg) -> PyResult<String> {
        self.run(py, |i| {
            let id = r#ref.resolve(&i.store)?;
            i.store.version_hash(id).map(|h| h.to_string())
        })
        .or_py()
    }

    /// Largest chunk in bytes.
    #[getter]
    fn chunk_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |i| i.store.config().chunk_bytes)
    }

    /// Auto-retention limit (`None`: keep every version).
    #[getter]
    fn max_versions(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        self.run(py, |i| i.store.config().max_versions)
    }

    /// Bytes of history the store may hold in memory, raw and encoded (`None`: no
    /// budget): past it old versions are kept encoded, and when even encoded the
    /// history passes it, the oldest go (spilled to the repository, or let go where no
    /// ref, HEAD or the reflog holds them). Settable: the next commit holds the history
    /// to the new value.
    #[getter]
    fn memory_budget(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        self.run(py, |i| i.store.config().memory_budget)
    }

    #[setter]
    fn set_memory_budget(&self, py: Python<'_>, budget: Option<usize>) -> PyResult<()> {
        self.run(py, |i| i.store.set_memory_budget(budget))
    }

    /// Encode old versions now (what commits start in the background) until the held
    /// bytes are within `memory_budget`; returns the bytes held. GIL released.
    fn enforce_memory_budget(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |i| i.store.enforce_memory_budget())
    }

    /// Release the store: wait for a background save, its versions and chunks leave
    /// memory, the repository files it mapped are unmapped, and every later call raises
    /// `StoreClosed`. Nothing new is saved: call `save()` first to keep new versions.
    /// Raises the error of a background save that nobody waited for (the store is closed
    /// all the same). Closing twice is allowed. A store used as a context manager
    /// (`with Store.open(path) as s:`) is closed when the block ends, also on an
    /// exception. GIL released.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.settle_pending(py)?;
        let old = py.detach(|| {
            let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if g.closed {
                return None;
            }
            g.closed = true;
            Store::with_config(persist::config(None, None, None, None))
                .ok()
                .map(|empty| std::mem::replace(&mut g.store, empty))
        });
        // Closed outside the lock (the wait and the unmapping can take a while).
        match old {
            Some(store) => py.detach(move || store.close()).or_py(),
            None => Ok(()),
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        py.detach(|| {
            self.inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .closed
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the store (see `close`: waits for a background save and raises its error
    /// if nobody waited for it); exceptions of the block propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    // ---- working state ---------------------------------------------------------------

    /// Add variable `name` holding a copy of `array` (any layout). O(size).
    #[pyo3(signature = (name, array, *, chunk_bytes = None, dtype = None))]
    fn insert(
        &self,
        py: Python<'_>,
        name: &str,
        array: &Bound<'_, PyAny>,
        chunk_bytes: Option<usize>,
        dtype: Option<&str>,
    ) -> PyResult<()> {
        let (arr, dt) = arrays::input(array, name, dtype)?;
        let g = arrays::read(&arr, dt)?;
        let v = g.view();
        self.run(py, |i| {
            on_view!(&v, x => match chunk_bytes {
                Some(c) => i.store.insert_chunked(name, x, c),
                None => i.store.insert(name, x),
            })
        })
        .or_py()
    }

    /// Overwrite variable `name` from `array` (same dtype and shape, any layout), copying
    /// only the chunks whose bytes changed. O(size) compare.
    #[pyo3(signature = (name, array, *, dtype = None))]
    fn write(
        &self,
        py: Python<'_>,
        name: &str,
        array: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<PyWriteStats> {
        let (arr, dt) = arrays::input(array, name, dtype)?;
        let g = arrays::read(&arr, dt)?;
        let v = g.view();
        let s = self
            .run(py, |i| on_view!(&v, x => i.store.write(name, x)))
            .or_py()?;
        Ok(s.into())
    }

    /// Write every array of `arrays` into its variable (inserting new names), copying only
    /// changed chunks. All or nothing. Returns `{name: WriteStats}`.
    fn sync<'py>(
        &self,
        py: Python<'py>,
        arrays: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let guards = read_mapping(arrays)?;
        let views: Vec<(String, View<'_>)> =
            guards.iter().map(|(n, g)| (n.clone(), g.view())).collect();
        let written = self.run(py, |i| sync(&mut i.store, &views)).or_py()?;
        stats_dict(py, written)
    }

    /// A copy of variable `name`, from the working state or from version `at`. O(size).
    #[pyo3(signature = (name, *, at = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        at: Option<RefArg>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let owned = self
            .run(py, |i| {
                let s = &i.store;
                match &at {
                    None => arrays::to_owned(s.tensor(name)?),
                    Some(r) => arrays::to_owned(s.snapshot(r.resolve(s)?)?.tensor(name)?),
                }
            })
            .or_py()?;
        Ok(owned.into_py(py))
    }

    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.get(py, name, None)
    }

    fn __contains__(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
        self.run(py, |i| i.store.contains(name))
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |i| i.store.names().len())
    }

    /// Names of the working variables, sorted.
    fn names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        self.run(py, |i| i.store.names())
    }

    /// `(dtype, shape)` of a working variable, dtype as `"f32"`, `"bf16"`, ...
    fn info(&self, py: Python<'_>, name: &str) -> PyResult<(String, Vec<usize>)> {
        self.run(py, |i| {
            i.store
                .layout(name)
                .map(|(dtype, shape)| (dtype.name().to_owned(), shape.to_vec()))
        })
        .or_py()
    }

    /// Drop variable `name` from the working state.
    fn remove(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.run(py, |i| i.store.remove(name).map(|_| ())).or_py()
    }

    // ---- commits and HEAD ------------------------------------------------------------

    /// Record the working state as a new version (O(1), no data copied). Keyword
    /// arguments (bool, int, float, str) are kept as the version's metadata.
    #[pyo3(signature = (message = "", **metadata))]
    fn commit(
        &self,
        py: Python<'_>,
        message: &str,
        metadata: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyVersion> {
        let meta = meta_from_py(metadata)?;
        let id = self
            .run(py, |i| i.store.commit_with(message, meta))
            .or_py()?;
        Ok(id.into())
    }

    /// Commit `arrays` (`{name: array}`, C-contiguous) with `message` and the keyword
    /// arguments as metadata, as `sync(arrays)` then `commit(...)` would, but copy them
    /// on another thread: returns at once the `Version` the commit will get. The next
    /// call on this store (any method, or `settle()`) waits for the copy, then calls
    /// `check(copied)` (`copied`: whether the copy succeeded): if it returns, the commit
    /// is made; if it raises, the variables the copy wrote are put back as they were, no
    /// version is made, and that call raises the check's exception. A failed copy
    /// (a shape that does not fit a variable, ...) changes nothing, and that call raises
    /// its error after the check returns. `check` must not call this store.
    ///
    /// The arrays are read while the caller goes on: nothing may write them, resize
    /// them or free their memory until the store is settled (`check` is where a caller
    /// that cannot prevent a write detects one). The arrays are kept alive until then,
    /// and a store dropped meanwhile waits for the copy. A process forked while the copy
    /// runs gets `InvalidArgument` from its next call on this store.
    ///
    /// `ready`, when given, is called (with no arguments, holding the GIL) on the copy
    /// thread before it reads the arrays: it returns once their bytes are in place (an
    /// accelerator's copy into a host staging area, say). If it raises, the copy is not
    /// made, `check(False)` is called, and the next call raises `ready`'s exception. The
    /// four parameters are positional, so that any keyword is metadata.
    #[pyo3(signature = (arrays, check, message = "", ready = None, /, **metadata))]
    fn commit_later(
        &self,
        py: Python<'_>,
        arrays: &Bound<'_, PyAny>,
        check: Py<PyAny>,
        message: &str,
        ready: Option<Py<PyAny>>,
        metadata: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyVersion> {
        let meta = meta_from_py(metadata)?;
        meta.validate().or_py()?;
        let (raws, keep) = raw_mapping(arrays)?;
        // A commit another thread left pending is made first.
        let mut slot = loop {
            self.settle_pending(py)?;
            let slot = self.pending_slot(py)?;
            if slot.is_none() {
                break slot;
            }
        };
        let inner = Arc::clone(&self.inner);
        let ready_err = Arc::new(Mutex::new(None));
        let ready_err_copy = Arc::clone(&ready_err);
        let (id_tx, id_rx) = std::sync::mpsc::channel::<Option<VersionId>>();
        let copy = std::thread::Builder::new()
            .name("th-commit-later".into())
            .spawn(move || -> Result<Undo, Error> {
                let mut g = inner.lock().unwrap_or_else(PoisonError::into_inner);
                if g.closed {
                    let _ = id_tx.send(None);
                    return Err(Error::InvalidArgument {
                        reason: "the store is closed".into(),
                    });
                }
                let _ = id_tx.send(Some(g.store.next_version_id()));
                if let Some(ready) = ready {
                    // Not holding the store's lock while this thread waits for the GIL
                    // (a thread holding the GIL may be waiting for that lock). Every
                    // other call on the store settles this commit first, so nothing
                    // commits meanwhile.
                    drop(g);
                    let called = Python::attach(|py| ready.call0(py).map(|_| ()));
                    if let Err(e) = called {
                        *ready_err_copy
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner) = Some(e);
                        return Err(Error::InvalidArgument {
                            reason: "the ready callable of commit_later raised".into(),
                        });
                    }
                    g = inner.lock().unwrap_or_else(PoisonError::into_inner);
                    if g.closed {
                        return Err(Error::InvalidArgument {
                            reason: "the store is closed".into(),
                        });
                    }
                }
                let mut views = Vec::with_capacity(raws.len());
                for r in &raws {
                    // SAFETY: the arrays are kept alive by the pending commit until this
                    // thread ended; `commit_later`'s caller promised not to write, resize
                    // or free them meanwhile.
                    #[allow(unsafe_code)]
                    let view = unsafe { r.view() };
                    match view {
                        Some(v) => views.push((r.name.clone(), v)),
                        None => {
                            return Err(Error::InvalidArgument {
                                reason: format!("`{}`: unsupported dtype", r.name),
                            })
                        }
                    }
                }
                // On one thread: the caller goes on computing on the others.
                let store = &mut g.store;
                let mut copy = move || sync_undoable(store, &views).map(|(_, undo)| undo);
                match one_thread_pool() {
                    Some(pool) => pool.install(copy),
                    None => copy(),
                }
            })
            .map_err(|e| {
                pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start a thread: {e}"))
            })?;
        let id = py.detach(move || id_rx.recv().ok().flatten());
        let Some(id) = id else {
            let _ = py.detach(|| copy.join());
            return Err(errors::store_closed());
        };
        *slot = Some(Pending {
            copy,
            check,
            message: message.to_owned(),
            meta,
            id,
            _arrays: keep,
            ready_err,
            pid: std::process::id(),
        });
        Ok(id.into())
    }

    /// Finish a `commit_later` in flight (see there); nothing to do without one.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        self.settle_pending(py)
    }

    /// Whether a `commit_later` is in flight.
    fn commit_pending(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.pending_slot(py)?.is_some())
    }

    /// The current version (`None` before the first commit).
    fn head(&self, py: Python<'_>) -> PyResult<Option<PyVersion>> {
        self.run(py, |i| i.store.head().map(PyVersion::from))
    }

    /// The branch HEAD is attached to (`None` when detached).
    fn current_branch(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.run(py, |i| i.store.current_branch().map(str::to_owned))
    }

    /// Whether the working state differs from HEAD.
    fn is_dirty(&self, py: Python<'_>) -> PyResult<bool> {
        self.run(py, |i| i.store.is_dirty())
    }

    /// Drop uncommitted changes of the working state.
    fn discard(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |i| i.store.discard()).or_py()
    }

    /// Make the working state version `ref` and move HEAD there (O(1)). With `into`
    /// (`{name: array}`), also write that version into the arrays in place, only the
    /// chunks that differ: compared chunk by chunk, or, with `known` (a version the arrays
    /// are known to hold), skipped without reading where the versions share chunks.
    #[pyo3(signature = (r#ref, *, into = None, known = None))]
    fn restore<'py>(
        &self,
        py: Python<'py>,
        r#ref: RefArg,
        into: Option<&Bound<'py, PyAny>>,
        known: Option<RefArg>,
    ) -> PyResult<PyVersion> {
        let r2 = r#ref.clone();
        let (id, _) = self.move_and_write(
            py,
            into,
            known,
            move |s| r2.resolve(s).map(Some),
            move |s| {
                let id = r#ref.resolve(s)?;
                s.restore(id).map(|()| id)
            },
            |_| {},
        )?;
        Ok(id)
    }

    /// Move HEAD to its parent and restore it (`into`/`known` as for `restore`).
    #[pyo3(signature = (*, into = None, known = None))]
    fn undo<'py>(
        &self,
        py: Python<'py>,
        into: Option<&Bound<'py, PyAny>>,
        known: Option<RefArg>,
    ) -> PyResult<PyVersion> {
        let (id, _) = self.move_and_write(
            py,
            into,
            known,
            |s| match s.head() {
                Some(h) => Ok(s.parent(h)?),
                None => Err(Error::NothingToUndo),
            },
            Store::undo,
            |_| {},
        )?;
        Ok(id)
    }

    /// Go back to the version the last undo came from (`into`/`known` as for `restore`).
    #[pyo3(signature = (*, into = None, known = None))]
    fn redo<'py>(
        &self,
        py: Python<'py>,
        into: Option<&Bound<'py, PyAny>>,
        known: Option<RefArg>,
    ) -> PyResult<PyVersion> {
        let (id, _) = self.move_and_write(
            py,
            into,
            known,
            |_| Ok(None),
            Store::redo,
            // Undo right after redo is its exact inverse (HEAD, branch and redo path).
            |s| {
                let _ = s.undo();
            },
        )?;
        Ok(id)
    }

    /// Write version `at` (default HEAD) into the arrays of `into` without moving HEAD,
    /// only the chunks that differ (see `restore`). Returns `{name: WriteStats}`.
    #[pyo3(signature = (into, *, at = None, known = None))]
    fn write_into<'py>(
        &self,
        py: Python<'py>,
        into: &Bound<'py, PyAny>,
        at: Option<RefArg>,
        known: Option<RefArg>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut guards = write_mapping(Some(into))?;
        let mut views: Vec<(String, ViewMut<'_>)> = guards
            .iter_mut()
            .map(|(n, g)| (n.clone(), g.view_mut()))
            .collect();
        let written = self
            .run(py, |i| -> Result<Written, Error> {
                let s = &i.store;
                let snap = match &at {
                    Some(r) => s.snapshot(r.resolve(s)?)?,
                    None => s.working_snapshot(),
                };
                let known = known_snapshot(s, &known)?;
                check_targets(&snap, &views)?;
                write_targets(&snap, known.as_ref(), &mut views)
            })
            .or_py()?;
        stats_dict(py, written)
    }

    // ---- refs ------------------------------------------------------------------------

    /// Create branch `name` at `at` (default HEAD).
    #[pyo3(signature = (name, at = None))]
    fn branch(&self, py: Python<'_>, name: &str, at: Option<RefArg>) -> PyResult<()> {
        self.run(py, |i| {
            let id = resolve_opt(&i.store, &at)?;
            i.store.branch(name, id)
        })
        .or_py()
    }

    /// Create tag `name` at `at` (default HEAD); tags never move.
    #[pyo3(signature = (name, at = None))]
    fn tag(&self, py: Python<'_>, name: &str, at: Option<RefArg>) -> PyResult<()> {
        self.run(py, |i| {
            let id = resolve_opt(&i.store, &at)?;
            i.store.tag(name, id)
        })
        .or_py()
    }

    /// Attach HEAD to branch `name` and restore its tip (`into`/`known` as for `restore`).
    #[pyo3(signature = (name, *, into = None, known = None))]
    fn checkout<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        into: Option<&Bound<'py, PyAny>>,
        known: Option<RefArg>,
    ) -> PyResult<PyVersion> {
        let (id, _) = self.move_and_write(
            py,
            into,
            known,
            |s| s.resolve(name).map(Some),
            |s| {
                s.checkout(name)?;
                head_or_err(s)
            },
            |_| {},
        )?;
        Ok(id)
    }

    /// Detach HEAD at its current version.
    fn detach(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |i| i.store.detach())
    }

    /// Delete branch `name` (its versions stay until pruned).
    fn delete_branch(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.run(py, |i| i.store.delete_branch(name)).or_py()
    }

    /// Delete tag `name`.
    fn delete_tag(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.run(py, |i| i.store.delete_tag(name)).or_py()
    }

    /// The version a ref names (`"main"`, `"HEAD"`, `"v3"`, a tag, or a `Version`).
    fn resolve(&self, py: Python<'_>, r#ref: RefArg) -> PyResult<PyVersion> {
        self.run(py, |i| r#ref.resolve(&i.store))
            .or_py()
            .map(PyVersion::from)
    }

    /// `[(name, "branch" | "tag", Version)]` for every ref, sorted by name.
    fn refs(&self, py: Python<'_>) -> PyResult<Vec<(String, &'static str, PyVersion)>> {
        self.run(py, |i| {
            i.store
                .refs()
                .into_iter()
                .map(|(n, r)| match r {
                    Ref::Branch(v) => (n, "branch", v.into()),
                    Ref::Tag(v) => (n, "tag", v.into()),
                })
                .collect()
        })
    }

    // ---- the tree --------------------------------------------------------------------

    /// A read-only snapshot of version `ref` (default: the working state as it is now).
    #[pyo3(signature = (r#ref = None))]
    fn snapshot(&self, py: Python<'_>, r#ref: Option<RefArg>) -> PyResult<PySnapshot> {
        let inner = self
            .run(py, |i| match &r#ref {
                Some(r) => i.store.snapshot(r.resolve(&i.store)?),
                None => Ok(i.store.working_snapshot()),
            })
            .or_py()?;
        Ok(PySnapshot { inner })
    }

    /// The first parent of `ref` (`None` for a root).
    fn parent(&self, py: Python<'_>, r#ref: RefArg) -> PyResult<Option<PyVersion>> {
        self.run(py, |i| i.store.parent(r#ref.resolve(&i.store)?))
            .or_py()
            .map(|p| p.map(PyVersion::from))
    }

    /// All parents of `ref` (two for a merge).
    fn parents(&self, py: Python<'_>, r#ref: RefArg) -> PyResult<Vec<PyVersion>> {
        self.run(py, |i| i.store.parents(r#ref.resolve(&i.store)?))
            .or_py()
            .map(|v| v.into_iter().map(PyVersion::from).collect())
    }

    /// The live children of `ref`, oldest first.
    fn children(&self, py: Python<'_>, r#ref: RefArg) -> PyResult<Vec<PyVersion>> {
        self.run(py, |i| i.store.children(r#ref.resolve(&i.store)?))
            .or_py()
            .map(|v| v.into_iter().map(PyVersion::from).collect())
    }

    /// The newest common ancestor of `a` and `b`, or `None`.
    fn merge_base(&self, py: Python<'_>, a: RefArg, b: RefArg) -> PyResult<Option<PyVersion>> {
        self.run(py, |i| {
            let s = &i.store;
            s.merge_base(a.resolve(s)?, b.resolve(s)?)
        })
        .or_py()
        .map(|v| v.map(PyVersion::from))
    }

    /// Every live version, oldest first.
    fn versions(&self, py: Python<'_>) -> PyResult<Vec<PyVersion>> {
        self.run(py, |i| {
            i.store
                .versions()
                .into_iter()
                .map(PyVersion::from)
                .collect()
        })
    }

    /// Live versions without children.
    fn tips(&self, py: Python<'_>) -> PyResult<Vec<PyVersion>> {
        self.run(py, |i| {
            i.store.tips().into_iter().map(PyVersion::from).collect()
        })
    }

    /// The metadata given to `commit` for version `ref`.
    fn metadata<'py>(&self, py: Python<'py>, r#ref: RefArg) -> PyResult<Bound<'py, PyDict>> {
        let m = self
            .run(py, |i| {
                let id = r#ref.resolve(&i.store)?;
                i.store.metadata(id).cloned()
            })
            .or_py()?;
        meta_dict(py, &m)
    }

    /// `ref` (default HEAD) and its ancestors, newest first, as `LogEntry`s with id,
    /// message, time, parents and metadata.
    #[pyo3(signature = (r#ref = None))]
    fn log(&self, py: Python<'_>, r#ref: Option<RefArg>) -> PyResult<Vec<PyLogEntry>> {
        let rows = self
            .run(py, |i| log_rows(&i.store, r#ref.as_ref()))
            .or_py()?;
        rows.into_iter()
            .map(|(id, message, time, parents, meta)| {
                Ok(PyLogEntry {
                    id: id.into(),
                    message,
                    time,
                    parents: parents.into_iter().map(PyVersion::from).collect(),
                    metadata: meta_dict(py, &meta)?.unbind(),
                })
            })
            .collect()
    }

    /// `{name: Change}` between versions `a` and `b`. `b` defaults to the working
    /// state; with no argument at all, the uncommitted changes (HEAD against working).
    #[pyo3(signature = (a = None, b = None))]
    fn diff<'py>(
        &self,
        py: Python<'py>,
        a: Option<RefArg>,
        b: Option<RefArg>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let d = self
            .run(py, |i| {
                let s = &i.store;
                match (&a, &b) {
                    (None, None) => Ok(s.diff_working()),
                    (Some(a), Some(b)) => s.diff(a.resolve(s)?, b.resolve(s)?),
                    (Some(a), None) => Ok(s.snapshot(a.resolve(s)?)?.diff(&s.working_snapshot())),
                    (None, Some(b)) => Ok(s.working_snapshot().diff(&s.snapshot(b.resolve(s)?)?)),
                }
            })
            .or_py()?;
        diff_dict(py, d)
    }

    /// Three-way merge of `other` into HEAD at chunk level. `strategy`: `"fail"` (a chunk
    /// changed on both sides raises `MergeConflict`), `"ours"`, `"theirs"` or `"mean"`.
    #[pyo3(signature = (other, *, strategy = "fail"))]
    fn merge(&self, py: Python<'_>, other: RefArg, strategy: &str) -> PyResult<PyVersion> {
        let strat = match strategy {
            "fail" => MergeStrategy::Fail,
            "ours" => MergeStrategy::Ours,
            "theirs" => MergeStrategy::Theirs,
            "mean" => MergeStrategy::Mean,
            other => {
                return Err(errors::invalid_argument(&format!(
                    "unknown merge strategy `{other}` (fail, ours, theirs, mean)"
                )))
            }
        };
        self.run(py, |i| {
            let id = other.resolve(&i.store)?;
            i.store.merge(id, strat)
        })
        .or_py()
        .map(PyVersion::from)
    }

    /// Commit the weighted elementwise mean of versions (a model soup).
    #[pyo3(signature = (refs, weights = None))]
    fn average(
        &self,
        py: Python<'_>,
        refs: Vec<RefArg>,
        weights: Option<Vec<f64>>,
    ) -> PyResult<PyVersion> {
        self.run(py, |i| {
            let ids = refs
                .iter()
                .map(|r| r.resolve(&i.store))
                .collect::<Result<Vec<_>, _>>()?;
            i.store.average(&ids, weights.as_deref())
        })
        .or_py()
        .map(PyVersion::from)
    }

    /// Drop versions: keep the last `keep_last` per branch (and HEAD), every
    /// `keep_every`-th version, tags and branch tips; `drop_unreachable` also drops
    /// versions no ref reaches.
    #[pyo3(signature = (*, keep_last = None, keep_every = None, drop_unreachable = false))]
    fn prune(
        &self,
        py: Python<'_>,
        keep_last: Option<usize>,
        keep_every: Option<usize>,
        drop_unreachable: bool,
    ) -> PyResult<PyPruneStats> {
        let policy = Retention {
            last: keep_last,
            ..Retention::default()
        }
        .keep_every(keep_every.unwrap_or(0))
        .drop_unreachable(drop_unreachable);
        self.run(py, |i| i.store.prune(&policy))
            .or_py()
            .map(PyPruneStats::from)
    }

    /// Versions, variables, unique chunks and bytes held, logical bytes (deep copies),
    /// sharing ratio.
    fn stats(&self, py: Python<'_>) -> PyResult<PyStats> {
        self.run(py, |i| i.store.stats()).map(Into::into)
    }

    /// Recompute every hash and check the tree; raises `Corrupt` on a mismatch.
    fn verify(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |i| i.store.verify()).or_py()
    }

    /// The history as text, like `git log --graph --oneline`.
    fn graph(&self, py: Python<'_>) -> PyResult<String> {
        self.run(py, |i| i.store.log_graph())
    }

    /// The history as Graphviz DOT.
    fn to_dot(&self, py: Python<'_>) -> PyResult<String> {
        self.run(py, |i| i.store.to_dot())
    }

    /// Write version `ref` (default HEAD) as a `.safetensors` file, chunk by chunk and
    /// atomically (no file is left at `path` on error).
    #[pyo3(signature = (path, r#ref = None))]
    fn export_safetensors(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        r#ref: Option<RefArg>,
    ) -> PyResult<()> {
        self.run(py, |i| {
            let id = resolve_opt(&i.store, &r#ref)?;
            i.store.export_safetensors(id, &path)
        })
        .or_py()
    }

    /// Add every tensor of a `.safetensors` file to the working state; returns the names,
    /// sorted. All or nothing.
    fn import_safetensors(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
    ) -> PyResult<Vec<String>> {
        self.run(py, |i| i.store.import_safetensors(&path)).or_py()
    }

    /// Bytes of freed chunk buffers kept for reuse.
    fn pooled_bytes(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |i| i.store.pooled_bytes())
    }

    /// Return pooled buffers to the allocator.
    fn release_pooled(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |i| i.store.release_pooled())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        self.run(py, |i| {
            let s = &i.store;
            format!(
                "Store({} variables, {} versions, head={})",
                s.names().len(),
                s.versions().len(),
                s.head().map_or("None".to_owned(), |h| h.to_string())
            )
        })
        .unwrap_or_else(|_| "Store(closed)".to_owned())
    }
}
