//! `Store::save` and `Store::save_as`: write what the repository lacks, in a crash-safe
//! order, then move the refs with create-if-absent writes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::backend::open_path;
use super::backend::{Backend, PutOutcome};
use super::format::{
    encode, index_key, manifest_key, manifests_packed, pack_key, pruned_key, ref_key, time_parts,
    to_json, version_key, EntryKind, HeadJson, IndexBody, IndexPack, Kind, ManifestBody,
    PrunedJson, RefEntry, VersionBody, HEAD_KEY,
};
use super::generation::{forget_collected, now_ns};
use super::pack::{write_packs, Form, Loc, NewChunk, Stored, MAX_DELTA_CHAIN};
use super::refs;
use super::RepoLink;
use crate::chunk::{Chunk, Pool};
use crate::encoded::encoded_ref;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::{check_ref_name_len, Head, History};
use crate::store::Store;
use crate::tensor::{check_dims, Tensor};
use crate::version::VersionId;

/// What a [`Store::save`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SaveStats {
    /// Versions written (new to the repository).
    pub versions_written: usize,
    /// Chunks written into new packs.
    pub chunks_written: usize,
    /// Distinct chunks of the new versions that the repository already held.
    pub chunks_present: usize,
    /// Packs written.
    pub packs_written: usize,
    /// Manifests (per-tensor objects) written.
    pub manifests_written: usize,
    /// Ref log entries written (branches, tags, deletions).
    pub refs_written: usize,
    /// Bytes of every object written.
    pub bytes_written: u64,
    /// Raw bytes of the chunks written into new packs (their length in their tensors).
    pub chunk_bytes_raw: u64,
    /// Bytes those chunks take in the packs (coded: byte planes or deltas; see
    /// `docs/FORMAT.md`, "Stored forms"), without alignment padding. At most
    /// `chunk_bytes_raw`.
    pub chunk_bytes_stored: u64,
    /// Of the chunks written, those written in the coded form the memory budget held
    /// them in (no decoding and coding again).
    #[serde(default)]
    pub chunks_written_as_held: usize,
}

/// A tensor's manifest object and its id. Refuses a layout the manifest reader refuses
/// (every constructor of a tensor checks it already: this is the last guard before a
/// repository would hold an object it cannot read).
pub(crate) fn manifest_bytes(name: &str, t: &Tensor) -> Result<(Vec<u8>, ContentHash)> {
    check_dims(name, t.shape())?;
    let body = ManifestBody {
        dtype: t.dtype().tag(),
        shape: t.shape().iter().map(|&d| d as u64).collect(),
        chunk_elems: t.chunk_elems() as u64,
        chunks: t.chunks().map(|c| c.hash().0).collect(),
    };
    Ok(encode(Kind::Manifest, &body))
}

/// Hash every chunk whose hash is not cached, in parallel.
pub(crate) fn hash_chunks(chunks: &[&Chunk]) {
    let todo: Vec<&&Chunk> = chunks
        .iter()
        .filter(|c| c.cached_hash().is_none())
        .collect();
    let bytes: usize = todo.iter().map(|c| c.len_bytes()).sum();
    if bytes >= 1 << 20 && todo.len() > 1 {
        crate::parallel::install(|| {
            todo.par_iter().with_min_len(1).for_each(|c| {
                let _ = c.hash();
            })
        });
    } else {
        todo.iter().for_each(|c| {
            let _ = c.hash();
        });
    }
}

/// Versions reachable from the refs and HEAD that `known` lacks or whose object a gc
/// record lists (`recorded`: they are written again, so that gc keeps them), oldest
/// first. A recorded version with a prune marker in the repository (`pruned`) is not
/// written again unless a ref or HEAD names it: readers pass through its marker, and
/// the store forgets it once a gc collected it.
fn unsaved_or_recorded(
    hist: &History,
    known: &HashMap<VersionId, ContentHash>,
    recorded: &HashSet<String>,
    pruned: &HashMap<ContentHash, Vec<ContentHash>>,
) -> Result<Vec<VersionId>> {
    let mut stack: Vec<VersionId> = hist.refs.values().map(|r| r.target()).collect();
    stack.extend(hist.head_id());
    let named: HashSet<VersionId> = stack.iter().copied().collect();
    let mut todo = BTreeSet::new();
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        match known.get(&v) {
            Some(_) if recorded.is_empty() => continue,
            Some(h) if !recorded.contains(&version_key(h)) => {}
            Some(h) if pruned.contains_key(h) && !named.contains(&v) => {}
            _ => {
                todo.insert(v);
            }
        }
        stack.extend(hist.node(v)?.parents.iter().copied());
    }
    Ok(todo.into_iter().collect())
}

/// Encode version `id` given its parents' and manifests' ids.
fn version_object(
    hist: &History,
    id: VersionId,
    hash_of: impl Fn(VersionId) -> Option<ContentHash>,
    manifest_of: &mut impl FnMut(&str, &Tensor) -> Result<ContentHash>,
) -> Result<(Vec<u8>, ContentHash, Vec<ContentHash>)> {
    version_object_with(hist, id, id.0, None, hash_of, manifest_of)
}

