//! Memory statistics and the integrity check.

use std::collections::HashSet;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::history::{Head, Vars};
use crate::store::Store;
use crate::tensor::verify_hashes;

/// What a store holds, against what deep copies would hold.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Live versions.
    pub versions: usize,
    /// Variables in the working state.
    pub variables: usize,
    /// Distinct chunks held by the working state and all live versions.
    pub unique_chunks: usize,
    /// Bytes of those chunks: the tensor data actually held.
    pub unique_bytes: usize,
    /// Memory the buffers of those chunks hold: for raw chunks on the heap at least their
    /// bytes, since buffers are whole 8-byte words and a buffer taken from the pool has
    /// the full `chunk_bytes` even when its chunk is shorter (the last chunk of a tensor,
    /// or chunks of whole rows that fill a chunk only in part); for chunks held encoded
    /// (see [`Config::memory_budget`](crate::Config::memory_budget)) their encoded forms,
    /// the bases their deltas keep alive, and decoded bytes kept after a read. Chunks in
    /// a repository count nothing. This is what the memory budget bounds.
    pub held_bytes: usize,
    /// What one deep copy of every live version would hold, plus one of the working state
    /// when it has uncommitted changes (saturating at `usize::MAX`). A working state equal
    /// to HEAD is HEAD's copy, not a second one: right after the first commit the ratio is
    /// 1.0.
    pub logical_bytes: usize,
    /// `logical_bytes / unique_bytes` (1.0 when nothing is held).
    pub sharing_ratio: f64,
    /// Freed chunk buffers kept for reuse (not counted in `unique_bytes`).
    pub pooled_bytes: usize,
    /// Of `unique_bytes`, the bytes of chunks held raw on the heap.
    pub heap_bytes: usize,
    /// Of `unique_bytes`, the (raw) bytes of chunks held encoded in memory.
    pub encoded_bytes: usize,
    /// Memory the encoded chunks hold (part of `held_bytes`): their encoded forms, the
    /// bases their deltas keep alive, and decoded bytes kept after a read.
    /// `encoded_bytes / encoded_held_bytes` is what encoding saves.
    pub encoded_held_bytes: usize,
    /// Of `unique_bytes`, the bytes of chunks that live in a repository (mapped or
    /// fetched when read, not on the heap).
    pub stored_bytes: usize,
    /// Bytes the chunks of `stored_bytes` take in the repository's packs (coded: byte
    /// planes or XOR deltas; raw chunks count their raw bytes). `stored_bytes /
    /// stored_pack_bytes` is what the repository's encoding saves on those chunks.
    /// Bases of deltas that no held version uses are not counted.
    pub stored_pack_bytes: usize,
}

