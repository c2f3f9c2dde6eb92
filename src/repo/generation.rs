//! What a store knows of other processes' gc runs: the gc generation and the gc records.
//!
//! A gc run creates `gc/generations/<seq>.json` (create-if-absent, the entry after the
//! latest) before it deletes anything, and removes its records only after its deletions.
//! A store remembers the latest generation and the records it saw; when, before a save
//! or a refresh, the generation is another or a record it saw is gone, some gc deleted
//! objects since, and the store lists `manifests/` and `versions/` and reads every index
//! again to forget what is gone (a save then writes it again when it needs it). Without
//! that, a gc run that recorded and deleted only manifests or versions between two saves
//! of a long-lived store went unnoticed, and the store's next save named deleted objects.

use std::collections::HashSet;

use super::backend::{is_not_found, Backend, PutOutcome};
use super::format::version_key;
use super::format::{
    generation_key, id_of_key, parse_gc, parse_generation_key, to_json, GcBody, GenerationJson,
    GC_PREFIX, GENERATIONS_PREFIX,
};
use super::RepoLink;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::History;
use crate::version::VersionId;

/// Most entries a gc run tries to create when other runs take the next ones first.
const MAX_GENERATION_TRIES: u64 = 64;

/// The gc generation and records found by one listing of `gc/`.
pub(crate) struct GcView {
    /// The highest generation entry (0 in a repository without any).
    pub(crate) generation: u64,
    /// Readable gc records, by key. A torn record is left out: it only ever delays
    /// deletions (gc deletes it).
    pub(crate) records: Vec<(String, GcBody)>,
}

impl GcView {
    /// List `gc/` once: the latest generation and every readable record.
    pub(crate) fn read(backend: &dyn Backend) -> Result<GcView> {
        let mut view = GcView {
            generation: 0,
            records: Vec::new(),
        };
        for o in backend.list(GC_PREFIX)? {
            if let Some(seq) = parse_generation_key(&o.key) {
                view.generation = view.generation.max(seq);
                continue;
            }
            let Some(id) = id_of_key(&o.key, "thgc") else {
                continue;
            };
            match backend.get(&o.key) {
                Ok(bytes) => {
                    if let Ok(rec) = parse_gc(&o.key, &bytes, Some(&id)) {
                        view.records.push((o.key, rec));
                    }
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(view)
    }

    /// Whether a gc may have deleted objects since `b` took its last view: the
    /// generation is another, or a record `b` saw is gone (a gc run removes its records
    /// after its deletions; a run that started deleting before `b` looked may have
    /// deleted more since).
    fn moved_since(&self, b: &RepoLink) -> bool {
        if self.generation != b.generation {
            return true;
        }
        let now: HashSet<&str> = self.records.iter().map(|(k, _)| k.as_str()).collect();
        b.records_seen.iter().any(|k| !now.contains(k.as_str()))
    }
}

/// Start a new gc generation: create the entry after the latest, create-if-absent (durable
/// on return on every backend). Returns its number.
///
/// # Errors
///
/// [`Error::Io`], also when other gc runs took the next [`MAX_GENERATION_TRIES`]
/// entries first.
pub(crate) fn start_generation(backend: &dyn Backend, time_ns: u64) -> Result<u64> {
    let latest = GcView::read(backend)?.generation;
    let body = to_json(&GenerationJson { time_ns });
    for seq in latest.saturating_add(1)..latest.saturating_add(1 + MAX_GENERATION_TRIES) {
        if backend.put_if_absent(&generation_key(seq), &body)? == PutOutcome::Created {
            return Ok(seq);
        }
    }
    Err(Error::Io {
        path: format!("{}/{GENERATIONS_PREFIX}", backend.location()),
        kind: std::io::ErrorKind::Interrupted,
        message: format!(
            "{MAX_GENERATION_TRIES} other gc runs started after generation {latest}; \
             nothing was deleted, run gc again"
        ),
    })
}

/// Delete the generation entries before `keep` (readers only need the latest).
///
/// # Errors
///
/// [`Error::Io`].
pub(crate) fn trim_generations(backend: &dyn Backend, keep: u64) -> Result<()> {
    for o in backend.list(GENERATIONS_PREFIX)? {
        if parse_generation_key(&o.key).is_some_and(|seq| seq < keep) {
            backend.delete(&o.key)?;
        }
    }
    Ok(())
}

impl RepoLink {
    /// Take `view` as what this store knows of gc: the generation, the records seen,
    /// and the objects they list (a save writes those again rather than reuse them).
    pub(crate) fn take_gc_view(&mut self, view: GcView) {
        self.generation = view.generation;
        self.gc_candidates.clear();
        self.gc_keys.clear();
        self.records_seen.clear();
        for (key, rec) in view.records {
            self.gc_candidates
                .extend(rec.chunks.iter().map(|h| ContentHash(*h)));
            self.gc_keys.extend(rec.keys);
            self.records_seen.insert(key);
        }
    }

    /// Read what other processes wrote since this store last looked, before a save or a
    /// refresh: gc generation and records (first), new index files, prune markers. If a
    /// gc deleted objects since (a new generation, a record gone, or an index superseding
    /// one read), read every index again and forget the manifests and versions that are
    /// gone.
    ///
    /// O(new index files + gc records) reads; after a gc, O(manifests + versions) listed.
    pub(crate) fn catch_up(&mut self) -> Result<()> {
        // The view comes first: the listings below then see every deletion of the gc
        // runs it shows as finished, and of runs that started deleting before it.
        let view = GcView::read(&*self.backend)?;
        let gc_deleted = view.moved_since(self);
        let superseded = self.read_indexes()?;
        if gc_deleted && !superseded {
            self.chunks.read_indexes(true)?;
        }
        if gc_deleted || superseded {
            self.forget_deleted()?;
        }
        self.read_markers()?;
        self.take_gc_view(view);
        Ok(())
    }

    /// Whether a gc may have deleted objects since the last
    /// [`catch_up`](RepoLink::catch_up): checked by a save after its barrier, when it wrote
    /// objects while gc records existed (a gc run may delete what it wrote again).
    pub(crate) fn gc_moved(&self) -> Result<bool> {
        Ok(GcView::read(&*self.backend)?.moved_since(self))
    }
}

/// Forget the versions another process pruned and a gc collected: saved versions whose
/// object is gone and that carry a prune marker in the repository leave `hist` as if
/// this store had pruned them (their children take their parents; the children keep
/// their content addresses, which name them through the marker). A version a ref or
/// HEAD of this store names is kept: a save writes it again. Returns the versions
/// forgotten.
///
/// O(saved versions).
pub(crate) fn forget_collected(hist: &mut History, b: &mut RepoLink) -> Vec<VersionId> {
    if b.gone.is_empty() {
        return Vec::new();
    }
    let mut named: HashSet<VersionId> = hist.refs.values().map(|r| r.target()).collect();
    named.extend(hist.head_id());
    let mut collected: Vec<(VersionId, String)> = b
        .saved
        .iter()
        .filter(|(id, h)| b.pruned.contains_key(*h) && !named.contains(*id))
        .map(|(id, h)| (*id, version_key(h)))
        .filter(|(id, key)| b.gone.contains(key) && hist.node(*id).is_ok())
        .collect();
    collected.sort_unstable();
    for (id, key) in &collected {
        hist.remove(*id);
        hist.reflog.retain(|(_, v)| v != id);
        b.gone.remove(key);
    }
    collected.into_iter().map(|(id, _)| id).collect()
}
