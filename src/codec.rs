//! The chunk codec: how a chunk's raw bytes are stored in fewer bytes, losslessly.
//!
//! A chunk is stored in one of four ways, chosen per chunk by what it saves:
//!
//! - **raw**: the bytes as they are;
//! - **planes**: the elements' bytes grouped by position (byte plane 0 of every element,
//!   then plane 1, ...: a float's sign and exponent bytes, which vary little, end up
//!   next to each other), then compressed with zstd;
//! - **difference delta**: each element's bits, read as an unsigned little-endian
//!   integer of the element's width, minus those of the element at the same place in a
//!   *base* chunk of the same length (the same variable's chunk in an earlier version),
//!   wrapping, then zigzag-mapped (0, -1, 1, -2, ... to 0, 1, 2, 3, ...), grouped into
//!   planes and compressed. After a dense training step most elements move by a few
//!   hundred units in the last place: a small difference, zero in its high bytes;
//! - **XOR delta**: the bytes XOR-ed with a base chunk, then grouped into planes and
//!   compressed (what format 2 repositories store; [`encode`] takes it only when asked,
//!   see [`Delta`]). The XOR of two close floats is as long as their difference, plus
//!   the carries of the subtraction as flipped high bits: measured on all-MiniLM-L6-v2
//!   AdamW checkpoints (`examples/codec_ratios`), difference deltas code to 0.92 of the
//!   XOR deltas' bytes in f32 and 0.90 in bf16, every step and every 5 steps, and to
//!   0.95 on the synthetic dense step of `bench_report`.
//!
//! A chunk is stored raw unless coding saves at least [`MIN_SAVING_DIVISOR`]⁻¹ of its
//! length (a coded chunk costs a decode on every read). The chunk's id stays the BLAKE3
//! hash of its raw bytes whatever its encoding, and [`decode`] checks the bytes it
//! produces against that id, so a damaged encoding, or a wrong base, is an error and
//! never wrong data.
//!
//! # Encoded form
//!
//! An encoded chunk is self-describing: a header, then the payload.
//!
//! ```text
//! offset  size     field
//! 0       1        codec version (2)
//! 1       1        method: 0 raw, 1 planes, 2 XOR delta + planes, 3 difference delta
//!                  + planes
//! 2       1        element width in bytes: 1, 2, 4 or 8
//! 3       1        raw-plane flags: bit p set = plane p stored raw (0 for method raw)
//! 4       8        raw length in bytes, little-endian
//! 12      32       the base chunk's id (deltas only)
//! 12|44   4·width  stored bytes of each plane, u32 little-endian (planes and delta only)
//! ...     ...      payload: the raw bytes (raw), or each plane in order, stored raw or
//!                  as its own zstd frame, then the raw_len % width trailing bytes
//! ```
//!
//! The planes of `n = raw_len / width` elements are `width` runs of `n` bytes (run `p`
//! holds byte `p` of every element, little-endian), followed by the `raw_len % width`
//! trailing bytes unchanged (for both deltas: XOR-ed with the base's). Elements of a
//! width other than 1, 2, 4 or 8 are grouped, and differenced, as single bytes. Each
//! plane is zstd-coded only if that saves at least 1/[`MIN_PLANE_SAVING_DIVISOR`] of
//! it, and stored raw otherwise: the low mantissa planes of floats (and of their
//! deltas) are close to random, and a raw plane decodes by a copy (or an XOR, in a
//! chain of XOR deltas) instead of a zstd decode. One frame per plane, not one
//! for all: a frame's blocks mix planes, and a block holding a random plane and a
//! compressible one costs a full entropy decode of both (measured on a 256 KiB f32
//! delta of a dense step: 453 µs for one frame, 58 µs for four, and 11% fewer bytes).
//! A plane of one byte repeated (a small difference delta's high planes are all zero)
//! is written as a zstd frame of RLE blocks directly, without zstd's match search: a
//! dense step's 256 KiB f32 delta encoded in 116-118 µs instead of 136 µs, per core
//! (`examples/codec_speed`), and its two zero planes decode in 1.4 µs instead of 6.
//!
//! # Bounds
//!
//! [`decode`] allocates at most the raw length the header states, and refuses a header
//! that states more than the caller's bound (the chunk size the caller expects), so a
//! damaged or hostile input cannot make it allocate more.

use std::cell::RefCell;
use std::fmt;

use rayon::prelude::*;

use crate::buffer::{AlignedBuf, Bytes};
use crate::hash::ContentHash;

/// The codec version in the first byte of every encoded chunk.
pub const CODEC_VERSION: u8 = 2;

/// zstd level of [`encode`]: -20, a fast level (match search that skips ahead over
/// bytes without matches), with Huffman-coded literals switched on (`compress_plane`;
/// negative levels leave literals raw by default). A plane's gain is in its literals'
/// entropy (the sign and exponent plane, a delta's high mantissa plane) and in long runs
/// of zero bytes (a delta's top planes), which a fast search still finds. On ten
/// consecutive all-MiniLM-L6-v2 checkpoints (`examples/codec_ratios`) it codes f32 to
/// 2.785x and bf16 to 4.920x at 534 MB/s per core, where level 3 gave 2.779x, 4.879x at
/// 237 MB/s (levels 1 and -5: 2.781x/373 MB/s and 2.785x/443 MB/s; -100 loses 0.4%).
/// What it gives up: matches in periodic integer data (an `i16` ramp of 3000 elements
/// coded to 1687 bytes, 392 at level 1). Planes under [`SMALL_PLANE_BYTES`] are coded
/// at [`SMALL_PLANE_LEVEL`] for that reason; large periodic integer tensors still lose.
pub const ZSTD_LEVEL: i32 = -20;

/// Planes shorter than this (bytes) are coded at [`SMALL_PLANE_LEVEL`]: on a few KiB
/// the fast level's time saving is a few microseconds, and its loose match search
/// loses what small tensors (biases, norms, counters, optimizer scalars) save.
pub const SMALL_PLANE_BYTES: usize = 16 << 10;

/// zstd level of planes under [`SMALL_PLANE_BYTES`]: 3, zstd's default.
pub const SMALL_PLANE_LEVEL: i32 = 3;

/// zstd's shortest match in [`encode`]'s planes: 7, zstd's longest setting. A plane's
/// matches are runs of zero bytes (a delta's high planes), long anyway; in the noisy
/// planes (a delta's second plane: a few low bits of each element) short matches save
/// little, cost the encoder time on the sign and exponent plane, and make decoding run
/// zstd's sequence decoder over most of the plane instead of its Huffman literal
/// decoder.
pub const ZSTD_MIN_MATCH: u32 = 7;

/// A coded chunk is kept only if it is at most `len - len / MIN_SAVING_DIVISOR` bytes
/// (it saves at least 4%); otherwise the chunk is stored raw.
pub const MIN_SAVING_DIVISOR: usize = 25;

