//! Snapshots: read-only handles to one version's variables.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use ndarray::ArrayD;

use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::Vars;
use crate::meta::Meta;
use crate::tensor::Tensor;
use crate::version::VersionId;

/// A read-only handle to the variables of one version.
///
/// # Sharing
///
/// It owns `Arc`s to the version's tensors, so it stays valid after the store moves on,
/// prunes the version, or is dropped, and it can be sent to other threads (`Send + Sync`).
/// `clone` is O(1).
#[derive(Clone)]
pub struct Snapshot {
    id: Option<VersionId>,
    message: Arc<str>,
    meta: Arc<Meta>,
    time: Option<SystemTime>,
    vars: Vars,
}

impl Snapshot {
    pub(crate) fn new(
        id: Option<VersionId>,
        message: Arc<str>,
        meta: Arc<Meta>,
        time: Option<SystemTime>,
        vars: Vars,
    ) -> Snapshot {
        Snapshot {
            id,
            message,
            meta,
            time,
            vars,
        }
    }

    /// The version this snapshot shows (`None` for a snapshot of the working state).
    #[must_use]
    pub fn id(&self) -> Option<VersionId> {
        self.id
    }

    /// The commit message.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The metadata recorded with the version (empty for the working state). O(1).
    #[must_use]
    pub fn metadata(&self) -> &Meta {
        &self.meta
    }

    /// When the version was committed.
    #[must_use]
    pub fn time(&self) -> Option<SystemTime> {
        self.time
    }

    /// Variable names, sorted. O(variables).
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.vars.keys().cloned().collect()
    }

    /// Whether the snapshot has a variable `name`. O(log variables).
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    /// The dtype and shape of a variable, without reading its data (a version read from
    /// a repository keeps its chunks unread). O(log variables).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`].
    pub fn layout(&self, name: &str) -> Result<(DType, &[usize])> {
        let t = self.vars.get(name).ok_or_else(|| Error::UnknownVariable {
            name: name.to_owned(),
        })?;
        Ok((t.dtype(), t.shape()))
    }

    /// The persistent tensor of a variable, for zero-copy reads. O(log variables).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`].
    pub fn tensor(&self, name: &str) -> Result<&Tensor> {
        let t = self.vars.get(name).ok_or_else(|| Error::UnknownVariable {
            name: name.to_owned(),
        })?;
        t.load()?;
        Ok(t)
    }

    /// A materialized copy of a variable. O(size).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`].
    pub fn get<T: Element>(&self, name: &str) -> Result<ArrayD<T>> {
        let t = self.tensor(name)?;
        t.check_dtype::<T>(name)?;
        t.to_array()
    }

    /// The tensors, sorted by name. Zero-copy.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &Tensor)> + '_ {
        self.vars.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// A BLAKE3 Merkle root over the variables' names and content hashes: equal for equal
    /// contents whatever the history. O(size) the first time (chunk hashes are cached).
    #[must_use]
    pub fn content_hash(&self) -> ContentHash {
        let mut h = blake3::Hasher::new();
        h.update(b"tensor-history/snapshot/v1");
        h.update(&(self.vars.len() as u64).to_le_bytes());
        for (name, t) in self.vars.iter() {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(t.content_hash().as_bytes());
        }
        ContentHash(*h.finalize().as_bytes())
    }

    /// Logical bytes of all variables (what one deep copy holds). O(variables).
    #[must_use]
    pub fn nbytes(&self) -> usize {
        self.vars.values().map(Tensor::nbytes).sum()
    }

    pub(crate) fn vars(&self) -> &Vars {
        &self.vars
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("id", &self.id)
            .field("message", &self.message)
            .field("meta", &self.meta)
            .field("variables", &self.vars.len())
            .finish()
    }
}
