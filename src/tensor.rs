//! Tensors: dtype + shape + a persistent vector of chunks.

use std::collections::HashSet;
use std::fmt;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Arc;

use ndarray::{ArrayBase, ArrayD, ArrayViewD, Data, DataMut, Dimension, IxDyn};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::chunk::{Alloc, Chunk};
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::kernels::{self, WriteMode};

/// The persistent container of a tensor's chunks (kept behind this alias so that it can
/// change without touching the rest of the crate).
pub(crate) type ChunkVec = imbl::Vector<Chunk>;

/// Work on fewer bytes than this runs on the calling thread. Handing a job to rayon's
/// pool from outside it costs microseconds, and moves data that the caller just touched
/// to another core's cache. Measured: with a 1 MiB threshold, an in-place `zip_update`
/// of a 4 MiB tensor in cache took 141-157 us on a rayon worker against 88 us on the
/// calling thread, and the training_undo example spent 312 ms in updates instead of
/// 169 ms.
pub(crate) const PAR_MIN_BYTES: usize = 8 << 20;

/// The threshold when the data is larger than the last-level cache (the store's working
/// state is): memory-bound work then gains from both cores' bandwidth even for a few
/// MiB. Measured on the 256 MiB report (4 MiB tensors): `write_unchanged` 0.72 with the
/// 8 MiB threshold, 1.05-1.09 with this one.
pub(crate) const PAR_MIN_BYTES_COLD: usize = 1 << 20;

/// How a store-driven write runs: where buffers come from, which stores the kernels use,
/// and from how many bytes work is split over rayon's pool.
#[derive(Debug)]
pub(crate) struct WriteCtx {
    pub(crate) alloc: Alloc,
    pub(crate) mode: WriteMode,
    pub(crate) par_min_bytes: usize,
}

/// Bytes compared on the calling thread before a chunk pair is handed to the parallel
/// full compare: most chunks that changed differ early (measured: `diff` of two 1 GiB
/// versions with every chunk changed took 2.2 ms with every pair sent to the pool).
const PREFIX_BYTES: usize = 64;

/// `items.map(f)` in order, on rayon's pool when `bytes` of work make it worth it.
fn map_par<I: Send, R: Send>(
    items: Vec<I>,
    bytes: usize,
    f: impl Fn(I) -> R + Sync + Send,
) -> Vec<R> {
    map_par_from(PAR_MIN_BYTES, items, bytes, f)
}

/// [`map_par`] with the threshold given.
fn map_par_from<I: Send, R: Send>(
    min_bytes: usize,
    items: Vec<I>,
    bytes: usize,
    f: impl Fn(I) -> R + Sync + Send,
) -> Vec<R> {
    if bytes >= min_bytes && items.len() > 1 {
        crate::parallel::install(|| items.into_par_iter().with_min_len(1).map(f).collect())
    } else {
        items.into_iter().map(f).collect()
    }
}

/// Initialize `dst` with a copy of `src` (of the same length): one `memcpy`.
#[allow(unsafe_code)]
fn copy_init<T: Copy>((dst, src): (&mut [MaybeUninit<T>], &[T])) {
    assert_eq!(dst.len(), src.len(), "copy_init: lengths differ");
    // SAFETY: both slices are valid for `src.len()` elements (checked above), `dst` is
    // borrowed mutably so they do not overlap, and `MaybeUninit<T>` has `T`'s layout.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<T>(), src.len());
    }
}

/// A tensor: dtype, shape and a persistent vector of [`Chunk`]s.
///
/// # Sharing
///
/// `clone` is O(1) and shares every chunk. Tensors in the working state, in versions and
/// in snapshots share the chunks they have in common; [`Tensor::shared_chunks`] and
/// [`Tensor::ptr_eq`] make that observable. A `Tensor` handle is immutable: writes go
/// through [`Store`](crate::Store), which replaces only the chunks that change.
///
/// # Memory layout
///
/// The flat row-major data is cut into chunks of `chunk_elems()` elements (the last may
/// be shorter). When one row of the outermost axis fits in the store's `chunk_bytes`, a
/// chunk holds whole rows (`rows_per_chunk()` of them), so each chunk is an ndarray view
/// of some rows ([`Tensor::row_blocks`]); otherwise rows are split across chunks.
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Arc<[usize]>,
    chunk_elems: usize,
    chunks: ChunkVec,
}

