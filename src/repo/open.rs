//! `Store::open`: connect to a repository and load its refs, HEAD, versions and
//! manifests (no chunk data); `Store::refresh`: take in what others saved since.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::backend::{is_not_found, Backend, PutOutcome};
use super::backend::{open_path, open_path_as};
use super::format::{
    corrupt, id_of_key, manifest_key, parse_json, parse_version, ref_key, to_json, version_key,
    ConfigJson, EntryKind, HeadJson, Manifest, PrunedJson, RefEntry, VersionBody, CONFIG_KEY,
    FORMAT_NAME, FORMAT_V1, FORMAT_VERSION, HEAD_KEY, MANIFESTS_PREFIX, PRUNED_PREFIX,
    VERSIONS_PREFIX,
};
use super::generation::GcView;
use super::refs;
use super::RepoChunks;
use super::RepoLink;
use crate::buffer::Bytes;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::{check_ref_name, Head, History, Ref, Vars, VarsSource, VersionVars};
use crate::store::Store;
use crate::tensor::{ChunkVec, Tensor};
use crate::version::VersionId;

/// Largest gap of unused ids left to give a loaded version the id it had when saved.
const MAX_ID_GAP: u64 = 1 << 20;

/// Where [`Store::open`] could not start at HEAD's version and started at an older one
/// instead (see [`Store::open_fallback`]).
///
/// HEAD's version names an object that does not read (a damaged or missing pack, index
/// or manifest): the store starts detached at the nearest version that reads (HEAD's
/// first-parent ancestors, then the newest), so that the rest of the history stays
/// usable; the branch still points at `wanted`, which gives [`Error::CorruptObject`]
/// when used. A program that resumes work from the working state must not take this
/// for the branch's tip without saying so.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenFallback {
    /// The branch HEAD was attached to in the repository (`None`: HEAD was detached).
    pub branch: Option<String>,
    /// HEAD's version, which does not read.
    pub wanted: VersionId,
    /// The version the store started at (HEAD is detached there).
    pub opened_at: VersionId,
    /// The error reading `wanted` gave.
    pub error: String,
}

/// What a [`Store::refresh`] took in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RefreshStats {
    /// Versions new to this store.
    pub versions_loaded: usize,
    /// Refs moved, created or deleted to match the repository.
    pub refs_updated: Vec<String>,
    /// Branches that moved both here and in the repository: this store keeps its own;
    /// merge the repository's (now loaded: see `theirs`) and save. A branch the
    /// repository deleted while this store moved it is listed too: the next save
    /// writes it again at this store's version.
    pub diverged: Vec<String>,
    /// For each branch in `diverged`, the repository's version of it, loaded into this
    /// store (`None`: the repository deleted it). Its content address is
    /// [`Store::version_hash`].
    pub theirs: BTreeMap<String, Option<VersionId>>,
}

impl RepoLink {
    /// Connect to the repository behind `backend`, creating it if the location is
    /// empty: check the format, read refs, HEAD, the chunk index, prune markers and gc
    /// records. Reads no version and no chunk.
    pub(crate) fn connect(backend: Arc<dyn Backend>) -> Result<RepoLink> {
        RepoLink::connect_as(backend, true)
    }

    /// [`connect`](RepoLink::connect); without `create`, an empty location is
    /// [`Error::NoRepository`] and nothing is written.
    pub(crate) fn connect_as(backend: Arc<dyn Backend>, create: bool) -> Result<RepoLink> {
        let config = match backend.get(CONFIG_KEY) {
            Ok(b) => b,
            Err(e) if is_not_found(&e) => {
                if !backend.list("")?.is_empty() {
                    // Another process may have created the repository between the read
                    // above and the listing: a repository's first object is its
                    // config.json, so it is there now if the objects listed are its.
                    match backend.get(CONFIG_KEY) {
                        Ok(b) => return RepoLink::connect_with(backend, b),
                        Err(e) if is_not_found(&e) => {}
                        Err(e) => return Err(e),
                    }
                    return Err(Error::UnsupportedFormat {
                        path: format!("{}/{CONFIG_KEY}", backend.location()),
                        found: "a non-empty location without a tensor-history config.json".into(),
                    });
                }
                if !create {
                    return Err(Error::NoRepository {
                        location: backend.location(),
                    });
                }
                let body = to_json(&ConfigJson {
                    format: FORMAT_NAME.into(),
                    version: u64::from(FORMAT_VERSION),
                    id: Some(super::format::new_repository_id()),
                });
                match backend.put_if_absent(CONFIG_KEY, &body)? {
                    PutOutcome::Created => {}
                    PutOutcome::AlreadyExists => {}
                }
                backend.get(CONFIG_KEY)?
            }
            Err(e) => return Err(e),
        };
        RepoLink::connect_with(backend, config)
    }