/// A plane is zstd-coded only if its frame is at most `n - n / MIN_PLANE_SAVING_DIVISOR`
/// bytes (it saves at least 4%); otherwise it is stored raw. Measured on f32 chunks of
/// pseudo-random weights and of their XOR deltas after dense steps (256 KiB chunks):
/// planes compress either not at all (the low mantissa planes: frames 10 bytes longer
/// than the plane) or by 13% and more (full chunk: 0.865 and 0.34 of the plane for the
/// low mantissa and sign/exponent planes; delta: 0.53, 0.02 and 0.0003), so any
/// threshold from 1% to 13% picks the same planes.
pub const MIN_PLANE_SAVING_DIVISOR: usize = 25;

/// A plane of at least [`SMALL_PLANE_BYTES`] whose bytes, sampled
/// ([`RANDOM_SAMPLE_BYTES`] at its start, middle and end), have an entropy of at least this many tenths of a bit
/// per byte is stored raw without trying zstd: entropy coding cannot save the 4% a
/// plane must save ([`MIN_PLANE_SAVING_DIVISOR`]) below about 7.7 bits. The low
/// mantissa planes of float chunks and of their deltas look so (7.9 bits and more; on
/// the Adam state of a 10 MiB MLP they code to 0.993 and 0.997 of their length, and
/// zstd spent a quarter of the encoder's time on them). What it gives up: repeats
/// within such a plane (random-looking bytes that recur), which only matches find.
pub const RANDOM_PLANE_TENTHS: u32 = 78;

/// Bytes [`RANDOM_PLANE_TENTHS`] samples at each of a plane's start, middle and end.
pub const RANDOM_SAMPLE_BYTES: usize = 2048;

/// [`encode`] takes an XOR delta of at most `len * DELTA_ENOUGH_TENTHS / 10` bytes
/// without trying planes alone (which would code the chunk a second time). Measured on
/// the 9 deltas between 10 consecutive all-MiniLM-L6-v2 AdamW checkpoints (256 KiB
/// chunks, one thread): with 9 tenths instead of a half, the coded bytes are the same to
/// 4 significant digits (f32 2.952x of raw, bf16 5.655x), planes alone are tried for
/// 12 f32 chunks instead of 6063 (they won 12 of 12 there, and 285 of 6063 before, each
/// by a few bytes), and encoding runs 1.35 times as fast (f32) and 1.20 (bf16). A
/// delta that saves less than a tenth is of a chunk that changed in its high bytes too,
/// where planes alone can win.
pub const DELTA_ENOUGH_TENTHS: usize = 9;

/// Bytes of the header without a base id and plane table.
pub const HEADER_LEN: usize = 12;

/// Bytes of the header of an XOR delta (with the base id), without its plane table.
pub const DELTA_HEADER_LEN: usize = HEADER_LEN + 32;

/// How a chunk is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Method {
    /// The raw bytes.
    Raw,
    /// Byte planes, zstd-compressed.
    Planes,
    /// XOR against a base chunk, then byte planes, zstd-compressed.
    XorPlanes,
    /// Zigzag-mapped wrapping difference against a base chunk's elements, then byte
    /// planes, zstd-compressed.
    DiffPlanes,
}

impl Method {
    fn tag(self) -> u8 {
        match self {
            Method::Raw => 0,
            Method::Planes => 1,
            Method::XorPlanes => 2,
            Method::DiffPlanes => 3,
        }
    }

    /// Whether the method is a delta against a base chunk.
    #[must_use]
    pub fn is_delta(self) -> bool {
        matches!(self, Method::XorPlanes | Method::DiffPlanes)
    }

    fn from_tag(tag: u8) -> Option<Method> {
        match tag {
            0 => Some(Method::Raw),
            1 => Some(Method::Planes),
            2 => Some(Method::XorPlanes),
            3 => Some(Method::DiffPlanes),
            _ => None,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Raw => "raw",
            Method::Planes => "planes",
            Method::XorPlanes => "xor-delta",
            Method::DiffPlanes => "diff-delta",
        })
    }
}

/// Why an encoded chunk could not be decoded. Every damaged input gives one of these,
/// never a panic or wrong bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The input ends before its header (or its raw payload) does.
    #[error("encoded chunk truncated: {needed} bytes needed, {found} found")]
    Truncated {
        /// Bytes the header (or the raw payload) needs.
        needed: usize,
        /// Bytes there are.
        found: usize,
    },
    /// The first byte is not a codec version this build reads.
    #[error("encoded chunk of codec version {found}, this build reads version {CODEC_VERSION}")]
    UnsupportedVersion {
        /// The version byte.
        found: u8,
    },
    /// The method byte names no method.
    #[error("encoded chunk of unknown method {found}")]
    UnknownMethod {
        /// The method byte.
        found: u8,
    },
    /// The element width is not 1, 2, 4 or 8, the raw-plane flags name a plane the width
    /// does not have (or are set on a raw chunk), or a raw plane's stated length is not
    /// the plane's.
    #[error("encoded chunk header is damaged: {reason}")]
    BadHeader {
        /// What is wrong.
        reason: String,
    },
    /// The header states a raw length above the caller's bound.
    #[error("encoded chunk states {raw_len} raw bytes, more than the {max} expected")]
    TooLarge {
        /// The raw length the header states.
        raw_len: u64,
        /// The bound.
        max: usize,
    },
    /// The chunk is a delta and no base was given.
    #[error("encoded chunk is a delta against chunk {base}, which was not given")]
    MissingBase {
        /// The base the header names.
        base: ContentHash,
    },
    /// The base given has another length than the chunk.
    #[error("delta base of {found} bytes for a chunk of {expected}")]
    BaseLength {
        /// The chunk's raw length.
        expected: usize,
        /// The base's length.
        found: usize,
    },
    /// The compressed payload does not decompress to the stated length.
    #[error("encoded chunk payload is damaged: {reason}")]
    BadPayload {
        /// What zstd (or the length check) reported.
        reason: String,
    },
    /// The decoded bytes do not have the chunk's id (a damaged payload, or a wrong base).
    #[error("decoded chunk has hash {found}, expected {expected}")]
    HashMismatch {
        /// The chunk's id.
        expected: ContentHash,
        /// The hash of the decoded bytes.
        found: ContentHash,
    },
}

/// The header of an encoded chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// How the payload is coded.
    pub method: Method,
    /// Element width in bytes (1, 2, 4 or 8).
    pub width: usize,
    /// Length of the raw chunk.
    pub raw_len: usize,
    /// The base of a delta.
    pub base: Option<ContentHash>,
    /// Bit `p` set: plane `p` is stored raw, not zstd-coded (0 for [`Method::Raw`]).
    pub raw_planes: u8,
    /// Stored bytes of each of the `width` planes (the rest 0; all 0 for
    /// [`Method::Raw`]).
    pub plane_lens: [u32; 8],
}

