//! Helpers shared by the store's methods: batches of input arrays, `into=` targets and
//! the delta write-back after a restore.

use pyo3::prelude::*;
use pyo3::types::PyAnyMethods;
use tensor_history::{Error, Snapshot, Store, Tensor, VersionId, WriteStats};

use crate::arrays::{self, on_view, ReadGuard, View, ViewMut, WriteGuard};
use crate::errors::OrPy;
use crate::store::{known_snapshot, stats_dict, PyStore, Written};
use crate::types::{PyVersion, RefArg};
use pyo3::types::PyDict;

/// The `(name, array)` pairs of `obj`: a mapping (its `items()`, in its order) or an
/// iterable of pairs; anything else is a `TypeError` that says so. `what` names the
/// argument in the message.
fn pairs<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    let bad = |found: &Bound<'py, PyAny>| {
        let t = found
            .get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string());
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{what} must be a mapping {{name: array}} or a list of (name, array) pairs, not {t}"
        ))
    };
    let items = if obj.hasattr("items")? {
        obj.call_method0("items")?
    } else if obj.cast::<pyo3::types::PyString>().is_ok() {
        return Err(bad(obj));
    } else {
        obj.clone()
    };
    let mut out = Vec::new();
    for item in items.try_iter().map_err(|_| bad(obj))? {
        let item = item?;
        let pair: (String, Bound<'py, PyAny>) = item.extract().map_err(|_| bad(&item))?;
        out.push(pair);
    }
    Ok(out)
}

/// `(name, borrowed array)` pairs from a mapping or a list of pairs, in its order.
pub(crate) fn read_mapping<'py>(
    arrays_obj: &Bound<'py, PyAny>,
) -> PyResult<Vec<(String, ReadGuard<'py>)>> {
    let mut out = Vec::new();
    for (name, arr) in pairs(arrays_obj, "arrays")? {
        let (u, dt) = arrays::input(&arr, &name, None)?;
        out.push((name, arrays::read(&u, dt)?));
    }
    Ok(out)
}

/// An array read later, on another thread, by address (see `Store.commit_later`).
pub(crate) struct RawArray {
    pub(crate) name: String,
    dtype: tensor_history::DType,
    addr: usize,
    shape: Vec<usize>,
}

impl RawArray {
    /// The array as a view.
    ///
    /// # Safety
    ///
    /// The array it was taken from must still be alive, unmoved and unresized.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn view(&self) -> Option<View<'static>> {
        // SAFETY: as the caller promises; the address, dtype and shape were read from a
        // C-contiguous array.
        unsafe { arrays::view_from_raw(self.dtype, self.addr, &self.shape) }
    }
}

/// Every array of a mapping as a [`RawArray`], and the array objects (to keep them alive
/// while they are read). Arrays must be C-contiguous.
pub(crate) fn raw_mapping(
    arrays_obj: &Bound<'_, PyAny>,
) -> PyResult<(Vec<RawArray>, Vec<Py<PyAny>>)> {
    let mut raws = Vec::new();
    let mut keep = Vec::new();
    for (name, arr) in pairs(arrays_obj, "arrays")? {
        let (u, dt) = arrays::input(&arr, &name, None)?;
        let g = arrays::read(&u, dt)?;
        let v = g.view();
        if !v.is_standard_layout() {
            return Err(crate::errors::invalid_argument(&format!(
                "`{name}`: commit_later reads C-contiguous arrays only"
            )));
        }
        raws.push(RawArray {
            name,
            dtype: v.dtype(),
            addr: v.addr(),
            shape: v.shape().to_vec(),
        });
        drop(v);
        drop(g);
        keep.push(u.into_any().unbind());
    }
    Ok((raws, keep))
}

/// `(name, writable borrow)` pairs of an `into=` mapping (`None`: no targets).
pub(crate) fn write_mapping<'py>(
    into: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<(String, WriteGuard<'py>)>> {
    let mut out = Vec::new();
    let Some(into) = into else { return Ok(out) };
    for (name, arr) in pairs(into, "into")? {
        let (g, _) = arrays::output(&arr, &name)?;
        out.push((name, g));
    }
    Ok(out)
}

