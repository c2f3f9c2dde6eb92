//! Version history for named tensors: in memory, and durable in a repository.
//!
//! tensor-history keeps the history of a set of named tensors (a model's parameters, an
//! optimizer's state) as persistent data: each tensor is cut into chunks held in
//! structurally shared vectors, each chunk with a lazily computed BLAKE3 hash. A commit
//! is a cheap immutable version, restore repoints the variables to any earlier version,
//! and versions form a tree with branches, tags, undo/redo, diff and merge. Costs grow
//! with what changed, not with the size of the model: the answer to "put my variables
//! back to what they were before this step" without a deep copy per step.
//!
//! The history can also outlive the process: [`Store::save`] writes what a repository
//! (a local directory, or object storage with the `s3` feature) lacks, crash-safely, and
//! [`Store::open`] reads it back lazily, so that a history can grow past RAM and be
//! shared by several processes ([`Store::refresh`], [`Store::gc`]).
//!
//! ```
//! use ndarray::array;
//! use tensor_history::{Store, VarDiff};
//!
//! let mut store = Store::new();
//! store.insert("w", &array![[1.0f32, 2.0], [3.0, 4.0]])?;
//! let v0 = store.commit("init")?;
//!
//! // Try a step: the first write to a shared chunk copies it, nothing else is copied.
//! store.update_map::<f32>("w", |x| x * 10.0)?;
//! let v1 = store.commit("scaled")?;
//!
//! // Go back: O(1), no tensor data copied.
//! store.restore(v0)?;
//! assert_eq!(store.get::<f32>("w")?, array![[1.0f32, 2.0], [3.0, 4.0]].into_dyn());
//!
//! // Undo and redo walk the tree.
//! store.redo().unwrap_err(); // restore cleared the redo path
//! store.restore(v1)?;
//! assert_eq!(store.undo()?, v0);
//! assert_eq!(store.redo()?, v1);
//!
//! // Branch from the first version and try something else there.
//! store.branch("explore", v0)?;
//! store.checkout("explore")?;
//! store.update::<f32>("w", |_offset, xs| xs[0] = -1.0)?;
//! let v2 = store.commit("explore")?;
//!
//! // Which chunks differ between the two branches?
//! let diff = store.diff(v1, v2)?;
//! assert!(matches!(diff.get("w"), Some(VarDiff::Changed(_))));
//! assert_eq!(store.merge_base(v1, v2)?, Some(v0));
//! store.verify()?;
//! # Ok::<(), tensor_history::Error>(())
//! ```
//!
//! # Core concepts
//!
//! ```text
//! Store ── working state: name -> Tensor (persistent map, O(1) clone)
//!   │
//!   ├── history: a tree of versions (parent links, message, time)
//!   │      refs: branches (move on commit), tags (never move), HEAD (a branch or a version)
//!   │
//!   └── commit() ──► VersionId ──snapshot()──► Snapshot (immutable, Send + Sync)
//!
//! Tensor = dtype + shape + persistent vector of Chunks   (clone: O(1), shares every chunk)
//! Chunk  = Arc'd immutable bytes (<= chunk_bytes) + lazily cached BLAKE3 hash
//! ```
//!
//! - A [`Chunk`] is a fixed-size piece of a tensor's row-major bytes. It is written in
//!   place only while uniquely owned; the first write after a commit goes through a copy
//!   (copy-on-write), and a copy that came out byte-identical is thrown away so the
//!   original stays shared. Chunks hold whole rows of the outermost axis when a row fits.
//! - A [`Tensor`] is a dtype, a shape and a persistent vector of chunks: clone is O(1).
//!   Its [`content_hash`](Tensor::content_hash) is a Merkle root over the chunk hashes.
//! - A version is an immutable node of the tree holding the variable map as it was at
//!   commit time (shared, not copied). [`VersionId`]s are dense and never reused.
//! - [`Ref`]s name versions: a branch moves when HEAD is attached to it and a commit is
//!   made; a tag never moves. A ref name takes at most [`MAX_REF_NAME_BYTES`] (255)
//!   bytes in a repository key, where ASCII letters, digits, `-` and `_` count one byte
//!   and every other byte three: 255 ASCII letters, or 85 bytes of any text. The limit is
//!   the same with every backend and without one.
//! - A tensor has at most [`MAX_DIMS`] (64) axes, the most a repository holds.
//! - A [`Snapshot`] is a read-only handle to one version; it stays valid after the store
//!   moves on or is dropped.
//!
//! # Costs
//!
//! Commit, restore, undo, redo and snapshot copy no tensor data: O(1) or O(variables).
//! A write copies only the chunks it changes. [`Store::diff`] skips shared chunks without
//! reading them. Hashes are computed lazily (for [`Tensor::content_hash`],
//! [`Store::verify`], or diffs across unrelated data), in parallel, once per chunk.
//! Dense updates of every parameter still copy every chunk once per version kept: use
//! [`Store::update_map`] or [`Store::zip_update`], which fuse that copy with the update.
//!
//! # Errors
//!
//! Every fallible call returns [`Error`]; a call that fails changes nothing.

