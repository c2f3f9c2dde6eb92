//! Storage backends: the small synchronous trait the repository protocol is written
//! against, and its implementations.
//!
//! A backend stores named objects ("keys": `/`-separated relative paths such as
//! `packs/ab/<id>.thpack`). It knows nothing of the repository format; the protocol in
//! [`crate::repo`] needs exactly these operations, so the same protocol runs on a local
//! directory, in memory, on a power-loss simulator in tests, and on object storage.
//!
//! # Contract every implementation keeps
//!
//! - `put` and `put_if_absent` are atomic: a reader sees no object, or the whole old
//!   object, or the whole new one; never a torn one.
//! - `put_if_absent` is a create-if-absent write: of several concurrent calls for one key
//!   exactly one gets [`PutOutcome::Created`]; it is durable when it returns (refs are
//!   committed with it).
//! - Data written by `put` is durable once a later `barrier` returns (on a local disk:
//!   files and the directories that name them are fsynced).
//! - A missing object is an [`Error::Io`] whose `kind` is
//!   [`std::io::ErrorKind::NotFound`] (see [`is_not_found`]); `delete` of a missing
//!   object succeeds.

use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

pub(crate) use crate::buffer::AlignedBuf;
pub(crate) use crate::buffer::Bytes;
use crate::error::{Error, Result};

mod local;
mod memory;
mod sim;

pub use local::{LocalDir, ReadMode};
pub use memory::MemoryBackend;
pub use sim::SimBackend;
#[cfg(feature = "object-store-client")]
mod object;
#[cfg(feature = "object-store-client")]
pub use object::{
    ObjectStoreBackend, ObjectStoreOptions, RequestStats, MIN_PART_SIZE, REQUESTS_IN_FLIGHT,
};

/// The backend for a location, the one place where a location's scheme is read:
///
/// | location | backend |
/// | --- | --- |
/// | a path, or `file:///absolute/path` | [`LocalDir`], created if absent |
/// | `memory://` | a new, empty [`MemoryBackend`] |
/// | `s3://bucket/prefix` (feature `s3`), `gs://bucket/prefix` (feature `gcs`), `az://container/prefix` or `abfs://...` (feature `azure`), and the `https://` forms `object_store` recognises | an object store (`ObjectStoreBackend`, configured from the environment) |
///
/// Object-store URLs are recognised by `object_store`'s URL parsing
/// (`ObjectStoreScheme`). `file://` is a [`LocalDir`] rather than `object_store`'s local
/// file system because the repository's durability rests on the directory's fsyncs.
///
/// # Errors
///
/// [`Error::Io`] if the directory cannot be created or an object-store client cannot be
/// configured; [`Error::InvalidArgument`] for a malformed URL or a scheme this build
/// does not support (naming the cargo feature that would).
pub fn open_location(location: &str) -> Result<Arc<dyn Backend>> {
    open_location_as(location, true)
}

/// [`open_location`]; without `create`, a local directory that does not exist is
/// [`Error::NoRepository`] instead of being created.
pub(crate) fn open_location_as(location: &str, create: bool) -> Result<Arc<dyn Backend>> {
    let local = |path: &str| -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(local_dir(Path::new(path), create)?))
    };
    let Some((scheme, rest)) = location.split_once("://") else {
        return local(location);
    };
    if scheme.len() < 2 || !scheme.bytes().all(|b| b.is_ascii_alphanumeric()) {
        // `C://x` on Windows, or a relative path that happens to hold `://`.
        return local(location);
    }
    match scheme {
        "file" => match rest.strip_prefix("localhost").unwrap_or(rest) {
            path if path.starts_with('/') => local(path),
            _ => Err(Error::InvalidArgument {
                reason: format!("`{location}`: a file:// URL needs an absolute path"),
            }),
        },
        "memory" => Ok(Arc::new(MemoryBackend::new())),
        _ => open_object_store(location, scheme),
    }
}

/// A local directory backend at `root`, created if absent when `create` says so, else
/// [`Error::NoRepository`] unless a directory is there.
fn local_dir(root: &Path, create: bool) -> Result<LocalDir> {
    if !create && !root.is_dir() {
        return Err(Error::NoRepository {
            location: root.display().to_string(),
        });
    }
    LocalDir::new(root)
}

