//! Core errors as Python exceptions: one class per error kind, defined in
//! `tensor_history/_errors.py` (so they can subclass `KeyError`, `TypeError`, ... next to
//! the package's base class), each with the error's fields as attributes.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::IntoPyObjectExt;
use tensor_history::Error;

use crate::types::PyVersion;

/// Build an instance of `tensor_history._errors.<class>` with `message` and attributes.
fn make(class: &str, message: String, attrs: Vec<(&str, Py<PyAny>)>) -> PyErr {
    Python::attach(|py| {
        let build = || -> PyResult<PyErr> {
            let cls = py.import("tensor_history._errors")?.getattr(class)?;
            let kw = PyDict::new(py);
            for (k, v) in attrs {
                kw.set_item(k, v)?;
            }
            Ok(PyErr::from_value(cls.call((message,), Some(&kw))?))
        };
        build().unwrap_or_else(|e| e)
    })
}

fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> Py<PyAny> {
    v.into_py_any(py).unwrap_or_else(|_| py.None())
}

/// The Python exception for a core error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    Python::attach(|py| {
        let ver = |id: tensor_history::VersionId| obj(py, PyVersion::from(id));
        let (class, attrs): (&str, Vec<(&str, Py<PyAny>)>) = match e {
            Error::UnknownVariable { name } => ("UnknownVariable", vec![("name", obj(py, name))]),
            Error::VariableExists { name } => ("VariableExists", vec![("name", obj(py, name))]),
            Error::DTypeMismatch {
                name,
                expected,
                found,
            } => (
                "DTypeMismatch",
                vec![
                    ("name", obj(py, name)),
                    ("expected", obj(py, expected.name())),
                    ("found", obj(py, found.name())),
                ],
            ),
            Error::ShapeMismatch {
                name,
                expected,
                found,
            } => (
                "ShapeMismatch",
                vec![
                    ("name", obj(py, name)),
                    ("expected", obj(py, PyTuple::new(py, expected).ok())),
                    ("found", obj(py, PyTuple::new(py, found).ok())),
                ],
            ),
            Error::RangeOutOfBounds { name, range, len } => (
                "RangeOutOfBounds",
                vec![
                    ("name", obj(py, name)),
                    ("start", obj(py, range.start)),
                    ("stop", obj(py, range.end)),
                    ("len", obj(py, len)),
                ],
            ),
            Error::NotRowAligned { row_bytes } => {
                ("NotRowAligned", vec![("row_bytes", obj(py, row_bytes))])
            }
            Error::InvalidConfig { reason } => ("InvalidConfig", vec![("reason", obj(py, reason))]),
            Error::InvalidHash { text } => ("InvalidHash", vec![("text", obj(py, text))]),
            Error::UnknownVersion { id } => ("UnknownVersion", vec![("id", ver(id))]),
            Error::PrunedVersion { id } => ("PrunedVersion", vec![("id", ver(id))]),
            Error::UnknownRef { name } => ("UnknownRef", vec![("name", obj(py, name))]),
            Error::RefExists { name } => ("RefExists", vec![("name", obj(py, name))]),
            Error::InvalidRefName { name } => ("InvalidRefName", vec![("name", obj(py, name))]),
            Error::RefNameTooLong { name, bytes, max } => (
                "InvalidRefName",
                vec![
                    ("name", obj(py, name)),
                    ("bytes", obj(py, bytes)),
                    ("max", obj(py, max)),
                ],
            ),
            Error::WrongRefKind { name, expected } => (
                "WrongRefKind",
                vec![
                    ("name", obj(py, name)),
                    ("expected", obj(py, expected.name())),
                ],
            ),
            Error::BranchCheckedOut { name } => ("BranchCheckedOut", vec![("name", obj(py, name))]),
            Error::NoCommits => ("NoCommits", vec![]),
            Error::UncommittedChanges => ("UncommittedChanges", vec![]),
            Error::NothingToUndo => ("NothingToUndo", vec![]),
            Error::NothingToRedo => ("NothingToRedo", vec![]),
            Error::MergeConflict { conflicts } => {
                let list: Vec<(String, Option<Vec<usize>>)> = conflicts
                    .into_iter()
                    .map(|c| (c.variable, c.chunks))
                    .collect();
                ("MergeConflict", vec![("conflicts", obj(py, list))])
            }
            Error::UnsupportedDType {
                name,
                dtype,
                operation,
            } => (
                "UnsupportedDType",
                vec![
                    ("name", obj(py, name)),
                    ("dtype", obj(py, dtype.name())),
                    ("operation", obj(py, operation)),
                ],
            ),
            Error::InvalidArgument { reason } => {
                ("InvalidArgument", vec![("reason", obj(py, reason))])
            }
            Error::Io {
                path,
                kind,
                message,
            } => (
                "StorageError",
                vec![
                    ("path", obj(py, path)),
                    ("kind", obj(py, format!("{kind:?}"))),
                    ("message", obj(py, message)),
                ],
            ),
            Error::UnsupportedFormat { path, found } => (
                "UnsupportedFormat",
                vec![("path", obj(py, path)), ("found", obj(py, found))],
            ),
            Error::BranchMoved { branch, theirs } => (
                "BranchMoved",
                vec![
                    ("branch", obj(py, branch)),
                    ("theirs", obj(py, theirs.map(|h| h.to_string()))),
                ],
            ),
            Error::InvalidSafeTensors { path, reason } => (
                "InvalidSafeTensors",
                vec![("path", obj(py, path)), ("reason", obj(py, reason))],
            ),
            Error::UnsupportedSafeTensorsDType { path, name, dtype } => (
                "UnsupportedDType",
                vec![
                    ("path", obj(py, path)),
                    ("name", obj(py, name)),
                    ("dtype", obj(py, dtype)),
                    ("operation", obj(py, "import_safetensors")),
                ],
            ),
            Error::Corrupt { reason } => ("Corrupt", vec![("reason", obj(py, reason))]),
            Error::Internal { reason } => ("InternalError", vec![("reason", obj(py, reason))]),
            Error::CorruptObject { path, reason } => (
                "CorruptObject",
                vec![("path", obj(py, path)), ("reason", obj(py, reason))],
            ),
            Error::AmbiguousRef { prefix, matches } => (
                "AmbiguousRef",
                vec![("prefix", obj(py, prefix)), ("matches", obj(py, matches))],
            ),
            Error::TooLarge { shape, dtype } => (
                "TooLarge",
                vec![
                    ("shape", obj(py, PyTuple::new(py, shape).ok())),
                    ("dtype", obj(py, dtype.name())),
                ],
            ),
            Error::OtherHistory {
                location,
                branch,
                theirs,
            } => (
                "OtherHistory",
                vec![
                    ("location", obj(py, location)),
                    ("branch", obj(py, branch)),
                    ("theirs", obj(py, theirs.map(|h| h.to_string()))),
                ],
            ),
            Error::NoRepository { location } => {
                ("NoRepository", vec![("location", obj(py, location))])
            }
            Error::RepositoryReplaced { location, reason } => (
                "RepositoryReplaced",
                vec![("location", obj(py, location)), ("reason", obj(py, reason))],
            ),
            Error::TooManyDims { name, dims, max } => (
                "TooManyDims",
                vec![
                    ("name", obj(py, name)),
                    ("dims", obj(py, dims)),
                    ("max", obj(py, max)),
                ],
            ),
            other => (
                "TensorHistoryError",
                vec![("detail", obj(py, format!("{other:?}")))],
            ),
        };
        make(class, msg, attrs)
    })
}