// Invariant: `chunk_elems >= 1`; `len * dtype.size() <= isize::MAX`;
// `chunks.len() == ceil(len / chunk_elems)`; chunk `i` holds elements
// `i * chunk_elems .. min(len, (i + 1) * chunk_elems)`, as bytes.

/// What a write ([`Store::write`](crate::Store::write), the `update` family, or a copy
/// into an array) changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteStats {
    /// Chunks whose bytes changed. One exception: [`Store::update`](crate::Store::update)
    /// and [`Store::update_range`](crate::Store::update_range) write a chunk that the
    /// working state alone holds in place, and count it whether or not the closure changed
    /// a byte (telling would need a copy of the old bytes).
    pub chunks_changed: usize,
    /// Chunks in the tensor.
    pub chunks_total: usize,
    /// Bytes copied: by `write` and the copies into arrays, the bytes of the changed
    /// chunks; by the `update` family, the bytes of the chunks copied on write (0 for a
    /// chunk written in place).
    pub bytes_copied: usize,
}

/// Elements per chunk for a tensor of this shape and dtype.
pub(crate) fn chunk_elems_for(shape: &[usize], dtype: DType, chunk_bytes: usize) -> Result<usize> {
    if chunk_bytes < dtype.size() {
        return Err(Error::InvalidConfig {
            reason: format!(
                "chunk_bytes {chunk_bytes} is smaller than one {dtype} element ({} bytes)",
                dtype.size()
            ),
        });
    }
    let per = chunk_bytes / dtype.size();
    if let Some(row) = row_len(shape) {
        if row > 0 && row <= per {
            return Ok(per / row * row);
        }
    }
    Ok(per)
}

/// Number of elements of `shape`; `None` if it overflows `usize` (a shape with a zero
/// axis has 0 elements, whatever the other axes).
pub(crate) fn shape_len(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// Elements in one row of the outermost axis (`None` for a scalar, or if the count
/// overflows `usize`).
fn row_len(shape: &[usize]) -> Option<usize> {
    shape_len(shape.split_first()?.1)
}

/// The most dimensions (axes) a tensor may have: the most a repository's manifest holds
/// (`docs/FORMAT.md`), enforced where tensors are made so that every tensor can be saved.
pub const MAX_DIMS: usize = 64;

/// [`Error::TooManyDims`] (naming `name`) if `shape` has more than [`MAX_DIMS`] axes.
pub(crate) fn check_dims(name: &str, shape: &[usize]) -> Result<()> {
    if shape.len() > MAX_DIMS {
        return Err(Error::TooManyDims {
            name: name.to_owned(),
            dims: shape.len(),
            max: MAX_DIMS,
        });
    }
    Ok(())
}

/// Bytes of a tensor of `shape` and `dtype`, checked: at most `isize::MAX`, the most any
/// allocation can hold.
///
/// # Errors
///
/// [`Error::TooLarge`] when the size overflows or exceeds `isize::MAX`.
pub(crate) fn checked_nbytes(shape: &[usize], dtype: DType) -> Result<usize> {
    shape_len(shape)
        .and_then(|n| n.checked_mul(dtype.size()))
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| Error::TooLarge {
            shape: shape.to_vec(),
            dtype,
        })
}

