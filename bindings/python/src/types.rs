//! Small value types handed to Python: versions, refs, statistics, log entries, diffs.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tensor_history::{Diff, Meta, PruneStats, Stats, Value, VarDiff, VersionId, WriteStats};

/// A version of the history (`v12`): hashable, ordered, usable wherever a ref is taken.
#[pyclass(frozen, eq, ord, hash, module = "tensor_history", name = "Version")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PyVersion {
    pub(crate) id: u64,
}

impl From<VersionId> for PyVersion {
    fn from(v: VersionId) -> Self {
        PyVersion { id: v.0 }
    }
}

impl From<PyVersion> for VersionId {
    fn from(v: PyVersion) -> Self {
        VersionId(v.id)
    }
}

#[pymethods]
impl PyVersion {
    #[new]
    fn new(id: u64) -> Self {
        PyVersion { id }
    }

    /// The numeric id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    fn __int__(&self) -> u64 {
        self.id
    }

    fn __index__(&self) -> u64 {
        self.id
    }

    fn __repr__(&self) -> String {
        format!("Version({})", self.id)
    }

    fn __str__(&self) -> String {
        format!("v{}", self.id)
    }

    /// Pickled as `Version(id)`, so versions (and the errors that carry them) cross
    /// process boundaries (`multiprocessing`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> (Bound<'py, pyo3::types::PyType>, (u64,)) {
        (slf.get_type(), (slf.get().id,))
    }
}

/// A ref as Python gives it: a `Version` or a name (branch, tag, `HEAD`, `v12`).
#[derive(Clone, Debug)]
pub(crate) enum RefArg {
    Id(VersionId),
    Name(String),
}

impl<'a, 'py> FromPyObject<'a, 'py> for RefArg {
    type Error = PyErr;

    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(v) = ob.cast::<PyVersion>() {
            return Ok(RefArg::Id(v.get().to_owned().into()));
        }
        if let Ok(s) = ob.cast::<PyString>() {
            return Ok(RefArg::Name(s.to_str()?.to_owned()));
        }
        Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "a ref is a Version or a str, not {}",
            ob.get_type().name()?
        )))
    }
}

impl RefArg {
    /// The version this ref names in `store`.
    pub(crate) fn resolve(
        &self,
        store: &tensor_history::Store,
    ) -> tensor_history::Result<VersionId> {
        match self {
            RefArg::Id(id) => store.snapshot(*id).map(|_| *id),
            RefArg::Name(n) => store.resolve(n),
        }
    }
}

/// What a write (or a write-back into an array) changed.
#[pyclass(frozen, get_all, module = "tensor_history", name = "WriteStats")]
#[derive(Clone, Debug)]
pub(crate) struct PyWriteStats {
    /// Chunks whose bytes changed and were copied.
    chunks_changed: usize,
    /// Chunks in the tensor.
    chunks_total: usize,
    /// Bytes copied.
    bytes_copied: usize,
}

impl From<WriteStats> for PyWriteStats {
    fn from(s: WriteStats) -> Self {
        PyWriteStats {
            chunks_changed: s.chunks_changed,
            chunks_total: s.chunks_total,
            bytes_copied: s.bytes_copied,
        }
    }
}

#[pymethods]
impl PyWriteStats {
    fn __repr__(&self) -> String {
        format!(
            "WriteStats(chunks_changed={}, chunks_total={}, bytes_copied={})",
            self.chunks_changed, self.chunks_total, self.bytes_copied
        )
    }
}

/// What a store holds against what deep copies would hold.
#[pyclass(frozen, get_all, module = "tensor_history", name = "Stats")]
#[derive(Clone, Debug)]
pub(crate) struct PyStats {
    /// Live versions.
    versions: usize,
    /// Variables in the working state.
    variables: usize,
    /// Distinct chunks held by the working state and every live version.
    unique_chunks: usize,
    /// Bytes of those chunks: the tensor data actually held (raw size).
    unique_bytes: usize,
    /// What one deep copy of every live version would hold, plus one of the working state
    /// when it has uncommitted changes.
    logical_bytes: usize,
    /// `logical_bytes / unique_bytes` (1.0 when nothing is held).
    sharing_ratio: f64,
    /// Freed chunk buffers kept for reuse (not counted in `unique_bytes`).
    pooled_bytes: usize,
    /// Memory the chunks' buffers hold: raw chunks on the heap, the encoded forms of
    /// chunks held encoded and what they keep alive. Chunks in a repository count
    /// nothing. This is what `memory_budget` bounds.
    held_bytes: usize,
    /// Of `unique_bytes`, the raw bytes of chunks held encoded in memory.
    encoded_bytes: usize,
    /// Memory the encoded chunks hold (part of `held_bytes`); `encoded_bytes /
    /// encoded_held_bytes` is what encoding saves.
    encoded_held_bytes: usize,
    /// Of `unique_bytes`, the raw bytes of chunks that live in a repository (read from
    /// it on use, not on the heap).
    stored_bytes: usize,
    /// Bytes the chunks of `stored_bytes` take in the repository's packs (byte planes,
    /// deltas); `stored_bytes / stored_pack_bytes` is what the repository's encoding saves.
    stored_pack_bytes: usize,
}