    /// [`connect`](RepoLink::connect) once the repository's config.json (`config`) is
    /// read.
    fn connect_with(backend: Arc<dyn Backend>, config: Bytes) -> Result<RepoLink> {
        let config_bytes = config.to_vec();
        let config: ConfigJson =
            parse_json(CONFIG_KEY, &config).map_err(|_| Error::UnsupportedFormat {
                path: CONFIG_KEY.into(),
                found: "a config.json that is not a tensor-history config".into(),
            })?;
        let format = u16::try_from(config.version)
            .ok()
            .filter(|v| (FORMAT_V1..=FORMAT_VERSION).contains(v));
        let Some(format) = format.filter(|_| config.format == FORMAT_NAME) else {
            return Err(Error::UnsupportedFormat {
                path: CONFIG_KEY.into(),
                found: format!("format `{}` version {}", config.format, config.version),
            });
        };
        let mut b = RepoLink::new(backend);
        b.chunks.set_format(format);
        b.config = config_bytes;
        b.refs_seen = refs::read_all(&*b.backend)?;
        b.head_seen = match b.backend.get(HEAD_KEY) {
            // HEAD is replaced in place (write and rename); a power loss can leave it torn.
            // It only says where to start, so an unreadable one means "the default".
            Ok(bytes) => parse_json(HEAD_KEY, &bytes).ok(),
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(e),
        };
        let view = GcView::read(&*b.backend)?;
        b.read_indexes()?;
        b.read_markers()?;
        b.take_gc_view(view);
        Ok(b)
    }

    /// Read the index files not read yet; whether a gc deleted objects since (see
    /// [`RepoChunks::read_indexes`](super::RepoChunks::read_indexes)).
    pub(crate) fn read_indexes(&mut self) -> Result<bool> {
        self.chunks.read_indexes(false)
    }

    /// After a gc deleted objects: forget the manifests and versions it took, so that a
    /// save writes them again when it needs them.
    pub(crate) fn forget_deleted(&mut self) -> Result<()> {
        let present: HashSet<String> = self
            .backend
            .list_keys(MANIFESTS_PREFIX)?
            .into_iter()
            .chain(self.backend.list_keys(VERSIONS_PREFIX)?)
            .collect();
        self.manifests
            .retain(|m| present.contains(&manifest_key(m)));
        for h in self.saved.values() {
            let key = version_key(h);
            if !present.contains(&key) {
                self.gone.insert(key);
            }
        }
        Ok(())
    }

    /// Read prune markers not read yet.
    pub(crate) fn read_markers(&mut self) -> Result<()> {
        for key in self.backend.list_keys(PRUNED_PREFIX)? {
            let Some(id) = id_of_key(&key, "json") else {
                continue;
            };
            if self.pruned.contains_key(&id) {
                continue;
            }
            // A marker torn by a crash before its save's barrier is ignored: the version
            // then simply stays in the history.
            if let Ok(bytes) = self.backend.get(&key) {
                if let Ok(m) = parse_json::<PrunedJson>(&key, &bytes) {
                    self.pruned.insert(id, m.parents);
                }
            }
        }
        Ok(())
    }
}