/// Check every target against the version it will receive: the variable exists there,
/// with the target's dtype and shape.
pub(crate) fn check_targets(
    snap: &Snapshot,
    targets: &[(String, ViewMut<'_>)],
) -> Result<(), Error> {
    for (name, v) in targets {
        let t = snap.tensor(name)?;
        arrays::check_target(name, t, v)?;
    }
    Ok(())
}

/// Write `snap` into the targets, each chunk only where it differs (see
/// [`arrays::write_back`]). Call [`check_targets`] first.
pub(crate) fn write_targets(
    snap: &Snapshot,
    known: Option<&Snapshot>,
    targets: &mut [(String, ViewMut<'_>)],
) -> Result<Vec<(String, WriteStats)>, Error> {
    let mut out = Vec::with_capacity(targets.len());
    for (name, v) in targets.iter_mut() {
        let t = snap.tensor(name)?;
        let k: Option<&Tensor> = known.and_then(|k| k.tensor(name).ok());
        out.push((name.clone(), arrays::write_back(t, v, k)?));
    }
    Ok(out)
}

/// What [`sync_undoable`] replaced: each variable it wrote with its tensor before (`None`
/// for one it inserted).
pub(crate) type Undo = Vec<(String, Option<Tensor>)>;

/// Write (or insert) every array into the working state, all or nothing: on an error the
/// variables touched so far are put back as they were.
pub(crate) fn sync(
    store: &mut Store,
    inputs: &[(String, View<'_>)],
) -> Result<Vec<(String, WriteStats)>, Error> {
    sync_undoable(store, inputs).map(|(out, _)| out)
}

/// [`sync`], also returning what it replaced, for [`undo_sync`].
pub(crate) fn sync_undoable(
    store: &mut Store,
    inputs: &[(String, View<'_>)],
) -> Result<(Vec<(String, WriteStats)>, Undo), Error> {
    let mut undo: Undo = Vec::with_capacity(inputs.len());
    let mut out = Vec::with_capacity(inputs.len());
    for (name, v) in inputs {
        let prev = store.tensor(name).ok().cloned();
        let res = if prev.is_some() {
            on_view!(v, x => store.write(name, x))
        } else {
            on_view!(v, x => store.insert(name, x)).and_then(|()| {
                let t = store.tensor(name)?;
                Ok(WriteStats {
                    chunks_changed: t.num_chunks(),
                    chunks_total: t.num_chunks(),
                    bytes_copied: t.nbytes(),
                })
            })
        };
        match res {
            Ok(s) => {
                undo.push((name.clone(), prev));
                out.push((name.clone(), s));
            }
            Err(e) => {
                undo_sync(store, undo);
                return Err(e);
            }
        }
    }
    Ok((out, undo))
}

/// Put back the variables a sync replaced (removing those it inserted), last first.
pub(crate) fn undo_sync(store: &mut Store, undo: Undo) {
    for (n, old) in undo.into_iter().rev() {
        let _ = store.remove(&n);
        if let Some(t) = old {
            let _ = store.insert_tensor(&n, t);
        }
    }
}

impl PyStore {
    /// Move HEAD with `op` after checking the targets against the version it reaches, then
    /// write that version into the targets. `target` predicts where `op` goes (`None`: not
    /// known in advance; then `rollback` undoes `op` if the targets do not fit).
    pub(crate) fn move_and_write<'py>(
        &self,
        py: Python<'py>,
        into: Option<&Bound<'py, PyAny>>,
        known: Option<RefArg>,
        target: impl FnOnce(&Store) -> Result<Option<VersionId>, Error> + Send,
        op: impl FnOnce(&mut Store) -> Result<VersionId, Error> + Send,
        rollback: impl FnOnce(&mut Store) + Send,
    ) -> PyResult<(PyVersion, Bound<'py, PyDict>)> {
        let mut guards = write_mapping(into)?;
        let mut views: Vec<(String, ViewMut<'_>)> = guards
            .iter_mut()
            .map(|(n, g)| (n.clone(), g.view_mut()))
            .collect();
        let (id, written) = self
            .run(py, |inner| -> Result<(VersionId, Written), Error> {
                let s = &mut inner.store;
                let known = known_snapshot(s, &known)?;
                if views.is_empty() {
                    return Ok((op(s)?, Vec::new()));
                }
                let predicted = target(s)?;
                if let Some(t) = predicted {
                    check_targets(&s.snapshot(t)?, &views)?;
                }
                let id = op(s)?;
                let snap = s.snapshot(id)?;
                if predicted.is_none() {
                    if let Err(e) = check_targets(&snap, &views) {
                        rollback(s);
                        return Err(e);
                    }
                }
                let written = write_targets(&snap, known.as_ref(), &mut views)?;
                Ok((id, written))
            })
            .or_py()?;
        Ok((id.into(), stats_dict(py, written)?))
    }
}