impl From<Stats> for PyStats {
    fn from(s: Stats) -> Self {
        PyStats {
            versions: s.versions,
            variables: s.variables,
            unique_chunks: s.unique_chunks,
            unique_bytes: s.unique_bytes,
            logical_bytes: s.logical_bytes,
            sharing_ratio: s.sharing_ratio,
            pooled_bytes: s.pooled_bytes,
            held_bytes: s.held_bytes,
            encoded_bytes: s.encoded_bytes,
            encoded_held_bytes: s.encoded_held_bytes,
            stored_bytes: s.stored_bytes,
            stored_pack_bytes: s.stored_pack_bytes,
        }
    }
}

#[pymethods]
impl PyStats {
    fn __repr__(&self) -> String {
        format!(
            "Stats(versions={}, variables={}, unique_chunks={}, unique_bytes={}, logical_bytes={}, sharing_ratio={:.2}, pooled_bytes={}, held_bytes={}, encoded_bytes={}, encoded_held_bytes={}, stored_bytes={}, stored_pack_bytes={})",
            self.versions,
            self.variables,
            self.unique_chunks,
            self.unique_bytes,
            self.logical_bytes,
            self.sharing_ratio,
            self.pooled_bytes,
            self.held_bytes,
            self.encoded_bytes,
            self.encoded_held_bytes,
            self.stored_bytes,
            self.stored_pack_bytes
        )
    }
}

/// What `prune` dropped.
#[pyclass(frozen, get_all, module = "tensor_history", name = "PruneStats")]
#[derive(Clone, Debug)]
pub(crate) struct PyPruneStats {
    /// The versions dropped, oldest first.
    dropped: Vec<PyVersion>,
    /// Live versions left.
    kept: usize,
    /// Unique chunk bytes held before pruning (`Stats.unique_bytes`).
    bytes_before: usize,
    /// Unique chunk bytes held after pruning.
    bytes_after: usize,
}

impl From<PruneStats> for PyPruneStats {
    fn from(s: PruneStats) -> Self {
        PyPruneStats {
            dropped: s.dropped.into_iter().map(PyVersion::from).collect(),
            kept: s.kept,
            bytes_before: s.bytes_before,
            bytes_after: s.bytes_after,
        }
    }
}

#[pymethods]
impl PyPruneStats {
    fn __repr__(&self) -> String {
        format!(
            "PruneStats(dropped={}, kept={}, bytes_before={}, bytes_after={})",
            self.dropped.len(),
            self.kept,
            self.bytes_before,
            self.bytes_after
        )
    }
}

/// Version metadata from `commit`'s keyword arguments (bool, int, float, str; NumPy's
/// `bool_` and integer scalars stay a bool and an int).
pub(crate) fn meta_from_py(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Meta> {
    let mut meta = Meta::new();
    let Some(kwargs) = kwargs else {
        return Ok(meta);
    };
    let np = kwargs.py().import("numpy")?;
    let (np_bool, np_int) = (np.getattr("bool_")?, np.getattr("integer")?);
    for (k, v) in kwargs.iter() {
        let key: String = k.extract()?;
        let int = |v: &Bound<'_, PyAny>| -> PyResult<Value> {
            Ok(Value::Int(v.extract::<i64>().map_err(|_| {
                crate::errors::invalid_argument(&format!(
                    "metadata `{key}` does not fit in 64 bits"
                ))
            })?))
        };
        let value = if let Ok(b) = v.cast::<pyo3::types::PyBool>() {
            Value::Bool(b.is_true())
        } else if v.is_instance(&np_bool)? {
            Value::Bool(v.is_truthy()?)
        } else if v.cast::<pyo3::types::PyInt>().is_ok() {
            int(&v)?
        } else if v.is_instance(&np_int)? {
            int(&v.call_method0("__index__")?)?
        } else if let Ok(s) = v.cast::<PyString>() {
            Value::Str(s.to_str()?.to_owned())
        } else if let Ok(f) = v.extract::<f64>() {
            Value::Float(f)
        } else {
            return Err(crate::errors::invalid_argument(&format!(
                "metadata `{key}` must be a bool, int, float or str, not {}",
                v.get_type().name()?
            )));
        };
        meta.insert(&key, value);
    }
    Ok(meta)
}