/// Versions read from the repository, checked, ready to enter the history.
struct Loaded {
    order: Vec<ContentHash>,
    bodies: HashMap<ContentHash, VersionBody>,
    parents: HashMap<ContentHash, Vec<ContentHash>>,
    vars: HashMap<ContentHash, VersionVars>,
}

/// Read every version reachable from `roots` (each with the key of the file that names
/// it: a ref log entry or HEAD) that `b` does not hold yet; their manifests are read when
/// first used. A root whose version object is absent is an error naming
/// the ref entry; a detached HEAD naming one is skipped (HEAD only says where to start).
/// Changes nothing.
fn read_versions(hist: &History, b: &RepoLink, roots: &[(ContentHash, String)]) -> Result<Loaded> {
    let backend = &*b.backend;
    let mut named_by: HashMap<ContentHash, &str> = HashMap::new();
    for (h, key) in roots {
        named_by.entry(*h).or_insert(key);
    }
    let mut bodies: HashMap<ContentHash, VersionBody> = HashMap::new();
    let mut visited = HashSet::new();
    let mut stack: Vec<ContentHash> = roots.iter().map(|(h, _)| *h).collect();
    while let Some(h) = stack.pop() {
        if b.by_hash.contains_key(&h) || !visited.insert(h) {
            continue;
        }
        let namer = named_by.get(&h).copied();
        if namer.is_none() {
            if let Some(ps) = b.pruned.get(&h) {
                stack.extend(ps.iter().copied());
                continue;
            }
        }
        let key = version_key(&h);
        let bytes = match (backend.get(&key), namer) {
            (Ok(bytes), _) => bytes,
            (Err(e), Some(HEAD_KEY)) if is_not_found(&e) => continue,
            (Err(e), Some(namer)) if is_not_found(&e) => {
                return Err(corrupt(
                    namer,
                    format!(
                        "names version {h}, but `{key}` is missing (deleted, or this entry \
                         is damaged)"
                    ),
                ))
            }
            (Err(e), _) if is_not_found(&e) => {
                return Err(corrupt(&key, "missing (the repository refers to it)"))
            }
            (Err(e), _) => return Err(e),
        };
        let body = parse_version(&key, &bytes, Some(&h))?;
        stack.extend(body.parents.iter().map(|p| ContentHash(*p)));
        bodies.insert(h, body);
    }

    // Parents as the history sees them: pruned ones replaced by their own parents.
    let mut parents: HashMap<ContentHash, Vec<ContentHash>> = HashMap::new();
    for (h, body) in &bodies {
        let mut out = Vec::new();
        let mut work: Vec<ContentHash> =
            body.parents.iter().rev().map(|p| ContentHash(*p)).collect();
        let mut seen = HashSet::new();
        while let Some(p) = work.pop() {
            if !seen.insert(p) {
                continue;
            }
            // A version this store holds, unless pruned here since: then its children
            // take its parents, as prune does in memory.
            let held = b.by_hash.get(&p).map(|id| hist.node(*id).is_ok());
            if bodies.contains_key(&p) || held == Some(true) {
                if !out.contains(&p) {
                    out.push(p);
                }
            } else if let Some(pp) = b.pruned.get(&p).or(held.and(b.parents_of.get(&p))) {
                work.extend(pp.iter().rev().copied());
            } else {
                return Err(corrupt(&version_key(h), format!("parent {p} is missing")));
            }
        }
        parents.insert(*h, out);
    }

    // Parents first; among the ready ones, creation order.
    let mut waiting: HashMap<ContentHash, usize> = HashMap::new();
    let mut children: HashMap<ContentHash, Vec<ContentHash>> = HashMap::new();
    let mut ready = BinaryHeap::new();
    for (h, ps) in &parents {
        let n = ps.iter().filter(|p| bodies.contains_key(p)).count();
        for p in ps.iter().filter(|p| bodies.contains_key(p)) {
            children.entry(*p).or_default().push(*h);
        }
        if n == 0 {
            ready.push(Reverse((bodies[h].seq, *h)));
        }
        waiting.insert(*h, n);
    }
    let mut order = Vec::with_capacity(bodies.len());
    while let Some(Reverse((_, h))) = ready.pop() {
        order.push(h);
        for c in children.get(&h).into_iter().flatten() {
            if let Some(n) = waiting.get_mut(c) {
                *n -= 1;
                if *n == 0 {
                    ready.push(Reverse((bodies[c].seq, *c)));
                }
            }
        }
    }
    if order.len() != bodies.len() {
        return Err(corrupt(VERSIONS_DIR, "the version graph has a cycle"));
    }

    // Each version's variables are read from its manifests when first used.
    let mut vars = HashMap::new();
    for h in &order {
        let source = ManifestVars {
            chunks: b.chunks.clone(),
            vars: bodies[h]
                .vars
                .iter()
                .map(|(name, m)| (name.clone(), ContentHash(*m)))
                .collect(),
        };
        vars.insert(*h, VersionVars::lazy(Arc::new(source)));
    }
    Ok(Loaded {
        order,
        bodies,
        parents,
        vars,
    })
}

