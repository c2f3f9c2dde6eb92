//! The integration tests of the public API: one test binary (linking one binary per
//! file made `cargo test` build and link dozens), one module per area.

#[path = "../common/mod.rs"]
mod common;

mod auto_traits;
mod background_save;
mod codec;
mod gc_dry_run;
mod gc_indexes;
mod history_behaviour;
mod history_errors;
mod memory;
mod memory_budget;
mod merge_numerics;
mod metadata;
mod pool_under_budget;
mod printed_text;
mod reflog;
mod repo_encoded;
mod repo_faults;
mod repo_format_fixtures;
mod repo_format_golden;
mod repo_lazy;
mod repo_limits;
mod repo_location;
mod repo_parts;
mod repo_rebase;
mod repo_roundtrip;
mod repo_shared;
mod repo_shared_reads;
mod repo_unchain;
mod repo_unreadable_chunks;
mod safetensors;
mod shards;
mod size_limits;
mod snapshot_threads;
mod tensor_layout;
mod tensor_writes;
mod working_errors;
mod write_stats;
