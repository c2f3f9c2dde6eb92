//! Sharded tensors assembled into whole ones.
//!
//! Several writers of one version (the `torch.distributed.checkpoint` storage layer of
//! the Python package, see `docs/FORMAT.md`, "Several writers, one version") store each
//! shard of a tensor as a variable of its own, named `<name>@<o0>,<o1>,...`: the name of
//! the whole tensor and the shard's offset along each axis. [`Snapshot::whole_tensors`]
//! puts the shards of each name back together, so that a version written by many ranks
//! reads, exports and compares as the one model it holds, in one process.

use std::collections::BTreeMap;
use std::path::Path;

use crate::chunk::Alloc;
use crate::config::DEFAULT_CHUNK_BYTES;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;
use crate::tensor::Tensor;

/// The variable that marks a version written through the DCP storage layer (its pickled
/// `Metadata`); [`Snapshot::whole_tensors`] leaves it out.
pub const DCP_METADATA: &str = ".dcp/metadata";

/// `name@o0,o1,...` split into the whole tensor's name and the offsets, or `None` for a
/// name that is not a shard's.
fn parse_shard(name: &str) -> Option<(&str, Vec<usize>)> {
    let (whole, offsets) = name.rsplit_once('@')?;
    if whole.is_empty() || offsets.is_empty() {
        return None;
    }
    let offsets: Option<Vec<usize>> = offsets.split(',').map(|o| o.parse().ok()).collect();
    Some((whole, offsets?))
}

/// One shard: its offsets (one per axis of the whole tensor) and its tensor.
struct Shard<'a> {
    offsets: Vec<usize>,
    tensor: &'a Tensor,
}

fn bad(name: &str, why: String) -> Error {
    Error::InvalidArgument {
        reason: format!("the shards of `{name}` do not make one tensor: {why}"),
    }
}

/// The whole tensor's shape from its shards, after checking that they have one dtype
/// and rank, do not overlap and cover it exactly (so the allocation is bounded by the
/// shards' own bytes). A tensor of a dtype stored as raw bytes has one more axis than
/// its offsets (the element's bytes), covered whole by every shard.
fn whole_shape(name: &str, shards: &[Shard<'_>]) -> Result<(DType, Vec<usize>)> {
    let first = shards[0].tensor;
    let dtype = first.dtype();
    let rank = first.shape().len();
    let axes = shards[0].offsets.len();
    if rank != axes && rank != axes + 1 {
        return Err(bad(
            name,
            format!("{axes} offsets for a shard of rank {rank}"),
        ));
    }
    let mut shape = vec![0usize; rank];
    let mut volume: usize = 0;
    for s in shards {
        let t = s.tensor;
        if t.dtype() != dtype || t.shape().len() != rank || s.offsets.len() != axes {
            return Err(bad(name, "shards of different dtypes or ranks".into()));
        }
        if rank > axes && t.shape()[axes] != first.shape()[axes] {
            return Err(bad(name, "shards with different element sizes".into()));
        }
        for (d, extent) in shape.iter_mut().enumerate() {
            let o = s.offsets.get(d).copied().unwrap_or(0);
            let end = o
                .checked_add(t.shape()[d])
                .ok_or_else(|| bad(name, "an offset out of range".into()))?;
            *extent = (*extent).max(end);
        }
        volume = volume
            .checked_add(t.len())
            .ok_or_else(|| bad(name, "too many elements".into()))?;
    }
    let whole = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(name, "too many elements".into()))?;
    for (i, a) in shards.iter().enumerate() {
        for b in &shards[i + 1..] {
            let overlap = (0..axes).all(|d| {
                let (ao, bo) = (a.offsets[d], b.offsets[d]);
                ao < bo + b.tensor.shape()[d] && bo < ao + a.tensor.shape()[d]
            });
            if overlap && !a.tensor.is_empty() && !b.tensor.is_empty() {
                return Err(bad(
                    name,
                    format!("shards at {:?} and {:?} overlap", a.offsets, b.offsets),
                ));
            }
        }
    }
    if volume != whole {
        return Err(bad(
            name,
            format!("they hold {volume} elements of the {whole} of shape {shape:?}"),
        ));
    }
    Ok((dtype, shape))
}