#[cfg(feature = "object-store-client")]
fn open_object_store(location: &str, _scheme: &str) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(ObjectStoreBackend::open(location)?))
}

#[cfg(not(feature = "object-store-client"))]
fn open_object_store(location: &str, scheme: &str) -> Result<Arc<dyn Backend>> {
    let feature = match scheme {
        "s3" | "s3a" => " (it needs the `s3` feature)",
        "gs" => " (it needs the `gcs` feature)",
        "az" | "adl" | "azure" | "abfs" | "abfss" => " (it needs the `azure` feature)",
        _ => " (object stores need the `s3`, `gcs` or `azure` feature)",
    };
    Err(Error::InvalidArgument {
        reason: format!(
            "`{location}`: the `{scheme}://` scheme is not supported by this build{feature}"
        ),
    })
}

/// What a create-if-absent write found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// The object did not exist and now holds the data.
    Created,
    /// An object of that key already existed; it was left as it was.
    AlreadyExists,
}

/// One object found by [`Backend::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The object's key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, if the backend knows.
    pub modified: Option<SystemTime>,
}

/// Where a repository's objects live. Synchronous; implementations that talk to a
/// network keep their own runtime private.
pub trait Backend: fmt::Debug + Send + Sync {
    /// The whole object. A local backend may return a mapped file (zero-copy).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] (kind `NotFound` when absent).
    fn get(&self, key: &str) -> Result<Bytes>;

    /// [`get`](Backend::get) of every key of `keys`, the results in the same order. The
    /// default reads them one by one; an object store sends the requests concurrently
    /// (one request's latency per batch instead of per object).
    fn get_many(&self, keys: &[String]) -> Vec<Result<Bytes>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// A byte range of the object.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] (kind `NotFound` when absent, `UnexpectedEof` when the range passes
    /// the end).
    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes>;

    /// Create or replace the object (atomically). Durable after the next
    /// [`barrier`](Backend::barrier).
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn put(&self, key: &str, data: &[u8]) -> Result<()>;

    /// [`put`](Backend::put) of the concatenation of `parts`, so that a pack is written
    /// from the chunks' own buffers without first copying them into one. The default
    /// concatenates and calls `put`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn put_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.put(key, &parts.concat())
    }

    /// [`put`](Backend::put) of every `(key, bytes)` of `objects`, in no particular order
    /// (durable at the next [`barrier`](Backend::barrier), as `put`). After an error,
    /// any of them may have been written, as after a crash in the middle of a sequence
    /// of `put`s. The default writes them one by one; an object store sends them
    /// concurrently (one request's latency per batch instead of per object).
    ///
    /// # Errors
    ///
    /// [`Error::Io`]: the first failure.
    fn put_many(&self, objects: &[(String, Vec<u8>)]) -> Result<()> {
        for (key, data) in objects {
            self.put(key, data)?;
        }
        Ok(())
    }

    /// Create the object only if no object of that key exists. Durable on return.
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<PutOutcome>;

    /// Every object whose key starts with `prefix`, in no particular order.
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;

    /// The keys of [`list`](Backend::list), for callers that need no size or time: a
    /// directory's listing then reads no file's metadata (a save lists `index/`, `gc/`,
    /// `pruned/` and its ref's log, which grow with the history).
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn list_keys(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.list(prefix)?.into_iter().map(|o| o.key).collect())
    }

    /// Delete the object; a missing object is not an error.
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn delete(&self, key: &str) -> Result<()>;

    /// Make every earlier `put` durable (fsync of files and directories on a disk).
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    fn barrier(&self) -> Result<()>;

    /// Where the objects live, as a user would write it (a path or a URL).
    fn location(&self) -> String;
}

/// [`open_location`] for a path that may not be UTF-8.
pub(crate) fn open_path(location: &Path) -> Result<Arc<dyn Backend>> {
    open_path_as(location, true)
}

/// [`open_location_as`] for a path that may not be UTF-8.
pub(crate) fn open_path_as(location: &Path, create: bool) -> Result<Arc<dyn Backend>> {
    match location.to_str() {
        Some(s) => open_location_as(s, create),
        None => Ok(Arc::new(local_dir(location, create)?)),
    }
}

/// Whether `e` says an object does not exist.
#[must_use]
pub fn is_not_found(e: &Error) -> bool {
    matches!(e, Error::Io { kind, .. } if *kind == std::io::ErrorKind::NotFound)
}
