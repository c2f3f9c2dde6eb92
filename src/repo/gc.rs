//! `Store::gc`: delete what no saved ref, tag or HEAD reaches, in two phases so that a
//! concurrent save never loses data, and rewrite mostly-dead packs.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::format::GenerationJson;

use serde::{Deserialize, Serialize};

use super::backend::{is_not_found, Backend, Bytes, ObjectInfo};
use super::format::{
    corrupt, encode, encode_index_in, gc_key, id_of_key, index_key, manifest_key, pack_key,
    parse_gc, parse_json, parse_ref_key, parse_version, pruned_key, version_key, EntryKind, GcBody,
    HeadJson, IndexBody, IndexPack, Kind, PrunedJson, FORMAT_V1, GC_PREFIX, HEAD_KEY, INDEX_PREFIX,
    MANIFESTS_PREFIX, PACKS_PREFIX, PRUNED_PREFIX, REFS_PREFIX, VERSIONS_PREFIX,
};
use super::generation::{
    close_generation, now_ns, start_generation, trim_generations, DEFAULT_DELETE_WITHIN,
};
use super::index::read_index_files;
use super::pack::{
    check_raw, read_manifest, read_stored, write_pack, Form, Loc, Span, Stored, WrittenPack,
};
use super::rebase::{code_pack, free_forms, Forms, Graph, GraphVersion, Planned, REBASE_BELOW};
use super::refs;
use super::RepoLink;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::store::Store;

/// A gc run that finds more index files than this merges them into one (every save
/// writes one, and opening a repository reads them all: one request each on object
/// storage).
pub const MERGE_INDEXES_ABOVE: usize = 8;

/// Default [`GcOptions::grace`]: one hour, longer than any save is expected to take.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(3600);

fn default_delete_within() -> Duration {
    DEFAULT_DELETE_WITHIN
}

/// How [`Store::gc_with`] collects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GcOptions {
    /// How long an object must stay unreferenced, from the gc run that first recorded
    /// it, before a later run deletes it (default [`DEFAULT_GC_GRACE`]). It must exceed
    /// the longest save of any process on the repository. `Duration::ZERO` deletes at
    /// once: only safe when no other process writes to the repository.
    pub grace: Duration,
    /// Packs whose live bytes are below this fraction of their chunk bytes are rewritten
    /// with only their live chunks (default 0.5).
    pub repack_below: f64,
    /// Write and delete nothing: only report what a run with these options would do
    /// (`objects_deleted` and `bytes_deleted` then count what it would delete, the
    /// packs it would rewrite included, `packs_rewritten` those packs and
    /// `chunks_unchained` the chunks it would code again; re-basing is not tried).
    pub dry_run: bool,
    /// How long a run may go on deleting once it announced its deletions (default
    /// [`DEFAULT_DELETE_WITHIN`]). The run's generation entry carries the deadline; the
    /// run starts no deletion after it and leaves the rest to a later run (its records
    /// stay). A save that wrote again an object the run may delete waits until the run
    /// is done or past its deadline (plus a margin for clocks, see `docs/FORMAT.md`),
    /// then writes again what is gone: so a longer time makes such saves wait longer
    /// after a run that crashed, and a shorter one lets a large run delete less.
    #[serde(default = "default_delete_within")]
    pub delete_within: Duration,
    /// Also code chunks stored whole (raw or byte planes) again as deltas against
    /// the chunk at the same index of the same variable in their version's first
    /// parent, where that saves at least 4%, rewriting each pack whose rewrite is at
    /// most [`REBASE_BELOW`](crate::REBASE_BELOW) of its bytes (default `false`). For
    /// histories written without deltas: DCP saves and other parts, repositories of
    /// stores that held no earlier version. Costs a decode and an encode of those
    /// chunks; a dry run does not try it. Format-1 repositories are left as they are.
    #[serde(default)]
    pub rebase: bool,
    /// Free what pruned versions leave behind inside delta chains (default `true`). A
    /// chunk of a live version stored as a delta needs its base, and that base's base:
    /// chunks of versions that were pruned stay as long as such a chain needs them.
    /// With `unchain`, each chunk of a live version whose chain needs a chunk that only
    /// pruned versions hold is coded again (against the same chunk of its nearest live
    /// ancestor, or whole) and its pack rewritten; a later run (this one with no grace)
    /// then deletes the pruned versions' chunks. Costs a decode and an encode of those
    /// chunks; a dry run does not try it. Format-1 repositories have no deltas.
    #[serde(default = "yes")]
    pub unchain: bool,
}

fn yes() -> bool {
    true
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            grace: DEFAULT_GC_GRACE,
            repack_below: 0.5,
            dry_run: false,
            delete_within: DEFAULT_DELETE_WITHIN,
            rebase: false,
            unchain: true,
        }
    }
}

impl GcOptions {
    /// Options that delete unreferenced data at once (single-writer tools and tests).
    #[must_use]
    pub fn immediate() -> GcOptions {
        GcOptions {
            grace: Duration::ZERO,
            ..GcOptions::default()
        }
    }
}