const VERSIONS_DIR: &str = "versions/";

/// A saved version's variables, read from its manifests on first use.
pub(crate) struct ManifestVars {
    pub(crate) chunks: Arc<RepoChunks>,
    pub(crate) vars: Vec<(String, ContentHash)>,
}

impl VarsSource for ManifestVars {
    /// Read and check every manifest (in parallel: they are many small objects), and
    /// check that every chunk is indexed. Reads no chunk data.
    fn load(&self) -> Result<Vars> {
        let tensors: Vec<Tensor> = crate::parallel::install(|| {
            self.vars
                .par_iter()
                .with_min_len(8)
                .map(|(_, m)| {
                    let (name, manifest) = self.chunks.manifest(m)?;
                    tensor_of(&self.chunks, &name, &manifest)
                })
                .collect::<Result<_>>()
        })?;
        Ok(self
            .vars
            .iter()
            .map(|(name, _)| name.clone())
            .zip(tensors)
            .collect())
    }
}

fn tensor_of(chunks: &Arc<RepoChunks>, key: &str, m: &Manifest) -> Result<Tensor> {
    let mut locs = chunks.locate_all(&m.chunks);
    if locs.iter().any(Option::is_none) {
        // A gc may have replaced index files between this store's listing and its reads
        // (it merges them, or drops the packs it deletes): read every index again once.
        chunks.read_indexes(true)?;
        locs = chunks.locate_all(&m.chunks);
    }
    for (i, (id, loc)) in m.chunks.iter().zip(locs).enumerate() {
        match loc {
            Some(loc) if loc.span.raw_len() == m.chunk_len(i) as u64 => {}
            Some(loc) => {
                return Err(corrupt(
                    key,
                    format!(
                        "chunk {i} is {} bytes in the index, {} by the layout",
                        loc.span.raw_len(),
                        m.chunk_len(i)
                    ),
                ))
            }
            None => return Err(chunks.missing(id, key)),
        }
    }
    let handles: ChunkVec = m
        .chunks
        .iter()
        .enumerate()
        .map(|(i, id)| chunks.stored_chunk(*id, m.chunk_len(i)))
        .collect();
    Ok(Tensor::from_parts(
        m.dtype,
        &m.shape,
        m.chunk_elems,
        handles,
    ))
}

/// Put loaded versions into the history (ids as saved where free); returns how many.
fn insert_versions(hist: &mut History, b: &mut RepoLink, mut loaded: Loaded) -> usize {
    let n = loaded.order.len();
    for h in loaded.order {
        let Some(body) = loaded.bodies.remove(&h) else {
            continue;
        };
        // A saved version's manifests are in the repository (written before it): a save
        // reuses them rather than write them again.
        b.manifests
            .extend(body.vars.iter().map(|(_, m)| ContentHash(*m)));
        let parents: Vec<VersionId> = loaded.parents[&h]
            .iter()
            .filter_map(|p| b.by_hash.get(p).copied())
            .collect();
        let next = hist.next_id().0;
        let floor = parents.iter().map(|p| p.0 + 1).max().unwrap_or(0).max(next);
        let id = if body.seq >= floor && body.seq - floor <= MAX_ID_GAP {
            body.seq
        } else {
            floor
        };
        if id != body.seq {
            b.seqs.insert(VersionId(id), body.seq);
        }
        let time = body.time();
        hist.insert(
            VersionId(id),
            parents,
            body.message.as_str().into(),
            Arc::new(body.meta),
            time,
            loaded
                .vars
                .remove(&h)
                .unwrap_or_else(|| VersionVars::held(Vars::new())),
        );
        b.record_version(
            VersionId(id),
            h,
            body.parents.iter().map(|p| ContentHash(*p)).collect(),
        );
    }
    n
}

