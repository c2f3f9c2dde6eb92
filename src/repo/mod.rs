//! The durable repository: where a [`Store`](crate::Store)'s history is saved, and the
//! storage backends under it.
//!
//! ```text
//! Store (memory)  ── save(): packs + manifests, index, versions, barrier, refs, HEAD ──►
//!                 ◄── open(): refs, HEAD, versions, manifests; chunks mapped on read ──
//! Backend: LocalDir (default) | MemoryBackend | SimBackend (tests) | object store
//! ```
//!
//! One file per concept:
//!
//! | file | what it holds |
//! | --- | --- |
//! | `link.rs` | [`RepoLink`]: a store's link to its repository (what it holds, what this store last saw) |
//! | `chunks.rs` | [`RepoChunks`]: the chunk index and the loader of stored chunks |
//! | `pack.rs` | the pack layout: writing, footers, ranged chunk reads, the hash check; the seam of a chunk codec |
//! | `refs.rs` | the one reader of ref logs |
//! | `index.rs` | the one reader of index files |
//! | `object.rs` | any object parsed from its key (fuzzing, tools) |
//! | `format/` | the envelope, the wire reader, object bodies, keys, JSON files |
//! | `open.rs`, `save.rs`, `gc.rs`, `generation.rs` | the protocols: open and refresh, save, gc, gc generations |
//! | `parts.rs` | [`Part`]: several writers, one version (each writer's chunks and manifests, then one commit naming them all) |
//! | `background.rs` | [`PendingSave`]: the save protocol on a writer thread, and what the store takes back |
//! | `backend/` | the storage trait and its implementations |
//!
//! `docs/FORMAT.md` describes the layout and the protocols.

pub(crate) mod backend;
mod background;
mod chunks;
mod format;
mod gc;
mod generation;
mod index;
mod link;
mod object;
mod open;
mod pack;
mod parts;
mod rebase;
mod refs;
mod save;

pub use backend::open_location;
pub(crate) use background::Background;
pub use background::PendingSave;
pub(crate) use chunks::{stored_len_of, RepoChunks};
pub use gc::{GcOptions, GcStats, DEFAULT_GC_GRACE, MERGE_INDEXES_ABOVE};
pub use generation::DEFAULT_DELETE_WITHIN;
pub(crate) use link::{resolve_prefix, RepoLink};
pub use object::parse_object;
pub use open::{OpenFallback, RefreshStats};
pub use parts::{Part, PartChunks, PartStats};
pub use rebase::REBASE_BELOW;
pub(crate) use save::Evictions;
pub use save::SaveStats;
