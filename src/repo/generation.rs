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
//!
//! The entry also names the records whose objects the run may delete and its deadline,
//! and the run closes it when done deleting. A save that wrote again what such a record
//! lists reads the entries after its barrier and waits for a run that may still delete
//! ([`RepoLink::gc_check`]): a save that began after the entry saw both the generation
//! and the records, and neither changes while the run deletes.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::backend::{is_not_found, Backend, PutOutcome};
use super::format::version_key;
use super::format::{
    generation_key, id_of_key, parse_gc, parse_generation_key, parse_json, to_json, GcBody,
    GenerationJson, GC_PREFIX, GENERATIONS_PREFIX,
};
use super::RepoLink;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::History;
use crate::version::VersionId;

/// Default [`GcOptions::delete_within`](crate::GcOptions::delete_within): 30 seconds.
/// An entry written without a deadline (by an earlier build) is read as covering its
/// run's records for this long after it started.
pub const DEFAULT_DELETE_WITHIN: Duration = Duration::from_secs(30);

/// Most entries a gc run tries to create when other runs take the next ones first.
const MAX_GENERATION_TRIES: u64 = 64;

/// What a save allows beyond a gc run's deadline before it takes the run as done
/// deleting: the clocks of the hosts sharing a repository may differ by this much, less
/// the time a deletion started just before the deadline takes to land (`docs/FORMAT.md`).
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// Longest sleep between two reads of a gc run's entry by a save that waits for it.
const MAX_POLL: Duration = Duration::from_millis(100);

/// Now, in nanoseconds since the Unix epoch (0 before it).
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The gc generation and records found by one listing of `gc/`.
pub(crate) struct GcView {
    /// The highest generation entry (0 in a repository without any).
    pub(crate) generation: u64,
    /// Every generation entry listed (gc runs that are deleting or were).
    pub(crate) entries: Vec<u64>,
    /// Readable gc records, by key. A torn record is left out: it only ever delays
    /// deletions (gc deletes it).
    pub(crate) records: Vec<(String, GcBody)>,
}