fn to_ref(b: &RepoLink, e: &RefEntry) -> Option<Ref> {
    let id = *b.by_hash.get(&e.version?)?;
    match e.kind {
        EntryKind::Branch => Some(Ref::Branch(id)),
        EntryKind::Tag => Some(Ref::Tag(id)),
        EntryKind::Deleted => None,
    }
}

/// The versions the refs and a detached HEAD name, each with the key of the file that
/// names it, except those `b` holds already.
fn roots_of(
    b: &RepoLink,
    refs: &BTreeMap<String, (u64, RefEntry)>,
    head: Option<&HeadJson>,
) -> Vec<(ContentHash, String)> {
    let mut roots: Vec<(ContentHash, String)> = refs
        .iter()
        .filter(|(_, (_, e))| e.kind != EntryKind::Deleted)
        .filter_map(|(name, (seq, e))| Some((e.version?, ref_key(name, *seq))))
        .collect();
    if let Some(HeadJson::Detached(h)) = head {
        roots.push((*h, HEAD_KEY.to_owned()));
    }
    roots.retain(|(h, _)| !b.by_hash.contains_key(h));
    roots
}

impl Store {
    /// Open the repository at `location` (a directory, created if absent, or a URL)
    /// with the default [`Config`]: refs, HEAD (with its branch) and the version tree
    /// come back as saved, and the working state is HEAD. No chunk data is read: chunks
    /// are mapped (or fetched) and checked against their hash on first read. Of the
    /// manifests (which chunks make each tensor), only HEAD's are read here; another
    /// version's are read, once, by the first call that needs its variables
    /// ([`restore`](Store::restore), [`checkout`](Store::checkout),
    /// [`snapshot`](Store::snapshot), [`diff`](Store::diff), merges, [`stats`](Store::stats),
    /// [`verify`](Store::verify), ...). Such a call can then also fail with
    /// [`Error::Io`] or [`Error::CorruptObject`] naming the manifest, and changes nothing
    /// when it does. If HEAD's own manifests do not read (damaged, or past a limit this
    /// build enforces, such as [`MAX_DIMS`](crate::MAX_DIMS)), the store starts detached
    /// at the nearest version that reads, HEAD's version gives the error when used, and
    /// [`open_fallback`](Store::open_fallback) says so: check it before resuming work.
    ///
    /// O(versions + HEAD's tensors) objects read.
    ///
    /// ```
    /// # use tensor_history::Store;
    /// # use ndarray::array;
    /// let dir = tempfile::tempdir().unwrap();
    /// let mut store = Store::new();
    /// store.insert("w", &array![1.0f32, 2.0])?;
    /// let v0 = store.commit("init")?;
    /// store.save_as(dir.path())?;
    ///
    /// let reopened = Store::open(dir.path())?;
    /// assert_eq!(reopened.head(), Some(v0));
    /// assert_eq!(reopened.get::<f32>("w")?, array![1.0f32, 2.0].into_dyn());
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Io`]; [`Error::UnsupportedFormat`] for a repository of another format
    /// version (or a non-empty directory that is not a repository);
    /// [`Error::CorruptObject`] naming a damaged or missing object.
    pub fn open(location: impl AsRef<Path>) -> Result<Store> {
        Store::open_with(location, Config::default())
    }

    /// [`open`](Store::open) with a [`Config`] for new tensors and retention.
    ///
    /// # Errors
    ///
    /// As for [`open`](Store::open), and [`Error::InvalidConfig`].
    pub fn open_with(location: impl AsRef<Path>, config: Config) -> Result<Store> {
        Store::open_backend(open_path(location.as_ref())?, config)
    }

    /// [`open`](Store::open) on a backend (an in-memory or simulated one, or one built
    /// by the caller).
    ///
    /// # Errors
    ///
    /// As for [`open_with`](Store::open_with).
    pub fn open_backend(backend: Arc<dyn Backend>, config: Config) -> Result<Store> {
        Store::open_backend_as(backend, config, true)
    }

    /// [`open_with`](Store::open_with) of a repository that must exist already: where
    /// there is none, [`Error::NoRepository`], and nothing is created or written at the
    /// location (no directory, no `config.json`). What readers call (a tool that only
    /// reads, a checkpoint loader), so that a mistyped path is an error, not a new empty
    /// repository.
    ///
    /// ```
    /// # use tensor_history::{Config, Error, Store};
    /// let dir = tempfile::tempdir().unwrap();
    /// let typo = dir.path().join("runs-typo");
    /// let err = Store::open_existing(&typo, Config::default()).unwrap_err();
    /// assert!(matches!(err, Error::NoRepository { .. }));
    /// assert!(!typo.exists());
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoRepository`], and as for [`open_with`](Store::open_with).
    pub fn open_existing(location: impl AsRef<Path>, config: Config) -> Result<Store> {
        Store::open_backend_as(open_path_as(location.as_ref(), false)?, config, false)
    }

    fn open_backend_as(backend: Arc<dyn Backend>, config: Config, create: bool) -> Result<Store> {
        let mut store = Store::with_config(config)?;
        let mut b = RepoLink::connect_as(backend, create)?;
        let mut hist = History::default();
        let refs = b.refs_seen.clone();
        let roots = roots_of(&b, &refs, b.head_seen.as_ref());
        let loaded = read_versions(&hist, &b, &roots)?;
        insert_versions(&mut hist, &mut b, loaded);
        for (name, (_, e)) in &refs {
            if check_ref_name(name).is_err() {
                continue;
            }
            if let Some(r) = to_ref(&b, e) {
                hist.set_ref(name.clone(), r);
            }
        }
        hist.set_head(pick_head(&hist, &b));
        if let Some(h) = hist.head_id() {
            match hist.node(h)?.vars.get() {
                Ok(_) => {}
                // HEAD's version names an object this build cannot read (a manifest of a
                // layout it refuses, or a damaged one): start detached at the nearest
                // version that reads, so that the rest of the history stays usable. The
                // version itself still gives the error when used.
                Err(e @ Error::CorruptObject { .. }) => {
                    let Some((id, _)) = readable_fallback(&hist, h) else {
                        return Err(e);
                    };
                    b.fallback = Some(OpenFallback {
                        branch: hist.head_branch().map(str::to_owned),
                        wanted: h,
                        opened_at: id,
                        error: e.to_string(),
                    });
                    hist.set_head(Head::Detached(id));
                }
                Err(e) => return Err(e),
            }
        }
        store.bind_opened(hist, Box::new(b))?;
        Ok(store)
    }

    /// Whether [`open`](Store::open) started at an older version because HEAD's did not
    /// read, and which ([`OpenFallback`]); `None` when it started at HEAD as saved. Check
    /// it before resuming work from an opened store: the working state is then the older
    /// version's, with HEAD detached there. O(1).
    ///
    /// ```
    /// # use tensor_history::Store;
    /// # use ndarray::array;
    /// let dir = tempfile::tempdir().unwrap();
    /// let mut store = Store::new();
    /// store.insert("w", &array![1.0f32])?;
    /// store.commit("init")?;
    /// store.save_as(dir.path())?;
    /// assert!(Store::open(dir.path())?.open_fallback().is_none());
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    #[must_use]
    pub fn open_fallback(&self) -> Option<&OpenFallback> {
        self.repo.as_ref()?.fallback.as_ref()
    }