/// What a [`Store::gc`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GcStats {
    /// Versions reachable from the saved refs and HEAD, or held by the store.
    pub versions_live: usize,
    /// Chunks those versions hold.
    pub chunks_live: usize,
    /// Objects recorded as unreferenced by this run (deleted by a run `grace` later).
    pub candidates_recorded: usize,
    /// Objects deleted.
    pub objects_deleted: usize,
    /// Bytes of the objects deleted.
    pub bytes_deleted: u64,
    /// Packs rewritten: mostly-dead ones with only their live chunks, those holding
    /// chunks that were unchained ([`GcOptions::unchain`]), and (with
    /// [`GcOptions::rebase`]) those whose chunks were re-based.
    pub packs_rewritten: usize,
    /// Chunks stored whole that were written again as deltas ([`GcOptions::rebase`]).
    #[serde(default)]
    pub chunks_rebased: usize,
    /// Chunks of live versions coded again because their delta chains needed chunks
    /// that only pruned versions hold ([`GcOptions::unchain`]).
    #[serde(default)]
    pub chunks_unchained: usize,
    /// Bytes of the packs those rewrites replaced, and of the packs written for them.
    #[serde(default)]
    pub rewritten_bytes_before: u64,
    /// See [`rewritten_bytes_before`](GcStats::rewritten_bytes_before).
    #[serde(default)]
    pub rewritten_bytes_after: u64,
    /// Index files replaced by one that lists what they listed (more than
    /// [`MERGE_INDEXES_ABOVE`] were found; counted in `objects_deleted` too).
    #[serde(default)]
    pub indexes_merged: usize,
}

/// What the saved refs reach.
#[derive(Default)]
struct Live {
    keys: HashSet<String>,
    /// Live chunks, and live manifests that packs hold (format 4).
    chunks: HashSet<ContentHash>,
    /// How many of `chunks` are manifests.
    packed_manifests: usize,
    versions: usize,
}

fn ns_of(t: Option<SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
}

fn get(backend: &dyn Backend, key: &str) -> Result<Bytes> {
    backend.get(key).map_err(|e| {
        if is_not_found(&e) {
            corrupt(key, "missing (a saved ref reaches it)")
        } else {
            e
        }
    })
}

/// Mark: every object the latest ref log entries, HEAD and `held` (saved versions the
/// store running gc holds, where still present) reach.
fn mark(
    backend: &dyn Backend,
    objects: &[ObjectInfo],
    packed: &HashMap<ContentHash, Loc>,
    held: &[ContentHash],
    mut graph: Option<&mut Graph>,
) -> Result<Live> {
    let mut live = Live::default();
    let mut roots = Vec::new();
    for latest in refs::latest_keys(objects.iter().map(|o| o.key.as_str())).into_values() {
        let e = refs::read_entry(backend, &latest.key)?;
        roots.extend(e.version.filter(|_| e.kind != EntryKind::Deleted));
        live.keys.insert(latest.key);
    }
    match backend.get(HEAD_KEY) {
        Ok(bytes) => {
            if let Ok(HeadJson::Detached(h)) = parse_json(HEAD_KEY, &bytes) {
                roots.push(h);
            }
        }
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(e),
    }
    // The store running gc may differ from what the repository's refs and HEAD say
    // (another process replaced HEAD.json, or moved a branch this store still has): what
    // its own refs and HEAD reach stays, since its heap no longer has those chunks.
    let present: HashSet<&str> = objects.iter().map(|o| o.key.as_str()).collect();
    roots.extend(
        held.iter()
            .filter(|h| present.contains(version_key(h).as_str())),
    );
    let markers: HashSet<&str> = objects
        .iter()
        .filter(|o| o.key.starts_with(PRUNED_PREFIX))
        .map(|o| o.key.as_str())
        .collect();
    let root_set: HashSet<ContentHash> = roots.iter().copied().collect();
    let mut seen = HashSet::new();
    let mut manifests = HashSet::new();
    let mut stack = roots;
    while let Some(h) = stack.pop() {
        if !seen.insert(h) {
            continue;
        }
        let marker = pruned_key(&h);
        if !root_set.contains(&h) && markers.contains(marker.as_str()) {
            if let Ok(m) = parse_json::<PrunedJson>(&marker, &get(backend, &marker)?) {
                live.keys.insert(marker);
                if let Some(g) = graph.as_deref_mut() {
                    g.pruned_parent.insert(h, m.parents.first().copied());
                }
                stack.extend(m.parents);
                continue;
            }
        }
        let key = version_key(&h);
        let body = parse_version(&key, &get(backend, &key)?, Some(&h))?;
        live.keys.insert(key);
        live.versions += 1;
        stack.extend(body.parents.iter().map(|p| ContentHash(*p)));
        for (_, m) in &body.vars {
            let m = ContentHash(*m);
            if manifests.insert(m) {
                let loc = packed.get(&m).copied();
                let (_, man) = read_manifest(backend, &m, loc)?;
                live.chunks.extend(man.chunks.iter().copied());
                if loc.is_some() {
                    // The pack entry holding it stays, as a chunk's does.
                    if live.chunks.insert(m) {
                        live.packed_manifests += 1;
                    }
                } else {
                    live.keys.insert(manifest_key(&m));
                }
                if let Some(g) = graph.as_deref_mut() {
                    g.manifests.insert(m, man);
                }
            }
        }
        if let Some(g) = graph.as_deref_mut() {
            g.versions.push(GraphVersion {
                id: h,
                first_parent: body.parents.first().map(|p| ContentHash(*p)),
                vars: body
                    .vars
                    .iter()
                    .map(|(n, m)| (n.clone(), ContentHash(*m)))
                    .collect(),
            });
        }
    }
    Ok(live)
}

impl Store {
    /// [`gc_with`](Store::gc_with) the default options: objects found unreferenced are
    /// deleted by a later run at least an hour after this one recorded them.
    ///
    /// # Errors
    ///
    /// As for [`gc_with`](Store::gc_with).
    pub fn gc(&mut self) -> Result<GcStats> {
        self.gc_with(&GcOptions::default())
    }

