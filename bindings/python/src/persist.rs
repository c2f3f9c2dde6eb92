//! Persistence helpers: the result classes of `save`, `refresh` and `gc` (`SaveStats`,
//! `RefreshStats`, `GcStats`), the store `Config` built from the keyword arguments of
//! `Store()` and `Store.open`, the opening of a repository, and `gc`'s options. The
//! `Store` methods themselves (`open`, `save`, `save_as`, `refresh`, `gc`,
//! `version_hash`) are in `store.rs`.

use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use tensor_history::{
    Config, ContentHash, Error, GcOptions, GcStats, OpenFallback, Part, PartStats, PendingSave,
    RefreshStats, SaveStats, Store,
};

use crate::errors::OrPy;

use crate::types::PyVersion;

/// What `write_part` wrote: one writer's part of a version several writers make (its
/// `items`, name and manifest id in hex, go to the coordinator's `commit_parts`).
#[pyclass(frozen, get_all, module = "tensor_history", name = "PartStats")]
#[derive(Clone, Debug)]
pub(crate) struct PyPartStats {
    /// The part: `(name, manifest id in hex)` per tensor, sorted by name.
    items: Vec<(String, String)>,
    /// Chunks written into new packs.
    chunks_written: usize,
    /// Distinct chunks the repository held already.
    chunks_present: usize,
    /// Packs written.
    packs_written: usize,
    /// Manifests written.
    manifests_written: usize,
    /// Bytes of every object written.
    bytes_written: u64,
}

impl From<PartStats> for PyPartStats {
    fn from(s: PartStats) -> Self {
        PyPartStats {
            items: s
                .part
                .items
                .into_iter()
                .map(|(n, id)| (n, id.to_string()))
                .collect(),
            chunks_written: s.chunks_written,
            chunks_present: s.chunks_present,
            packs_written: s.packs_written,
            manifests_written: s.manifests_written,
            bytes_written: s.bytes_written,
        }
    }
}

#[pymethods]
impl PyPartStats {
    fn __repr__(&self) -> String {
        format!(
            "PartStats(items={}, chunks_written={}, chunks_present={}, packs_written={}, \
             manifests_written={}, bytes_written={})",
            self.items.len(),
            self.chunks_written,
            self.chunks_present,
            self.packs_written,
            self.manifests_written,
            self.bytes_written
        )
    }
}

/// Parts from Python: each a list of `(name, manifest id in hex)`.
pub(crate) fn parts_from_py(parts: Vec<Vec<(String, String)>>) -> Result<Vec<Part>, Error> {
    parts
        .into_iter()
        .map(|items| {
            let items = items
                .into_iter()
                .map(|(name, hex)| {
                    let id = hex
                        .parse::<ContentHash>()
                        .map_err(|_| Error::InvalidArgument {
                            reason: format!(
                                "`{hex}` (for `{name}`) is not a 64-digit hex manifest id"
                            ),
                        })?;
                    Ok((name, id))
                })
                .collect::<Result<_, Error>>()?;
            Ok(Part { items })
        })
        .collect()
}

/// What a `save` (or `save_as`) wrote.
#[pyclass(frozen, get_all, module = "tensor_history", name = "SaveStats")]
#[derive(Clone, Debug)]
pub(crate) struct PySaveStats {
    /// Versions new to the repository.
    versions_written: usize,
    /// Chunks written into new packs.
    chunks_written: usize,
    /// Distinct chunks of the new versions that the repository already held.
    chunks_present: usize,
    /// Packs written.
    packs_written: usize,
    /// Manifests (per-tensor objects) written.
    manifests_written: usize,
    /// Ref log entries written.
    refs_written: usize,
    /// Bytes of every object written.
    bytes_written: u64,
    /// Raw bytes of the chunks written into new packs.
    chunk_bytes_raw: u64,
    /// Bytes those chunks take in the packs (coded: byte planes or deltas).
    chunk_bytes_stored: u64,
    /// Of the chunks written, those written in the coded form the memory budget held
    /// them in (not decoded and coded again).
    chunks_written_as_held: usize,
}

impl From<SaveStats> for PySaveStats {
    fn from(s: SaveStats) -> Self {
        PySaveStats {
            versions_written: s.versions_written,
            chunks_written: s.chunks_written,
            chunks_present: s.chunks_present,
            packs_written: s.packs_written,
            manifests_written: s.manifests_written,
            refs_written: s.refs_written,
            bytes_written: s.bytes_written,
            chunk_bytes_raw: s.chunk_bytes_raw,
            chunk_bytes_stored: s.chunk_bytes_stored,
            chunks_written_as_held: s.chunks_written_as_held,
        }
    }
}

#[pymethods]
impl PySaveStats {
    fn __repr__(&self) -> String {
        format!(
            "SaveStats(versions_written={}, chunks_written={}, chunks_present={}, \
             packs_written={}, manifests_written={}, refs_written={}, bytes_written={}, \
             chunk_bytes_raw={}, chunk_bytes_stored={}, chunks_written_as_held={})",
            self.versions_written,
            self.chunks_written,
            self.chunks_present,
            self.packs_written,
            self.manifests_written,
            self.refs_written,
            self.bytes_written,
            self.chunk_bytes_raw,
            self.chunk_bytes_stored,
            self.chunks_written_as_held
        )
    }
}