/// [`version_object`] with the parents' content addresses given (`parents`), or taken
/// from the history.
fn version_object_with(
    hist: &History,
    id: VersionId,
    seq: u64,
    parents: Option<Vec<ContentHash>>,
    hash_of: impl Fn(VersionId) -> Option<ContentHash>,
    manifest_of: &mut impl FnMut(&str, &Tensor) -> Result<ContentHash>,
) -> Result<(Vec<u8>, ContentHash, Vec<ContentHash>)> {
    let node = hist.node(id)?;
    let parents: Vec<ContentHash> = match parents {
        Some(p) => p,
        None => node
            .parents
            .iter()
            .map(|p| {
                hash_of(*p).ok_or_else(|| Error::Corrupt {
                    reason: format!("parent {p} of {id} has no content address"),
                })
            })
            .collect::<Result<_>>()?,
    };
    let (time_secs, time_nanos) = time_parts(node.time);
    let body = VersionBody {
        seq,
        parents: parents.iter().map(|p| p.0).collect(),
        time_secs,
        time_nanos,
        message: node.message.to_string(),
        meta: (*node.meta).clone(),
        vars: node
            .vars
            .get()?
            .iter()
            .map(|(name, t)| Ok((name.clone(), manifest_of(name, t)?.0)))
            .collect::<Result<_>>()?,
    };
    let (bytes, hash) = encode(Kind::Version, &body);
    Ok((bytes, hash, parents))
}