    /// Delete repository data that no saved ref, tag or HEAD reaches (after `prune` and
    /// `save`, the repository shrinks), without locks:
    ///
    /// 1. Mark everything the latest saved refs and HEAD reach, and every saved version
    ///    this store holds (another process may have moved the refs or replaced HEAD
    ///    since; prune first to let gc delete versions no ref reaches).
    /// 2. Rewrite packs whose live bytes are below `repack_below`: new pack, barrier, new
    ///    index, barrier; the old pack is then unreferenced.
    /// 3. Record every unreferenced object in a gc record (saves from then on write those
    ///    chunks again instead of reusing them).
    /// 4. Delete the objects of records at least `grace` old that are still unreferenced
    ///    and were not rewritten since (indexes naming deleted packs are first replaced by
    ///    ones that do not), then the records. Before the first deletion, a new gc
    ///    generation entry tells every other store that objects may be gone: their next
    ///    save or refresh forgets what was deleted, and writes it again when needed.
    ///
    /// A save that runs concurrently never loses data as long as it takes less than
    /// `grace`: what it writes or reuses is referenced by the time step 4 looks again,
    /// and a save that writes again what this run is deleting waits for the run to be
    /// done (or past its deadline, `delete_within`) and writes it once more
    /// (`docs/FORMAT.md` states the rule and the clock assumption).
    ///
    /// O(repository metadata) reads + O(dead objects) deletes + O(live bytes of
    /// rewritten packs).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] without a repository; [`Error::Io`];
    /// [`Error::CorruptObject`] if an object a saved ref reaches is damaged or missing
    /// (nothing is deleted then).
    pub fn gc_with(&mut self, options: &GcOptions) -> Result<GcStats> {
        self.settle_save(true);
        let mut b = self.repo.take().ok_or_else(|| Error::InvalidArgument {
            reason: "this store has no repository".into(),
        })?;
        // Every saved version this store still holds (it reads their chunks back).
        let held: Vec<ContentHash> = b
            .saved
            .iter()
            .filter(|(id, _)| self.hist.node(**id).is_ok())
            .map(|(_, h)| *h)
            .collect();
        let result = gc_into(&mut b, options, &held);
        self.repo = Some(b);
        result
    }
}

/// What each index file read supersedes (superseded ones included), by id.
type SupersedesOf = HashMap<ContentHash, Vec<ContentHash>>;

/// Every non-superseded index file with its body, and what every file read supersedes.
fn read_indexes(
    backend: &dyn Backend,
    objects: &[ObjectInfo],
) -> Result<(Vec<(String, IndexBody)>, SupersedesOf)> {
    // A damaged index is left alone (its packs are then kept too).
    let keys = objects
        .iter()
        .map(|o| o.key.as_str())
        .filter(|k| k.starts_with(INDEX_PREFIX));
    let files = read_index_files(backend, keys, &HashSet::new())?;
    let supersedes = files
        .read
        .iter()
        .map(|f| {
            let ids = f.body.supersedes.iter().map(|h| ContentHash(*h)).collect();
            (f.id, ids)
        })
        .collect();
    let current = files.current().map(|f| (f.key, f.body)).collect();
    Ok((current, supersedes))
}

/// A chunk in a pack: its id and where the pack holds it.
type PackChunk = (ContentHash, Span);

/// The packs that the indexes name and that exist, and which of them serves each live
/// chunk (the first one found).
struct Packs {
    chunks: HashMap<ContentHash, Vec<PackChunk>>,
    serving: HashMap<ContentHash, ContentHash>,
}

impl Packs {
    /// Whether `pack` serves no live chunk.
    fn dead(&self, pack: &ContentHash) -> bool {
        self.chunks
            .get(pack)
            .is_none_or(|cs| cs.iter().all(|c| self.serving.get(&c.0) != Some(pack)))
    }
}

/// In a dry run, the pack that serves the chunks of the packs a run would rewrite.
const DRY_RUN_PACK: ContentHash = ContentHash([0; 32]);

/// The objects of one listing, by key.
type Listed<'a> = HashMap<&'a str, &'a ObjectInfo>;

