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

/// Default length of the reflog: the last 8 versions that HEAD (and the branch it was
/// attached to) left through `restore`, `undo`, `redo` or a checkout while no branch or
/// tag pointed at them any more (see [`Store::reflog`](crate::Store::reflog)).
pub const DEFAULT_REFLOG_ENTRIES: usize = 8;

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
    /// branch's first-parent line (and HEAD's), plus tagged versions and the versions in
    /// the reflog (see `reflog_entries`), like a checkpoint manager's `max_to_keep`;
    /// versions outside every window are pruned. `None` (the default) keeps everything.
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
    /// How many positions the reflog keeps (default [`DEFAULT_REFLOG_ENTRIES`]; 0 keeps
    /// none). When `restore`, `undo`, `redo` or a checkout moves HEAD (and the branch it
    /// is attached to) away from a version that no branch or tag then points at, that
    /// version is recorded; [`Store::prune`](crate::Store::prune) and auto-retention
    /// keep the recorded versions, so a version is never dropped right after a branch was
    /// moved off it. The oldest entry goes when the log is full: each entry can keep one
    /// version's changed chunks alive, so this is a bound on that memory.
    #[serde(default = "default_reflog_entries")]
    pub reflog_entries: usize,
    /// Bytes of tensor data the history may hold in memory, raw and encoded, the
    /// working state and HEAD included (default `None`: no budget). When a commit finds
    /// the held bytes (see [`Stats::held_bytes`](crate::Stats::held_bytes)) above the
    /// budget, a background thread encodes the chunks of the oldest versions that
    /// neither HEAD nor the working state holds: losslessly, in groups of a raw key
    /// chunk and up to [`DELTA_SPAN`](crate::DELTA_SPAN) difference deltas (against the same
    /// chunk of the parent version, or of the key every
    /// [`DELTA_ANCHOR_EVERY`](crate::DELTA_ANCHOR_EVERY) versions), so that reading a
    /// chunk decodes at most [`MAX_DELTA_CHAIN`](crate::MAX_DELTA_CHAIN) deltas (see
    /// [`codec`](crate::codec)). The encoded chunks replace the raw ones at the next
    /// commit after the thread is done; reading such a version (restore, get, diff,
    /// export, save) decodes what it reads.
    ///
    /// When even encoded the history would hold more than the budget (the encoded
    /// versions plus the raw working state and HEAD), the oldest versions go:
    /// - **with a repository**, they are spilled there: the commit starts a background
    ///   save (as [`Store::save_in_background`](crate::Store::save_in_background), refs
    ///   included), whose end evicts the saved versions' chunks from memory (read back
    ///   on use); a commit that finds the history past the budget plus a working state
    ///   waits for it. Its error, if any, is returned by the next save, refresh or
    ///   close; until then no other spill starts, and memory stays over the budget.
    /// - **without one**, the oldest versions that no branch, tag, HEAD, the redo path
    ///   or the reflog holds are dropped, oldest first, as
    ///   [`max_versions`](Config::max_versions) does: reading one gives
    ///   [`Error::PrunedVersion`](crate::Error::PrunedVersion), never other data. A
    ///   version a delta of a later one is coded against is freed with the last of them.
    ///
    /// A revert to HEAD never waits for encoding, and a commit (a `keep`) waits only
    /// when it would hold more than the budget plus one working state (the model in
    /// flight): then it waits for the pass (and runs the next one itself, on every
    /// core) or the spill in flight. So the history holds at most about the budget plus
    /// one working state, whatever the speed of commits; HEAD and the working state stay
    /// raw, so a budget below two working states is always exceeded by them.
    /// [`Store::enforce_memory_budget`](crate::Store::enforce_memory_budget) encodes at
    /// once. With a repository, versions already saved, or captured by a background
    /// save in flight, are not encoded: a save's end evicts their chunks (the repository
    /// holds them), except a saved parent of a version not saved yet, kept raw until the
    /// next save (its delta bases). A save writes chunks held encoded in their coded
    /// form. Of the raw buffers an encoding frees, the buffer pool (see
    /// `recycle_bytes`) keeps as many as the working state has chunks, so the next dense
    /// commit copies into memory that is already mapped. The encoding runs on a thread
    /// pool of its own, never the one a commit's or restore's parallel copy runs on.
    #[serde(default)]
    pub memory_budget: Option<usize>,
}

fn default_reflog_entries() -> usize {
    DEFAULT_REFLOG_ENTRIES
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            max_versions: None,
            recycle_bytes: DEFAULT_RECYCLE_BYTES,
            stream_threshold_bytes: DEFAULT_STREAM_THRESHOLD_BYTES,
            reflog_entries: DEFAULT_REFLOG_ENTRIES,
            memory_budget: None,
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