impl Header {
    /// Bytes of this header in the encoded form.
    #[must_use]
    pub fn len(&self) -> usize {
        let fixed = if self.base.is_some() {
            DELTA_HEADER_LEN
        } else {
            HEADER_LEN
        };
        match self.method {
            Method::Raw => fixed,
            _ => fixed + 4 * self.width,
        }
    }

    /// Never true: a header has at least [`HEADER_LEN`] bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.push(CODEC_VERSION);
        out.push(self.method.tag());
        out.push(self.width as u8);
        out.push(self.raw_planes);
        out.extend_from_slice(&(self.raw_len as u64).to_le_bytes());
        if let Some(b) = &self.base {
            out.extend_from_slice(b.as_bytes());
        }
        if self.method != Method::Raw {
            for l in &self.plane_lens[..self.width] {
                out.extend_from_slice(&l.to_le_bytes());
            }
        }
    }

    /// Parse the header at the start of `encoded`, refusing a raw length above `max_raw`.
    /// O(1).
    ///
    /// # Errors
    ///
    /// [`CodecError::Truncated`], [`CodecError::UnsupportedVersion`],
    /// [`CodecError::UnknownMethod`], [`CodecError::BadHeader`], [`CodecError::TooLarge`].
    pub fn parse(encoded: &[u8], max_raw: usize) -> Result<Header, CodecError> {
        if encoded.len() < HEADER_LEN {
            return Err(CodecError::Truncated {
                needed: HEADER_LEN,
                found: encoded.len(),
            });
        }
        if encoded[0] != CODEC_VERSION {
            return Err(CodecError::UnsupportedVersion { found: encoded[0] });
        }
        let method =
            Method::from_tag(encoded[1]).ok_or(CodecError::UnknownMethod { found: encoded[1] })?;
        let width = usize::from(encoded[2]);
        if !matches!(width, 1 | 2 | 4 | 8) {
            return Err(CodecError::BadHeader {
                reason: format!("element width {width}"),
            });
        }
        let raw_planes = encoded[3];
        if method == Method::Raw && raw_planes != 0 {
            return Err(CodecError::BadHeader {
                reason: format!("raw-plane flags {raw_planes} on a raw chunk"),
            });
        }
        if width < 8 && raw_planes >> width != 0 {
            return Err(CodecError::BadHeader {
                reason: format!("raw-plane flags {raw_planes} for {width} planes"),
            });
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&encoded[4..12]);
        let raw_len = u64::from_le_bytes(len);
        if raw_len > max_raw as u64 {
            return Err(CodecError::TooLarge {
                raw_len,
                max: max_raw,
            });
        }
        let mut at = HEADER_LEN;
        let base = if method.is_delta() {
            if encoded.len() < DELTA_HEADER_LEN {
                return Err(CodecError::Truncated {
                    needed: DELTA_HEADER_LEN,
                    found: encoded.len(),
                });
            }
            let mut id = [0u8; 32];
            id.copy_from_slice(&encoded[HEADER_LEN..DELTA_HEADER_LEN]);
            at = DELTA_HEADER_LEN;
            Some(ContentHash(id))
        } else {
            None
        };
        let mut plane_lens = [0u32; 8];
        if method != Method::Raw {
            let end = at + 4 * width;
            if encoded.len() < end {
                return Err(CodecError::Truncated {
                    needed: end,
                    found: encoded.len(),
                });
            }
            let n = raw_len / width as u64;
            for (p, l) in plane_lens[..width].iter_mut().enumerate() {
                let mut b = [0u8; 4];
                b.copy_from_slice(&encoded[at + 4 * p..at + 4 * p + 4]);
                *l = u32::from_le_bytes(b);
                if raw_planes >> p & 1 == 1 && u64::from(*l) != n {
                    return Err(CodecError::BadHeader {
                        reason: format!("raw plane {p} of {l} bytes, {n} expected"),
                    });
                }
            }
        }
        Ok(Header {
            method,
            width,
            // raw_len <= max_raw, a usize.
            raw_len: raw_len as usize,
            base,
            raw_planes,
            plane_lens,
        })
    }
}

/// A chunk in its encoded form: header and payload, in one buffer.
#[derive(Clone, PartialEq, Eq)]
pub struct Encoded {
    header: Header,
    bytes: Vec<u8>,
}

impl Encoded {
    /// The header.
    #[must_use]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// How the chunk is coded.
    #[must_use]
    pub fn method(&self) -> Method {
        self.header.method
    }

    /// The base chunk a delta needs to decode.
    #[must_use]
    pub fn base(&self) -> Option<ContentHash> {
        self.header.base
    }

    /// The whole encoded form (header and payload).
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The encoded form, by value.
    #[must_use]
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Bytes of the encoded form.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true: an encoded chunk has a header.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoded")
            .field("header", &self.header)
            .field("len", &self.bytes.len())
            .finish()
    }
}

/// A width this codec groups by: 1, 2, 4 or 8 (others are grouped as single bytes).
fn plane_width(width: usize) -> usize {
    if matches!(width, 1 | 2 | 4 | 8) {
        width
    } else {
        1
    }
}

/// What the planes are of: the chunk's bytes, their XOR with a base's, or the zigzag
/// of their difference from a base's elements.
#[derive(Clone, Copy)]
enum Against<'a> {
    Nothing,
    Xor(&'a [u8]),
    Diff(&'a [u8]),
}

/// `dst` := the byte planes of `src` (`Nothing`), of `src ^ base` (`Xor`) or of the
/// zigzag of `src - base` per element (`Diff`), trailing bytes last (XOR-ed with the
/// base's for both deltas). With AVX2 the same loops are compiled for it (byte shuffles
/// across whole registers): the baseline x86-64 build gathers bytes with SSE2 unpacks at
/// about a third of the speed.
fn split_planes(src: &[u8], against: Against<'_>, width: usize, dst: &mut [u8]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe {
            return split_planes_avx2(src, against, width, dst);
        }
    }
    split_planes_any(src, against, width, dst);
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
fn split_planes_avx2(src: &[u8], against: Against<'_>, width: usize, dst: &mut [u8]) {
    split_planes_any(src, against, width, dst);
}

#[inline(always)]
fn split_planes_any(src: &[u8], against: Against<'_>, width: usize, dst: &mut [u8]) {
    debug_assert_eq!(src.len(), dst.len(), "planes are as long as the chunk");
    let base = match against {
        Against::Nothing => None,
        Against::Xor(b) => Some(b),
        Against::Diff(b) => {
            match width {
                2 => split_diff::<u16, 2>(src, b, dst),
                4 => split_diff::<u32, 4>(src, b, dst),
                8 => split_diff::<u64, 8>(src, b, dst),
                _ => split_diff::<u8, 1>(src, b, dst),
            }
            return;
        }
    };
    match width {
        2 => split::<2>(src, base, dst),
        4 => split::<4>(src, base, dst),
        8 => split::<8>(src, base, dst),
        _ => match base {
            Some(b) => dst
                .iter_mut()
                .zip(src.iter().zip(b))
                .for_each(|(d, (s, b))| *d = s ^ b),
            None => dst.copy_from_slice(src),
        },
    }
}