/// The gc protocol proper (see [`Store::gc_with`] and `docs/FORMAT.md`): list, mark,
/// rewrite mostly-dead packs, record the unreferenced, delete what records of at least
/// `grace` age still list, trim.
fn gc_into(b: &mut RepoLink, options: &GcOptions, held: &[ContentHash]) -> Result<GcStats> {
    let backend = b.backend.clone();
    let backend = &*backend;
    let mut stats = GcStats::default();

    // List and mark.
    let objects = backend.list("")?;
    // A dry run plans the unchaining (from metadata) but not the re-basing (which
    // keeps a delta only where coding it shows a saving).
    let coding = b.chunks.format() != FORMAT_V1;
    let rebase = coding && options.rebase && !options.dry_run;
    let unchain = coding && options.unchain;
    let mut graph = (rebase || unchain).then(Graph::default);
    let (indexes, supersedes) = read_indexes(backend, &objects)?;
    let packed: HashMap<ContentHash, Loc> = indexes
        .iter()
        .flat_map(|(_, body)| &body.packs)
        .flat_map(|p| p.chunks.iter().map(move |e| (p.pack, e)))
        .filter(|(_, e)| e.span.form == Form::Manifest)
        .map(|(pack, e)| {
            let loc = Loc {
                pack: ContentHash(pack),
                span: e.span,
            };
            (ContentHash(e.id), loc)
        })
        .collect();
    let mut live = mark(backend, &objects, &packed, held, graph.as_mut())?;
    // The chunks of live versions, before their chains' bases join them.
    let version_live = unchain.then(|| live.chunks.clone());
    keep_bases(&mut live, &indexes);
    stats.versions_live = live.versions;
    stats.chunks_live = live.chunks.len() - live.packed_manifests;
    let listed: Listed<'_> = objects.iter().map(|o| (o.key.as_str(), o)).collect();

    // Rewrite mostly-dead packs: new pack and index first, then the old pack is garbage.
    let mut packs = serving_packs(&indexes, &listed, &live);
    let unchained = version_live.map(|v| free_chains(&mut packs, &v, &live.chunks));
    let mut rewrite = plan_repack(&packs, options.repack_below);
    let rebased = graph.map(|g| {
        let plan = Plan {
            graph: &g,
            rebase,
            unchained: unchained.as_ref(),
        };
        plan_rebase(&plan, &indexes, &packs, &mut rewrite)
    });
    if options.dry_run {
        // Each rewritten pack would then serve nothing: count it with what a run
        // deletes. `DRY_RUN_PACK` stands for the packs a run would write.
        stats.packs_rewritten = rewrite.len();
        for r in &rewrite {
            for (id, _) in &r.chunks {
                packs.serving.insert(*id, DRY_RUN_PACK);
            }
        }
        stats.chunks_unchained = rebased
            .as_ref()
            .map_or(0, |r| r.planned.values().filter(|p| p.required).count());
    } else if !rewrite.is_empty() {
        repack(b, &rewrite, rebased.as_ref(), &mut packs, &mut stats)?;
    }

    // Phase 1: record what is unreferenced now.
    let (candidates, candidate_chunks) = unreferenced(&objects, &live, &packs);
    let now = now_ns();
    let mut records = read_records(backend, &objects, options.dry_run)?;
    stats.candidates_recorded = record(
        b,
        options.dry_run,
        now,
        &candidates,
        candidate_chunks,
        &mut records,
    )?;

    // Phase 2: delete candidates of records old enough, still unreferenced, unchanged.
    let grace = u64::try_from(options.grace.as_nanos()).unwrap_or(u64::MAX);
    let (mut doomed, done_records) = due(&records, &candidates, &listed, now, grace);
    let merge = indexes.len() > MERGE_INDEXES_ABOVE;
    if options.dry_run {
        let (old_indexes, _) = indexes_to_replace(&indexes, &doomed, merge, &listed, &supersedes);
        if merge {
            stats.indexes_merged = old_indexes.len();
        }
        let gone = old_indexes
            .iter()
            .map(String::as_str)
            .chain(doomed.iter().copied());
        for k in gone {
            stats.objects_deleted += 1;
            stats.bytes_deleted += listed.get(k).map_or(0, |o| o.size);
        }
        return Ok(stats);
    }
    let mut run = None;
    if !doomed.is_empty() || merge {
        let (seq, entry) =
            start_generation(backend, now_ns(), &done_records, options.delete_within)?;
        run = Some((seq, entry));
    }
    let mut finish = |b: &mut RepoLink, stats: &mut GcStats| -> Result<()> {
        let mut finished = true;
        if let Some((_, entry)) = &run {
            look_again(backend, &listed, &mut doomed)?;
            let (old_indexes, replacement) =
                indexes_to_replace(&indexes, &doomed, merge, &listed, &supersedes);
            let before = stats.objects_deleted;
            let deadline = entry.deadline_ns.unwrap_or(0);
            finished = delete(
                b,
                &listed,
                &old_indexes,
                &replacement,
                &doomed,
                deadline,
                stats,
            )?;
            if merge {
                // The old indexes are deleted first.
                stats.indexes_merged = old_indexes.len().min(stats.objects_deleted - before);
            }
        }
        trim(b, &done_records, finished, run.clone())
    };
    let result = finish(b, &mut stats);
    if let (Err(_), Some((seq, entry))) = (&result, run.clone()) {
        // The run deletes nothing more: saves waiting for it go on. If this fails too,
        // the entry's deadline ends the wait.
        let _ = close_generation(backend, seq, entry);
    }
    result.map(|()| stats)
}

/// Mark every chunk that a live chunk's delta chain needs, transitively: the bases any
/// index entry of a live chunk names (a chunk stored in two packs in two forms keeps
/// the bases of both). O(index entries).
fn keep_bases(live: &mut Live, indexes: &[(String, IndexBody)]) {
    let mut bases: HashMap<ContentHash, Vec<ContentHash>> = HashMap::new();
    for (_, body) in indexes {
        for e in body.packs.iter().flat_map(|p| &p.chunks) {
            if let Some(base) = e.span.base() {
                bases.entry(ContentHash(e.id)).or_default().push(base);
            }
        }
    }
    if bases.is_empty() {
        return;
    }
    let mut todo: Vec<ContentHash> = live
        .chunks
        .iter()
        .filter(|h| bases.contains_key(h))
        .copied()
        .collect();
    while let Some(h) = todo.pop() {
        for base in bases.get(&h).into_iter().flatten() {
            if live.chunks.insert(*base) {
                todo.push(*base);
            }
        }
    }
}

/// Which pack serves each live chunk; every listed pack's chunks.
fn serving_packs(indexes: &[(String, IndexBody)], listed: &Listed<'_>, live: &Live) -> Packs {
    let mut packs = Packs {
        chunks: HashMap::new(),
        serving: HashMap::new(),
    };
    for (_, body) in indexes {
        for p in &body.packs {
            let pack = ContentHash(p.pack);
            if !listed.contains_key(pack_key(&pack).as_str()) {
                continue;
            }
            let list = packs.chunks.entry(pack).or_default();
            for e in &p.chunks {
                let id = ContentHash(e.id);
                list.push((id, e.span));
                if live.chunks.contains(&id) {
                    packs.serving.entry(id).or_insert(pack);
                }
            }
        }
    }
    packs
}

/// A pack to write again: the live chunks it serves; `optional` for one that only
/// re-basing would rewrite.
struct Rewrite {
    pack: ContentHash,
    chunks: Vec<PackChunk>,
    optional: bool,
}

