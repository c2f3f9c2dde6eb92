//! Store configuration.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Default chunk size: 64 KiB, chosen by the chunk-size sweep in `benches/README.md`
/// (large enough that per-chunk overhead and hashing stay cheap, small enough that a
/// sparse change copies little and allocations stay below glibc's mmap threshold).
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;

/// Default cap of the buffer pool: 1 GiB of freed chunk buffers kept for reuse.
pub const DEFAULT_RECYCLE_BYTES: usize = 1 << 30;

/// How a [`Store`](crate::Store) cuts tensors and keeps history.
///
/// ```
/// use tensor_history::{Config, Store};
/// let store = Store::with_config(Config { chunk_bytes: 16 * 1024, ..Config::default() })?;
/// assert_eq!(store.config().chunk_bytes, 16 * 1024);
/// # Ok::<(), tensor_history::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Largest chunk in bytes (default [`DEFAULT_CHUNK_BYTES`]). A chunk holds as many
    /// whole rows of the outermost axis as fit; a row larger than this is split. Must be
    /// at least one element of every dtype stored.
    pub chunk_bytes: usize,
    /// Auto-retention: after every commit, keep at most this many versions on each
    /// branch's first-parent line (and HEAD's), plus tagged versions, like a checkpoint
    /// manager's `max_to_keep`; versions outside every window are pruned. `None` (the
    /// default) keeps everything.
    pub max_versions: Option<usize>,
    /// Bytes of freed full-size chunk buffers kept for reuse by later copy-on-write
    /// writes, which then pay no page faults (default [`DEFAULT_RECYCLE_BYTES`]; 0 turns
    /// recycling off). Pooled buffers are not counted by [`Stats`](crate::Stats) as held.
    pub recycle_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            max_versions: None,
            recycle_bytes: DEFAULT_RECYCLE_BYTES,
        }
    }
}

impl Config {
    /// Check the values.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a `chunk_bytes` of 0 or a `max_versions` of `Some(0)`.
    pub fn validate(&self) -> Result<()> {
        if self.chunk_bytes == 0 {
            return Err(Error::InvalidConfig {
                reason: "chunk_bytes must be at least one element, not 0".into(),
            });
        }
        if self.max_versions == Some(0) {
            return Err(Error::InvalidConfig {
                reason: "max_versions must keep at least 1 version".into(),
            });
        }
        Ok(())
    }
}