#[inline(always)]
fn split<const W: usize>(src: &[u8], base: Option<&[u8]>, dst: &mut [u8]) {
    let n = src.len() / W;
    let (planes, tail) = dst.split_at_mut(n * W);
    let (body, rest) = src.as_chunks::<W>();
    // One plane at a time, as a strided gather over whole elements (`[u8; W]`, so no
    // bounds checks): loops the compiler vectorizes, where one loop storing W planes
    // per element would not be.
    match base {
        Some(b) => {
            let (bbody, brest) = b.as_chunks::<W>();
            for (p, out) in planes.chunks_exact_mut(n.max(1)).enumerate().take(W) {
                for ((o, e), be) in out.iter_mut().zip(body).zip(bbody) {
                    *o = e[p] ^ be[p];
                }
            }
            for ((d, s), b) in tail.iter_mut().zip(rest).zip(brest) {
                *d = s ^ b;
            }
        }
        None => {
            for (p, out) in planes.chunks_exact_mut(n.max(1)).enumerate().take(W) {
                for (o, e) in out.iter_mut().zip(body) {
                    *o = e[p];
                }
            }
            tail.copy_from_slice(rest);
        }
    }
}

/// `dst` := the bytes whose planes (as [`split_planes`] made them against the same
/// base) are `planes`. Compiled for AVX2 too, used when the CPU has it (as
/// [`split_planes`]).
fn join_planes(planes: &[u8], against: Against<'_>, width: usize, dst: &mut [u8]) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if std::arch::is_x86_feature_detected!("avx2") {
        #[allow(unsafe_code)]
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe {
            return join_planes_avx2(planes, against, width, dst);
        }
    }
    join_planes_any(planes, against, width, dst);
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
#[allow(unsafe_code)]
#[target_feature(enable = "avx2")]
fn join_planes_avx2(planes: &[u8], against: Against<'_>, width: usize, dst: &mut [u8]) {
    join_planes_any(planes, against, width, dst);
}

#[inline(always)]
fn join_planes_any(planes: &[u8], against: Against<'_>, width: usize, dst: &mut [u8]) {
    debug_assert_eq!(planes.len(), dst.len(), "planes are as long as the chunk");
    let base = match against {
        Against::Nothing => None,
        Against::Xor(b) => Some(b),
        Against::Diff(b) => {
            match width {
                2 => join_diff::<u16, 2>(planes, b, dst),
                4 => join_diff::<u32, 4>(planes, b, dst),
                8 => join_diff::<u64, 8>(planes, b, dst),
                _ => join_diff::<u8, 1>(planes, b, dst),
            }
            return;
        }
    };
    match width {
        2 => join::<2>(planes, base, dst),
        4 => join::<4>(planes, base, dst),
        8 => join::<8>(planes, base, dst),
        _ => match base {
            Some(b) => dst
                .iter_mut()
                .zip(planes.iter().zip(b))
                .for_each(|(d, (s, b))| *d = s ^ b),
            None => dst.copy_from_slice(planes),
        },
    }
}

#[inline(always)]
fn join<const W: usize>(planes: &[u8], base: Option<&[u8]>, dst: &mut [u8]) {
    let n = planes.len() / W;
    let ins: [&[u8]; W] = std::array::from_fn(|p| &planes[p * n..(p + 1) * n]);
    let tail = &planes[n * W..];
    let (body, dtail) = dst.split_at_mut(n * W);
    // Each element assembled as one little-endian word from its W plane bytes, and
    // stored whole (with its base's word XOR-ed in): loops the compiler vectorizes, not
    // W byte stores per element.
    match base {
        Some(b) => {
            for (i, (e, be)) in body.chunks_exact_mut(W).zip(b.chunks_exact(W)).enumerate() {
                let w = word::<W>(&ins, i) ^ load::<W>(be);
                e.copy_from_slice(&w.to_le_bytes()[..W]);
            }
            for ((d, s), b) in dtail.iter_mut().zip(tail).zip(&b[n * W..]) {
                *d = s ^ b;
            }
        }
        None => {
            for (i, e) in body.chunks_exact_mut(W).enumerate() {
                let w = word::<W>(&ins, i);
                e.copy_from_slice(&w.to_le_bytes()[..W]);
            }
            dtail.copy_from_slice(tail);
        }
    }
}

/// An element of a difference delta: an unsigned integer `W` bytes wide.
trait Lane: Copy {
    /// The element in the `W` little-endian bytes `b` starts with.
    fn load(b: &[u8]) -> Self;
    /// The low `W` bytes of `w`.
    fn from_word(w: u64) -> Self;
    /// As a word (zero-extended).
    fn word(self) -> u64;
    /// The zigzag of `self - base` (wrapping, as a signed integer of the width).
    fn zigzag_diff(self, base: Self) -> Self;
    /// `base + d`, where `self` is the zigzag of `d`: the inverse of `zigzag_diff`.
    fn undiff(self, base: Self) -> Self;
}

macro_rules! lane {
    ($u:ty, $i:ty) => {
        impl Lane for $u {
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$u>()];
                a.copy_from_slice(&b[..std::mem::size_of::<$u>()]);
                <$u>::from_le_bytes(a)
            }
            #[inline(always)]
            fn from_word(w: u64) -> Self {
                w as $u
            }
            #[inline(always)]
            fn word(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn zigzag_diff(self, base: Self) -> Self {
                let d = self.wrapping_sub(base) as $i;
                ((d << 1) ^ (d >> (<$i>::BITS - 1))) as $u
            }
            #[inline(always)]
            fn undiff(self, base: Self) -> Self {
                base.wrapping_add((self >> 1) ^ (self & 1).wrapping_neg())
            }
        }
    };
}
lane!(u8, i8);
lane!(u16, i16);
lane!(u32, i32);
lane!(u64, i64);

/// [`split_planes`] of a difference delta, `T` an unsigned integer `W` bytes wide: one
/// plane at a time, as the XOR split (the difference is computed again per plane, in
/// registers, rather than stored).
#[inline(always)]
fn split_diff<T: Lane, const W: usize>(src: &[u8], base: &[u8], dst: &mut [u8]) {
    let n = src.len() / W;
    let (planes, tail) = dst.split_at_mut(n * W);
    let (body, rest) = src.as_chunks::<W>();
    let (bbody, brest) = base.as_chunks::<W>();
    for (p, out) in planes.chunks_exact_mut(n.max(1)).enumerate().take(W) {
        for ((o, e), be) in out.iter_mut().zip(body).zip(bbody) {
            *o = (T::load(e).zigzag_diff(T::load(be)).word() >> (8 * p)) as u8;
        }
    }
    for ((d, s), b) in tail.iter_mut().zip(rest).zip(brest) {
        *d = s ^ b;
    }
}