/// The packs whose live bytes are below `repack_below` of their chunk bytes, each with
/// the live chunks it serves.
fn plan_repack(packs: &Packs, repack_below: f64) -> Vec<Rewrite> {
    let mut rewrite = Vec::new();
    for (pack, chunks) in &packs.chunks {
        let total: u64 = chunks.iter().map(|c| c.1.stored_len()).sum();
        let served: Vec<&PackChunk> = chunks
            .iter()
            .filter(|c| packs.serving.get(&c.0) == Some(pack))
            .collect();
        let live_bytes: u64 = served.iter().map(|c| c.1.stored_len()).sum();
        if live_bytes > 0 && (live_bytes as f64) < repack_below * total as f64 {
            rewrite.push(Rewrite {
                pack: *pack,
                chunks: served.into_iter().copied().collect(),
                optional: false,
            });
        }
    }
    rewrite
}

/// What pruned versions left inside delta chains (see [`GcOptions::unchain`]).
struct Unchained {
    /// Chunks that gc keeps only as the bases of live chunks' deltas.
    base_only: HashSet<ContentHash>,
    /// Chunks of live versions with no stored form free of `base_only`.
    stranded: HashSet<ContentHash>,
    /// Every stored form of each chunk of a live version.
    forms: Forms,
    /// The chunks of live versions that have a free form.
    free: HashSet<ContentHash>,
}

impl Unchained {
    /// Whether a stored form needs no chunk of `base_only` once the `planned` chunks
    /// are coded again (each planned chunk's chain is free: see `Graph::unchain`).
    fn form_free(&self, span: &Span, planned: &HashMap<ContentHash, Planned>) -> bool {
        span.base().is_none_or(|b| {
            !self.base_only.contains(&b) && (self.free.contains(&b) || planned.contains_key(&b))
        })
    }
}

/// Find the chunks of live versions whose chains need chunks that only pruned versions
/// hold; serve each chunk that has a form free of them from that form (so that the
/// packs of the other forms can go), and say which chunks are stranded (no such form).
/// O(index entries · chain bound).
fn free_chains(
    packs: &mut Packs,
    version_live: &HashSet<ContentHash>,
    live: &HashSet<ContentHash>,
) -> Unchained {
    let base_only: HashSet<ContentHash> = live.difference(version_live).copied().collect();
    let mut out = Unchained {
        base_only,
        stranded: HashSet::new(),
        forms: HashMap::new(),
        free: HashSet::new(),
    };
    if out.base_only.is_empty() {
        return out;
    }
    for (pack, chunks) in &packs.chunks {
        for (id, span) in chunks {
            if version_live.contains(id) {
                out.forms.entry(*id).or_default().push(Loc {
                    pack: *pack,
                    span: *span,
                });
            }
        }
    }
    let free = free_forms(&out.forms, version_live, &out.base_only);
    out.free = free
        .iter()
        .filter(|(_, f)| f.is_some())
        .map(|(c, _)| *c)
        .collect();
    let none = HashMap::new();
    // Packs holding a form that is not free (as things stand, before any planning).
    let mut unfree: HashSet<ContentHash> = HashSet::new();
    for (id, locs) in &out.forms {
        for loc in locs {
            if !out.form_free(&loc.span, &none) {
                unfree.insert(loc.pack);
            }
        }
        let Some(serving) = packs.serving.get(id).copied() else {
            continue;
        };
        match free.get(id).copied().flatten() {
            None => {
                out.stranded.insert(*id);
            }
            Some(f) => {
                let served_free = locs
                    .iter()
                    .any(|l| l.pack == serving && out.form_free(&l.span, &none));
                if !served_free {
                    packs.serving.insert(*id, f.pack);
                }
            }
        }
    }
    // A chunk that such a pack serves (a manifest beside the old forms, say) is served
    // from another pack where one holds it in a free form: the old pack then serves
    // nothing and goes as it is, instead of being written again each run until its
    // grace period ends.
    for (id, locs) in &out.forms {
        if packs.serving.get(id).is_some_and(|p| unfree.contains(p)) {
            if let Some(other) = locs
                .iter()
                .find(|l| !unfree.contains(&l.pack) && out.form_free(&l.span, &none))
            {
                packs.serving.insert(*id, other.pack);
            }
        }
    }
    out
}

/// What one gc run codes again: the graph of live versions, whether to re-base chunks
/// stored whole, and what pruned versions left inside chains.
struct Plan<'a> {
    graph: &'a Graph,
    rebase: bool,
    unchained: Option<&'a Unchained>,
}

/// The coding plan of one gc run: what each live chunk's served form is, and the
/// planned chunks (see `rebase.rs`).
struct Rebased {
    served: HashMap<ContentHash, Loc>,
    planned: HashMap<ContentHash, Planned>,
}