    /// Take in the refs and versions that other processes saved since this store opened
    /// the repository or last refreshed. A ref this store did not move since follows the
    /// repository (the working state follows an attached branch when it is clean); a
    /// branch moved on both sides keeps this store's target and is reported as
    /// diverged, unless this store's version stays reachable from another of its refs
    /// and the branch is not the one HEAD is attached to (then it follows). The
    /// checked-out branch never moves off a version this store committed on it, so the
    /// working state changes only where this store made no commit of its own.
    /// Uncommitted changes are kept.
    ///
    /// O(new versions + refs) objects read.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] without a repository; [`Error::Io`],
    /// [`Error::CorruptObject`]. Nothing changes on error.
    pub fn refresh(&mut self) -> Result<RefreshStats> {
        self.settle_save(true);
        self.take_unreported()?;
        let mut b = self.repo.take().ok_or_else(|| Error::InvalidArgument {
            reason: "this store has no repository".into(),
        })?;
        let result = refresh_into(self, &mut b);
        self.repo = Some(b);
        result
    }
}

/// The version nearest to `head` whose variables read (its first-parent ancestors, then
/// every other version, newest first), with its variables.
fn readable_fallback(hist: &History, head: VersionId) -> Option<(VersionId, Vars)> {
    let mut order = Vec::new();
    let mut at = hist.node(head).ok()?.parents.first().copied();
    while let Some(v) = at {
        order.push(v);
        at = hist.node(v).ok()?.parents.first().copied();
    }
    order.extend(hist.live().rev().map(|(id, _)| id));
    order
        .into_iter()
        .filter(|&id| id != head)
        .find_map(|id| Some((id, hist.node(id).ok()?.vars.get().ok()?.clone())))
}