/// The parents (content addresses) saved version `h` was written with, if writing it
/// again with them keeps it readable: each is a version this store holds (written again
/// too if a gc took it), or one it pruned whose object is still in the repository, or
/// one it pruned whose prune marker is in the repository or,
/// if a gc deleted the marker this store saw, is added to `markers` (with its own
/// parents, recursively). `None` otherwise: the version is then written with its
/// parents in the history, and so gets a new content address.
///
/// A marker found in the repository that a gc record lists is added to `reused`.
fn original_parents(
    hist: &History,
    b: &RepoLink,
    h: ContentHash,
    markers: &mut Vec<(ContentHash, Vec<ContentHash>, Vec<u8>)>,
    reused: &mut HashSet<String>,
) -> Result<Option<Vec<ContentHash>>> {
    let Some(parents) = b.parents_of.get(&h) else {
        return Ok(None);
    };
    let mut planned = Vec::new();
    let mut stack = parents.clone();
    let mut seen = HashSet::new();
    while let Some(p) = stack.pop() {
        if !seen.insert(p) {
            continue;
        }
        let held = b.by_hash.get(&p).is_some_and(|id| hist.node(*id).is_ok());
        if held || markers.iter().any(|m| m.0 == p) {
            continue;
        }
        // A version this store pruned since it saved it, whose object is still in the
        // repository (no gc deleted or recorded it): named as it is, like a chunk or
        // manifest a save reuses; its marker follows the refs (step 6 of a save).
        let key = version_key(&p);
        if b.by_hash.contains_key(&p) && !b.gone.contains(&key) && !b.gc_keys.contains(&key) {
            continue;
        }
        match b.backend.get(&pruned_key(&p)) {
            Ok(_) => {
                if b.gc_keys.contains(&pruned_key(&p)) {
                    reused.insert(pruned_key(&p));
                }
                continue;
            }
            Err(e) if super::backend::is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
        // Only a marker this store saw (that a gc deleted since) is written again before
        // the refs: a first marker waits until the refs moved (see `write_refs`).
        let Some(pp) = b.parents_of.get(&p).filter(|_| b.pruned.contains_key(&p)) else {
            return Ok(None);
        };
        let bytes = to_json(&PrunedJson {
            parents: pp.clone(),
        });
        planned.push((p, pp.clone(), bytes));
        stack.extend(pp.iter().copied());
    }
    markers.extend(planned);
    Ok(Some(parents.clone()))
}

/// What one save did, for the store to apply after.
pub(crate) struct Saved {
    pub(crate) stats: SaveStats,
    /// Refs not written: name, and the repository's version (`None`: deleted there).
    pub(crate) conflicts: Vec<(String, Option<ContentHash>)>,
    /// The first error of a ref that could not be written (every other ref was).
    pub(crate) ref_error: Option<Error>,
}

impl Saved {
    /// The stats, or the first conflict, or the first ref error.
    pub(crate) fn into_result(self) -> Result<SaveStats> {
        match (self.conflicts.into_iter().next(), self.ref_error) {
            (Some((branch, theirs)), _) => Err(Error::BranchMoved { branch, theirs }),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(self.stats),
        }
    }
}

/// The refs of the repository `b` just connected to that its store did not see: each
/// latest entry is kept in `b.refs_seen` only where the store saw exactly that state of
/// the ref (same kind and version) in a repository it was bound to before
/// (`b.refs_seen_before`), so that the save may move or delete it as a save there
/// would. The others leave `refs_seen` and are returned: the save writes a ref of the
/// store over one of them only as a fast-forward (see [`check_unseen`]), and leaves the
/// rest as they are.
fn take_unseen_refs(b: &mut RepoLink) -> BTreeMap<String, (u64, RefEntry)> {
    let all = std::mem::take(&mut b.refs_seen);
    let mut unseen = BTreeMap::new();
    for (name, (seq, entry)) in all {
        let seen = b
            .refs_seen_before
            .get(&name)
            .is_some_and(|states| states.contains(&entry));
        if seen {
            b.refs_seen.insert(name, (seq, entry));
        } else {
            unseen.insert(name, (seq, entry));
        }
    }
    unseen
}

/// Before a save onto a repository the store was not bound to writes any ref: every ref
/// of the store that the repository has in a state the store did not see (`unseen`)
/// must be in that state already or a fast-forward of it (a deletion there names
/// nothing to lose), else [`Error::BranchMoved`] naming the ref and the repository's
/// version. Each of them then counts as seen (the ref write follows the repository's
/// log). A detached HEAD of the repository at a version this store does not hold is
/// taken as this store's, so that the save leaves it as it is.
fn check_unseen(
    hist: &History,
    b: &mut RepoLink,
    unseen: &BTreeMap<String, (u64, RefEntry)>,
) -> Result<()> {
    let hash_of = |v: VersionId| b.saved.get(&v).copied();
    for (name, (_, theirs)) in unseen {
        let Some(r) = hist.refs.get(name) else {
            continue;
        };
        let want = refs::entry_of(Some(r), &hash_of);
        let lost = theirs.kind != EntryKind::Deleted
            && *theirs != want
            && !fast_forward(hist, b, theirs, &want);
        if lost {
            return Err(Error::BranchMoved {
                branch: name.clone(),
                theirs: theirs.version,
            });
        }
    }
    let mine = match &hist.head {
        Head::Branch(name) => Some(HeadJson::Branch(name.clone())),
        Head::Detached(v) => hash_of(*v).map(HeadJson::Detached),
    };
    if matches!(&b.head_seen, Some(HeadJson::Detached(h)) if !b.by_hash.contains_key(h)) {
        b.head_seen = mine;
    }
    for (name, entry) in unseen {
        if hist.refs.contains_key(name) {
            b.refs_seen.insert(name.clone(), entry.clone());
        }
    }
    Ok(())
}

impl Store {
    /// Write every version reachable from a branch, a tag or HEAD that the repository
    /// lacks, then move the refs and HEAD. Only chunks the repository lacks are written
    /// (a second save with nothing new writes no chunk); uncommitted changes are not
    /// saved. Order: packs (the new manifests in the last one; in a repository of format
    /// 3 or earlier, objects beside them), barrier, index, versions, barrier (fsync), refs
    /// (create-if-absent), then prune markers and HEAD, barrier. A crash at any point
    /// leaves the previous save readable.
    /// Afterwards, chunks held only by saved versions (not by the working state) leave the
    /// heap: they are read back from the repository when used.
    ///
    /// O(new chunks) writes + O(chunks of new versions) hashing (parallel, cached). A
    /// save that writes again objects a gc run of another process is deleting right
    /// then waits for that run to be done (at most the run's
    /// [`delete_within`](crate::GcOptions::delete_within) plus 5 s) and writes them once
    /// more; no other save waits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the store has no repository (see
    /// [`save_as`](Store::save_as)); [`Error::Io`] from the backend (nothing in memory is
    /// lost; the next save writes what is missing); [`Error::BranchMoved`] if a branch moved
    /// in the repository since this store last saw it and this store's version does not
    /// descend from the repository's. Nothing is written for that branch; every other
    /// ref is saved, and HEAD unless it is attached to that branch; prune markers are
    /// written except for versions the repository's version of that branch may still
    /// reach. The error names the first such branch and the repository's version of it;
    /// [`refresh`](Store::refresh) loads it (and lists every diverged branch), then
    /// merge it and save. [`Error::RefNameTooLong`] for a ref held from another
    /// repository whose name does not fit this one's keys (every other ref, HEAD and
    /// prune markers are saved). A ref that fails to write never keeps the others from
    /// being written.
    /// [`Error::RepositoryReplaced`] if the repository was deleted or replaced by another
    /// one since this store connected (no ref is written).
    pub fn save(&mut self) -> Result<SaveStats> {
        self.settle_save(true);
        self.take_unreported()?;
        let mut bound = self.repo.take().ok_or_else(|| Error::InvalidArgument {
            reason: "this store has no repository: use save_as or open".into(),
        })?;
        let result = save_into(&mut self.hist, &mut bound, None, &mut Vec::new());
        if result.is_ok() {
            self.evict(&mut bound);
        }
        self.repo = Some(bound);
        result?.into_result()
    }

    /// Bind the store to the repository at `location` (a directory, created if absent,
    /// or a URL) and [`save`](Store::save) there. On error the store keeps its previous
    /// repository, if any.
    ///
    /// Onto a repository that already has a history, `save_as` adds this store's
    /// versions and refs to it and loses none of its history: a ref of the repository
    /// that this store also has must be at a version this store's ref descends from (a
    /// fast-forward), unless this store saw exactly that state of the ref in the
    /// repository it was bound to (then it moves or deletes it as [`save`](Store::save)
    /// would: a store saving again into a copy of its own repository). Refs that only
    /// the repository has are left as they are. Otherwise `save_as` returns
    /// [`Error::OtherHistory`] naming the first such ref and the repository's version of
    /// it, before writing any ref or HEAD, and the store stays bound where it was (the
    /// objects it wrote are unreferenced, and gc removes them). To keep both
    /// histories, give this store's branch another name (or open the repository and
    /// merge), then `save_as` again. A detached HEAD of the repository at a version this
    /// store does not hold is left as it is.
    ///
    /// O(all chunks) the first time.
    ///
    /// # Errors
    ///
    /// As for [`save`](Store::save) and [`open`](Store::open); [`Error::OtherHistory`] as
    /// above ([`Error::BranchMoved`] if another process moves a ref while this save
    /// writes them).
    pub fn save_as(&mut self, location: impl AsRef<Path>) -> Result<SaveStats> {
        let backend = open_path(location.as_ref())?;
        self.save_to(backend)
    }

    /// [`save_as`](Store::save_as) with a backend.
    ///
    /// # Errors
    ///
    /// As for [`save_as`](Store::save_as).
    pub fn save_to(&mut self, backend: Arc<dyn Backend>) -> Result<SaveStats> {
        self.settle_save(true);
        self.take_unreported()?;
        let mut bound = Box::new(RepoLink::connect(backend)?);
        if let Some(old) = &self.repo {
            bound.seqs.clone_from(&old.seqs);
            bound.refs_seen_before.clone_from(&old.refs_seen_before);
            for (name, (_, entry)) in &old.refs_seen {
                let states = bound.refs_seen_before.entry(name.clone()).or_default();
                if !states.contains(entry) {
                    states.push(entry.clone());
                }
            }
        }
        let unseen = take_unseen_refs(&mut bound);
        // An error here (a ref of the repository that this save would overwrite, found
        // before any ref was written, included) leaves the store bound where it was.
        let saved = match save_into(&mut self.hist, &mut bound, Some(&unseen), &mut Vec::new()) {
            Ok(s) => s,
            // A ref of the repository that this store never saw there, and that this
            // save would overwrite: the location holds another history.
            Err(Error::BranchMoved { branch, theirs }) => {
                return Err(Error::OtherHistory {
                    location: bound.location.clone(),
                    branch,
                    theirs,
                })
            }
            Err(e) => return Err(e),
        };
        match saved.into_result() {
            // A conflict or a ref name too long found while writing the refs comes after
            // every other ref was saved: the store is bound to the new repository.
            Err(e) if !matches!(e, Error::BranchMoved { .. } | Error::RefNameTooLong { .. }) => {
                Err(e)
            }
            r => {
                self.evict(&mut bound);
                self.repo = Some(bound);
                r
            }
        }
    }

    /// The content address of version `id`: the BLAKE3 hash of its version object, the
    /// same in every process and repository (messages, times, parents and contents
    /// included). Printable, and accepted by [`resolve`](Store::resolve) as a hex prefix
    /// once the version is saved or loaded.
    ///
    /// O(1) for a saved version; else O(chunks of it and its unsaved ancestors) hashing.
    /// With a [background save](Store::save_in_background) in flight, a version that was
    /// not saved before it waits for that save to end (the save may have written it
    /// with parents pruned since).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn version_hash(&self, id: VersionId) -> Result<ContentHash> {
        self.hist.node(id)?;
        // While a background save runs, the versions saved before it, and, for a
        // version they lack, what that save wrote once it is done: it may have written
        // the version with parents this store pruned since.
        let mut known: HashMap<VersionId, ContentHash> = match (&self.repo, &self.bg.inflight) {
            (Some(b), _) => b.saved.clone(),
            (None, Some(f)) if f.saved.contains_key(&id) => f.saved.clone(),
            (None, Some(f)) => f.saved_when_done(),
            (None, None) => HashMap::new(),
        };
        if let Some(h) = known.get(&id) {
            return Ok(*h);
        }
        let mut todo = BTreeSet::new();
        let mut stack = vec![id];
        while let Some(v) = stack.pop() {
            if known.contains_key(&v) || !todo.insert(v) {
                continue;
            }
            stack.extend(self.hist.node(v)?.parents.iter().copied());
        }
        for v in todo {
            let node = self.hist.node(v)?;
            let chunks: Vec<&Chunk> = node.vars.get()?.values().flat_map(|t| t.chunks()).collect();
            hash_chunks(&chunks);
            let (_, h, _) =
                version_object(&self.hist, v, |p| known.get(&p).copied(), &mut |name, t| {
                    Ok(manifest_bytes(name, t)?.1)
                })?;
            known.insert(v, h);
        }
        known.get(&id).copied().ok_or(Error::UnknownVersion { id })
    }

    /// Replace heap chunks held only by saved versions with stored chunks. Their buffers
    /// leave the process: the pool is cut back to what it held before, so that the heap
    /// and the pool together hold about the working state after a save. After a save
    /// (here or on a background writer) that succeeded: the versions `b` recorded since
    /// the last eviction are taken from it.
    pub(crate) fn evict(&mut self, b: &mut RepoLink) {
        let ids = std::mem::take(&mut b.unevicted);
        let b: &RepoLink = b;
        let mut replaced: HashMap<usize, Chunk> = HashMap::new();
        self.evict_saved(ids, &b.saved, |c| {
            c.cached_hash().filter(|h| b.chunks.contains(h))?;
            Some(
                replaced
                    .entry(c.addr())
                    .or_insert_with(|| b.stored_chunk(c.hash(), c.len_bytes()))
                    .clone(),
            )
        });
    }

    /// In the saved versions `new` and those [`Evictions`] holds for a look (`saved`:
    /// every version in the repository), replace each heap chunk that the working state
    /// does not hold by the stored chunk `stored` gives for it, if any (`stored` is
    /// dropped before the pool is cut). The freed buffers leave the process: the pool is
    /// cut back to what it held before.
    ///
    /// O(versions + working chunks + chunks of the versions looked at): the versions
    /// saved since the last eviction, those holding a chunk the working state or a base
    /// let go since, and those holding a chunk `stored` had no replacement for. Not
    /// every saved version's chunks: before, a save of a long history spent most of its
    /// time here.
    pub(crate) fn evict_saved(
        &mut self,
        new: Vec<VersionId>,
        saved: &HashMap<VersionId, ContentHash>,
        mut stored: impl FnMut(&Chunk) -> Option<Chunk>,
    ) {
        let pooled_before = self.pool().map(Pool::buffers);
        let mut keep: HashSet<usize> = self
            .working
            .values()
            .flat_map(|t| t.chunks().map(Chunk::addr))
            .collect();
        // A saved version that is the first parent of one not saved yet keeps its chunks
        // on the heap: the next save takes its deltas against them (an evicted base
        // would be read back from the repository and decoded first). At most the
        // versions a save has just written; the next save evicts them.
        for (id, node) in self.hist.live() {
            let Some(p) = node.parents.first().filter(|p| saved.contains_key(p)) else {
                continue;
            };
            if saved.contains_key(&id) {
                continue;
            }
            if let Some(vars) = self.hist.node(*p).ok().and_then(|n| n.vars.loaded()) {
                keep.extend(vars.values().flat_map(|t| t.chunks().map(Chunk::addr)));
            }
        }
        let todo = self.evictions.take(new, &keep);
        let mut pinned: Vec<(usize, VersionId)> = Vec::new();
        let mut retry: Vec<VersionId> = Vec::new();
        // A pin's range may hold versions that are not saved (committed on another line):
        // they keep their chunks.
        for id in todo.into_iter().filter(|id| saved.contains_key(id)) {
            let mut held = false;
            self.replace_chunks_in(vec![id], |c| {
                if c.is_stored() {
                    return None;
                }
                if keep.contains(&c.addr()) {
                    pinned.push((c.addr(), id));
                    return None;
                }
                let r = stored(c);
                held |= r.is_none();
                r
            });
            if held {
                retry.push(id);
            }
        }
        self.evictions.put_back(pinned, retry);
        // The raw chunks `stored` may hold go first, so that their buffers are freed
        // before the pool is cut back.
        drop(stored);
        if let (Some(pool), Some(keep)) = (self.pool(), pooled_before) {
            pool.truncate(keep);
        }
    }
}

