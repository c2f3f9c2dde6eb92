//! Store configuration.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Default chunk size: 256 KiB, chosen by the chunk-size sweep in `benches/README.md`.
/// Smaller chunks copy less per sparse change, but every chunk written after a commit
/// also costs a path copy in the persistent vector, which touches the reference counts
/// of the 64 chunks in its node (cold cache lines): at 64 KiB that fixed cost made a
/// sparse trial 2.2x and a dense step 1.5x slower than at 256 KiB on a 1 GiB model.
/// Tensors whose updates are sparse (embedding tables) can use smaller chunks with
/// [`Store::insert_chunked`](crate::Store::insert_chunked).
pub const DEFAULT_CHUNK_BYTES: usize = 256 * 1024;

/// Default cap of the buffer pool: 1 GiB of freed chunk buffers kept for reuse.
pub const DEFAULT_RECYCLE_BYTES: usize = 1 << 30;

/// Default working-state size from which fused updates use streaming stores: 32 MiB,
/// the last-level cache of the machines the benchmarks ran on.
pub const DEFAULT_STREAM_THRESHOLD_BYTES: usize = 32 << 20;

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
    /// [`Store::update_map`](crate::Store::update_map) and
    /// [`Store::zip_update`](crate::Store::zip_update) write new chunks with non-temporal
    /// (streaming) stores when the working state holds at least this many bytes
    /// (default [`DEFAULT_STREAM_THRESHOLD_BYTES`]): data larger than the last-level cache
    /// is then not read before it is overwritten. `usize::MAX` turns them off.
    pub stream_threshold_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            max_versions: None,
            recycle_bytes: DEFAULT_RECYCLE_BYTES,
            stream_threshold_bytes: DEFAULT_STREAM_THRESHOLD_BYTES,
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