/// A version's metadata as a dict.
pub(crate) fn meta_dict<'py>(py: Python<'py>, m: &Meta) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in m.iter() {
        match v {
            Value::Int(i) => d.set_item(k, i)?,
            Value::Float(f) => d.set_item(k, f)?,
            Value::Str(s) => d.set_item(k, s)?,
            Value::Bool(b) => d.set_item(k, b)?,
        }
    }
    Ok(d)
}

/// One entry of `Store.log()`.
#[pyclass(frozen, get_all, module = "tensor_history", name = "LogEntry")]
#[derive(Debug)]
pub(crate) struct PyLogEntry {
    /// The version.
    pub(crate) id: PyVersion,
    /// Its commit message.
    pub(crate) message: String,
    /// Commit time, seconds since the Unix epoch.
    pub(crate) time: f64,
    /// Its parents (two for a merge).
    pub(crate) parents: Vec<PyVersion>,
    /// Keyword arguments given to `commit`.
    pub(crate) metadata: Py<PyDict>,
}

#[pymethods]
impl PyLogEntry {
    fn __repr__(&self) -> String {
        format!("LogEntry(id=v{}, message={:?})", self.id.id, self.message)
    }
}

/// How one variable differs between two states.
#[pyclass(frozen, get_all, module = "tensor_history", name = "Change")]
#[derive(Clone, Debug)]
pub(crate) struct PyChange {
    /// `"added"`, `"removed"`, `"changed"` or `"unchanged"`.
    kind: &'static str,
    /// Indices of the changed chunks.
    chunks: Vec<usize>,
    /// Flat element ranges of the changed chunks, as `(start, stop)`.
    elements: Vec<(usize, usize)>,
    /// Bytes in the changed chunks.
    bytes: usize,
    /// Whether dtype, shape or chunk size differ.
    layout_changed: bool,
}

#[pymethods]
impl PyChange {
    fn __repr__(&self) -> String {
        match self.kind {
            "changed" => format!(
                "Change(changed, chunks={}, bytes={})",
                self.chunks.len(),
                self.bytes
            ),
            k => format!("Change({k})"),
        }
    }
}

/// `{name: Change}` for every variable of either state, sorted by name.
pub(crate) fn diff_dict<'py>(py: Python<'py>, d: Diff) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (name, v) in d.vars {
        let c = match v {
            VarDiff::Added => change("added"),
            VarDiff::Removed => change("removed"),
            VarDiff::Unchanged => change("unchanged"),
            VarDiff::Changed(t) => PyChange {
                kind: "changed",
                chunks: t.chunks,
                elements: t.elements.into_iter().map(|r| (r.start, r.end)).collect(),
                bytes: t.bytes,
                layout_changed: t.layout_changed,
            },
        };
        out.set_item(name, Py::new(py, c)?)?;
    }
    Ok(out)
}

fn change(kind: &'static str) -> PyChange {
    PyChange {
        kind,
        chunks: Vec::new(),
        elements: Vec::new(),
        bytes: 0,
        layout_changed: false,
    }
}

/// One row of `Store.log()`: id, message, time (seconds since the epoch), parents and
/// metadata.
pub(crate) type LogRow = (VersionId, String, f64, Vec<VersionId>, Meta);

/// `ref` (default HEAD; nothing before the first commit) and its ancestors, newest first.
pub(crate) fn log_rows(
    s: &tensor_history::Store,
    r: Option<&RefArg>,
) -> tensor_history::Result<Vec<LogRow>> {
    let start = match r {
        Some(r) => r.resolve(s)?,
        None => match s.head() {
            Some(h) => h,
            None => return Ok(Vec::new()),
        },
    };
    let mut rows = Vec::new();
    for id in s.log(start)? {
        let snap = s.snapshot(id)?;
        let time = snap
            .time()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        rows.push((
            id,
            snap.message().to_owned(),
            time,
            s.parents(id)?,
            snap.metadata().clone(),
        ));
    }
    Ok(rows)
}