/// `InvalidArgument` raised by the bindings themselves (a read-only output array, ...).
pub(crate) fn invalid_argument(reason: &str) -> PyErr {
    to_py(Error::InvalidArgument {
        reason: reason.to_owned(),
    })
}

/// `UnsupportedDType` for a NumPy dtype the store has no element type for.
pub(crate) fn unsupported_dtype(name: &str, dtype: &str) -> PyErr {
    make(
        "UnsupportedDType",
        format!(
            "NumPy dtype {dtype} is not supported (variable `{name}`); use float16/32/64, \
             bfloat16, int8-64 or uint8-64{}",
            if dtype == "|b1" {
                " (store a bool array as uint8: `a.view(np.uint8)`)"
            } else {
                ""
            }
        ),
        Python::attach(|py| {
            vec![
                ("name", obj(py, name)),
                ("dtype", obj(py, dtype)),
                ("operation", obj(py, "store")),
            ]
        }),
    )
}

/// `StoreClosed`: a call on a store after its `close()`.
pub(crate) fn store_closed() -> PyErr {
    make(
        "StoreClosed",
        "the store is closed (close() or the end of its with block); open it again".to_owned(),
        Vec::new(),
    )
}

/// `Result<T, Error>` into `PyResult<T>`.
pub(crate) trait OrPy<T> {
    fn or_py(self) -> PyResult<T>;
}

impl<T> OrPy<T> for Result<T, Error> {
    fn or_py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// A core result from a store call that may also have found the store closed.
impl<T> OrPy<T> for PyResult<Result<T, Error>> {
    fn or_py(self) -> PyResult<T> {
        self?.map_err(to_py)
    }
}