/// [`join_planes`] of a difference delta (see [`split_diff`]).
#[inline(always)]
fn join_diff<T: Lane, const W: usize>(planes: &[u8], base: &[u8], dst: &mut [u8]) {
    let n = planes.len() / W;
    let ins: [&[u8]; W] = std::array::from_fn(|p| &planes[p * n..(p + 1) * n]);
    let tail = &planes[n * W..];
    let (body, dtail) = dst.split_at_mut(n * W);
    for (i, (e, be)) in body
        .chunks_exact_mut(W)
        .zip(base.chunks_exact(W))
        .enumerate()
    {
        let v = T::from_word(word::<W>(&ins, i)).undiff(T::load(be));
        e.copy_from_slice(&v.word().to_le_bytes()[..W]);
    }
    for ((d, s), b) in dtail.iter_mut().zip(tail).zip(&base[n * W..]) {
        *d = s ^ b;
    }
}

/// Element `i` of the planes `ins` as a little-endian word (in the low `W` bytes).
#[inline(always)]
fn word<const W: usize>(ins: &[&[u8]; W], i: usize) -> u64 {
    let mut w = 0u64;
    for (p, plane) in ins.iter().enumerate() {
        w |= u64::from(plane[i]) << (8 * p);
    }
    w
}

/// The `W` little-endian bytes of `b` as a word.
#[inline(always)]
fn load<const W: usize>(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..W].copy_from_slice(&b[..W]);
    u64::from_le_bytes(w)
}

thread_local! {
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static SMALL_COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// zstd-compress `plane` into `frame` (cleared first), kept only if it is at most
/// `limit` bytes; `false` if it is longer, or zstd failed (out of memory): the plane is
/// then stored raw. `frame` keeps its capacity between calls.
fn compress_plane(plane: &[u8], limit: usize, frame: &mut Vec<u8>) -> bool {
    if let Some(&byte) = plane.first().filter(|&&b| repeats(plane, b)) {
        rle_frame(byte, plane.len(), frame);
        return frame.len() <= limit;
    }
    let small = plane.len() < SMALL_PLANE_BYTES;
    if !small && looks_random(plane) {
        return false;
    }
    let cell = if small {
        &SMALL_COMPRESSOR
    } else {
        &COMPRESSOR
    };
    cell.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            use zstd::zstd_safe::{CParameter, ParamSwitch};
            let level = if small { SMALL_PLANE_LEVEL } else { ZSTD_LEVEL };
            *c = zstd::bulk::Compressor::new(level).ok().and_then(|mut c| {
                c.set_parameter(CParameter::MinMatch(ZSTD_MIN_MATCH)).ok()?;
                c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
                    .ok()?;
                Some(c)
            });
        }
        let Some(comp) = c.as_mut() else {
            return false;
        };
        frame.clear();
        frame.reserve(zstd::zstd_safe::compress_bound(plane.len()));
        comp.compress_to_buffer(plane, frame).is_ok() && frame.len() <= limit
    })
}

/// Whether every byte of `plane` is `byte`. Blocks of 4 KiB without an early exit
/// inside one (the compiler vectorizes them), so about memory speed: a few microseconds
/// for a 64 KiB plane, where zstd takes 10-35 microseconds to find its runs.
fn repeats(plane: &[u8], byte: u8) -> bool {
    plane
        .chunks(4096)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | (b ^ byte)) == 0)
}

/// Largest block of a zstd frame: 128 KiB (RFC 8878, `Block_Maximum_Size`).
const ZSTD_MAX_BLOCK: usize = 128 << 10;

/// Write into `frame` (cleared first) the zstd frame (RFC 8878) of `len` (at least 1)
/// bytes all `byte`: a single-segment frame header recording the content size, then RLE
/// blocks of at most [`ZSTD_MAX_BLOCK`] bytes each (the byte, repeated), no checksum;
/// any zstd decoder reads it, [`decompress_to`] included. About 10 bytes.
fn rle_frame(byte: u8, len: usize, frame: &mut Vec<u8>) {
    debug_assert!(len > 0);
    frame.clear();
    frame.extend_from_slice(&0xFD2F_B528u32.to_le_bytes());
    // Frame header descriptor: Frame_Content_Size_flag (bits 7-6), Single_Segment_flag
    // (bit 5); no checksum, no dictionary. With a single segment the content size field
    // is 1, 2 (the size less 256), 4 or 8 bytes for the flags 0-3.
    let len64 = len as u64;
    let (flag, size, size_bytes) = if len64 < 256 {
        (0u8, len64, 1)
    } else if len64 < 256 + 65536 {
        (1, len64 - 256, 2)
    } else if len64 <= u64::from(u32::MAX) {
        (2, len64, 4)
    } else {
        (3, len64, 8)
    };
    frame.push(flag << 6 | 1 << 5);
    frame.extend_from_slice(&size.to_le_bytes()[..size_bytes]);
    let mut left = len;
    while left > 0 {
        let n = left.min(ZSTD_MAX_BLOCK);
        left -= n;
        // Block header, 3 bytes little-endian: Last_Block (bit 0), Block_Type 1 = RLE
        // (bits 2-1), Block_Size (bits 23-3: for RLE the bytes it makes).
        let header = u32::from(left == 0) | 1 << 1 | (n as u32) << 3;
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.push(byte);
    }
}

/// Whether `plane`'s bytes, [`RANDOM_SAMPLE_BYTES`] at its start, middle and end, have
/// an entropy of at least [`RANDOM_PLANE_TENTHS`] tenths of a bit per byte. O(1): a
/// few microseconds.
fn looks_random(plane: &[u8]) -> bool {
    let w = RANDOM_SAMPLE_BYTES.min(plane.len() / 3);
    let mid = plane.len() / 2 - w / 2;
    let windows = [&plane[..w], &plane[mid..mid + w], &plane[plane.len() - w..]];
    // Four tables, so that consecutive equal bytes do not wait on one counter.
    let mut counts = [[0u32; 256]; 4];
    for win in windows {
        let mut quads = win.chunks_exact(4);
        for q in &mut quads {
            for (t, &b) in q.iter().enumerate() {
                counts[t][usize::from(b)] += 1;
            }
        }
        for &b in quads.remainder() {
            counts[0][usize::from(b)] += 1;
        }
    }
    let n = (3 * w) as f64;
    let bits: f64 = (0..256)
        .map(|b| counts.iter().map(|t| t[b]).sum::<u32>())
        .filter(|&c| c > 0)
        .map(|c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum();
    bits * 10.0 >= f64::from(RANDOM_PLANE_TENTHS)
}

/// Decompress one zstd frame into exactly `dst` (which it must fill): nothing is
/// allocated, and a frame that states another size is refused before it is decoded.
fn decompress_to(frame: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let bad = |reason: String| CodecError::BadPayload { reason };
    let len = dst.len();
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|e| bad(e.to_string()))?);
        }
        let dec = d.as_mut().expect("set above");
        // The frame must state its size, and state the plane's (our encoder always
        // records the size).
        match zstd::zstd_safe::get_frame_content_size(frame) {
            Ok(Some(n)) if n == len as u64 => {}
            Ok(Some(n)) => return Err(bad(format!("frame of {n} bytes, {len} stated"))),
            _ => return Err(bad("not a zstd frame that records its size".into())),
        }
        // At most `len` bytes: zstd stops with an error when the frame holds more.
        let n = dec
            .decompress_to_buffer(frame, dst)
            .map_err(|e| bad(e.to_string()))?;
        if n != len {
            return Err(bad(format!("{n} bytes decompressed, {len} stated")));
        }
        Ok(())
    })
}

