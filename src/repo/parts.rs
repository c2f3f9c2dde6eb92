//! Several writers, one version: [`Store::write_part`] and [`Store::commit_parts`].
//!
//! Each writer (a process, a rank of a distributed job) writes the chunks of its tensors
//! that the repository lacks, in packs of its own, then their manifests, and returns a
//! [`Part`]: the names of its tensors and their manifest ids. One coordinator then
//! commits a version naming every part's tensors and saves it with the ordinary save
//! protocol (create-if-absent ref entries, so a moved branch is
//! [`Error::BranchMoved`]). Until that save, what the writers wrote is unreferenced:
//! gc collects it once its grace period has passed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::backend::{is_not_found, open_location, Backend};
use super::format::{index_key, manifest_key, manifests_packed, IndexBody, IndexPack};
use super::open::ManifestVars;
use super::pack::{write_packs, Form, NewChunk, Stored};
use super::save::{hash_chunks, manifest_bytes};
use super::RepoLink;
use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::history::{check_ref_name, check_ref_name_len, Head, Ref, VarsSource};
use crate::meta::Meta;
use crate::store::Store;
use crate::version::VersionId;
use crate::RefKind;

/// What one writer wrote durably for a version that several writers make together: its
/// tensors' names and manifest ids (the manifests, and the chunks they name, are in the
/// repository when [`Store::write_part`] returns it).
///
/// Small (about 40 bytes per tensor plus its name), `Serialize` (send it to the
/// coordinator however the writers talk to it) and printable as text with
/// [`Part::to_text`] / [`Part::from_text`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// Tensor name -> manifest id, sorted by name.
    pub items: Vec<(String, ContentHash)>,
}

impl Part {
    /// One line per tensor: the manifest id in hex, a space, the name. O(tensors).
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (name, id) in &self.items {
            out.push_str(&format!("{id} {name}\n"));
        }
        out
    }

    /// Parse [`Part::to_text`]'s form. O(length).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a line that is not a 64-digit hex id, a space and a
    /// name.
    pub fn from_text(text: &str) -> Result<Part> {
        let mut items = Vec::new();
        for line in text.lines() {
            let parsed = line
                .split_once(' ')
                .and_then(|(id, name)| Some((name.to_owned(), id.parse::<ContentHash>().ok()?)));
            match parsed {
                Some(item) => items.push(item),
                None => {
                    return Err(Error::InvalidArgument {
                        reason: format!("not a part line (`<64 hex> <name>`): `{line}`"),
                    })
                }
            }
        }
        Ok(Part { items })
    }
}

/// What [`Store::write_part`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PartStats {
    /// The part to give the coordinator.
    pub part: Part,
    /// Chunks written into new packs.
    pub chunks_written: usize,
    /// Distinct chunks the repository held already (not written).
    pub chunks_present: usize,
    /// Packs written.
    pub packs_written: usize,
    /// Manifests written.
    pub manifests_written: usize,
    /// Bytes of every object written.
    pub bytes_written: u64,
}

/// How [`Store::write_part_as`] stores the chunks a part writes. Either way they read
/// back the same, and their ids are the BLAKE3 of their raw bytes (a chunk present in
/// either form is not written again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PartChunks {
    /// Byte-plane coded where that saves at least 4% (in a format 2 or 3 repository), as
    /// a save stores a chunk without a delta base: on float32 training checkpoints about
    /// 15% smaller, at the cost of encoding on write and decoding on read.
    #[default]
    Coded,
    /// As they are: nothing to encode or decode. For writers whose cores are the
    /// bottleneck, such as many ranks sharing a few cores.
    Raw,
}

impl Store {
    /// Write every variable of the working state into the repository at `location` (a
    /// directory, created if absent, or a URL) as one writer's [`Part`] of a version that
    /// a coordinator commits with [`commit_parts`](Store::commit_parts): the chunks the
    /// repository lacks into packs of this writer, with every variable's manifest that no
    /// index lists (format 4; in format 3 and earlier, objects written after the index
    /// when not there already: one read each, concurrent on an object store, as are the
    /// writes), an index of them, then a barrier. No version, ref or HEAD is
    /// written, and this
    /// store is not bound to the repository (it may be an in-memory store made for the
    /// purpose). Many writers may write parts into one repository at once.
    ///
    /// A chunk a gc record lists is written again rather than reused. What a part wrote
    /// is unreferenced until a saved version names it: the coordinator must save within
    /// gc's grace period (one hour by default) after the first part was written.
    ///
    /// O(new chunks) written, O(chunks) hashed (parallel, cached); O(index files + refs)
    /// read to connect.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] from the backend, [`Error::UnsupportedFormat`] for a location that
    /// holds something else; the part is then not durable and must not be committed.
    pub fn write_part(&self, location: &str) -> Result<PartStats> {
        self.write_part_to(open_location(location)?)
    }