/// The saved versions that may still hold chunks on the heap, between evictions (see
/// [`Store::evict_saved`]). A version saved since the last eviction is looked at by the
/// next one; after that only when a chunk that kept it on the heap left the working
/// state (and no unsaved version takes deltas against it), or when a chunk of it had no
/// stored replacement. A version holds a chunk's buffer, so that the buffer's address
/// names it while a version is listed for it.
#[derive(Debug, Default)]
pub(crate) struct Evictions {
    /// Chunk address -> the first and the last saved version (by id) found holding it on
    /// the heap because the working state (or an unsaved version's base) holds it too.
    /// When the chunk leaves the working state, every version between the two is looked
    /// at again (once): a range per chunk, not a list, so that a tensor that stays the
    /// same for a long run (a frozen backbone) costs one entry per chunk.
    pinned: HashMap<usize, (VersionId, VersionId)>,
    /// Versions a chunk of which had no stored replacement: looked at again.
    retry: HashSet<VersionId>,
}

impl Evictions {
    /// The versions to look at: `new`, the retried ones, and those in the ranges of the
    /// chunks not in `keep` any more (their pins go).
    fn take(&mut self, new: Vec<VersionId>, keep: &HashSet<usize>) -> Vec<VersionId> {
        let mut todo: HashSet<VersionId> = std::mem::take(&mut self.retry);
        todo.extend(new);
        self.pinned.retain(|addr, (first, last)| {
            if keep.contains(addr) {
                return true;
            }
            todo.extend((first.0..=last.0).map(VersionId));
            false
        });
        let mut todo: Vec<VersionId> = todo.into_iter().collect();
        todo.sort_unstable();
        todo
    }