/// A save running on a writer thread, returned by `Store.save(background=True)`.
#[pyclass(frozen, module = "tensor_history", name = "PendingSave")]
pub(crate) struct PyPendingSave {
    state: Mutex<Pending>,
}

enum Pending {
    Running(PendingSave),
    Ended(Result<SaveStats, Error>),
}

impl PyPendingSave {
    pub(crate) fn new(p: PendingSave) -> PyPendingSave {
        PyPendingSave {
            state: Mutex::new(Pending::Running(p)),
        }
    }
}

#[pymethods]
impl PyPendingSave {
    /// Block until the save ended (GIL released) and return its `SaveStats`, or raise its
    /// error (`StorageError`, `BranchMoved`, ...). Waiting again gives the same outcome.
    fn wait(&self, py: Python<'_>) -> PyResult<PySaveStats> {
        let outcome = py.detach(|| {
            let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let ended = match std::mem::replace(&mut *g, Pending::Ended(Ok(SaveStats::default()))) {
                Pending::Running(p) => p.wait(),
                Pending::Ended(r) => r,
            };
            *g = Pending::Ended(ended.clone());
            ended
        });
        outcome.or_py().map(Into::into)
    }

    /// Whether the save ended (`wait()` then returns at once).
    fn done(&self, py: Python<'_>) -> bool {
        py.detach(
            || match &*self.state.lock().unwrap_or_else(PoisonError::into_inner) {
                Pending::Running(p) => p.is_finished(),
                Pending::Ended(_) => true,
            },
        )
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "PendingSave(done={})",
            if self.done(py) { "True" } else { "False" }
        )
    }
}

/// What a `refresh` took in from the repository.
#[pyclass(frozen, get_all, module = "tensor_history", name = "RefreshStats")]
#[derive(Clone, Debug)]
pub(crate) struct PyRefreshStats {
    /// Versions new to this store.
    versions_loaded: usize,
    /// Refs moved, created or deleted to match the repository.
    refs_updated: Vec<String>,
    /// Branches moved both here and in the repository (this store keeps its own).
    diverged: Vec<String>,
    /// For each diverged branch, the repository's version (loaded here), or `None` if
    /// the repository deleted it.
    theirs: std::collections::BTreeMap<String, Option<PyVersion>>,
}

impl From<RefreshStats> for PyRefreshStats {
    fn from(s: RefreshStats) -> Self {
        PyRefreshStats {
            versions_loaded: s.versions_loaded,
            refs_updated: s.refs_updated,
            diverged: s.diverged,
            theirs: s
                .theirs
                .into_iter()
                .map(|(name, v)| (name, v.map(PyVersion::from)))
                .collect(),
        }
    }
}