thread_local! {
    /// Plane buffers of [`decode_links`], kept warm between chunks (taken out while in
    /// use, so a nested decode allocates its own).
    static CHAIN_BUFS: RefCell<[Vec<u8>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// Run `f` with the thread's plane buffer and scratch plane (fresh ones if they are in
/// use), and keep them for the next call unless they grew past 16 MiB.
fn with_chain_bufs<R>(f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> R) -> R {
    let [mut a, mut b] = CHAIN_BUFS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let r = f(&mut a, &mut b);
    if a.capacity() <= 16 << 20 && b.capacity() <= 16 << 20 {
        CHAIN_BUFS.with(|c| *c.borrow_mut() = [a, b]);
    }
    r
}

/// Encode with a given method (no choice): `base` is required for the deltas
/// ([`Method::XorPlanes`], [`Method::DiffPlanes`]) and ignored otherwise. O(len).
///
/// # Panics
///
/// If `method` is a delta and `base` is `None` or of another length than `raw` (a
/// programmer error: [`encode`] checks both).
#[must_use]
pub fn encode_as(
    method: Method,
    raw: &[u8],
    width: usize,
    base: Option<(&ContentHash, &[u8])>,
) -> Encoded {
    let width = plane_width(width);
    let base = if method.is_delta() {
        let b = base.expect("a delta needs a base");
        assert_eq!(b.1.len(), raw.len(), "a delta base has the chunk's length");
        Some(b)
    } else {
        None
    };
    let raw_header = Header {
        method: Method::Raw,
        width,
        raw_len: raw.len(),
        base: None,
        raw_planes: 0,
        plane_lens: [0; 8],
    };
    let n = raw.len() / width;
    if method == Method::Raw || u32::try_from(n).is_err() {
        // Raw, or planes too long for the plane table: the bytes as they are.
        let mut bytes = Vec::with_capacity(HEADER_LEN + raw.len());
        raw_header.write(&mut bytes);
        bytes.extend_from_slice(raw);
        return Encoded {
            header: raw_header,
            bytes,
        };
    }
    let mut header = Header {
        method,
        base: base.map(|b| *b.0),
        ..raw_header
    };
    let limit = n - n / MIN_PLANE_SAVING_DIVISOR;
    with_encode_bufs(|planes, frame| {
        planes.clear();
        planes.resize(raw.len(), 0);
        let against = match (method, base) {
            (Method::XorPlanes, Some(b)) => Against::Xor(b.1),
            (Method::DiffPlanes, Some(b)) => Against::Diff(b.1),
            _ => Against::Nothing,
        };
        split_planes(raw, against, width, planes);
        // The header's plane table is known only once every plane is coded: a
        // placeholder of the same length first, the header itself last.
        let hlen = header.len();
        let mut bytes = Vec::with_capacity(hlen + raw.len());
        bytes.resize(hlen, 0);
        for p in 0..width {
            let plane = &planes[p * n..(p + 1) * n];
            if compress_plane(plane, limit, frame) {
                bytes.extend_from_slice(frame);
            } else {
                header.raw_planes |= 1 << p;
                bytes.extend_from_slice(plane);
            }
            // At most n bytes, checked to fit a u32 above.
            header.plane_lens[p] = (bytes.len() - hlen - prefix_len(&header, p)) as u32;
        }
        bytes.extend_from_slice(&planes[n * width..]);
        let mut head = Vec::with_capacity(hlen);
        header.write(&mut head);
        bytes[..hlen].copy_from_slice(&head);
        Encoded { header, bytes }
    })
}

/// Bytes of the planes before plane `p` (their lengths in `header`'s table).
fn prefix_len(header: &Header, p: usize) -> usize {
    header.plane_lens[..p].iter().map(|&l| l as usize).sum()
}

thread_local! {
    /// The plane buffer and frame buffer of [`encode_as`], kept warm between chunks: a
    /// save encodes thousands of chunks per thread, and fresh buffers of a chunk's size
    /// would be mapped and faulted in for each.
    static ENCODE_BUFS: RefCell<[Vec<u8>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// Run `f` with the thread's encode buffers (fresh ones if they are in use), and keep
/// them for the next call unless they grew past 16 MiB.
fn with_encode_bufs<R>(f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> R) -> R {
    let [mut a, mut b] = ENCODE_BUFS.with(|c| std::mem::take(&mut *c.borrow_mut()));
    let r = f(&mut a, &mut b);
    if a.capacity() <= 16 << 20 && b.capacity() <= 16 << 20 {
        ENCODE_BUFS.with(|c| *c.borrow_mut() = [a, b]);
    }
    r
}

/// The delta [`encode_with`] takes against a base.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Delta {
    /// A difference delta ([`Method::DiffPlanes`]): what [`encode`] takes.
    #[default]
    Diff,
    /// An XOR delta ([`Method::XorPlanes`]): the only delta a format 2 repository
    /// stores, which the builds that wrote it read.
    Xor,
}

impl Delta {
    /// The method of this delta.
    #[must_use]
    pub fn method(self) -> Method {
        match self {
            Delta::Diff => Method::DiffPlanes,
            Delta::Xor => Method::XorPlanes,
        }
    }
}

/// Encode a chunk of elements `width` bytes wide (1, 2, 4 or 8; any other width is
/// grouped as single bytes), choosing the method by what it saves: a difference delta
/// against `base` (its id and raw bytes, used only if of the same length), or planes,
/// or raw when neither saves at least 1/[`MIN_SAVING_DIVISOR`] of the length. O(len): a
/// delta that saves at least a tenth ([`DELTA_ENOUGH_TENTHS`]) is taken without trying
/// planes alone; otherwise both are tried.
#[must_use]
pub fn encode(raw: &[u8], width: usize, base: Option<(&ContentHash, &[u8])>) -> Encoded {
    encode_with(raw, width, base, Delta::Diff)
}

/// [`encode`], with `delta` as the delta it takes against `base`.
#[must_use]
pub fn encode_with(
    raw: &[u8],
    width: usize,
    base: Option<(&ContentHash, &[u8])>,
    delta: Delta,
) -> Encoded {
    let limit = raw.len() - raw.len() / MIN_SAVING_DIVISOR;
    let mut best: Option<Encoded> = None;
    if let Some(b) = base.filter(|b| b.1.len() == raw.len() && !raw.is_empty()) {
        let d = encode_as(delta.method(), raw, width, Some(b));
        if d.method().is_delta() && d.len() <= raw.len() / 10 * DELTA_ENOUGH_TENTHS {
            return d;
        }
        best = Some(d);
    }
    if !raw.is_empty() {
        let p = encode_as(Method::Planes, raw, width, None);
        if best.as_ref().is_none_or(|b| p.len() < b.len()) {
            best = Some(p);
        }
    }
    match best {
        Some(b) if b.method() != Method::Raw && b.len() <= limit => b,
        _ => encode_as(Method::Raw, raw, width, None),
    }
}

/// Decode an encoded chunk whose id is `id` into 8-byte-aligned bytes, and check them
/// against `id`. `base` is the raw bytes of the chunk the header names as base (needed
/// for an XOR delta, ignored otherwise); `max_raw` bounds the raw length the header may
/// state, and so what is allocated. O(raw length).
///
/// # Errors
///
/// A [`CodecError`] for a truncated, damaged or oversized input, a missing or wrong
/// base, or decoded bytes that do not hash to `id`.
pub fn decode(
    encoded: &[u8],
    id: &ContentHash,
    max_raw: usize,
    base: Option<&[u8]>,
) -> Result<Bytes, CodecError> {
    decode_chain(&[encoded], base, id, max_raw)
}

/// Decode a delta chain in one pass and check the result against `id` once.
/// `links[0]` is the chunk's encoded form, `links[i + 1]` the encoded form of the base
/// `links[i]` names; the chain ends at a full chunk (raw or planes) or, when its last
/// link is a delta, at `base` (the raw bytes of that delta's base, e.g. a decoded chunk
/// already at hand). `max_raw` bounds every link's stated raw length.
///
/// XOR is linear: the byte planes of the chunk are the XOR of the planes every link
/// stores, so the chain costs, per link, one XOR pass (a raw plane is XOR-ed straight
/// from the link, a zstd-coded plane decompressed first), then one interleaving pass and
/// one hash (decoding the links one by one, each checked, would interleave and hash
/// every link). Only the chunk's own bytes are checked: a damaged or wrong link
/// anywhere makes them miss `id`. O(raw length · links); each thread keeps a plane
/// buffer as long as the largest chunk it decoded and a scratch plane (up to 16 MiB
/// each) for its next decode.
///
/// # Errors
///
/// As [`decode`]: a [`CodecError`] for a truncated, damaged or oversized link, a link of
/// another raw length than the chunk ([`CodecError::BaseLength`]), a missing `base`, or
/// bytes that do not hash to `id`.
///
/// # Panics
///
/// If `links` is empty (a programmer error).
pub fn decode_chain(
    links: &[&[u8]],
    base: Option<&[u8]>,
    id: &ContentHash,
    max_raw: usize,
) -> Result<Bytes, CodecError> {
    decode_chain_in(links, base, id, max_raw, &Heap)
}

/// Where decoded bytes are written: `filled(len, fill)` gives `len` bytes written by
/// `fill` (which writes every byte) as [`Bytes`].
pub(crate) trait Out {
    fn filled(&self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Bytes;
}

/// Decoded bytes in new word-aligned heap buffers.
pub(crate) struct Heap;

impl Out for Heap {
    fn filled(&self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> Bytes {
        AlignedBuf::filled(len, fill)
    }
}

/// [`decode_chain`], writing the decoded bytes where `out` gives them.
pub(crate) fn decode_chain_in(
    links: &[&[u8]],
    base: Option<&[u8]>,
    id: &ContentHash,
    max_raw: usize,
    out: &dyn Out,
) -> Result<Bytes, CodecError> {
    assert!(!links.is_empty(), "a chain has at least one link");
    let bytes = decode_links(links, base, max_raw, out)?;
    let found = ContentHash::of_bytes(&bytes);
    if found != *id {
        return Err(CodecError::HashMismatch {
            expected: *id,
            found,
        });
    }
    Ok(bytes)
}

/// `acc ^= other`, byte by byte (vectorized by the compiler).
fn xor_into(acc: &mut [u8], other: &[u8]) {
    acc.iter_mut().zip(other).for_each(|(a, b)| *a ^= b);
}

/// Check that `payload` holds exactly the planes `header` states, and that each zstd
/// plane's frame states the plane's length: before anything is allocated for the link,
/// so a header or frame claiming more than the payload holds costs nothing. O(width).
fn check_link(header: &Header, payload: &[u8]) -> Result<(), CodecError> {
    let width = header.width;
    let n = header.raw_len / width;
    let tail = header.raw_len % width;
    let stored: u64 = header.plane_lens[..width]
        .iter()
        .map(|&l| u64::from(l))
        .sum::<u64>()
        + tail as u64;
    if (payload.len() as u64) < stored {
        return Err(CodecError::Truncated {
            needed: header.len().saturating_add(stored as usize),
            found: header.len() + payload.len(),
        });
    }
    if payload.len() as u64 > stored {
        return Err(CodecError::BadPayload {
            reason: format!("{} bytes after the planes", payload.len() as u64 - stored),
        });
    }
    let mut at = 0;
    for p in 0..width {
        // The lengths sum to at most `payload.len()` (checked above).
        let len = header.plane_lens[p] as usize;
        if header.raw_planes >> p & 1 == 0 {
            // Our encoder always records the size.
            match zstd::zstd_safe::get_frame_content_size(&payload[at..at + len]) {
                Ok(Some(m)) if m == n as u64 => {}
                Ok(Some(m)) => {
                    return Err(CodecError::BadPayload {
                        reason: format!("plane {p}: frame of {m} bytes, {n} stated"),
                    })
                }
                _ => {
                    return Err(CodecError::BadPayload {
                        reason: format!("plane {p}: not a zstd frame that records its size"),
                    })
                }
            }
        }
        at += len;
    }
    Ok(())
}

/// Put the planes one link stores into `acc` (`first`: `acc` := them; otherwise
/// `acc ^= them`): a raw plane by a copy or an XOR straight from `payload`, a zstd plane
/// decompressed into `acc` (first link) or into `scratch` and XOR-ed. `acc` is
/// `header.raw_len` bytes long; `scratch` grows to one plane at most. The link was
/// checked by [`check_link`].
fn apply_link(
    header: &Header,
    payload: &[u8],
    acc: &mut [u8],
    scratch: &mut Vec<u8>,
    first: bool,
) -> Result<(), CodecError> {
    let width = header.width;
    let n = header.raw_len / width;
    let mut at = 0;
    for p in 0..width {
        // The lengths sum to at most `payload.len()` (checked above).
        let len = header.plane_lens[p] as usize;
        let src = &payload[at..at + len];
        at += len;
        let dst = &mut acc[p * n..(p + 1) * n];
        match (header.raw_planes >> p & 1 == 1, first) {
            (true, true) => dst.copy_from_slice(src),
            (true, false) => xor_into(dst, src),
            (false, true) => decompress_to(src, dst)?,
            (false, false) => {
                scratch.resize(n, 0);
                decompress_to(src, &mut scratch[..n])?;
                xor_into(dst, &scratch[..n]);
            }
        }
    }
    let dst = &mut acc[n * width..];
    if first {
        dst.copy_from_slice(&payload[at..]);
    } else {
        xor_into(dst, &payload[at..]);
    }
    Ok(())
}

/// The raw bytes of the chain `links` (see [`decode_chain`]), not checked against any
/// id.
fn decode_links(
    links: &[&[u8]],
    base: Option<&[u8]>,
    max_raw: usize,
    out: &dyn Out,
) -> Result<Bytes, CodecError> {
    let encoded = links[0];
    let header = Header::parse(encoded, max_raw)?;
    let payload = &encoded[header.len()..];
    let raw_len = header.raw_len;
    match header.method {
        Method::Raw => {
            if payload.len() != raw_len {
                return Err(CodecError::Truncated {
                    needed: header.len() + raw_len,
                    found: encoded.len(),
                });
            }
            Ok(out.filled(raw_len, &mut |dst| dst.copy_from_slice(payload)))
        }
        Method::Planes => with_chain_bufs(|acc, scratch| {
            // Bounded by the stated raw length (at most `max_raw`), which the payload
            // was checked to hold first.
            check_link(&header, payload)?;
            acc.resize(raw_len, 0);
            apply_link(&header, payload, acc, scratch, true)?;
            Ok(join_with(acc, Against::Nothing, header.width, out))
        }),
        Method::DiffPlanes => {
            let Some(named) = header.base else {
                return Err(CodecError::BadHeader {
                    reason: "a delta without a base id".into(),
                });
            };
            check_link(&header, payload)?;
            // A difference is not linear in the planes as an XOR is: the base is decoded
            // whole first (the given one for a chain of one link, else the rest of the
            // chain), then this link's planes are added to its elements.
            let rest;
            let b = if links.len() == 1 {
                checked_base(base, named, raw_len)?
            } else {
                // From `out` too: a store's pool takes the buffer back when it drops.
                rest = decode_links(&links[1..], base, max_raw, out)?;
                checked_base(Some(&rest[..]), named, raw_len)?
            };
            with_chain_bufs(|acc, scratch| {
                acc.resize(raw_len, 0);
                apply_link(&header, payload, acc, scratch, true)?;
                Ok(join_with(acc, Against::Diff(b), header.width, out))
            })
        }
        Method::XorPlanes => {
            let Some(mut named) = header.base else {
                return Err(CodecError::BadHeader {
                    reason: "a delta without a base id".into(),
                });
            };
            if links.len() == 1 {
                // Refuse a missing or wrong base before decompressing.
                checked_base(base, named, raw_len)?;
            }
            with_chain_bufs(|acc, scratch| {
                check_link(&header, payload)?;
                acc.resize(raw_len, 0);
                apply_link(&header, payload, acc, scratch, true)?;
                for (i, link) in links.iter().enumerate().skip(1) {
                    let h = Header::parse(link, max_raw)?;
                    if h.raw_len != raw_len {
                        return Err(CodecError::BaseLength {
                            expected: raw_len,
                            found: h.raw_len,
                        });
                    }
                    if h.width != header.width
                        || h.method == Method::Raw
                        || h.method == Method::DiffPlanes
                    {
                        // Planes of another grouping (or none), or a difference: decode
                        // the rest apart.
                        let b = decode_links(&links[i..], base, max_raw, out)?;
                        return Ok(join_with(acc, Against::Xor(&b), header.width, out));
                    }
                    check_link(&h, &link[h.len()..])?;
                    apply_link(&h, &link[h.len()..], acc, scratch, false)?;
                    if h.method == Method::Planes {
                        return Ok(join_with(acc, Against::Nothing, header.width, out));
                    }
                    if let Some(n) = h.base {
                        named = n;
                    }
                }
                let b = checked_base(base, named, raw_len)?;
                Ok(join_with(acc, Against::Xor(b), header.width, out))
            })
        }
    }
}

/// The base bytes `b` given for a delta against chunk `named` of `raw_len` bytes:
/// [`CodecError::MissingBase`] if none, [`CodecError::BaseLength`] if of another length.
fn checked_base(b: Option<&[u8]>, named: ContentHash, raw_len: usize) -> Result<&[u8], CodecError> {
    match b {
        None => Err(CodecError::MissingBase { base: named }),
        Some(b) if b.len() != raw_len => Err(CodecError::BaseLength {
            expected: raw_len,
            found: b.len(),
        }),
        Some(b) => Ok(b),
    }
}

/// The bytes whose planes (as [`split_planes`] made them against the same base) are
/// `planes`, aligned.
fn join_with(planes: &[u8], against: Against<'_>, width: usize, out: &dyn Out) -> Bytes {
    out.filled(planes.len(), &mut |dst| {
        join_planes(planes, against, width, dst)
    })
}

/// One chunk to decode with [`decode_all`]: its encoded form, its id, and its base's raw
/// bytes when it is a delta.
#[derive(Clone, Copy, Debug)]
pub struct DecodeJob<'a> {
    /// The encoded form.
    pub encoded: &'a [u8],
    /// The chunk's id.
    pub id: ContentHash,
    /// The base's raw bytes (for a delta).
    pub base: Option<&'a [u8]>,
}

/// Decode many chunks in parallel on the crate's pool ([`crate::parallel`]), each as
/// [`decode`] does, in order. O(total raw length / threads).
#[must_use]
pub fn decode_all(jobs: &[DecodeJob<'_>], max_raw: usize) -> Vec<Result<Bytes, CodecError>> {
    crate::parallel::install(|| {
        jobs.par_iter()
            .map(|j| decode(j.encoded, &j.id, max_raw, j.base))
            .collect()
    })
}

/// One chunk to encode with [`encode_all`]: its raw bytes, element width and base (as
/// [`encode`] takes them).
#[derive(Clone, Copy, Debug)]
pub struct EncodeJob<'a> {
    /// The raw bytes.
    pub raw: &'a [u8],
    /// Element width in bytes.
    pub width: usize,
    /// The base's id and raw bytes, for a delta.
    pub base: Option<(&'a ContentHash, &'a [u8])>,
    /// The delta to take against the base.
    pub delta: Delta,
}

/// Encode many chunks in parallel on the crate's pool, each as [`encode_with`] does, in
/// order. O(total length / threads).
#[must_use]
pub fn encode_all(jobs: &[EncodeJob<'_>]) -> Vec<Encoded> {
    crate::parallel::install(|| {
        jobs.par_iter()
            .map(|j| encode_with(j.raw, j.width, j.base, j.delta))
            .collect()
    })
}