    fn put_back(&mut self, pinned: Vec<(usize, VersionId)>, retry: Vec<VersionId>) {
        for (addr, id) in pinned {
            let range = self.pinned.entry(addr).or_insert((id, id));
            range.0 = range.0.min(id);
            range.1 = range.1.max(id);
        }
        self.retry.extend(retry);
    }
}

/// Times a save writes its objects again because a gc deleted objects while it wrote.
const MAX_SAVE_ROUNDS: usize = 4;

/// The save protocol proper; `b` is updated with what became durable, and the versions
/// forgotten in `hist` (collected by another process's gc) are added to `forgotten`.
/// `unseen`: for a save onto a repository the store was not bound to, the refs there
/// it did not see (see [`take_unseen_refs`]), checked before any ref is written.
pub(crate) fn save_into(
    hist: &mut History,
    b: &mut RepoLink,
    unseen: Option<&BTreeMap<String, (u64, RefEntry)>>,
    forgotten: &mut Vec<VersionId>,
) -> Result<Saved> {
    let mut stats = SaveStats::default();
    let mut round = 0;
    // gc runs this save waited for or took in (see `RepoLink::gc_check`).
    let mut settled = HashSet::new();
    loop {
        round += 1;
        b.check_config()?;
        let since = now_ns();
        // What other processes wrote since: index files, gc records and generation (a
        // gc that deleted objects since makes the store forget them first). Objects a
        // record lists are written again rather than reused, so that a gc that recorded
        // them before this save started never deletes them under it.
        b.catch_up()?;
        // Versions another process pruned and a gc collected are forgotten here too,
        // not written again.
        forgotten.extend(forget_collected(hist, b));
        let (wrote, rewrote) = write_objects(hist, b, &mut stats)?;
        // A gc run that started deleting since the catch-up (a new generation), or that
        // finished a run started before it (a record gone), may have deleted objects
        // this round wrote again or reused; so may a run whose entry the catch-up saw
        // and that is still deleting (the save waits until it closes or passes its
        // deadline). Write what is gone again before any ref names it. Only records
        // make objects deletable, so without any there is nothing to check.
        if !(wrote && !b.records_seen.is_empty() && b.gc_check(&rewrote, since, &mut settled)?) {
            break;
        }
        if round == MAX_SAVE_ROUNDS {
            return Err(Error::Io {
                path: b.location.clone(),
                kind: std::io::ErrorKind::Interrupted,
                message: format!(
                    "gc runs deleted objects during each of {MAX_SAVE_ROUNDS} rounds of this \
                     save; no ref was written, save again"
                ),
            });
        }
    }
    // Once more before the refs: a repository deleted while this save wrote its objects
    // gets no refs (the objects went into an empty location).
    b.check_config()?;
    if let Some(unseen) = unseen {
        check_unseen(hist, b, unseen)?;
    }
    write_refs(hist, b, stats)
}