#[pymethods]
impl PyRefreshStats {
    fn __repr__(&self) -> String {
        format!(
            "RefreshStats(versions_loaded={}, refs_updated={:?}, diverged={:?}, theirs={{{}}})",
            self.versions_loaded,
            self.refs_updated,
            self.diverged,
            self.theirs
                .iter()
                .map(|(name, v)| match v {
                    Some(v) => format!("{name:?}: Version({})", v.id),
                    None => format!("{name:?}: None"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Where `Store.open` started at an older version because HEAD's did not read (the
/// store's `open_fallback`): HEAD is detached at `opened_at`; the branch still points at
/// `wanted`, which raises `CorruptObject` when read.
#[pyclass(frozen, get_all, module = "tensor_history", name = "OpenFallback")]
#[derive(Clone, Debug)]
pub(crate) struct PyOpenFallback {
    /// The branch HEAD was attached to in the repository (`None`: it was detached).
    branch: Option<String>,
    /// HEAD's version, which does not read.
    wanted: PyVersion,
    /// The version the store started at.
    opened_at: PyVersion,
    /// The error reading `wanted` gave.
    error: String,
}

impl From<&OpenFallback> for PyOpenFallback {
    fn from(f: &OpenFallback) -> Self {
        PyOpenFallback {
            branch: f.branch.clone(),
            wanted: f.wanted.into(),
            opened_at: f.opened_at.into(),
            error: f.error.clone(),
        }
    }
}

impl PyOpenFallback {
    /// The warning `Store.open` gives.
    pub(crate) fn message(&self, location: &str) -> String {
        let head = match &self.branch {
            Some(b) => format!("branch `{b}` at version {}", self.wanted.id),
            None => format!("the detached HEAD at version {}", self.wanted.id),
        };
        format!(
            "the repository at `{location}`: {head} does not read ({}); the store opened \
             detached at version {}, an older one (see Store.open_fallback)",
            self.error, self.opened_at.id
        )
    }
}

#[pymethods]
impl PyOpenFallback {
    fn __repr__(&self) -> String {
        format!(
            "OpenFallback(branch={:?}, wanted=Version({}), opened_at=Version({}), error={:?})",
            self.branch, self.wanted.id, self.opened_at.id, self.error
        )
    }
}

/// What a `gc` found and did (or, with `dry_run`, would do).
#[pyclass(frozen, get_all, module = "tensor_history", name = "GcStats")]
#[derive(Clone, Debug)]
pub(crate) struct PyGcStats {
    /// Versions reachable from the saved refs and HEAD.
    versions_live: usize,
    /// Chunks those versions hold.
    chunks_live: usize,
    /// Objects recorded as unreferenced by this run (deleted by a run `grace` later).
    candidates_recorded: usize,
    /// Objects deleted.
    objects_deleted: usize,
    /// Bytes of the objects deleted.
    bytes_deleted: u64,
    /// Packs rewritten: mostly-dead ones with only their live chunks, and (with
    /// `rebase`) those whose chunks were re-based.
    packs_rewritten: usize,
    /// Chunks stored whole that were written again as deltas (`rebase`).
    chunks_rebased: usize,
    /// Chunks of live versions coded again because their delta chains needed chunks
    /// that only pruned versions hold (`unchain`).
    chunks_unchained: usize,
    /// Bytes of the packs rewritten, before and after.
    rewritten_bytes_before: u64,
    /// Bytes of the packs written for them.
    rewritten_bytes_after: u64,
    /// Index files replaced by one listing what they listed (more than 8 were found;
    /// counted in `objects_deleted` too).
    indexes_merged: usize,
}

impl From<GcStats> for PyGcStats {
    fn from(s: GcStats) -> Self {
        PyGcStats {
            versions_live: s.versions_live,
            chunks_live: s.chunks_live,
            candidates_recorded: s.candidates_recorded,
            objects_deleted: s.objects_deleted,
            bytes_deleted: s.bytes_deleted,
            packs_rewritten: s.packs_rewritten,
            chunks_rebased: s.chunks_rebased,
            chunks_unchained: s.chunks_unchained,
            rewritten_bytes_before: s.rewritten_bytes_before,
            rewritten_bytes_after: s.rewritten_bytes_after,
            indexes_merged: s.indexes_merged,
        }
    }
}

#[pymethods]
impl PyGcStats {
    fn __repr__(&self) -> String {
        format!(
            "GcStats(versions_live={}, chunks_live={}, candidates_recorded={}, \
             objects_deleted={}, bytes_deleted={}, packs_rewritten={}, chunks_rebased={}, \
             chunks_unchained={})",
            self.versions_live,
            self.chunks_live,
            self.candidates_recorded,
            self.objects_deleted,
            self.bytes_deleted,
            self.packs_rewritten,
            self.chunks_rebased,
            self.chunks_unchained
        )
    }
}

/// A store `Config` from the keyword arguments of `Store()` and `Store.open`.
pub(crate) fn config(
    chunk_bytes: Option<usize>,
    max_versions: Option<usize>,
    recycle_bytes: Option<usize>,
    memory_budget: Option<usize>,
) -> Config {
    let mut c = Config {
        memory_budget,
        ..Config::default()
    };
    if let Some(b) = chunk_bytes {
        c.chunk_bytes = b;
    }
    c.max_versions = max_versions;
    if let Some(r) = recycle_bytes {
        c.recycle_bytes = r;
    }
    c
}

/// Open the repository at `path`, creating it if absent when `create` says so.
pub(crate) fn open(path: &Path, config: Config, create: bool) -> Result<Store, Error> {
    if create {
        Store::open_with(path, config)
    } else {
        Store::open_existing(path, config)
    }
}

/// `GcOptions` from `gc`'s keyword arguments: `grace` in seconds (>= 0, finite),
/// `repack_below` in [0, 1], `delete_within` in seconds (> 0, finite).
pub(crate) fn gc_options(
    grace: Option<f64>,
    repack_below: Option<f64>,
    dry_run: bool,
    delete_within: Option<f64>,
    rebase: bool,
    unchain: bool,
) -> Result<GcOptions, Error> {
    let mut o = GcOptions::default();
    o.dry_run = dry_run;
    o.rebase = rebase;
    o.unchain = unchain;
    if let Some(g) = grace {
        o.grace = Duration::try_from_secs_f64(g).map_err(|_| Error::InvalidArgument {
            reason: format!("grace must be a finite number of seconds >= 0, not {g}"),
        })?;
    }
    if let Some(d) = delete_within {
        o.delete_within = Duration::try_from_secs_f64(d)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| Error::InvalidArgument {
                reason: format!("delete_within must be a finite number of seconds > 0, not {d}"),
            })?;
    }
    if let Some(r) = repack_below {
        if !(0.0..=1.0).contains(&r) {
            return Err(Error::InvalidArgument {
                reason: format!("repack_below must be in [0, 1], not {r}"),
            });
        }
        o.repack_below = r;
    }
    Ok(o)
}
