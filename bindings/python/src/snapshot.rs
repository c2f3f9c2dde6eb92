//! `Snapshot`: a read-only mapping of one version's variables.

use std::time::UNIX_EPOCH;

use pyo3::prelude::*;
use tensor_history::Snapshot;

use crate::arrays;
use crate::errors::OrPy;
use crate::types::PyVersion;

/// A read-only handle to one version (or to the working state as it was). It stays valid
/// after the store moves on, prunes the version, or is dropped. Indexing returns a copy.
#[pyclass(frozen, module = "tensor_history", name = "Snapshot", mapping)]
pub(crate) struct PySnapshot {
    pub(crate) inner: Snapshot,
}

#[pymethods]
impl PySnapshot {
    /// The version, or `None` for a snapshot of the working state.
    #[getter]
    fn id(&self) -> Option<PyVersion> {
        self.inner.id().map(PyVersion::from)
    }

    /// The commit message (empty for the working state).
    #[getter]
    fn message(&self) -> String {
        self.inner.message().to_owned()
    }

    /// Commit time in seconds since the Unix epoch (`None` for the working state).
    #[getter]
    fn time(&self) -> Option<f64> {
        self.inner
            .time()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64())
    }

    /// Bytes of tensor data this snapshot shows (as a deep copy would hold them).
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// Variable names, sorted.
    fn keys(&self) -> Vec<String> {
        self.inner.names()
    }

    /// `(dtype, shape)` of variable `name`, dtype as `"f32"`, `"bf16"`, ...; reads no
    /// tensor data (a version of a repository keeps its chunks unread).
    fn info(&self, name: &str) -> PyResult<(String, Vec<usize>)> {
        self.inner
            .layout(name)
            .map(|(dtype, shape)| (dtype.name().to_owned(), shape.to_vec()))
            .or_py()
    }

    /// A copy of variable `name`, or `default` if there is none.
    #[pyo3(signature = (name, default = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if !self.inner.contains(name) {
            return Ok(default.unwrap_or_else(|| py.None().into_bound(py)));
        }
        self.__getitem__(py, name)
    }

    /// The content hash (BLAKE3 Merkle root over every tensor), 64 hex digits. Hashes
    /// chunks not hashed yet, in parallel, without the GIL.
    fn content_hash(&self, py: Python<'_>) -> String {
        let s = &self.inner;
        py.detach(|| s.content_hash().to_string())
    }

    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let s = &self.inner;
        let owned = py
            .detach(|| s.tensor(name).and_then(arrays::to_owned))
            .or_py()?;
        Ok(owned.into_py(py))
    }

    fn __contains__(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn __len__(&self) -> usize {
        self.inner.names().len()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let names = pyo3::types::PyList::new(py, self.inner.names())?;
        names.try_iter().map(|i| i.into_any())
    }

    fn __repr__(&self) -> String {
        match self.inner.id() {
            Some(id) => format!("Snapshot({id}, {} variables)", self.inner.names().len()),
            None => format!("Snapshot(working, {} variables)", self.inner.names().len()),
        }
    }
}