impl Store {
    fn all_vars(&self) -> impl Iterator<Item = &Vars> + '_ {
        // Versions not read from the repository yet are read here; one that cannot be read
        // is left out (`verify` reports it).
        std::iter::once(&self.working)
            .chain(self.hist.live().filter_map(|(_, n)| n.vars.get().ok()))
    }

    /// Every distinct chunk held by the working state and the live versions.
    fn unique_chunks(&self) -> Vec<&Chunk> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for vars in self.all_vars() {
            for t in vars.values() {
                for c in t.chunks() {
                    if seen.insert(c.addr()) {
                        out.push(c);
                    }
                }
            }
        }
        out
    }

    pub(crate) fn unique_bytes(&self) -> usize {
        self.unique_chunks().iter().map(|c| c.len_bytes()).sum()
    }

    /// Versions, variables, distinct chunks and bytes actually held, logical bytes (what
    /// deep copies would hold) and the sharing ratio. O(chunks of all versions). Reads
    /// the manifests of versions an opened store has not used yet; a version whose
    /// manifests cannot be read is left out ([`verify`](Store::verify) reports it).
    #[must_use]
    pub fn stats(&self) -> Stats {
        let unique = self.unique_chunks();
        let unique_bytes: usize = unique.iter().map(|c| c.len_bytes()).sum();
        let mem = crate::encoded::memory_of(unique.iter().copied());
        let held_bytes = mem.raw_held + mem.encoded_held;
        // Deep copies of many versions can count more bytes than a `usize` holds.
        let working = self.is_dirty().then_some(&self.working);
        let logical_bytes = working
            .into_iter()
            .chain(self.hist.live().filter_map(|(_, n)| n.vars.get().ok()))
            .flat_map(|v| v.values())
            .fold(0usize, |a, t| a.saturating_add(t.nbytes()));
        Stats {
            versions: self.hist.live().count(),
            variables: self.working.len(),
            unique_chunks: unique.len(),
            unique_bytes,
            held_bytes,
            logical_bytes,
            sharing_ratio: if unique_bytes == 0 {
                1.0
            } else {
                logical_bytes as f64 / unique_bytes as f64
            },
            pooled_bytes: self.pooled_bytes(),
            heap_bytes: unique
                .iter()
                .filter(|c| !c.is_stored() && !c.is_encoded())
                .map(|c| c.len_bytes())
                .sum(),
            encoded_bytes: mem.encoded_raw,
            encoded_held_bytes: mem.encoded_held,
            stored_bytes: unique
                .iter()
                .filter(|c| c.is_stored())
                .map(|c| c.len_bytes())
                .sum(),
            stored_pack_bytes: unique
                .iter()
                .filter(|c| c.is_stored())
                .map(|c| crate::repo::stored_len_of(c).unwrap_or(c.len_bytes()))
                .sum(),
        }
    }

    /// Check everything: recompute the hash of every distinct chunk (in parallel, once per
    /// chunk) against its cached hash (caching it where none was), check every tensor's
    /// layout, and check the tree: parents and children agree, parents are older, refs,
    /// HEAD, the redo path and the reflog point at live versions.
    ///
    /// O(size of distinct chunks) hashing + O(versions + chunks).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] naming the first broken invariant.
    pub fn verify(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::Corrupt { reason });
        for (name, t) in self.working.iter() {
            t.verify_layout(name)?;
        }
        for (id, node) in self.hist.live() {
            for (name, t) in node.vars.get()?.iter() {
                t.verify_layout(&format!("{name}@{id}"))?;
            }
            for p in &node.parents {
                if *p >= id {
                    return bad(format!("{id} has parent {p}, which is not older"));
                }
                match self.hist.node(*p) {
                    Ok(pn) if pn.children.contains(&id) => {}
                    Ok(_) => return bad(format!("{p} does not list its child {id}")),
                    Err(_) => return bad(format!("{id} has a parent {p} that is not live")),
                }
            }
            for c in &node.children {
                match self.hist.node(*c) {
                    Ok(cn) if cn.parents.contains(&id) => {}
                    _ => return bad(format!("{id} lists {c} as a child, which is not")),
                }
            }
        }
        for (name, r) in &self.hist.refs {
            if self.hist.node(r.target()).is_err() {
                return bad(format!("ref `{name}` points at {}, not live", r.target()));
            }
        }
        match &self.hist.head {
            Head::Detached(v) if self.hist.node(*v).is_err() => {
                return bad(format!("HEAD is detached at {v}, not live"));
            }
            Head::Branch(b) if !self.hist.refs.contains_key(b) && self.hist.live().count() > 0 => {
                return bad(format!("HEAD is attached to `{b}`, which does not exist"));
            }
            _ => {}
        }
        for (name, v) in &self.hist.reflog {
            if self.hist.node(*v).is_err() {
                return bad(format!("reflog entry of `{name}` holds {v}, not live"));
            }
        }
        for r in &self.hist.redo {
            if self.hist.node(*r).is_err() {
                return bad(format!("redo path holds {r}, not live"));
            }
        }
        let chunks = self.unique_chunks();
        // Stored chunks are read (and checked against their hash) here, so that a missing
        // or damaged repository file is an error rather than a panic.
        crate::parallel::install(|| {
            chunks
                .par_iter()
                .filter(|c| c.is_unloaded())
                .try_for_each(|c| c.load())
        })?;
        if let Some(i) = verify_hashes(&chunks) {
            return bad(format!(
                "a chunk of {} bytes has a cached hash that does not match its bytes (#{i})",
                chunks[i].len_bytes()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array1;

    use crate::history::Ref;
    use crate::version::VersionId;
    use crate::{ContentHash, Error, Store};

    fn store() -> Store {
        let mut s = Store::new();
        s.insert("x", &Array1::from_elem(1000, 1.5f32)).unwrap();
        s.commit("a").unwrap();
        s
    }

    #[test]
    fn verify_catches_a_cached_hash_that_does_not_match_the_bytes() {
        let mut s = store();
        s.verify().unwrap();
        let forged = s.alloc.chunk_from_bytes(&[0u8; 4000]);
        forged.plant_hash_for_test(ContentHash::of_bytes(b"not these bytes"));
        let t = s
            .tensor("x")
            .unwrap()
            .with_chunks(std::iter::once(forged).collect());
        s.working.insert("x".into(), t);
        assert!(matches!(s.verify(), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn verify_catches_a_ref_to_a_version_that_is_not_live() {
        let mut s = store();
        s.hist.refs.insert("ghost".into(), Ref::Tag(VersionId(7)));
        assert!(matches!(s.verify(), Err(Error::Corrupt { reason }) if reason.contains("ghost")));
    }

    #[test]
    fn verify_catches_parent_and_child_links_that_disagree() {
        let mut s = store();
        s.commit("b").unwrap();
        s.hist.node_mut(VersionId(0)).unwrap().children.clear();
        assert!(matches!(s.verify(), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn verify_catches_a_chunk_of_the_wrong_length() {
        let mut s = store();
        let t = s.tensor("x").unwrap().clone();
        let short = s.alloc.chunk_from_bytes(&[0u8; 8]);
        s.working
            .insert("x".into(), t.with_chunks(std::iter::once(short).collect()));
        assert!(matches!(s.verify(), Err(Error::Corrupt { .. })));
    }
}
