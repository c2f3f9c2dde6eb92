//! Python bindings of tensor-history: the extension module `tensor_history._core`.
//!
//! The pure-Python package `tensor_history` (under `python/`) re-exports these classes
//! and adds the PyTorch tracker. NumPy arrays come in with any layout and go out as
//! copies; restores can write into the caller's arrays, only where chunks differ.

#![deny(unsafe_code)]

mod arrays;
mod errors;
mod persist;
mod snapshot;
mod store;
mod types;
mod writeback;

use pyo3::prelude::*;

/// The compiled core of the `tensor_history` package.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::PyStore>()?;
    m.add_class::<snapshot::PySnapshot>()?;
    m.add_class::<types::PyVersion>()?;
    m.add_class::<types::PyWriteStats>()?;
    m.add_class::<types::PyStats>()?;
    m.add_class::<types::PyPruneStats>()?;
    m.add_class::<types::PyLogEntry>()?;
    m.add_class::<types::PyChange>()?;
    m.add_class::<persist::PySaveStats>()?;
    m.add_class::<persist::PyPartStats>()?;
    m.add_class::<persist::PyPendingSave>()?;
    m.add_class::<persist::PyRefreshStats>()?;
    m.add_class::<persist::PyOpenFallback>()?;
    m.add_class::<persist::PyGcStats>()?;
    m.add("DEFAULT_CHUNK_BYTES", tensor_history::DEFAULT_CHUNK_BYTES)?;
    Ok(())
}
