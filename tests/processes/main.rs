//! Tests that run child processes: forked children (a pool and a background save that
//! must not survive `fork()`, a pack truncated under a reading child) and children of
//! this binary killed in the middle of saves. Kept apart from the other integration
//! tests so that a fork happens while few other test threads hold locks.

#[path = "../common/mod.rs"]
mod common;

mod fork;
mod fork_background_save;
mod repo_kill;
mod truncated_pack;