/// Plan the unchaining of stranded chunks and (with `rebase`) the re-basing of chunks
/// stored whole, and add the packs to write again to `rewrite`: each serving a
/// stranded chunk or holding a form that is not free (required), each serving a chunk
/// to re-base (optional: `repack` rewrites it only if that shrinks it enough).
/// O(live chunks + index entries).
fn plan_rebase(
    plan: &Plan<'_>,
    indexes: &[(String, IndexBody)],
    packs: &Packs,
    rewrite: &mut Vec<Rewrite>,
) -> Rebased {
    let mut served: HashMap<ContentHash, Loc> = HashMap::new();
    for (pack, chunks) in &packs.chunks {
        for (id, span) in chunks {
            if packs.serving.get(id) == Some(pack) {
                served.entry(*id).or_insert(Loc {
                    pack: *pack,
                    span: *span,
                });
            }
        }
    }
    let mut planned = match plan.unchained {
        Some(u) => plan.graph.unchain(&served, &u.stranded, &u.base_only),
        None => HashMap::new(),
    };
    if plan.rebase {
        let bases: HashSet<ContentHash> = indexes
            .iter()
            .flat_map(|(_, body)| body.packs.iter().flat_map(|p| &p.chunks))
            .filter_map(|e| e.span.base())
            .collect();
        planned = plan.graph.plan(&served, &bases, planned);
    }
    // A planned chunk whose served form is already the planned delta stays as it is
    // (its base is coded again instead).
    let unchanged: HashSet<ContentHash> = planned
        .iter()
        .filter(|(c, p)| {
            p.required && p.base.is_some() && served.get(c).is_some_and(|l| l.span.base() == p.base)
        })
        .map(|(c, _)| *c)
        .collect();
    let mut required: HashSet<ContentHash> = HashSet::new();
    let mut optional: HashSet<ContentHash> = HashSet::new();
    for (c, p) in &planned {
        if unchanged.contains(c) {
            continue;
        }
        if let Some(l) = served.get(c) {
            if p.required {
                required.insert(l.pack);
            } else {
                optional.insert(l.pack);
            }
        }
    }
    // Every pack still holding a form that is not free, so that the form goes.
    if let Some(u) = plan.unchained {
        for loc in u.forms.values().flatten() {
            if !u.form_free(&loc.span, &planned) {
                required.insert(loc.pack);
            }
        }
    }
    planned.retain(|c, _| !unchanged.contains(c));
    for r in rewrite.iter_mut() {
        required.remove(&r.pack);
        optional.remove(&r.pack);
    }
    let wanted = required
        .iter()
        .map(|p| (p, false))
        .chain(optional.difference(&required).map(|p| (p, true)));
    for (pack, optional) in wanted {
        let chunks: Vec<PackChunk> = packs.chunks[pack]
            .iter()
            .filter(|c| packs.serving.get(&c.0) == Some(pack))
            .copied()
            .collect();
        if chunks.is_empty() {
            // It serves nothing: it is garbage as it is.
            continue;
        }
        rewrite.push(Rewrite {
            pack: *pack,
            chunks,
            optional,
        });
    }
    Rebased { served, planned }
}

/// Write each pack of `rewrite` again with only its live chunks (with `rebased`, the
/// planned ones coded as deltas; an optional pack only if that shrinks it to at most
/// [`REBASE_BELOW`] of its bytes), barrier, one index of the new packs, barrier; the new
/// packs then serve those chunks (in `packs` and in the store's index).
fn repack(
    b: &mut RepoLink,
    rewrite: &[Rewrite],
    rebased: Option<&Rebased>,
    packs: &mut Packs,
    stats: &mut GcStats,
) -> Result<()> {
    let backend = b.backend.clone();
    let backend = &*backend;
    let mut index = IndexBody::default();
    let mut moved = Vec::new();
    for Rewrite {
        pack,
        chunks,
        optional,
    } in rewrite
    {
        let ids: Vec<ContentHash> = chunks.iter().map(|c| c.0).collect();
        let coded = match rebased {
            Some(r) => code_pack(
                backend,
                &r.served,
                &r.planned,
                &ids,
                super::format::delta_in(b.chunks.format()),
            )?,
            None => HashMap::new(),
        };
        let before: u64 = packs.chunks[pack].iter().map(|c| c.1.stored_len()).sum();
        let after: u64 = chunks
            .iter()
            .map(|(id, span)| {
                coded
                    .get(id)
                    .map_or(span.stored_len(), |c| c.bytes.len() as u64)
            })
            .sum();
        if *optional && after as f64 > REBASE_BELOW * before as f64 {
            continue;
        }
        if coded.is_empty() && chunks.len() == packs.chunks[pack].len() {
            // The same pack again (the same id): writing it over the durable one could
            // only tear it.
            continue;
        }
        // Chunks move in their stored forms (a delta stays a delta against the same
        // base, which the mark keeps live; a raw chunk is checked against its id), or
        // as the delta just coded, against a base the mark reached.
        // `None`: the delta in `coded`.
        let mut data: Vec<(ContentHash, Span, Option<Bytes>)> = Vec::with_capacity(chunks.len());
        for (id, span) in chunks {
            if let Some(c) = coded.get(id) {
                let span = Span {
                    len: c.bytes.len() as u64,
                    form: c.form,
                    ..*span
                };
                data.push((*id, span, None));
                continue;
            }
            let loc = Loc {
                pack: *pack,
                span: *span,
            };
            let stored = read_stored(backend, id, &loc)?;
            let stored = match span.form {
                Form::Raw | Form::Manifest => check_raw(&pack_key(pack), id, span, stored)?,
                _ => stored,
            };
            data.push((*id, *span, Some(stored)));
        }
        stats.packs_rewritten += 1;
        let unchained = coded.values().filter(|c| c.required).count();
        stats.chunks_unchained += unchained;
        stats.chunks_rebased += coded.len() - unchained;
        stats.rewritten_bytes_before += before;
        stats.rewritten_bytes_after += after;
        let moving: Vec<Stored<'_>> = data
            .iter()
            .map(|(h, span, d)| Stored {
                id: *h,
                bytes: std::borrow::Cow::Borrowed(match d {
                    Some(stored) => &stored[..],
                    None => &coded[h].bytes[..],
                }),
                raw_len: span.raw_len,
                form: span.form,
            })
            .collect();
        let WrittenPack {
            id: new_pack,
            entries,
            ..
        } = write_pack(backend, b.chunks.format(), &moving)?;
        for e in &entries {
            moved.push((
                ContentHash(e.id),
                Loc {
                    pack: new_pack,
                    span: e.span,
                },
            ));
        }
        // The new pack serves its chunks: it is no candidate for deletion, even if a
        // crashed earlier run left a pack of the same id (and so the same content) that
        // the listing saw unindexed.
        packs.chunks.insert(
            new_pack,
            entries
                .iter()
                .map(|e| (ContentHash(e.id), e.span))
                .collect(),
        );
        index.packs.push(IndexPack {
            pack: new_pack.0,
            chunks: entries,
        });
    }
    if index.packs.is_empty() {
        return Ok(());
    }
    // The new packs are durable before an index names them.
    backend.barrier()?;
    let (bytes, id) = b.chunks.encode_index(&mut index);
    backend.put(&index_key(&id), &bytes)?;
    backend.barrier()?;
    b.chunks.note_index(Some(id));
    let mut idx = b.chunks.index.write().unwrap_or_else(|p| p.into_inner());
    for (h, loc) in moved {
        packs.serving.insert(h, loc.pack);
        idx.insert(h, loc);
    }
    Ok(())
}