    /// [`write_part`](Store::write_part) into a backend.
    ///
    /// # Errors
    ///
    /// As for [`write_part`](Store::write_part).
    pub fn write_part_to(&self, backend: Arc<dyn Backend>) -> Result<PartStats> {
        self.write_part_to_as(backend, PartChunks::Coded)
    }

    /// [`write_part`](Store::write_part) with the new chunks stored as `how` says.
    ///
    /// # Errors
    ///
    /// As for [`write_part`](Store::write_part).
    pub fn write_part_as(&self, location: &str, how: PartChunks) -> Result<PartStats> {
        self.write_part_to_as(open_location(location)?, how)
    }

    /// [`write_part_to`](Store::write_part_to) with the new chunks stored as `how` says.
    ///
    /// # Errors
    ///
    /// As for [`write_part`](Store::write_part).
    pub fn write_part_to_as(
        &self,
        backend: Arc<dyn Backend>,
        how: PartChunks,
    ) -> Result<PartStats> {
        let b = RepoLink::connect(backend.clone())?;
        let mut stats = PartStats::default();
        let mut seen = HashSet::new();
        let chunks: Vec<(&Chunk, usize)> = self
            .working
            .values()
            .flat_map(|t| t.chunks().map(move |c| (c, t.dtype().size())))
            .filter(|(c, _)| seen.insert(c.addr()))
            .collect();
        let plain: Vec<&Chunk> = chunks.iter().map(|(c, _)| *c).collect();
        hash_chunks(&plain);
        let mut ids = HashSet::new();
        let mut new: Vec<NewChunk<'_>> = Vec::new();
        for (c, width) in chunks {
            let h = c.hash();
            if !ids.insert(h) {
                continue;
            }
            // Present with every link of its chain outside gc records (as a save reuses).
            if b.chain_links(&h).is_some() {
                stats.chunks_present += 1;
            } else {
                // A part has no parent version to take deltas against: its new chunks
                // are stored whole, byte-plane coded where that saves (formats 2 and 3)
                // unless asked for raw.
                new.push(NewChunk {
                    id: h,
                    chunk: c,
                    width,
                    base: None,
                    coded: None,
                });
            }
        }
        // The manifests: in format 4 entries of this writer's last pack (those no index
        // lists outside gc records; a pack is never written over), else objects.
        let packed = manifests_packed(b.chunks.format());
        let mut done = HashSet::new();
        let mut tail: Vec<Stored<'_>> = Vec::new();
        let mut manifests: Vec<(String, Vec<u8>)> = Vec::new();
        for (name, t) in self.working.iter() {
            let (bytes, id) = manifest_bytes(name, t)?;
            stats.part.items.push((name.clone(), id));
            if !done.insert(id) {
                continue;
            }
            if !packed {
                manifests.push((manifest_key(&id), bytes));
            } else if !b.chunks.locate(&id).is_some_and(|l| l.span.form.is_plain())
                || b.gc_candidates.contains(&id)
            {
                stats.manifests_written += 1;
                tail.push(Stored::manifest(id, bytes));
            }
        }
        let mut index = IndexBody::default();
        let code = how == PartChunks::Coded;
        for pack in write_packs(&*backend, b.chunks.format(), &new, tail, code)? {
            stats.packs_written += 1;
            stats.chunks_written += pack
                .entries
                .iter()
                .filter(|e| e.span.form != Form::Manifest)
                .count();
            stats.bytes_written += pack.size;
            index.packs.push(IndexPack {
                pack: pack.id.0,
                chunks: pack.entries,
            });
        }
        if !index.packs.is_empty() {
            // Packs durable before an index names them (as in a save).
            backend.barrier()?;
            let (bytes, id) = b.chunks.encode_index(&mut index);
            backend.put(&index_key(&id), &bytes)?;
            stats.bytes_written += bytes.len() as u64;
        }
        // Manifest objects (format 3 and earlier): every one is read first, all at once
        // (concurrently on an object store), then the ones not there whole are written,
        // all at once.
        let keys: Vec<String> = manifests.iter().map(|(k, _)| k.clone()).collect();
        let mut absent = Vec::new();
        for (got, (key, bytes)) in backend.get_many(&keys).into_iter().zip(manifests) {
            // A manifest already there whole is never written over: a version may name
            // it, and a put torn by a power loss would damage that version. One that is
            // there but damaged (a torn put of an earlier writer that nothing names) is
            // replaced.
            let whole = match got {
                Ok(old) => *old == *bytes,
                Err(e) if is_not_found(&e) => false,
                Err(e) => return Err(e),
            };
            if !whole {
                stats.manifests_written += 1;
                stats.bytes_written += bytes.len() as u64;
                absent.push((key, bytes));
            }
        }
        backend.put_many(&absent)?;
        backend.barrier()?;
        Ok(stats)
    }

