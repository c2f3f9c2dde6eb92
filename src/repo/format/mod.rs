//! The repository's file formats, one file for each thing encoded: the envelope every
//! binary object shares (`envelope`), the direct reader of its postcard bodies (`wire`),
//! the bodies themselves (`bodies`), object keys (`keys`) and the small JSON files
//! (`json`). Packs have a layout of their own, in `repo/pack.rs`. `docs/FORMAT.md`
//! describes the same in prose.

mod bodies;
mod envelope;
mod json;
mod keys;
mod wire;

pub(crate) use bodies::*;
pub(crate) use envelope::*;
pub(crate) use json::*;
pub(crate) use keys::*;
pub(crate) use wire::*;

use super::backend::{is_not_found, Backend, Bytes};
use crate::error::{Error, Result};

pub(crate) fn corrupt(path: &str, reason: impl Into<String>) -> Error {
    Error::CorruptObject {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Read an object that another object names, turning "not found" into a
/// corrupt-repository error naming it.
pub(crate) fn must_get(backend: &dyn Backend, key: &str) -> Result<Bytes> {
    backend.get(key).map_err(|e| {
        if is_not_found(&e) {
            corrupt(key, "missing (the repository refers to it)")
        } else {
            e
        }
    })
}