/// The unreferenced objects of the listing (packs serving no live chunk, manifests,
/// versions and markers not reached, ref log entries older than the latest), and the
/// chunks of those packs.
fn unreferenced(
    objects: &[ObjectInfo],
    live: &Live,
    packs: &Packs,
) -> (HashSet<String>, Vec<[u8; 32]>) {
    let latest_ref = refs::latest_keys(objects.iter().map(|o| o.key.as_str()));
    let mut candidates: HashSet<String> = HashSet::new();
    let mut candidate_chunks = Vec::new();
    for o in objects {
        let k = o.key.as_str();
        let dead = if k.starts_with(PACKS_PREFIX) {
            id_of_key(k, "thpack").is_some_and(|p| {
                let d = packs.dead(&p);
                if d {
                    // A live chunk of a dead pack is served by another (a rewrite moved
                    // it): it stays, and saves need not write it again.
                    candidate_chunks.extend(
                        packs
                            .chunks
                            .get(&p)
                            .into_iter()
                            .flatten()
                            .filter(|c| !live.chunks.contains(&c.0))
                            .map(|c| c.0 .0),
                    );
                }
                d
            })
        } else if k.starts_with(MANIFESTS_PREFIX)
            || k.starts_with(VERSIONS_PREFIX)
            || k.starts_with(PRUNED_PREFIX)
        {
            !live.keys.contains(k)
        } else if k.starts_with(REFS_PREFIX) {
            parse_ref_key(k)
                .is_some_and(|(name, seq)| latest_ref.get(&name).is_some_and(|l| seq < l.seq))
        } else {
            false
        };
        if dead {
            candidates.insert(o.key.clone());
        }
    }
    (candidates, candidate_chunks)
}