/// Write the versions the repository lacks (or that gc recorded or deleted): packs with
/// the manifests (format 4) or packs and manifest objects, barrier, index, versions,
/// barrier; record them in `b`. Returns whether
/// anything was written, and the keys of the objects written again or reused that a gc
/// record lists.
fn write_objects(
    hist: &History,
    b: &mut RepoLink,
    stats: &mut SaveStats,
) -> Result<(bool, HashSet<String>)> {
    let backend = b.backend.clone();
    let written_before = stats.bytes_written;
    let mut redo = b.gc_keys.clone();
    redo.extend(b.gone.iter().cloned());
    let todo = unsaved_or_recorded(hist, &b.saved, &redo, &b.pruned)?;

    // Chunks of the new versions, each with its tensor's element width and the chunk at
    // the same index of the same variable in the version's first parent (the base a
    // delta may be taken against): hash (parallel), then keep those the repository
    // lacks.
    let mut seen = HashSet::new();
    let mut chunks: Vec<(&Chunk, usize, Option<&Chunk>)> = Vec::new();
    for v in &todo {
        let node = hist.node(*v)?;
        let parent_vars = node
            .parents
            .first()
            .and_then(|p| hist.node(*p).ok())
            .and_then(|n| n.vars.get().ok());
        for (name, t) in node.vars.get()?.iter() {
            let base_chunks: Vec<&Chunk> = parent_vars
                .and_then(|pv| pv.get(name))
                .filter(|pt| pt.dtype() == t.dtype() && pt.chunk_elems() == t.chunk_elems())
                .map(|pt| pt.chunks().collect())
                .unwrap_or_default();
            for (i, c) in t.chunks().enumerate() {
                if seen.insert(c.addr()) {
                    let base = base_chunks
                        .get(i)
                        .copied()
                        .filter(|bc| bc.len_bytes() == c.len_bytes() && !bc.ptr_eq(c));
                    chunks.push((c, t.dtype().size(), base));
                }
            }
        }
    }
    let plain: Vec<&Chunk> = chunks.iter().map(|c| c.0).collect();
    hash_chunks(&plain);
    let mut new_ids = HashSet::new();
    let mut new: Vec<NewChunk<'_>> = Vec::new();
    // Links of each new chunk's delta chain at most (its own included; 1 for a full
    // chunk): a delta is taken only against a base whose chain is shorter than
    // `MAX_DELTA_CHAIN`.
    let mut links: HashMap<ContentHash, usize> = HashMap::new();
    for (c, width, base) in chunks {
        let h = c.hash();
        if b.chain_links(&h).is_some() {
            if new_ids.insert(h) {
                stats.chunks_present += 1;
            }
        } else if new_ids.insert(h) {
            let chain = |bh: &ContentHash| {
                let n = links.get(bh).copied().or_else(|| b.chain_links(bh))?;
                (n < MAX_DELTA_CHAIN).then_some(n)
            };
            // A chunk the memory budget holds coded is written in that form when its
            // base (for a delta) is in the repository or new in this save, within the
            // chain bound: no decoding and coding again.
            let coded = encoded_ref(c).and_then(|e| match e.form()? {
                (bytes, None) => Some((bytes, Form::Planes, 1)),
                (bytes, Some(bh)) => Some((bytes, Form::Delta(bh.0), chain(&bh)? + 1)),
            });
            let base = base
                .and_then(|bc| Some((bc.cached_hash()?, bc)))
                .filter(|(bh, _)| *bh != h)
                .and_then(|(bh, bc)| Some((bh, bc, chain(&bh)?)));
            let n = match (coded, base) {
                (Some((_, _, n)), _) => n,
                (None, base) => base.map_or(1, |(_, _, n)| n + 1),
            };
            links.insert(h, n);
            new.push(NewChunk {
                id: h,
                chunk: c,
                width,
                base: base.map(|(bh, bc, _)| (bh, bc)),
                coded: coded.map(|(bytes, form, _)| (bytes, form)),
            });
        }
    }

    // The manifests the repository lacks. In format 4 they are entries of the last
    // pack (one file for all of them, durable with the packs); before, objects of
    // their own, put while the packs are written (on a local disk the packs' syncer
    // makes them durable meanwhile; on an object store their requests overlap the
    // packs'). Nothing trusts a manifest before the barrier below, and no reader takes
    // a manifest's presence for its chunks'.
    let packed = manifests_packed(b.chunks.format());
    let mut rewrote: HashSet<String> = HashSet::new();
    let mut manifests_new: HashSet<ContentHash> = HashSet::new();
    let mut manifest_ids: HashMap<(VersionId, &str), ContentHash> = HashMap::new();
    let mut manifest_objects: Vec<(String, Vec<u8>)> = Vec::new();
    let mut manifest_entries: Vec<Stored<'_>> = Vec::new();
    for v in &todo {
        for (name, t) in hist.node(*v)?.vars.get()?.iter() {
            let (bytes, id) = manifest_bytes(name, t)?;
            manifest_ids.insert((*v, name.as_str()), id);
            let absent = match b.chunks.locate(&id) {
                // In a pack: written again only if a gc record lists the pack.
                Some(l) if l.span.form == Form::Manifest => b.gc_candidates.contains(&id),
                _ => {
                    !b.manifests.contains(&id)
                        || (!b.gc_keys.is_empty() && b.gc_keys.contains(&manifest_key(&id)))
                }
            };
            if absent && manifests_new.insert(id) {
                stats.manifests_written += 1;
                if packed {
                    manifest_entries.push(Stored::manifest(id, bytes));
                    continue;
                }
                let key = manifest_key(&id);
                if b.gc_keys.contains(&key) {
                    rewrote.insert(key.clone());
                }
                stats.bytes_written += bytes.len() as u64;
                manifest_objects.push((key, bytes));
            }
        }
    }

    // Packs, then one index of them.
    let mut index = IndexBody::default();
    if b.chunks.format() != super::format::FORMAT_V1 {
        stats.chunks_written_as_held += new.iter().filter(|c| c.coded.is_some()).count();
    }
    let (packs, manifests_put) = std::thread::scope(|scope| {
        let manifests = (!manifest_objects.is_empty())
            .then(|| scope.spawn(|| backend.put_many(&manifest_objects)));
        let packs = write_packs(&*backend, b.chunks.format(), &new, manifest_entries, true);
        let put = manifests.map_or(Ok(()), |m| {
            m.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        (packs, put)
    });
    manifests_put?;
    drop(manifest_objects);
    for pack in packs? {
        let key = pack_key(&pack.id);
        if b.gc_keys.contains(&key) {
            rewrote.insert(key);
        }
        stats.packs_written += 1;
        for e in pack
            .entries
            .iter()
            .filter(|e| e.span.form != Form::Manifest)
        {
            stats.chunks_written += 1;
            stats.chunk_bytes_raw += e.span.raw_len();
            stats.chunk_bytes_stored += e.span.stored_len();
        }
        stats.bytes_written += pack.size;
        index.packs.push(IndexPack {
            pack: pack.id.0,
            chunks: pack.entries,
        });
    }
    let mut index_id = None;
    if !index.packs.is_empty() {
        // The packs are durable before an index names them: readers (and later saves)
        // trust the index, and skip writing a chunk it lists.
        backend.barrier()?;
        let (bytes, id) = b.chunks.encode_index(&mut index);
        backend.put(&index_key(&id), &bytes)?;
        stats.bytes_written += bytes.len() as u64;
        index_id = Some(id);
    }

    // Versions (parents before children).
    let mut new_versions: HashMap<VersionId, ContentHash> = HashMap::new();
    let mut new_parents: Vec<(VersionId, ContentHash, Vec<ContentHash>)> = Vec::new();
    let mut markers_new: Vec<(ContentHash, Vec<ContentHash>, Vec<u8>)> = Vec::new();
    let mut reused = HashSet::new();
    for v in &todo {
        // The manifests are written above: a version names them by id.
        let mut manifest_of = |name: &str, t: &Tensor| match manifest_ids.get(&(*v, name)) {
            Some(id) => Ok(*id),
            None => manifest_bytes(name, t).map(|(_, id)| id),
        };
        // A version written again (a gc recorded or deleted it) keeps its content
        // address: the same parents as before, through prune markers written again
        // where a gc took them.
        let original = match b.saved.get(v) {
            Some(h) => original_parents(hist, b, *h, &mut markers_new, &mut reused)?,
            None => None,
        };
        let hash_of = |p: VersionId| b.saved.get(&p).or_else(|| new_versions.get(&p)).copied();
        // A version keeps the `seq` it was first written with (its content address).
        let seq = b.seqs.get(v).copied().unwrap_or(v.0);
        let (bytes, id, parents) =
            version_object_with(hist, *v, seq, original, hash_of, &mut manifest_of)?;
        if b.gc_keys.contains(&version_key(&id)) {
            rewrote.insert(version_key(&id));
        }
        backend.put(&version_key(&id), &bytes)?;
        stats.versions_written += 1;
        stats.bytes_written += bytes.len() as u64;
        new_versions.insert(*v, id);
        new_parents.push((*v, id, parents));
    }

    for (h, _, bytes) in &markers_new {
        if b.gc_keys.contains(&pruned_key(h)) {
            rewrote.insert(pruned_key(h));
        }
        backend.put(&pruned_key(h), bytes)?;
        stats.bytes_written += bytes.len() as u64;
    }
    backend.barrier()?;

    // Everything above is durable: record it.
    for (h, parents, _) in markers_new {
        b.pruned.insert(h, parents);
    }
    {
        let mut idx = b.chunks.index.write().unwrap_or_else(|p| p.into_inner());
        for p in &index.packs {
            for e in &p.chunks {
                let h = ContentHash(e.id);
                idx.insert(
                    h,
                    Loc {
                        pack: ContentHash(p.pack),
                        span: e.span,
                    },
                );
                b.gc_candidates.remove(&h);
            }
        }
    }
    b.chunks.note_index(index_id);
    b.manifests.extend(manifests_new);
    for (v, h, parents) in new_parents {
        b.gone.remove(&version_key(&h));
        b.record_version(v, h, parents);
    }
    rewrote.extend(reused);
    Ok((stats.bytes_written > written_before, rewrote))
}

/// Move the refs (create-if-absent entries), then write prune markers and HEAD.
fn write_refs(hist: &History, b: &mut RepoLink, mut stats: SaveStats) -> Result<Saved> {
    let backend = b.backend.clone();
    // Refs: one create-if-absent log entry per ref that changed.
    let hash_of = |v: VersionId| b.saved.get(&v).copied();
    let mut names: BTreeSet<String> = hist.refs.keys().cloned().collect();
    names.extend(b.refs_seen.keys().cloned());
    let mut conflicts = Vec::new();
    // One ref that cannot be written never keeps the others (or HEAD) from moving.
    let mut failed: Vec<String> = Vec::new();
    let mut ref_error: Option<Error> = None;
    for name in names {
        let want = refs::entry_of(hist.refs.get(&name), &hash_of);
        let seen = b.refs_seen.get(&name);
        let unchanged = match seen {
            None => want.kind == EntryKind::Deleted,
            Some((_, e)) => *e == want,
        };
        if unchanged {
            continue;
        }
        // A name too long for a key (held from a repository an older build wrote on an
        // object store) can only be written where the repository has it already.
        if seen.is_none() {
            if let Err(e) = check_ref_name_len(&name) {
                ref_error.get_or_insert(e);
                continue;
            }
        }
        let mut seq = seen.map_or(0, |(s, _)| s + 1);
        let body = to_json(&want);
        let mut tries = 0;
        loop {
            tries += 1;
            let written = backend
                .put_if_absent(&ref_key(&name, seq), &body)
                .and_then(|outcome| {
                    // gc trims the entries before a ref's latest one, so the entry after
                    // the one this store saw may be absent although the ref moved further:
                    // a later entry wins over the one just created.
                    let latest = refs::read_latest(&*backend, &name)?;
                    Ok((outcome == PutOutcome::Created, latest))
                });
            let (created, latest) = match written {
                Ok(w) => w,
                Err(e) => {
                    failed.push(name.clone());
                    ref_error.get_or_insert(e);
                    break;
                }
            };
            match latest {
                Some((lseq, _)) if created && lseq == seq => {
                    stats.refs_written += 1;
                    stats.bytes_written += body.len() as u64;
                    b.refs_seen.insert(name.clone(), (seq, want.clone()));
                    break;
                }
                latest => {
                    let Some((lseq, lentry)) = latest else {
                        conflicts.push((name.clone(), None));
                        break;
                    };
                    if lentry == want {
                        b.refs_seen.insert(name.clone(), (lseq, lentry));
                        break;
                    }
                    if tries < 8 && fast_forward(hist, b, &lentry, &want) {
                        seq = lseq + 1;
                        continue;
                    }
                    let theirs = lentry.version.filter(|_| lentry.kind != EntryKind::Deleted);
                    conflicts.push((name.clone(), theirs));
                    break;
                }
            }
        }
    }

    // Prune markers, only once every ref is at its new state: a marker makes readers and
    // gc pass through a version, so it must not exist while a ref still reaches that
    // version through its children (the previous save's refs). After a conflict the
    // other process's version of that ref may still reach it: such markers wait for a
    // later save (all of them when that version's ancestry is not known here).
    let mut markers = Vec::new();
    let theirs_reach = if failed.is_empty() {
        reached_by(b, conflicts.iter().filter_map(|(_, h)| *h))
    } else {
        None
    };
    if let Some(theirs_reach) = theirs_reach {
        for (id, h) in &b.saved {
            if hist.node(*id).is_err() && !b.pruned.contains_key(h) && !theirs_reach.contains(h) {
                let parents = b.parents_of.get(h).cloned().unwrap_or_default();
                let bytes = to_json(&PrunedJson {
                    parents: parents.clone(),
                });
                backend.put(&pruned_key(h), &bytes)?;
                stats.bytes_written += bytes.len() as u64;
                markers.push((*h, parents));
            }
        }
    }

    // HEAD.
    let head = match &hist.head {
        Head::Branch(name) => Some(HeadJson::Branch(name.clone())),
        Head::Detached(v) => hash_of(*v).map(HeadJson::Detached),
    };
    let head_conflicts = matches!(&head, Some(HeadJson::Branch(n))
        if conflicts.iter().any(|(c, _)| c == n) || failed.contains(n)
            || (check_ref_name_len(n).is_err() && !b.refs_seen.contains_key(n)));
    let head = head.filter(|h| b.head_seen.as_ref() != Some(h) && !head_conflicts);
    if let Some(head) = &head {
        let body = to_json(head);
        backend.put(HEAD_KEY, &body)?;
        stats.bytes_written += body.len() as u64;
    }
    if head.is_some() || !markers.is_empty() {
        backend.barrier()?;
    }
    if head.is_some() {
        b.head_seen = head;
    }
    for (h, parents) in markers {
        b.pruned.insert(h, parents);
    }
    Ok(Saved {
        stats,
        conflicts,
        ref_error,
    })
}

/// The versions (content addresses) that `roots` reach through their saved parents and
/// prune markers, or `None` if one of them is not known to this store (not loaded yet).
fn reached_by(
    b: &RepoLink,
    roots: impl Iterator<Item = ContentHash>,
) -> Option<HashSet<ContentHash>> {
    let mut seen = HashSet::new();
    let mut stack: Vec<ContentHash> = roots.collect();
    while let Some(h) = stack.pop() {
        if !seen.insert(h) {
            continue;
        }
        let parents = b.parents_of.get(&h).or_else(|| b.pruned.get(&h))?;
        stack.extend(parents.iter().copied());
    }
    Some(seen)
}

/// Whether writing `want` over the repository's `theirs` loses nothing: both are the
/// same kind and `theirs`' version is an ancestor of `want`'s (which this store holds).
fn fast_forward(hist: &History, b: &RepoLink, theirs: &RefEntry, want: &RefEntry) -> bool {
    if theirs.kind != want.kind || want.kind == EntryKind::Deleted {
        return false;
    }
    let (Some(t), Some(w)) = (theirs.version, want.version) else {
        return false;
    };
    let (Some(tid), Some(wid)) = (b.by_hash.get(&t), b.by_hash.get(&w)) else {
        return false;
    };
    hist.ancestors(*wid).is_ok_and(|a| a.contains(tid))
}

#[cfg(test)]
mod evictions_tests {
    use super::*;

    #[test]
    fn a_chunk_pinned_by_many_versions_is_one_range_and_its_release_looks_at_them_once() {
        let mut e = Evictions::default();
        let keep: HashSet<usize> = [8, 16].into();
        // Versions 3..=1002 all hold chunk 8 (a frozen tensor); version 1002 holds 16.
        for v in 3..=1002u64 {
            e.put_back(vec![(8, VersionId(v))], Vec::new());
        }
        e.put_back(vec![(16, VersionId(1002))], vec![VersionId(1)]);
        assert_eq!(e.pinned.len(), 2);
        assert_eq!(e.pinned[&8], (VersionId(3), VersionId(1002)));
        // Both still held: only the new and the retried versions are looked at.
        assert_eq!(
            e.take(vec![VersionId(1003)], &keep),
            vec![VersionId(1), VersionId(1003)]
        );
        // Chunk 16 let go: version 1002 once; chunk 8 stays pinned.
        let keep8: HashSet<usize> = [8].into();
        assert_eq!(e.take(Vec::new(), &keep8), vec![VersionId(1002)]);
        assert_eq!(e.take(Vec::new(), &keep8), Vec::<VersionId>::new());
        // Chunk 8 let go: its 1000 versions, once.
        let got = e.take(Vec::new(), &HashSet::new());
        assert_eq!(got.len(), 1000);
        assert_eq!((got[0], got[999]), (VersionId(3), VersionId(1002)));
        assert!(e.take(Vec::new(), &HashSet::new()).is_empty());
    }
}