    /// Commit one version onto `branch` whose variables are every tensor of `parts`
    /// (written by [`write_part`](Store::write_part), by this or other processes, into
    /// this store's repository), with `message` and `meta`; its parent is the branch's
    /// tip (none for a new branch). No tensor data is read: the manifests are read and
    /// every chunk they name is checked to be in the repository's index. Then
    /// [`save`](Store::save) publishes it: a branch that moved in the repository since
    /// this store read it is [`Error::BranchMoved`], and the version is then not
    /// published (what the parts wrote is garbage for gc).
    ///
    /// HEAD stays where it is, unless it is attached to `branch` (the working state then
    /// becomes the new version, as after a commit) or the store has no version yet (HEAD
    /// is then attached to `branch`).
    ///
    /// O(parts' tensors) manifests read, O(new index files) read.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] without a repository, or for a name two parts give
    /// different manifests; [`Error::InvalidRefName`], [`Error::RefNameTooLong`];
    /// [`Error::WrongRefKind`] if `branch` is a tag; [`Error::UncommittedChanges`] if the
    /// new version would become HEAD's (see above) while the working state has
    /// uncommitted changes; [`Error::CorruptObject`] for a
    /// manifest that is missing or damaged or a chunk not in the index (a part that is
    /// not durable); [`Error::Io`]. Nothing changes on error.
    pub fn commit_parts(
        &mut self,
        branch: &str,
        parts: &[Part],
        message: &str,
        meta: Meta,
    ) -> Result<VersionId> {
        self.settle_save(true);
        meta.validate()?;
        check_ref_name(branch)?;
        check_ref_name_len(branch)?;
        let tip = match self.hist.refs.get(branch) {
            Some(Ref::Branch(v)) => Some(*v),
            Some(Ref::Tag(_)) => {
                return Err(Error::WrongRefKind {
                    name: branch.to_owned(),
                    expected: RefKind::Branch,
                })
            }
            None => None,
        };
        // The new version becomes HEAD's when HEAD is attached to the branch, or when the
        // store has no version yet; uncommitted changes there would be lost.
        let takes_head = self.hist.head_branch() == Some(branch) || self.hist.head_id().is_none();
        if takes_head && self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        let mut items: BTreeMap<&str, ContentHash> = BTreeMap::new();
        for (name, id) in parts.iter().flat_map(|p| &p.items) {
            if let Some(other) = items.insert(name, *id) {
                if other != *id {
                    return Err(Error::InvalidArgument {
                        reason: format!(
                            "two parts name `{name}` with different manifests ({other} and {id})"
                        ),
                    });
                }
            }
        }
        let b = self.repo.as_mut().ok_or_else(|| Error::InvalidArgument {
            reason: "this store has no repository: open the one the parts were written to".into(),
        })?;
        // The writers' index files are new to this store.
        b.read_indexes()?;
        let source = ManifestVars {
            chunks: b.chunks.clone(),
            vars: items.iter().map(|(n, id)| ((*n).to_owned(), *id)).collect(),
        };
        let vars = source.load()?;
        b.manifests.extend(items.values().copied());
        let parents: Vec<VersionId> = tip.into_iter().collect();
        if takes_head {
            self.hist.set_head(Head::Branch(branch.to_owned()));
            return self.commit_vars(parents, message, meta, vars);
        }
        let id = self.hist.add(parents, message, meta, vars);
        self.hist.set_ref(branch.to_owned(), Ref::Branch(id));
        Ok(id)
    }
}