fn pick_head(hist: &History, b: &RepoLink) -> Head {
    let has_versions = hist.live().next().is_some();
    match &b.head_seen {
        Some(HeadJson::Branch(n))
            if matches!(hist.refs.get(n), Some(Ref::Branch(_))) || !has_versions =>
        {
            return Head::Branch(n.clone());
        }
        Some(HeadJson::Detached(h)) => {
            if let Some(id) = b.by_hash.get(h) {
                return Head::Detached(*id);
            }
        }
        _ => {}
    }
    if matches!(hist.refs.get("main"), Some(Ref::Branch(_))) || !has_versions {
        return Head::Branch("main".into());
    }
    if let Some((name, _)) = hist.refs.iter().find(|(_, r)| matches!(r, Ref::Branch(_))) {
        return Head::Branch(name.clone());
    }
    match hist.live().next_back() {
        Some((id, _)) => Head::Detached(id),
        None => Head::Branch("main".into()),
    }
}

fn refresh_into(store: &mut Store, b: &mut RepoLink) -> Result<RefreshStats> {
    b.check_config()?;
    b.catch_up()?;
    super::generation::forget_collected(&mut store.hist, b);
    let refs = refs::read_all(&*b.backend)?;
    let changed: BTreeMap<String, (u64, RefEntry)> = refs
        .into_iter()
        .filter(|(name, (seq, _))| b.refs_seen.get(name).is_none_or(|(s, _)| s < seq))
        .collect();
    // A ref that moved to a version this store pruned since: that version is loaded
    // again, under a new id (its old one stays pruned).
    let mut revived = Vec::new();
    for (_, e) in changed.values() {
        let Some(h) = e.version.filter(|_| e.kind != EntryKind::Deleted) else {
            continue;
        };
        if let Some(id) = b.by_hash.get(&h).copied() {
            if store.hist.node(id).is_err() {
                b.by_hash.remove(&h);
                b.saved.remove(&id);
                revived.push((h, id));
            }
        }
    }
    let roots = roots_of(b, &changed, None);
    let loaded = read_versions(&store.hist, b, &roots)
        .and_then(|l| read_checked_out(store, b, &changed, &l).map(|()| l));
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            for (h, id) in revived {
                b.by_hash.insert(h, id);
                b.saved.insert(id, h);
            }
            return Err(e);
        }
    };
    let mut stats = RefreshStats {
        versions_loaded: insert_versions(&mut store.hist, b, loaded),
        ..RefreshStats::default()
    };
    let hash_of = |v: VersionId| b.saved.get(&v).copied();
    for (name, (seq, theirs)) in changed {
        if check_ref_name(&name).is_err() {
            continue;
        }
        let local = store.hist.refs.get(&name).copied();
        let local_entry = refs::entry_of(local.as_ref(), &hash_of);
        let seen_entry = b.refs_seen.get(&name).map(|(_, e)| e.clone());
        let unchanged_here = match &seen_entry {
            Some(e) => *e == local_entry,
            None => local.is_none(),
        };
        if local_entry == theirs {
            b.refs_seen.insert(name, (seq, theirs));
            continue;
        }
        let checked_out = store.hist.head_branch() == Some(name.as_str());
        if !unchanged_here && theirs.kind == EntryKind::Deleted {
            // Deleted there, moved here: this store keeps its ref and takes the deletion
            // as seen, so that the next save writes the ref again (a deletion names no
            // version: nothing of the other side is lost).
            b.refs_seen.insert(name.clone(), (seq, theirs));
            stats.theirs.insert(name.clone(), None);
            stats.diverged.push(name);
            continue;
        }
        // A ref moved here loses nothing by following the repository's when this store
        // deleted it, or when its version stays reachable from another ref or a
        // detached HEAD; but the branch HEAD is attached to follows only if this store
        // did not move it: following would change the working state under the process
        // without its asking (its own version may be reachable from a tag, yet the
        // process trains on from it).
        let follows = unchanged_here
            || match local {
                None => true,
                Some(r) => !checked_out && reachable_elsewhere(&store.hist, &name, r.target()),
            };
        if !follows || (checked_out && (store.is_dirty() || theirs.kind != EntryKind::Branch)) {
            stats
                .theirs
                .insert(name.clone(), to_ref(b, &theirs).map(|r| r.target()));
            stats.diverged.push(name);
            continue;
        }
        match to_ref(b, &theirs) {
            Some(r) => {
                store.hist.set_ref(name.clone(), r);
                if checked_out {
                    // Read before anything changed (see `read_checked_out`).
                    let vars = store.hist.node(r.target())?.vars.get()?.clone();
                    store.follow_branch(vars);
                }
            }
            None => store.hist.remove_ref(&name),
        }
        b.refs_seen.insert(name.clone(), (seq, theirs));
        stats.refs_updated.push(name);
    }
    Ok(stats)
}