// `unsafe` lives in `kernels::stream` (streaming stores for fused updates, a measured
// win), in `parallel::pool` (the fork-aware pool, published once and never freed), in
// two blocks of `tensor.rs` that materialize a tensor into an uninitialized
// buffer without zeroing it first (`copy_init`, one `memcpy` per chunk, and the
// `set_len` after every chunk was copied, in `Tensor::to_array`), and in the two
// functions that map files (`repo::backend::local::map_file` for repository packs,
// `safetensors::map_file` for imported files), with a `// SAFETY:` comment on
// every block.
#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

/// The README's code blocks run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The code blocks of the user guide's pages (`docs/`) run as doctests, one struct per
/// page that has Rust blocks.
#[cfg(doctest)]
#[doc = include_str!("../docs/concepts.md")]
struct ConceptsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/training-loop.md")]
struct TrainingLoopDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/branches.md")]
struct BranchesDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/dense-training.md")]
struct DenseTrainingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/saving.md")]
struct SavingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/object-storage.md")]
struct ObjectStorageDoctests;

mod budget;
mod buffer;
mod chunk;
pub mod codec;
mod config;
#[cfg(test)]
mod core_tests;
mod diff;
mod element;
mod encoded;
mod error;
mod hash;
mod history;
mod kernels;
mod merge;
mod meta;
pub mod parallel;
mod render;
mod repo;
mod retention;
mod safetensors;
mod shards;
mod snapshot;
mod stats;
mod store;
mod tensor;
mod text;
mod version;

pub use buffer::Bytes;
pub use chunk::{Chunk, WeakChunk};
pub use config::{
    Config, DEFAULT_CHUNK_BYTES, DEFAULT_RECYCLE_BYTES, DEFAULT_REFLOG_ENTRIES,
    DEFAULT_STREAM_THRESHOLD_BYTES,
};
pub use diff::{Diff, TensorDiff, VarDiff};
pub use element::{DType, Element};
pub use encoded::{DELTA_ANCHOR_EVERY, DELTA_SPAN, MAX_DELTA_CHAIN, RAW_KEY_MIN_BYTES};
pub use error::{Conflict, Error, Result};
pub use hash::{ContentHash, ParseHashError};
pub use history::{Ref, MAX_REF_NAME_BYTES};
pub use merge::MergeStrategy;
pub use meta::{Meta, Value};
pub use repo::backend::{
    is_not_found, Backend, LocalDir, MemoryBackend, ObjectInfo, PutOutcome, ReadMode, SimBackend,
};
#[cfg(feature = "object-store-client")]
pub use repo::backend::{
    ObjectStoreBackend, ObjectStoreOptions, RequestStats, MIN_PART_SIZE, REQUESTS_IN_FLIGHT,
};
pub use repo::{
    open_location, parse_object, GcOptions, GcStats, OpenFallback, Part, PartChunks, PartStats,
    PendingSave, RefreshStats, SaveStats, DEFAULT_DELETE_WITHIN, DEFAULT_GC_GRACE,
    MERGE_INDEXES_ABOVE, REBASE_BELOW,
};
pub use retention::{Goal, KeepBest, PruneStats, Retention};
pub use safetensors::write_safetensors;
pub use shards::DCP_METADATA;
pub use snapshot::Snapshot;
pub use stats::Stats;
pub use store::Store;
pub use tensor::{Tensor, WriteStats, MAX_DIMS};
pub use version::{ParseVersionIdError, RefKind, VersionId};