impl Tensor {
    /// A tensor holding a copy of `array`, cut into chunks of at most `chunk_bytes` bytes.
    /// Any memory layout is accepted; the data is stored in logical row-major order.
    ///
    /// O(size).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `chunk_bytes` is smaller than one element;
    /// [`Error::TooLarge`] if the array's logical size exceeds `isize::MAX` bytes (a
    /// broadcast view of a huge shape); [`Error::TooManyDims`] for more than
    /// [`MAX_DIMS`] axes.
    pub fn from_array<T, S, D>(array: &ArrayBase<S, D>, chunk_bytes: usize) -> Result<Tensor>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        Tensor::from_array_in(array, chunk_bytes, &Alloc::default())
    }

    pub(crate) fn from_array_in<T, S, D>(
        array: &ArrayBase<S, D>,
        chunk_bytes: usize,
        alloc: &Alloc,
    ) -> Result<Tensor>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let shape: Arc<[usize]> = array.shape().into();
        check_dims("", &shape)?;
        checked_nbytes(&shape, T::DTYPE)?;
        let chunk_elems = chunk_elems_for(&shape, T::DTYPE, chunk_bytes)?;
        let std = array.as_standard_layout();
        let flat = std.as_slice().ok_or_else(|| Error::Internal {
            reason: "standard-layout array without a contiguous slice".into(),
        })?;
        let pieces: Vec<&[T]> = flat.chunks(chunk_elems).collect();
        let chunks = map_par(pieces, std::mem::size_of_val(flat), |c| {
            alloc.chunk_from_bytes(bytemuck::cast_slice(c))
        });
        Ok(Tensor {
            dtype: T::DTYPE,
            shape,
            chunk_elems,
            chunks: chunks.into_iter().collect(),
        })
    }

    /// A tensor of `dtype` and `shape` holding a copy of `bytes` (little-endian elements,
    /// row-major), cut into chunks of at most `chunk_bytes` bytes as
    /// [`from_array`](Tensor::from_array) would cut them. O(size), in parallel above
    /// [`PAR_MIN_BYTES`].
    ///
    /// Fails with [`Error::ShapeMismatch`] (the byte count as a one-element shape) when
    /// `bytes` does not hold exactly the elements of `shape`, and with
    /// [`Error::InvalidConfig`] when `chunk_bytes` is smaller than one element.
    pub(crate) fn from_le_bytes_in(
        name: &str,
        dtype: DType,
        shape: &[usize],
        bytes: &[u8],
        chunk_bytes: usize,
        alloc: &Alloc,
    ) -> Result<Tensor> {
        check_dims(name, shape)?;
        let fits = shape_len(shape).and_then(|n| n.checked_mul(dtype.size())) == Some(bytes.len());
        if !fits {
            return Err(Error::ShapeMismatch {
                name: name.to_owned(),
                expected: shape.to_vec(),
                found: vec![bytes.len() / dtype.size()],
            });
        }
        let chunk_elems = chunk_elems_for(shape, dtype, chunk_bytes)?;
        let pieces: Vec<&[u8]> = bytes.chunks(chunk_elems * dtype.size()).collect();
        let chunks = map_par(pieces, bytes.len(), |c| alloc.chunk_from_bytes(c));
        Ok(Tensor {
            dtype,
            shape: shape.into(),
            chunk_elems,
            chunks: chunks.into_iter().collect(),
        })
    }

    /// The element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    #[must_use]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements. O(ndim).
    #[must_use]
    pub fn len(&self) -> usize {
        // Every constructor checked that the size fits (see `checked_nbytes`).
        shape_len(&self.shape).unwrap_or(usize::MAX)
    }

    /// Whether the tensor has no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Logical size in bytes (what a deep copy holds).
    #[must_use]
    pub fn nbytes(&self) -> usize {
        self.len().saturating_mul(self.dtype.size())
    }

    /// Elements per chunk (the last chunk may hold fewer).
    #[must_use]
    pub fn chunk_elems(&self) -> usize {
        self.chunk_elems
    }

    /// Number of chunks.
    #[must_use]
    pub fn num_chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Rows of the outermost axis per chunk, when chunks hold whole rows.
    #[must_use]
    pub fn rows_per_chunk(&self) -> Option<usize> {
        let row = row_len(&self.shape)?;
        (row > 0 && self.chunk_elems.is_multiple_of(row)).then(|| self.chunk_elems / row)
    }

    /// Chunk `i`, if it exists. O(log chunks).
    #[must_use]
    pub fn chunk(&self, i: usize) -> Option<&Chunk> {
        self.chunks.get(i)
    }

    /// The chunks in order. Zero-copy.
    pub fn chunks(&self) -> impl Iterator<Item = &Chunk> + '_ {
        self.chunks.iter()
    }

    /// Flat element range held by chunk `i`; an empty range at the end (`len..len`) for
    /// an `i` past the last chunk. O(ndim).
    #[must_use]
    pub fn chunk_range(&self, i: usize) -> Range<usize> {
        let len = self.len();
        let start = i.checked_mul(self.chunk_elems).map_or(len, |s| s.min(len));
        start..start.saturating_add(self.chunk_elems).min(len)
    }

    /// The chunks as typed slices, in order. Zero-copy.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the tensor's dtype; [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk stored in a repository cannot be read.
    pub fn chunk_slices<T: Element>(&self) -> Result<impl Iterator<Item = &[T]> + '_> {
        self.check_dtype::<T>("")?;
        self.load()?;
        Ok(self.chunks.iter().map(Chunk::as_slice::<T>))
    }

    /// One `(rows, view)` pair per chunk, where `view` is a zero-copy ndarray view of the
    /// rows `rows` of the outermost axis: blockwise compute without materializing.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the tensor's dtype; [`Error::NotRowAligned`]
    /// if a row does not fit in a chunk, rows have zero elements, or the tensor is a
    /// scalar (its `row_bytes` saturates at `usize::MAX` for a row too large to count,
    /// such as the rows of a `[0, 2^61]` tensor of `f64`); [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk stored in a repository cannot be read.
    pub fn row_blocks<T: Element>(
        &self,
    ) -> Result<impl Iterator<Item = (Range<usize>, ArrayViewD<'_, T>)> + '_> {
        self.check_dtype::<T>("")?;
        let rows_per_chunk = self.rows_per_chunk().ok_or_else(|| Error::NotRowAligned {
            row_bytes: shape_len(self.shape.get(1..).unwrap_or(&[]))
                .unwrap_or(usize::MAX)
                .saturating_mul(self.dtype.size()),
        })?;
        self.load()?;
        // `rows_per_chunk` exists, so the row length is known and at least 1.
        let row = self.chunk_elems / rows_per_chunk;
        Ok(self.chunks.iter().enumerate().map(move |(i, c)| {
            let data = c.as_slice::<T>();
            let rows = data.len() / row;
            let start = i * rows_per_chunk;
            let mut dims = self.shape.to_vec();
            dims[0] = rows;
            let view = ArrayViewD::from_shape(IxDyn(&dims), data)
                .expect("a chunk of whole rows has the shape of those rows");
            (start..start + rows, view)
        }))
    }

    /// A materialized copy as an owned array. O(size).
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`] if `T` is not the tensor's dtype; [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk stored in a repository cannot be read.
    pub fn to_array<T: Element>(&self) -> Result<ArrayD<T>> {
        self.check_dtype::<T>("")?;
        self.load()?;
        let len = self.len();
        let filled: usize = self.chunks.iter().map(|c| c.as_slice::<T>().len()).sum();
        if filled != len {
            return Err(Error::Internal {
                reason: format!("tensor data ({filled} elements) does not fill its shape ({len})"),
            });
        }
        // The copy runs over chunks in parallel once it is large: the new buffer's pages
        // are touched for the first time here, and page faults scale with cores.
        let mut out: Vec<T> = Vec::with_capacity(len);
        let mut rest = &mut out.spare_capacity_mut()[..len];
        let mut jobs = Vec::with_capacity(self.chunks.len());
        for c in self.chunks.iter() {
            let src = c.as_slice::<T>();
            let (dst, tail) = rest.split_at_mut(src.len());
            jobs.push((dst, src));
            rest = tail;
        }
        map_par_from(
            PAR_MIN_BYTES_COLD,
            jobs,
            len * std::mem::size_of::<T>(),
            copy_init,
        );
        // SAFETY: the chunks, whose lengths sum to `len` (checked above), were copied
        // into the first `len` elements, one after the other: all are initialized.
        #[allow(unsafe_code)]
        unsafe {
            out.set_len(len);
        }
        ArrayD::from_shape_vec(IxDyn(&self.shape), out).map_err(|e| Error::Internal {
            reason: format!("tensor data does not fill its shape: {e}"),
        })
    }

    /// Copy the whole tensor into `out` (same shape, any memory layout). O(size).
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::ShapeMismatch`]; [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk stored in a repository cannot be read. `out`
    /// is untouched then.
    pub fn copy_into<T, S, D>(&self, out: &mut ArrayBase<S, D>) -> Result<WriteStats>
    where
        T: Element,
        S: DataMut<Elem = T>,
        D: Dimension,
    {
        self.copy_chunks_into(out, |_| true)
    }

    /// Write into `out`, which is known to hold the values of `known`, only the chunks
    /// where `self` differs from `known`: undo or restore for a buffer the store does not
    /// own (a framework's parameter), at a cost proportional to what changed.
    ///
    /// Chunks shared by pointer are skipped without reading data; chunks whose hashes are
    /// both cached and equal are skipped too; every other chunk is copied. If `known` has
    /// another dtype, shape or chunk layout, everything is copied.
    ///
    /// O(chunks) pointer compares + O(changed bytes) copies.
    ///
    /// # Errors
    ///
    /// [`Error::DTypeMismatch`], [`Error::ShapeMismatch`] for `out`; [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk stored in a repository cannot be read. `out`
    /// is untouched then.
    pub fn copy_changed_into<T, S, D>(
        &self,
        out: &mut ArrayBase<S, D>,
        known: &Tensor,
    ) -> Result<WriteStats>
    where
        T: Element,
        S: DataMut<Elem = T>,
        D: Dimension,
    {
        if !self.same_layout(known) {
            return self.copy_into(out);
        }
        if self.chunks.ptr_eq(&known.chunks) {
            self.check_dtype::<T>("")?;
            self.check_shape("", out.shape())?;
            return Ok(WriteStats {
                chunks_total: self.num_chunks(),
                ..WriteStats::default()
            });
        }
        let differ: Vec<bool> = self
            .chunks
            .iter()
            .zip(known.chunks.iter())
            .map(|(a, b)| {
                !(a.ptr_eq(b)
                    || matches!((a.cached_hash(), b.cached_hash()), (Some(x), Some(y)) if x == y))
            })
            .collect();
        self.copy_chunks_into(out, |i| differ[i])
    }

    fn copy_chunks_into<T, S, D>(
        &self,
        out: &mut ArrayBase<S, D>,
        wanted: impl Fn(usize) -> bool + Sync,
    ) -> Result<WriteStats>
    where
        T: Element,
        S: DataMut<Elem = T>,
        D: Dimension,
    {
        self.check_dtype::<T>("")?;
        self.check_shape("", out.shape())?;
        self.load()?;
        let ce = self.chunk_elems;
        let mut stats = WriteStats {
            chunks_total: self.num_chunks(),
            ..WriteStats::default()
        };
        if let Some(flat) = out.as_slice_mut() {
            let jobs: Vec<(&mut [T], &Chunk)> = flat
                .chunks_mut(ce)
                .zip(self.chunks.iter())
                .enumerate()
                .filter(|(i, _)| wanted(*i))
                .map(|(_, job)| job)
                .collect();
            stats.chunks_changed = jobs.len();
            stats.bytes_copied = jobs.iter().map(|(_, c)| c.len_bytes()).sum();
            map_par(jobs, stats.bytes_copied, |(dst, c)| {
                dst.copy_from_slice(c.as_slice::<T>())
            });
        } else {
            let mut src = self.chunks.iter().enumerate().flat_map(|(i, c)| {
                let w = wanted(i);
                c.as_slice::<T>().iter().map(move |v| (w, *v))
            });
            for dst in out.iter_mut() {
                if let Some((true, v)) = src.next() {
                    *dst = v;
                }
            }
            for i in 0..self.num_chunks() {
                if wanted(i) {
                    stats.chunks_changed += 1;
                    stats.bytes_copied += self.chunk_range(i).len() * self.dtype.size();
                }
            }
        }
        Ok(stats)
    }

    /// The content hash: a BLAKE3 Merkle root over dtype, shape and the chunk hashes.
    /// Tensors with equal dtype, shape and bytes have equal hashes whatever their history,
    /// as long as they are cut into chunks of the same size (the chunk layout is part of
    /// the hash: the same values in stores with different `chunk_bytes` hash differently).
    ///
    /// O(size) the first time (chunk hashes computed in parallel, then cached),
    /// O(chunks) after.
    #[must_use]
    pub fn content_hash(&self) -> ContentHash {
        let chunks: Vec<&Chunk> = self.chunks.iter().collect();
        let unknown: usize = chunks
            .iter()
            .filter(|c| c.cached_hash().is_none())
            .map(|c| c.len_bytes())
            .sum();
        let hashes = map_par(chunks, unknown, Chunk::hash);
        let mut h = blake3::Hasher::new();
        h.update(b"tensor-history/tensor/v1");
        h.update(&[self.dtype.tag()]);
        h.update(&(self.shape.len() as u64).to_le_bytes());
        for d in self.shape.iter() {
            h.update(&(*d as u64).to_le_bytes());
        }
        h.update(&(hashes.len() as u64).to_le_bytes());
        for c in &hashes {
            h.update(c.as_bytes());
        }
        ContentHash(*h.finalize().as_bytes())
    }

    /// How many of `self`'s chunks are shared (pointer-equal) with a chunk of `other`.
    /// O(chunks).
    #[must_use]
    pub fn shared_chunks(&self, other: &Tensor) -> usize {
        let theirs: HashSet<usize> = other.chunks.iter().map(Chunk::addr).collect();
        self.chunks
            .iter()
            .filter(|c| theirs.contains(&c.addr()))
            .count()
    }

    /// Whether both tensors have the same dtype and shape and share every chunk (no data
    /// read). O(1) when the chunk vectors are shared, else O(chunks).
    #[must_use]
    pub fn ptr_eq(&self, other: &Tensor) -> bool {
        self.same_layout(other)
            && (self.chunks.ptr_eq(&other.chunks)
                || self
                    .chunks
                    .iter()
                    .zip(other.chunks.iter())
                    .all(|(a, b)| a.ptr_eq(b)))
    }

    /// Whether both tensors hold the same dtype, shape and bytes: pointer-equal chunks are
    /// skipped, others compared by cached hashes or bytes. Never computes a hash. With the
    /// same chunk layout no stored chunk is read (their hashes are known); with different
    /// layouts the bytes are compared, loading stored chunks.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] or [`Error::CorruptObject`] if a stored chunk that must be compared
    /// cannot be read.
    pub fn content_eq(&self, other: &Tensor) -> Result<bool> {
        if !self.same_layout(other) {
            if self.dtype != other.dtype || self.shape != other.shape {
                return Ok(false);
            }
            self.load()?;
            other.load()?;
            return Ok(self
                .chunks
                .iter()
                .flat_map(|c| c.data().iter())
                .eq(other.chunks.iter().flat_map(|c| c.data().iter())));
        }
        if self.chunks.ptr_eq(&other.chunks) {
            return Ok(true);
        }
        Ok(self.changed_chunks(other).is_empty())
    }

    /// Indices of the chunks whose content differs from `other`'s (same layout assumed).
    /// Pointer-equal chunks are skipped; the others are compared in parallel.
    pub(crate) fn changed_chunks(&self, other: &Tensor) -> Vec<usize> {
        debug_assert!(
            self.same_layout(other),
            "changed_chunks needs the same layout"
        );
        if self.chunks.ptr_eq(&other.chunks) {
            return Vec::new();
        }
        // Pointer-equal chunks are equal unread. Of the others, those whose first bytes
        // (or known hashes) differ are found on this thread; only the rest, which may be
        // equal and so need a full compare, go to the parallel pass.
        let mut changed = Vec::new();
        let mut unsure: Vec<(usize, &Chunk, &Chunk)> = Vec::new();
        for (i, (a, b)) in self.chunks.iter().zip(other.chunks.iter()).enumerate() {
            if a.ptr_eq(b) {
                continue;
            }
            let head = a.len_bytes().min(PREFIX_BYTES);
            let hashes_differ =
                matches!((a.cached_hash(), b.cached_hash()), (Some(x), Some(y)) if x != y);
            let unloaded = a.is_unloaded() || b.is_unloaded();
            if hashes_differ || (!unloaded && a.data()[..head] != b.data()[..head]) {
                changed.push(i);
            } else {
                unsure.push((i, a, b));
            }
        }
        let bytes = unsure.iter().map(|(_, a, _)| a.len_bytes()).sum();
        changed.extend(
            map_par(unsure, bytes, |(i, a, b)| (!a.same_content(b)).then_some(i))
                .into_iter()
                .flatten(),
        );
        changed.sort_unstable();
        changed
    }

    /// Same dtype, shape and chunk size: chunk `i` of one covers the same elements as
    /// chunk `i` of the other.
    pub(crate) fn same_layout(&self, other: &Tensor) -> bool {
        self.dtype == other.dtype
            && self.shape == other.shape
            && self.chunk_elems == other.chunk_elems
    }

    pub(crate) fn check_dtype<T: Element>(&self, name: &str) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                name: name.to_owned(),
                expected: self.dtype,
                found: T::DTYPE,
            })
        }
    }

    pub(crate) fn check_shape(&self, name: &str, found: &[usize]) -> Result<()> {
        if *self.shape == *found {
            Ok(())
        } else {
            Err(Error::ShapeMismatch {
                name: name.to_owned(),
                expected: self.shape.to_vec(),
                found: found.to_vec(),
            })
        }
    }

    /// A tensor from its parts (a manifest read from a repository, already checked:
    /// `chunks` has the layout's count and lengths).
    pub(crate) fn from_parts(
        dtype: DType,
        shape: &[usize],
        chunk_elems: usize,
        chunks: ChunkVec,
    ) -> Tensor {
        Tensor {
            dtype,
            shape: shape.into(),
            chunk_elems,
            chunks,
        }
    }

    /// Load every stored chunk not loaded yet (in parallel), so that reads cannot fail.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] or [`Error::CorruptObject`] from the repository.
    pub fn load(&self) -> Result<()> {
        let todo: Vec<&Chunk> = self.chunks.iter().filter(|c| c.is_unloaded()).collect();
        if todo.is_empty() {
            return Ok(());
        }
        let bytes = todo.iter().map(|c| c.len_bytes()).sum();
        map_par_from(PAR_MIN_BYTES_COLD, todo, bytes, Chunk::load)
            .into_iter()
            .collect()
    }

    /// A tensor of the same layout with the given chunks.
    pub(crate) fn with_chunks(&self, chunks: ChunkVec) -> Tensor {
        debug_assert_eq!(
            chunks.len(),
            self.chunks.len(),
            "with_chunks: chunk count changed"
        );
        Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            chunk_elems: self.chunk_elems,
            chunks,
        }
    }

    /// Visit the elements in `range` chunk by chunk with `f(flat_offset, slice)`.
    /// A uniquely owned chunk is written in place; a shared one through a copy that
    /// replaces it only if its bytes changed. Returns chunks written and bytes copied.
    pub(crate) fn update_range<T: Element>(
        &mut self,
        range: Range<usize>,
        alloc: &Alloc,
        mut f: impl FnMut(usize, &mut [T]),
    ) -> (usize, usize) {
        debug_assert!(range.end <= self.len(), "update_range: range out of bounds");
        if range.is_empty() {
            return (0, 0);
        }
        let ce = self.chunk_elems;
        let es = self.dtype.size();
        let mut written = 0;
        let mut copied = 0;
        for i in range.start / ce..range.end.div_ceil(ce) {
            let cstart = i * ce;
            let lo = range.start.max(cstart) - cstart;
            let hi = range.end.min(cstart + ce) - cstart;
            let Some(chunk) = self.chunks.get_mut(i) else {
                break;
            };
            if let Some(data) = chunk.get_mut() {
                f(cstart + lo, &mut data.slice_mut::<T>()[lo..hi]);
                written += 1;
                continue;
            }
            let mut copy = alloc.copy_of(chunk);
            let data = copy.get_mut().expect("a fresh copy is uniquely owned");
            f(cstart + lo, &mut data.slice_mut::<T>()[lo..hi]);
            if copy.data()[lo * es..hi * es] != chunk.data()[lo * es..hi * es] {
                copied += copy.len_bytes();
                *chunk = copy;
                written += 1;
            }
        }
        (written, copied)
    }

    /// `x = f(x)` for every element, fused with copy-on-write; chunks that come out equal
    /// stay shared. Returns chunks written and bytes copied.
    pub(crate) fn map<T: Element>(
        &mut self,
        ctx: &WriteCtx,
        f: impl Fn(T) -> T + Sync,
    ) -> (usize, usize) {
        let mode = ctx.mode;
        self.fused(
            ctx,
            None,
            |src, _, dst| kernels::map_into(src, dst, &f, mode),
            |buf, _| kernels::map_in_place(buf, &f),
        )
    }

    /// `x = f(x, y)` for every element with `y` from `other` (same shape, flat row-major),
    /// fused with copy-on-write. Returns chunks written and bytes copied.
    pub(crate) fn zip<T: Element>(
        &mut self,
        other: &[T],
        ctx: &WriteCtx,
        f: impl Fn(T, T) -> T + Sync,
    ) -> (usize, usize) {
        debug_assert_eq!(other.len(), self.len(), "zip: operand length differs");
        let mode = ctx.mode;
        self.fused(
            ctx,
            Some(other),
            |src, o, dst| kernels::zip_into(src, o, dst, &f, mode),
            |buf, o| kernels::zip_in_place(buf, o, &f),
        )
    }

    fn fused<T: Element>(
        &mut self,
        ctx: &WriteCtx,
        other: Option<&[T]>,
        into: impl Fn(&[T], &[T], &mut [T]) -> bool + Sync,
        in_place: impl Fn(&mut [T], &[T]) -> bool + Sync,
    ) -> (usize, usize) {
        let ce = self.chunk_elems;
        let bytes = self.nbytes();
        let alloc = &ctx.alloc;
        let chunks: Vec<(usize, &mut Chunk)> = self.chunks.iter_mut().enumerate().collect();
        map_par_from(ctx.par_min_bytes, chunks, bytes, |(i, chunk)| {
            let n = chunk.len_bytes() / std::mem::size_of::<T>();
            let o = other.map_or(&[][..], |o| &o[i * ce..i * ce + n]);
            if let Some(data) = chunk.get_mut() {
                // Counted only if a bit changed (the cached hash is reset either way).
                return (usize::from(in_place(data.slice_mut::<T>(), o)), 0);
            }
            let len = chunk.len_bytes();
            let mut data = alloc.data(len);
            if into(chunk.as_slice::<T>(), o, data.slice_mut::<T>()) {
                *chunk = Chunk::from_data(data);
                (1, len)
            } else {
                (0, 0)
            }
        })
        .into_iter()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Overwrite from a flat row-major slice, keeping every chunk whose bytes are equal.
    ///
    /// One pass, in parallel over chunks: each chunk is compared and, where it differs,
    /// copied at once (in place when this tensor holds it alone, else into a new buffer),
    /// while its bytes are still in cache. A dense change differs in its first bytes, so
    /// it costs about one copy.
    pub(crate) fn write_from<T: Element>(&mut self, src: &[T], ctx: &WriteCtx) -> WriteStats {
        debug_assert_eq!(src.len(), self.len(), "write_from: length differs");
        let ce = self.chunk_elems.max(1);
        let alloc = &ctx.alloc;
        let nbytes = self.nbytes();
        let total = self.num_chunks();
        let jobs: Vec<(&mut Chunk, &[T])> = self.chunks.iter_mut().zip(src.chunks(ce)).collect();
        let copied: Vec<usize> = map_par_from(ctx.par_min_bytes, jobs, nbytes, |(chunk, new)| {
            if bytemuck::cast_slice::<T, u8>(new) == chunk.data() {
                return 0;
            }
            let len = chunk.len_bytes();
            match chunk.get_mut() {
                Some(data) => data.slice_mut::<T>().copy_from_slice(new),
                None => *chunk = alloc.chunk_from_bytes(bytemuck::cast_slice(new)),
            }
            len
        });
        let mut stats = WriteStats {
            chunks_total: total,
            ..WriteStats::default()
        };
        for len in copied.into_iter().filter(|&n| n > 0) {
            stats.chunks_changed += 1;
            stats.bytes_copied += len;
        }
        stats
    }

    /// Check the layout invariants (hashes are checked by the caller, once per unique
    /// chunk).
    pub(crate) fn verify_layout(&self, name: &str) -> Result<()> {
        let bad = |reason: String| Error::Corrupt {
            reason: format!("tensor `{name}`: {reason}"),
        };
        let len = checked_nbytes(&self.shape, self.dtype)
            .map_err(|_| bad("shape larger than memory can address".into()))?
            / self.dtype.size();
        if self.chunk_elems == 0 {
            return Err(bad("zero elements per chunk".into()));
        }
        if self.chunks.len() != len.div_ceil(self.chunk_elems) {
            return Err(bad(format!(
                "{} chunks for {} elements of {} per chunk",
                self.chunks.len(),
                len,
                self.chunk_elems
            )));
        }
        for (i, c) in self.chunks.iter().enumerate() {
            let want = self.chunk_range(i).len() * self.dtype.size();
            if c.len_bytes() != want {
                return Err(bad(format!(
                    "chunk {i} holds {} bytes, not {want}",
                    c.len_bytes()
                )));
            }
        }
        Ok(())
    }
}

/// Hash every chunk (in parallel), check each against its cached hash and cache the ones
/// not yet known. Returns the index of the first chunk whose cached hash is wrong.
pub(crate) fn verify_hashes(chunks: &[&Chunk]) -> Option<usize> {
    crate::parallel::install(|| {
        chunks
            .par_iter()
            .enumerate()
            .find_any(|(_, c)| !c.verify_and_cache_hash())
            .map(|(i, _)| i)
    })
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &&*self.shape)
            .field("chunk_elems", &self.chunk_elems)
            .field("chunks", &self.chunks.len())
            .finish()
    }
}