/// Whether version `v` is reachable from a ref other than `name`, or from a detached
/// HEAD.
fn reachable_elsewhere(hist: &History, name: &str, v: VersionId) -> bool {
    let mut roots: Vec<VersionId> = hist
        .refs
        .iter()
        .filter(|(n, _)| n.as_str() != name)
        .map(|(_, r)| r.target())
        .collect();
    if let Head::Detached(h) = hist.head {
        roots.push(h);
    }
    roots
        .into_iter()
        .any(|r| hist.ancestors(r).is_ok_and(|a| a.contains(&v)))
}

/// Read the variables of the version the checked-out branch may move to, so that a
/// refresh that cannot read them fails before it changes anything.
fn read_checked_out(
    store: &Store,
    b: &RepoLink,
    changed: &BTreeMap<String, (u64, RefEntry)>,
    loaded: &Loaded,
) -> Result<()> {
    let Some((_, entry)) = store.hist.head_branch().and_then(|name| changed.get(name)) else {
        return Ok(());
    };
    let Some(h) = entry.version.filter(|_| entry.kind == EntryKind::Branch) else {
        return Ok(());
    };
    if let Some(vars) = loaded.vars.get(&h) {
        vars.get()?;
    } else if let Some(node) = b.by_hash.get(&h).and_then(|id| store.hist.node(*id).ok()) {
        node.vars.get()?;
    }
    Ok(())
}