/// Every readable gc record of the listing. A record torn by a crash is deleted (it
/// only ever delays deletions), except in a dry run.
fn read_records(
    backend: &dyn Backend,
    objects: &[ObjectInfo],
    dry_run: bool,
) -> Result<Vec<(String, GcBody)>> {
    let mut records: Vec<(String, GcBody)> = Vec::new();
    for o in objects.iter().filter(|o| o.key.starts_with(GC_PREFIX)) {
        let Some(id) = id_of_key(&o.key, "thgc") else {
            continue;
        };
        match backend
            .get(&o.key)
            .and_then(|bytes| parse_gc(&o.key, &bytes, Some(&id)))
        {
            Ok(body) => records.push((o.key.clone(), body)),
            Err(Error::CorruptObject { .. }) if dry_run => {}
            Err(Error::CorruptObject { .. }) => backend.delete(&o.key)?,
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(records)
}

/// Write a gc record of the candidates no record lists yet (barrier), and add it to
/// `records`; a dry run only adds it, as if recorded now. Returns how many it records.
fn record(
    b: &mut RepoLink,
    dry_run: bool,
    now: u64,
    candidates: &HashSet<String>,
    candidate_chunks: Vec<[u8; 32]>,
    records: &mut Vec<(String, GcBody)>,
) -> Result<usize> {
    let recorded: HashSet<&String> = records.iter().flat_map(|(_, r)| r.keys.iter()).collect();
    let mut fresh: Vec<String> = candidates
        .iter()
        .filter(|k| !recorded.contains(k))
        .cloned()
        .collect();
    fresh.sort();
    if fresh.is_empty() {
        return Ok(0);
    }
    let n = fresh.len();
    if dry_run {
        let body = GcBody {
            time_ns: now,
            keys: fresh,
            chunks: Vec::new(),
        };
        records.push((String::new(), body));
        return Ok(n);
    }
    let body = GcBody {
        time_ns: now,
        keys: fresh,
        chunks: candidate_chunks,
    };
    let (bytes, id) = encode(Kind::Gc, &body);
    b.backend.put(&gc_key(&id), &bytes)?;
    b.backend.barrier()?;
    b.gc_candidates
        .extend(body.chunks.iter().map(|h| ContentHash(*h)));
    records.push((gc_key(&id), body));
    Ok(n)
}

/// The objects due for deletion: those of records at least `grace` old that are still
/// candidates and were not written again since the record; and those records' keys.
fn due<'r>(
    records: &'r [(String, GcBody)],
    candidates: &HashSet<String>,
    listed: &Listed<'_>,
    now: u64,
    grace: u64,
) -> (Vec<&'r str>, Vec<String>) {
    let mut doomed: Vec<&str> = Vec::new();
    let mut done_records = Vec::new();
    for (key, rec) in records {
        if now.saturating_sub(rec.time_ns) < grace {
            continue;
        }
        // "Not written again since the record" compares the object's modification time
        // with the record's own, both from the backend's clock (on S3 the server's), so
        // the gc host's clock is not trusted for it. Strictly older: S3 times have
        // one-second resolution, and an object of the record's second may be newer.
        let rec_modified = listed.get(key.as_str()).and_then(|o| o.modified);
        let unchanged = |o: &ObjectInfo| match (o.modified, rec_modified) {
            (Some(m), Some(r)) => m < r,
            _ => ns_of(o.modified) <= rec.time_ns,
        };
        for k in &rec.keys {
            let still =
                candidates.contains(k) && listed.get(k.as_str()).is_some_and(|o| unchanged(o));
            if still {
                doomed.push(k);
            }
        }
        done_records.push(key.clone());
    }
    (doomed, done_records)
}

/// After the deletions were announced (the generation entry: a store that saves or
/// refreshes from now on reads its listings again and forgets what is gone, and a save
/// running now checks again before it writes a ref, waiting for this run if it wrote
/// again what the run may delete), look again: an object written again since the first
/// listing (by a save that found it in a record) stays.
fn look_again(backend: &dyn Backend, listed: &Listed<'_>, doomed: &mut Vec<&str>) -> Result<()> {
    let again: HashMap<String, ObjectInfo> = backend
        .list("")?
        .into_iter()
        .map(|o| (o.key.clone(), o))
        .collect();
    doomed.retain(|k| match (listed.get(k), again.get(*k)) {
        (Some(before), Some(now)) => before.modified == now.modified && before.size == now.size,
        _ => false,
    });
    Ok(())
}

/// The indexes that name a pack about to go (with `merge`, every index read), and the
/// index that replaces them: it lists their other packs, and supersedes them and every
/// index they supersede, transitively, whose file is still listed (a run that wrote the
/// superseding index was stopped before it deleted those; once the indexes superseding
/// them are deleted, nothing else would keep readers off their entries, whose packs may
/// be gone, and a later merge would copy those entries). Those leftover files are
/// deleted too.
fn indexes_to_replace(
    indexes: &[(String, IndexBody)],
    doomed: &[&str],
    merge: bool,
    listed: &Listed<'_>,
    supersedes: &SupersedesOf,
) -> (Vec<String>, IndexBody) {
    let doomed_packs: HashSet<ContentHash> = doomed
        .iter()
        .filter(|k| k.starts_with(PACKS_PREFIX))
        .filter_map(|k| id_of_key(k, "thpack"))
        .collect();
    let mut old_indexes = Vec::new();
    let mut replacement = IndexBody::default();
    for (key, body) in indexes {
        if merge
            || body
                .packs
                .iter()
                .any(|p| doomed_packs.contains(&ContentHash(p.pack)))
        {
            old_indexes.push(key.clone());
            if let Some(id) = id_of_key(key, "thidx") {
                replacement.supersedes.push(id.0);
            }
            let mut todo: Vec<ContentHash> =
                body.supersedes.iter().map(|h| ContentHash(*h)).collect();
            while let Some(old) = todo.pop() {
                let k = index_key(&old);
                if listed.contains_key(k.as_str()) && !old_indexes.contains(&k) {
                    replacement.supersedes.push(old.0);
                    old_indexes.push(k);
                    todo.extend(supersedes.get(&old).into_iter().flatten());
                }
            }
            replacement.packs.extend(
                body.packs
                    .iter()
                    .filter(|p| !doomed_packs.contains(&ContentHash(p.pack)))
                    .cloned(),
            );
        }
    }
    (old_indexes, replacement)
}

/// Delete: the replacement index first (then the indexes it supersedes), then the
/// doomed objects, keeping the store's own bookkeeping in step; barrier. No deletion
/// starts at or after `deadline_ns` (this host's clock): returns whether every one was
/// made.
fn delete(
    b: &mut RepoLink,
    listed: &Listed<'_>,
    old_indexes: &[String],
    replacement: &IndexBody,
    doomed: &[&str],
    deadline_ns: u64,
    stats: &mut GcStats,
) -> Result<bool> {
    let backend = b.backend.clone();
    let backend = &*backend;
    if now_ns() >= deadline_ns {
        return Ok(false);
    }
    if !old_indexes.is_empty() {
        let (bytes, id) = encode_index_in(b.chunks.format(), replacement);
        backend.put(&index_key(&id), &bytes)?;
        backend.barrier()?;
        b.chunks.note_index(Some(id));
        for k in old_indexes {
            if now_ns() >= deadline_ns {
                backend.barrier()?;
                return Ok(false);
            }
            backend.delete(k)?;
            stats.objects_deleted += 1;
            stats.bytes_deleted += listed.get(k.as_str()).map_or(0, |o| o.size);
        }
    }
    for k in doomed {
        if now_ns() >= deadline_ns {
            backend.barrier()?;
            return Ok(false);
        }
        backend.delete(k)?;
        stats.objects_deleted += 1;
        stats.bytes_deleted += listed.get(k).map_or(0, |o| o.size);
        if let Some(p) = id_of_key(k, "thpack") {
            let mut idx = b.chunks.index.write().unwrap_or_else(|p| p.into_inner());
            idx.retain(|_, loc| loc.pack != p);
        }
        if let Some(v) = id_of_key(k, "thver") {
            // Keep the bookkeeping of versions this store holds in sync.
            if let Some(id) = b.by_hash.remove(&v) {
                b.saved.remove(&id);
            }
        }
        if let Some(m) = id_of_key(k, "thman") {
            b.manifests.remove(&m);
        }
    }
    backend.barrier()?;
    Ok(true)
}

/// After the deletions: remove the records they finished if every deletion was made
/// (`finished`; a run stopped at its deadline leaves them to a later run), barrier;
/// close this run's generation entry, remove the entries below it whose runs are done,
/// and catch up with what the repository holds now.
fn trim(
    b: &mut RepoLink,
    done_records: &[String],
    finished: bool,
    run: Option<(u64, GenerationJson)>,
) -> Result<()> {
    let backend = b.backend.clone();
    if finished {
        for k in done_records {
            backend.delete(k)?;
        }
        backend.barrier()?;
    }
    if let Some((seq, entry)) = run {
        close_generation(&*backend, seq, entry)?;
        trim_generations(&*backend, seq)?;
    }
    b.catch_up()
}