/// Copy the row-major shard whose bytes are `pieces` in order (its chunks, a row may
/// straddle two) and whose shape is `sshape`, at `offsets`, into the row-major `whole`
/// (of shape `wshape`), elements of `size` bytes: one copy per innermost row or piece of
/// it, straight from the chunks.
fn place(
    whole: &mut [u8],
    wshape: &[usize],
    pieces: &[&[u8]],
    sshape: &[usize],
    offsets: &[usize],
    size: usize,
) {
    let rank = wshape.len();
    if rank == 0 || sshape.contains(&0) {
        return;
    }
    // Element strides of the whole tensor.
    let mut strides = vec![1usize; rank];
    for d in (0..rank - 1).rev() {
        strides[d] = strides[d + 1] * wshape[d + 1];
    }
    let offset = |d: usize| offsets.get(d).copied().unwrap_or(0);
    let row = sshape[rank - 1] * size;
    let rows: usize = sshape[..rank - 1].iter().product();
    // Where the next row starts in `pieces`.
    let (mut piece, mut within) = (0usize, 0usize);
    // The shard's index along the outer axes, last axis fastest.
    let mut index = vec![0usize; rank - 1];
    for _ in 0..rows {
        let at = offset(rank - 1)
            + index
                .iter()
                .enumerate()
                .map(|(d, i)| (offset(d) + i) * strides[d])
                .sum::<usize>();
        let mut dst = &mut whole[at * size..at * size + row];
        while !dst.is_empty() {
            let src = &pieces[piece][within..];
            let n = src.len().min(dst.len());
            dst[..n].copy_from_slice(&src[..n]);
            dst = &mut dst[n..];
            within += n;
            if within == pieces[piece].len() {
                piece += 1;
                within = 0;
            }
        }
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            if index[d] < sshape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

impl Snapshot {
    /// The snapshot's variables with sharded tensors assembled: every group of variables
    /// named `<name>@<o0>,<o1>,...` (a shard of `<name>` at those offsets, as the
    /// Python package's DCP storage layer stores them) becomes one tensor `<name>`, and
    /// the other variables are kept as they are, except [`DCP_METADATA`]. Sorted by
    /// name. Tensors that were not sharded share their chunks with the snapshot;
    /// assembled ones are new (chunks of [`DEFAULT_CHUNK_BYTES`]).
    ///
    /// O(size of the sharded tensors) time and memory, plus O(shards²) per tensor to
    /// check that its shards do not overlap.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the shards of a name are of different dtypes or
    /// ranks, overlap, leave part of the tensor out, or share their name with a whole
    /// tensor; [`Error::Io`] or [`Error::CorruptObject`] if a chunk that lives in a
    /// repository cannot be read.
    pub fn whole_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut plain: BTreeMap<String, Tensor> = BTreeMap::new();
        let mut sharded: BTreeMap<&str, Vec<Shard<'_>>> = BTreeMap::new();
        for (name, t) in self.tensors() {
            if name == DCP_METADATA {
                continue;
            }
            match parse_shard(name) {
                Some((whole, offsets)) => sharded
                    .entry(whole)
                    .or_default()
                    .push(Shard { offsets, tensor: t }),
                None => {
                    plain.insert(name.to_owned(), t.clone());
                }
            }
        }
        let alloc = Alloc::new(None);
        for (name, shards) in sharded {
            if plain.contains_key(name) {
                return Err(bad(name, "a whole tensor has that name too".into()));
            }
            let (dtype, shape) = whole_shape(name, &shards)?;
            let size = dtype.size();
            let total: usize = shape.iter().product::<usize>() * size;
            let mut whole = vec![0u8; total];
            for s in &shards {
                // Chunks that live in a repository are read (and checked) here.
                s.tensor.load()?;
                let pieces: Vec<&[u8]> = s.tensor.chunks().map(|c| c.data()).collect();
                place(
                    &mut whole,
                    &shape,
                    &pieces,
                    s.tensor.shape(),
                    &s.offsets,
                    size,
                );
            }
            let t =
                Tensor::from_le_bytes_in(name, dtype, &shape, &whole, DEFAULT_CHUNK_BYTES, &alloc)?;
            plain.insert(name.to_owned(), t);
        }
        Ok(plain.into_iter().collect())
    }

    /// Write [`whole_tensors`](Snapshot::whole_tensors) to a `.safetensors` file at
    /// `path`, atomically, as [`write_safetensors`](Snapshot::write_safetensors) writes
    /// the variables as stored.
    ///
    /// # Errors
    ///
    /// Those of [`whole_tensors`](Snapshot::whole_tensors) and
    /// [`write_safetensors`](Snapshot::write_safetensors); on error no file is left at
    /// `path` (an existing one is unchanged).
    pub fn write_whole_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let whole = self.whole_tensors()?;
        crate::safetensors::write_safetensors(whole.iter().map(|(n, t)| (n.as_str(), t)), path)
    }

    /// Whether this snapshot was written through the DCP storage layer (it holds
    /// [`DCP_METADATA`]). O(log variables).
    #[must_use]
    pub fn is_dcp(&self) -> bool {
        self.contains(DCP_METADATA)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_parse_and_others_do_not() {
        assert_eq!(parse_shard("w@0,256"), Some(("w", vec![0, 256])));
        assert_eq!(parse_shard("a@b@3"), Some(("a@b", vec![3])));
        for n in ["w", "w@", "@3", "w@1,x", "w@-1", "w@1,,2"] {
            assert_eq!(parse_shard(n), None, "{n}");
        }
    }

    #[test]
    fn place_copies_rows_at_their_offsets() {
        // A 3x4 whole of u8 from a 2x2 shard at (1, 2).
        let mut whole = vec![0u8; 12];
        // Its bytes in two chunks, the first row straddling them.
        place(
            &mut whole,
            &[3, 4],
            &[&[1], &[2, 3, 4]],
            &[2, 2],
            &[1, 2],
            1,
        );
        assert_eq!(whole, [0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4]);
    }
}
