//! Shared byte buffers: [`Bytes`] (an owned buffer or a slice of a mapped file, shared
//! by O(1) clones) and [`AlignedBuf`] (bytes in 8-byte words, so they can be viewed as
//! slices of any element type). The core's lowest data type: chunks hold them, backends
//! return them.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Shared immutable bytes: an owned buffer or a slice of a mapped file (what a backend
/// reads, what a chunk loaded from a repository holds). Clone is O(1) and shares the
/// bytes.
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Bytes {
    /// Bytes owned by `owner` (a `Vec<u8>`, a memory map, ...), all of them.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Bytes {
        let len = (*owner).as_ref().len();
        Bytes {
            owner,
            range: 0..len,
        }
    }

    /// A sub-range, sharing the owner. `None` if `range` is not inside `self`. O(1).
    #[must_use]
    pub fn slice(&self, range: Range<usize>) -> Option<Bytes> {
        if range.start > range.end || range.end > self.range.len() {
            return None;
        }
        Some(Bytes {
            owner: Arc::clone(&self.owner),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }
}

impl Bytes {
    /// A handle that does not keep the bytes alive: [`WeakBytes::upgrade`] gives them
    /// back while another [`Bytes`] holds them. O(1).
    pub(crate) fn downgrade(&self) -> WeakBytes {
        WeakBytes {
            owner: Arc::downgrade(&self.owner),
            range: self.range.clone(),
        }
    }
}

/// Bytes that some [`Bytes`] may still hold (see [`Bytes::downgrade`]).
#[derive(Clone)]
pub(crate) struct WeakBytes {
    owner: std::sync::Weak<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl WeakBytes {
    /// The bytes, if a [`Bytes`] still holds them. O(1).
    pub(crate) fn upgrade(&self) -> Option<Bytes> {
        Some(Bytes {
            owner: self.owner.upgrade()?,
            range: self.range.clone(),
        })
    }
}

impl fmt::Debug for WeakBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakBytes")
            .field("len", &self.range.len())
            .finish()
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        Bytes::new(Arc::new(v))
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes").field("len", &self.len()).finish()
    }
}

/// A buffer of 8-byte words holding `len` bytes: bytes read into it can be viewed as
/// slices of any element type in place.
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    /// A word-aligned copy of `data`, as [`Bytes`].
    pub(crate) fn bytes_of(data: &[u8]) -> Bytes {
        let mut words = vec![0u64; data.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..data.len()].copy_from_slice(data);
        Bytes::new(Arc::new(AlignedBuf {
            words,
            len: data.len(),
        }))
    }

    /// `len` word-aligned bytes written by `fill` (which is given them zeroed), as
    /// [`Bytes`].
    pub(crate) fn filled(len: usize, fill: impl FnOnce(&mut [u8])) -> Bytes {
        let mut words = vec![0u64; len.div_ceil(8)];
        fill(&mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len]);
        Bytes::new(Arc::new(AlignedBuf { words, len }))
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}