impl GcView {
    /// List `gc/` once: the latest generation and every readable record.
    pub(crate) fn read(backend: &dyn Backend) -> Result<GcView> {
        let mut view = GcView {
            generation: 0,
            entries: Vec::new(),
            records: Vec::new(),
        };
        for key in backend.list_keys(GC_PREFIX)? {
            if let Some(seq) = parse_generation_key(&key) {
                view.generation = view.generation.max(seq);
                view.entries.push(seq);
                continue;
            }
            let Some(id) = id_of_key(&key, "thgc") else {
                continue;
            };
            match backend.get(&key) {
                Ok(bytes) => {
                    if let Ok(rec) = parse_gc(&key, &bytes, Some(&id)) {
                        view.records.push((key, rec));
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

/// A gc run's generation entry, as read back.
pub(crate) struct RunEntry {
    /// The body, with the fields of older builds' entries filled in (see [`RunEntry::read`]).
    pub(crate) body: GenerationJson,
}

impl RunEntry {
    /// The entry of generation `seq`; `None` if it is gone (a later run trimmed it: that
    /// run was done) or does not parse (damage: a run writes its entry whole, create-if-
    /// absent, so no run in progress has an unreadable entry). An entry of an older
    /// build (only `time_ns`) covers every record, with the deadline `time_ns` +
    /// [`DEFAULT_DELETE_WITHIN`].
    ///
    /// # Errors
    ///
    /// [`Error::Io`] other than "not found".
    pub(crate) fn read(backend: &dyn Backend, seq: u64) -> Result<Option<RunEntry>> {
        let key = generation_key(seq);
        let bytes = match backend.get(&key) {
            Ok(b) => b,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Ok(mut body) = parse_json::<GenerationJson>(&key, &bytes) else {
            return Ok(None);
        };
        if body.deadline_ns.is_none() {
            body.deadline_ns = Some(body.time_ns.saturating_add(ns(DEFAULT_DELETE_WITHIN)));
        }
        Ok(Some(RunEntry { body }))
    }

    fn deadline_ns(&self) -> u64 {
        self.body.deadline_ns.unwrap_or(self.body.time_ns)
    }

    /// Whether the run may delete the objects of record `key`.
    pub(crate) fn covers(&self, key: &str) -> bool {
        self.body
            .records
            .as_ref()
            .is_none_or(|r| r.iter().any(|k| k == key))
    }

    /// Whether the run may still delete at `now` (this host's clock): it has not closed
    /// its entry and its deadline, plus [`DEADLINE_MARGIN`], has not passed.
    pub(crate) fn may_delete(&self, now: u64) -> bool {
        self.body.closed_ns.is_none()
            && now < self.deadline_ns().saturating_add(ns(DEADLINE_MARGIN))
    }

    /// When the run was done deleting at the latest, by this host's clock: when it
    /// closed its entry, else its deadline, plus [`DEADLINE_MARGIN`] (the clocks may
    /// differ by that much).
    pub(crate) fn ended_ns(&self) -> u64 {
        self.body
            .closed_ns
            .unwrap_or_else(|| self.deadline_ns())
            .saturating_add(ns(DEADLINE_MARGIN))
    }

    /// Wait until the run of entry `seq` closed its entry or passed its deadline (plus
    /// [`DEADLINE_MARGIN`]), reading the entry with sleeps of at most [`MAX_POLL`]. Never
    /// longer than the run's own time to delete (deadline less start) plus the margin,
    /// whatever the clocks say: the run started before this store saw its entry.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] from reading the entry.
    pub(crate) fn wait(self, backend: &dyn Backend, seq: u64) -> Result<()> {
        let start = Instant::now();
        let within = Duration::from_nanos(self.deadline_ns().saturating_sub(self.body.time_ns))
            .saturating_add(DEADLINE_MARGIN);
        let mut pause = Duration::from_millis(1);
        let mut entry = self;
        loop {
            let left = within.saturating_sub(start.elapsed());
            if !entry.may_delete(now_ns()) || left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(MAX_POLL);
            match RunEntry::read(backend, seq)? {
                Some(e) => entry = e,
                None => return Ok(()),
            }
        }
    }
}

/// Start a new gc generation: create the entry after the latest, create-if-absent (durable
/// on return on every backend), naming the records whose objects the run may delete and
/// its deadline. Returns its number and its body (to close it with, see
/// [`close_generation`]).
///
/// # Errors
///
/// [`Error::Io`], also when other gc runs took the next [`MAX_GENERATION_TRIES`]
/// entries first.
pub(crate) fn start_generation(
    backend: &dyn Backend,
    time_ns: u64,
    records: &[String],
    delete_within: Duration,
) -> Result<(u64, GenerationJson)> {
    let latest = GcView::read(backend)?.generation;
    let entry = GenerationJson {
        time_ns,
        records: Some(records.to_vec()),
        deadline_ns: Some(time_ns.saturating_add(ns(delete_within))),
        closed_ns: None,
    };
    let body = to_json(&entry);
    for seq in latest.saturating_add(1)..latest.saturating_add(1 + MAX_GENERATION_TRIES) {
        if backend.put_if_absent(&generation_key(seq), &body)? == PutOutcome::Created {
            return Ok((seq, entry));
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

/// Close a gc run's entry: the run deletes nothing more (replaces the entry with
/// `closed_ns` set, barrier). A save waiting for the run goes on.
///
/// # Errors
///
/// [`Error::Io`]; the entry then stays open until its deadline.
pub(crate) fn close_generation(
    backend: &dyn Backend,
    seq: u64,
    mut entry: GenerationJson,
) -> Result<()> {
    entry.closed_ns = Some(now_ns().max(entry.time_ns));
    backend.put(&generation_key(seq), &to_json(&entry))?;
    backend.barrier()
}

/// Delete the generation entries before `keep` whose runs are done deleting (closed,
/// past their deadline, or unreadable): readers only need the latest number, and saves
/// the entries of runs that may still delete.
///
/// O(entries) reads.
///
/// # Errors
///
/// [`Error::Io`].
pub(crate) fn trim_generations(backend: &dyn Backend, keep: u64) -> Result<()> {
    for o in backend.list(GENERATIONS_PREFIX)? {
        let Some(seq) = parse_generation_key(&o.key).filter(|seq| *seq < keep) else {
            continue;
        };
        let done = RunEntry::read(backend, seq)?.is_none_or(|e| !e.may_delete(now_ns()));
        if done {
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
        let gc_deleted = view.moved_since(self) || self.relist;
        let superseded = self.read_indexes()?;
        if gc_deleted && !superseded {
            self.chunks.read_indexes(true)?;
        }
        if gc_deleted || superseded {
            self.forget_deleted()?;
        }
        self.relist = false;
        self.read_markers()?;
        self.take_gc_view(view);
        Ok(())
    }

    /// Whether a save must go back to its catch-up before it writes a ref: checked after
    /// its barrier, when it wrote objects while gc records existed. Yes when a gc may
    /// have deleted objects since the last [`catch_up`](RepoLink::catch_up) (a new
    /// generation, a record gone), and when a gc run's entry covers a record that lists
    /// an object of `rewrote` (keys this round wrote again because a record listed them)
    /// and that run may have deleted since `since_ns` (this host's clock when the round's
    /// catch-up began): a run that may still delete is first waited for (see
    /// [`RunEntry::wait`]). Runs in `settled` were waited for or taken in already by an
    /// earlier round; runs this check takes in are added. Only a save that wrote again
    /// what such a run may delete ever waits.
    ///
    /// One listing of `gc/`; with `rewrote` not empty, one read per generation entry.
    ///
    /// # Errors
    ///
    /// [`Error::Io`].
    pub(crate) fn gc_check(
        &mut self,
        rewrote: &HashSet<String>,
        since_ns: u64,
        settled: &mut HashSet<u64>,
    ) -> Result<bool> {
        let backend = self.backend.clone();
        let view = GcView::read(&*backend)?;
        let mut again = view.moved_since(self);
        if rewrote.is_empty() {
            return Ok(again);
        }
        for &seq in &view.entries {
            if settled.contains(&seq) {
                continue;
            }
            let Some(run) = RunEntry::read(&*backend, seq)? else {
                continue;
            };
            let overlaps = view
                .records
                .iter()
                .any(|(k, rec)| run.covers(k) && rec.keys.iter().any(|o| rewrote.contains(o)));
            if !overlaps {
                continue;
            }
            if run.may_delete(now_ns()) {
                run.wait(&*backend, seq)?;
            } else if run.ended_ns() <= since_ns {
                // Done deleting before this round's catch-up, which saw what it left.
                continue;
            }
            // The run may have deleted what this round wrote again, while leaving its
            // records (stopped at its deadline) and the generation as they were: list
            // again at the next catch-up.
            self.relist = true;
            settled.insert(seq);
            again = true;
        }
        Ok(again)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::backend::MemoryBackend;

    const SEC: u64 = 1_000_000_000;

    fn entry_of(backend: &MemoryBackend, seq: u64, body: &[u8]) -> Option<RunEntry> {
        backend.put(&generation_key(seq), body).unwrap();
        RunEntry::read(backend, seq).unwrap()
    }

    #[test]
    fn an_entry_of_an_earlier_build_covers_every_record_until_thirty_seconds_after_it_started() {
        let backend = MemoryBackend::new();
        let t = 1_000 * SEC;
        let run = entry_of(&backend, 1, format!("{{\"time_ns\": {t}}}").as_bytes()).unwrap();
        assert!(run.covers("gc/00/anything.thgc"));
        let margin = ns(DEADLINE_MARGIN);
        assert!(run.may_delete(t + 30 * SEC + margin - 1));
        assert!(!run.may_delete(t + 30 * SEC + margin));
        assert_eq!(run.ended_ns(), t + 30 * SEC + margin);
    }

    #[test]
    fn an_entry_covers_only_its_records_and_a_closed_one_deletes_nothing_more() {
        let backend = MemoryBackend::new();
        let t = 1_000 * SEC;
        let (seq, body) = start_generation(
            &backend,
            t,
            &["gc/a.thgc".to_owned()],
            Duration::from_secs(2),
        )
        .unwrap();
        let run = RunEntry::read(&backend, seq).unwrap().unwrap();
        assert!(run.covers("gc/a.thgc") && !run.covers("gc/b.thgc"));
        assert!(run.may_delete(t + 2 * SEC));
        close_generation(&backend, seq, body).unwrap();
        let run = RunEntry::read(&backend, seq).unwrap().unwrap();
        assert!(!run.may_delete(t));
        let closed = run.body.closed_ns.unwrap();
        assert_eq!(run.ended_ns(), closed + ns(DEADLINE_MARGIN));
        // A closed entry ends a wait at once.
        let start = Instant::now();
        run.wait(&backend, seq).unwrap();
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_damaged_or_missing_entry_reads_as_no_run() {
        let backend = MemoryBackend::new();
        assert!(entry_of(&backend, 1, b"\xff{").is_none());
        assert!(RunEntry::read(&backend, 2).unwrap().is_none());
    }

    #[test]
    fn trimming_keeps_the_entries_of_runs_that_may_still_delete() {
        let backend = MemoryBackend::new();
        let now = now_ns();
        let within = Duration::from_secs(60);
        let (open, _) = start_generation(&backend, now, &[], within).unwrap();
        let (closed, body) = start_generation(&backend, now, &[], within).unwrap();
        close_generation(&backend, closed, body).unwrap();
        // An earlier build's entry of long ago, and a crashed run past its deadline.
        backend
            .put(&generation_key(3), b"{\"time_ns\": 1}")
            .unwrap();
        let (crashed, _) = start_generation(&backend, 1, &[], within).unwrap();
        let (latest, _) = start_generation(&backend, now, &[], within).unwrap();
        trim_generations(&backend, latest).unwrap();
        let left: Vec<u64> = backend
            .list(GENERATIONS_PREFIX)
            .unwrap()
            .iter()
            .filter_map(|o| parse_generation_key(&o.key))
            .collect();
        assert!(crashed > 3);
        assert_eq!(left, vec![open, latest]);
    }
}
