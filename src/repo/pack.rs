//! Packs: the files that hold chunk bytes. The one place that knows their layout:
//! writing them (alignment, padding, the footer and the id), parsing and checking their
//! footers (whole, or by ranged reads of the tail), reading one chunk back by a ranged
//! read, and the hash check of what was read. Save, open, gc and repack all go through
//! here.
//!
//! ```text
//! 0..64              header: magic, kind `P`, format version (u16 LE), zero padding
//! 64..F              chunks, each at a multiple of PACK_ALIGN, zero padding between
//! F..F+n             footer: postcard Vec<PackEntry>
//! F+n..F+n+16        F and n, u64 LE each
//! last 32 bytes      BLAKE3(header[..10] ‖ footer ‖ F and n) = the pack's id
//! ```
//!
//! # Stored forms
//!
//! A chunk's raw bytes (what its id, the BLAKE3 of those bytes, names) become the bytes a
//! pack stores in one function, [`store_chunks`] (raw in format 1; raw, byte planes or
//! a delta against a base in formats 2 and 3, chosen by the codec: an XOR delta in
//! format 2, a difference delta in format 3), and the stored bytes
//! are read by [`read_stored`] (bounded by what the entry's [`Form`] allows) and, for
//! raw chunks, checked by [`check_raw`]; coded chunks are decoded with their chain by
//! the chunk source (`chunks.rs`). What an entry records of a stored chunk is the
//! [`Span`], written in pack footers and index files alike ([`entries_wire`]; the wire
//! reader for the index fast path is [`PackEntry::read_wire`]). Save, open, gc and
//! repack ask [`Span::raw_len`] for a chunk's length in its tensor and
//! [`Span::base`] for the base a delta needs. A different pack size is
//! [`PACK_TARGET_BYTES`].

use std::borrow::Cow;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::backend::{Backend, Bytes};
use super::format::{
    check_header, corrupt, delta_in, header_in, id_of_key, manifest_key, manifests_packed,
    must_get, pack_key, parse_manifest, Kind, Manifest, RawHash, Wire, FORMAT_V1, HEADER_LEN,
    PACKS_PREFIX, TRAILER_LEN,
};
use crate::buffer::AlignedBuf;
use crate::chunk::Chunk;
use crate::codec::{encode_all, EncodeJob, Encoded, Header, Method};
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// Chunk data in a pack starts at multiples of this.
pub(crate) const PACK_ALIGN: usize = 64;

/// Packs are cut at about this size.
pub(crate) const PACK_TARGET_BYTES: usize = 32 << 20;

/// A write of less than this many times [`PACK_TARGET_BYTES`] is cut into packs (and
/// coded in groups) of this many parts of it, down to [`PACK_MIN_TARGET_BYTES`], so
/// that writing and syncing its first packs overlaps coding the rest and what is left
/// to write and sync after the last group is coded is small: a dense save of 64 MiB
/// (coded to about 23 MiB) took a median of 74 ms in packs of 8 MiB (3 packs) where
/// one pack took 86 ms (6 alternated runs of 15 saves each, 2 cores). Larger
/// writes are cut at [`PACK_TARGET_BYTES`], as many packs already overlap.
const PACKS_PER_WRITE: usize = 8;

/// The smallest pack size [`pack_target`] chooses.
const PACK_MIN_TARGET_BYTES: usize = 4 << 20;

/// The pack size (stored bytes) and coding group size (raw bytes) of a write of
/// `raw_bytes` raw bytes of chunks: [`PACK_TARGET_BYTES`], or a [`PACKS_PER_WRITE`]th
/// of the write when that is less (at least [`PACK_MIN_TARGET_BYTES`]).
fn pack_target(raw_bytes: usize) -> usize {
    (raw_bytes / PACKS_PER_WRITE).clamp(PACK_MIN_TARGET_BYTES, PACK_TARGET_BYTES)
}

/// Writers store a chunk as a delta only when its chain (the chunk, its base, the
/// base's base, ... down to a full chunk) has at most this many links: a full chunk
/// at least every 8 versions of a tensor. Reading a chunk decodes its whole chain
/// (measured on 256 KiB f32 chunks: 0.44 ms at depth 0, 1.6 ms at depth 8, one
/// thread), so 8 keeps a read within about 4 full decodes while the full chunk's
/// bytes are shared by 8 versions (a dense step's delta stores about a third of the
/// full chunk, see `benches/README.md`).
pub(crate) const MAX_DELTA_CHAIN: usize = 8;

/// Bytes after a pack's footer: footer offset, footer length (u64 LE each), trailer.
pub(crate) const PACK_TAIL_LEN: usize = 16 + TRAILER_LEN;

/// How a chunk's bytes are stored in its pack (format version 2; every chunk of a
/// version-1 pack is [`Form::Raw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Form {
    /// The raw bytes, as they are: mapped packs serve them in place.
    Raw,
    /// The chunk's encoded form (`codec.rs`): byte planes, zstd-coded.
    Planes,
    /// The chunk's encoded form: a delta (XOR or difference) against the chunk of this
    /// id (of the same raw length), byte planes, zstd-coded.
    Delta(RawHash),
    /// A manifest (format 4): its object's bytes without the trailer (their BLAKE3 is
    /// the manifest id, the entry's id), as they are.
    Manifest,
}

impl Form {
    /// The form an encoded chunk is stored in: its byte planes, its delta against the
    /// base it names, or [`Form::Raw`] where the encoder kept the raw bytes (they are
    /// stored as they are, without the codec's header).
    pub(crate) fn of(e: &Encoded) -> Form {
        match (e.method(), e.base()) {
            (Method::Planes, _) => Form::Planes,
            (m, Some(base)) if m.is_delta() => Form::Delta(base.0),
            _ => Form::Raw,
        }
    }

    /// Whether the stored bytes are the bytes of the id, as they are ([`Form::Raw`] or
    /// [`Form::Manifest`]): either serves them, as a chunk or as a manifest (the same
    /// id is the same bytes).
    pub(crate) fn is_plain(self) -> bool {
        matches!(self, Form::Raw | Form::Manifest)
    }
}

/// What an entry records of one stored chunk: where its stored bytes are in its pack,
/// how long the chunk is, and how it is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Span {
    /// Offset of the stored bytes in the pack (a multiple of [`PACK_ALIGN`]).
    pub(crate) offset: u64,
    /// Length of the stored bytes.
    pub(crate) len: u64,
    /// Length of the chunk's raw bytes (equal to `len` for [`Form::Raw`]).
    pub(crate) raw_len: u64,
    /// How the bytes are stored.
    pub(crate) form: Form,
}

impl Span {
    /// A raw chunk of `len` bytes at `offset`.
    pub(crate) fn raw(offset: u64, len: u64) -> Span {
        Span {
            offset,
            len,
            raw_len: len,
            form: Form::Raw,
        }
    }

    /// Bytes of the chunk in its tensor (its raw bytes).
    pub(crate) fn raw_len(&self) -> u64 {
        self.raw_len
    }

    /// Bytes the chunk takes in its pack.
    pub(crate) fn stored_len(&self) -> u64 {
        self.len
    }

    /// The base of a delta.
    pub(crate) fn base(&self) -> Option<ContentHash> {
        match self.form {
            Form::Delta(b) => Some(ContentHash(b)),
            _ => None,
        }
    }

    /// The byte range of the stored bytes in the pack, if it does not overflow.
    fn range(&self) -> Option<std::ops::Range<u64>> {
        Some(self.offset..self.offset.checked_add(self.len)?)
    }

    /// Whether the stored length fits the form: a raw chunk stores exactly its raw
    /// bytes, a coded one at most its raw length plus the codec's largest header (a
    /// writer stores a chunk coded only when that saves bytes). Checked when an entry
    /// is read, so that no read is sized by a length that no writer writes.
    fn plausible(&self, id: &RawHash) -> bool {
        match self.form {
            Form::Raw => self.len == self.raw_len,
            Form::Manifest => self.len == self.raw_len && self.len > 0,
            Form::Planes | Form::Delta(_) => {
                self.raw_len > 0
                    && self.len <= self.raw_len.saturating_add(MAX_CODED_OVERHEAD)
                    && self.form != Form::Delta(*id)
            }
        }
    }
}

/// Bytes a coded chunk's header may add to its raw length: the codec's delta header and
/// a plane table of 8 planes.
const MAX_CODED_OVERHEAD: u64 = (crate::codec::DELTA_HEADER_LEN + 4 * 8) as u64;

/// One chunk in a pack footer or an index file: its id and its span. Format 2 encodes
/// it as the id's 32 bytes followed by the span's fields (`offset`, `len`, `raw_len`
/// varints, then the form: a varint 0 raw, 1 planes, 2 delta followed by the base's 32
/// bytes), the postcard encoding of this struct; format 1 as `{ id, offset, len }`
/// ([`EntryV1`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PackEntry {
    pub(crate) id: RawHash,
    pub(crate) span: Span,
}

/// A pack entry of format version 1: a raw chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EntryV1 {
    id: RawHash,
    offset: u64,
    len: u64,
}

impl From<EntryV1> for PackEntry {
    fn from(e: EntryV1) -> PackEntry {
        PackEntry {
            id: e.id,
            span: Span::raw(e.offset, e.len),
        }
    }
}

impl PackEntry {
    /// Fewest bytes an entry takes on the wire (for bounding sequence lengths).
    pub(crate) const MIN_WIRE_LEN: usize = 32 + 2;

    /// The format-1 form of this entry (a raw chunk), for the writers of version-1
    /// repositories, which store every chunk raw.
    pub(crate) fn v1(&self) -> EntryV1 {
        debug_assert_eq!(self.span.form, Form::Raw);
        EntryV1 {
            id: self.id,
            offset: self.span.offset,
            len: self.span.len,
        }
    }

    /// Read one entry of format `version` as postcard encodes it (`None` for anything
    /// it does not accept: the caller then asks postcard).
    pub(crate) fn read_wire(w: &mut Wire<'_>, version: u16) -> Option<PackEntry> {
        let id = w.hash()?;
        let offset = w.varint()?;
        let len = w.varint()?;
        if version == FORMAT_V1 {
            return Some(PackEntry {
                id,
                span: Span::raw(offset, len),
            });
        }
        let raw_len = w.varint()?;
        let form = match w.varint()? {
            0 => Form::Raw,
            1 => Form::Planes,
            2 => Form::Delta(w.hash()?),
            3 => Form::Manifest,
            _ => return None,
        };
        Some(PackEntry {
            id,
            span: Span {
                offset,
                len,
                raw_len,
                form,
            },
        })
    }

    /// Whether the entry's lengths fit its form (see [`Span`]): entries that do not are
    /// refused where they are read (pack footers, index files).
    pub(crate) fn plausible(&self) -> bool {
        self.span.plausible(&self.id)
    }

    /// [`plausible`](PackEntry::plausible), and of a form that format `version` has
    /// (manifest entries only from format 4).
    pub(crate) fn plausible_in(&self, version: u16) -> bool {
        self.plausible() && (self.span.form != Form::Manifest || manifests_packed(version))
    }
}

/// The entries of a footer or index pack of format `version`, encoded.
pub(crate) fn entries_wire(entries: &[PackEntry], version: u16) -> Vec<u8> {
    // Serializing plain data structures to a Vec cannot fail.
    if version == FORMAT_V1 {
        let v1: Vec<EntryV1> = entries.iter().map(PackEntry::v1).collect();
        postcard::to_stdvec(&v1).unwrap_or_default()
    } else {
        postcard::to_stdvec(entries).unwrap_or_default()
    }
}

/// Parse a footer's entries of format `version` (the direct reader, then postcard);
/// the rest of the bytes.
fn take_entries(bytes: &[u8], version: u16) -> Option<(Vec<PackEntry>, &[u8])> {
    let mut w = Wire(bytes);
    let fast = (|| {
        let n = w.len(PackEntry::MIN_WIRE_LEN)?;
        (0..n)
            .map(|_| PackEntry::read_wire(&mut w, version))
            .collect::<Option<Vec<_>>>()
    })();
    if let Some(e) = fast {
        return Some((e, w.0));
    }
    if version == FORMAT_V1 {
        let (e, rest) = postcard::take_from_bytes::<Vec<EntryV1>>(bytes).ok()?;
        Some((e.into_iter().map(PackEntry::from).collect(), rest))
    } else {
        postcard::take_from_bytes::<Vec<PackEntry>>(bytes).ok()
    }
}

/// Where a chunk lives: its pack and its span there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) pack: ContentHash,
    pub(crate) span: Span,
}

/// A pack just written.
#[derive(Debug)]
pub(crate) struct WrittenPack {
    pub(crate) id: ContentHash,
    pub(crate) entries: Vec<PackEntry>,
    /// Bytes of the pack file.
    pub(crate) size: u64,
}

/// A chunk to write into a pack: its id, raw bytes, element width, and the base a
/// delta may be taken against (its id and raw bytes, of the same length).
#[derive(Clone, Copy)]
pub(crate) struct NewChunk<'a> {
    pub(crate) id: ContentHash,
    pub(crate) chunk: &'a Chunk,
    pub(crate) width: usize,
    pub(crate) base: Option<(ContentHash, &'a Chunk)>,
    /// The chunk's coded form when it is already held coded (a chunk the memory budget
    /// encoded): written as it is instead of decoded and coded again. Its base, for a
    /// delta, is in the repository or written by the same save.
    pub(crate) coded: Option<(&'a [u8], Form)>,
}

/// A chunk in the form a pack stores it, ready to write.
pub(crate) struct Stored<'a> {
    pub(crate) id: ContentHash,
    pub(crate) bytes: Cow<'a, [u8]>,
    pub(crate) raw_len: u64,
    pub(crate) form: Form,
}

impl Stored<'_> {
    /// Manifest `id` as a pack entry ([`Form::Manifest`]), from its object's bytes:
    /// the trailer (the id) is dropped, so that the BLAKE3 of the stored bytes is the
    /// entry's id, as for a raw chunk.
    pub(crate) fn manifest(id: ContentHash, mut object: Vec<u8>) -> Stored<'static> {
        object.truncate(object.len() - TRAILER_LEN);
        Stored {
            id,
            raw_len: object.len() as u64,
            bytes: Cow::Owned(object),
            form: Form::Manifest,
        }
    }

    /// A chunk stored raw.
    pub(crate) fn raw(id: ContentHash, raw: &[u8]) -> Stored<'_> {
        Stored {
            id,
            bytes: Cow::Borrowed(raw),
            raw_len: raw.len() as u64,
            form: Form::Raw,
        }
    }
}

/// A chunk to encode: its id, raw bytes, element width, and a base (id and raw bytes).
pub(crate) type ToEncode<'a> = (
    ContentHash,
    &'a [u8],
    usize,
    Option<(ContentHash, &'a [u8])>,
);

/// The stored forms of chunks (id, raw bytes, element width, base) in a repository of
/// format `format`: raw in format 1; in formats 2 and 3 encoded in parallel by
/// [`codec::encode_all`](crate::codec::encode_all), which keeps a coded form (planes,
/// or a delta against the base: XOR in format 2, difference in format 3) only when it
/// saves at least 1/[`MIN_SAVING_DIVISOR`](crate::codec::MIN_SAVING_DIVISOR) of the
/// chunk. The one way into a pack (see the module docs). O(total bytes / threads).
/// With `code` false every chunk is stored raw (a coded pack may hold raw chunks
/// only).
pub(crate) fn store_chunks<'a>(
    format: u16,
    chunks: &[ToEncode<'a>],
    code: bool,
) -> Vec<Stored<'a>> {
    if format == FORMAT_V1 || !code {
        return chunks.iter().map(|c| Stored::raw(c.0, c.1)).collect();
    }
    let jobs: Vec<EncodeJob<'_>> = chunks
        .iter()
        .map(|(_, raw, width, base)| EncodeJob {
            raw,
            width: *width,
            base: base.as_ref().map(|(h, b)| (h, *b)),
            delta: delta_in(format),
        })
        .collect();
    let encoded = encode_all(&jobs);
    chunks
        .iter()
        .zip(encoded)
        .map(|(c, e)| match Form::of(&e) {
            Form::Raw => Stored::raw(c.0, c.1),
            form => Stored {
                id: c.0,
                raw_len: c.1.len() as u64,
                bytes: Cow::Owned(e.into_bytes()),
                form,
            },
        })
        .collect()
}

/// The bytes of chunk `id` as its pack stores them (one ranged read of `loc`), bounded
/// before the read by what the entry's form allows.
///
/// # Errors
///
/// [`Error::Io`]; [`Error::CorruptObject`] naming the pack for an implausible entry or
/// a pack too short for the chunk.
pub(crate) fn read_stored(backend: &dyn Backend, id: &ContentHash, loc: &Loc) -> Result<Bytes> {
    let key = pack_key(&loc.pack);
    if !loc.span.plausible(&id.0) {
        return Err(corrupt(
            &key,
            format!("chunk {id}: entry's lengths do not fit its stored form"),
        ));
    }
    let range = loc
        .span
        .range()
        .ok_or_else(|| corrupt(&key, "chunk offset overflows"))?;
    let stored = backend.get_range(&key, range).map_err(|e| match e {
        Error::Io {
            kind: std::io::ErrorKind::UnexpectedEof,
            ..
        } => corrupt(&key, format!("pack too short for chunk {id} (truncated)")),
        e => e,
    })?;
    if stored.len() as u64 != loc.span.stored_len() {
        return Err(corrupt(&key, format!("chunk {id}: short read")));
    }
    Ok(stored)
}

/// The raw bytes of raw-stored chunk `id` read from `stored` (read from `span` of pack
/// `key`), checked against the id.
pub(crate) fn check_raw(key: &str, id: &ContentHash, span: &Span, stored: Bytes) -> Result<Bytes> {
    // Chunk data is viewed as `&[T]`: a buffer not on an 8-byte boundary is copied to one.
    let raw = if (stored.as_ptr() as usize).is_multiple_of(8) {
        stored
    } else {
        AlignedBuf::bytes_of(&stored)
    };
    if ContentHash::of_bytes(&raw) != *id {
        return Err(corrupt(
            key,
            format!(
                "chunk {id} at offset {} does not match its hash",
                span.offset
            ),
        ));
    }
    Ok(raw)
}

/// Read raw-stored chunk `id` from where `loc` says it is (one ranged read) and check
/// it. A coded chunk needs its chain: the chunk source decodes those
/// (`RepoChunks::load`).
///
/// # Errors
///
/// [`Error::Io`]; [`Error::CorruptObject`] naming the pack for a pack too short for the
/// chunk, bytes that do not match the chunk's hash, or a chunk that is not stored raw.
pub(crate) fn read_chunk(backend: &dyn Backend, id: &ContentHash, loc: &Loc) -> Result<Bytes> {
    let key = pack_key(&loc.pack);
    if !loc.span.form.is_plain() {
        return Err(corrupt(&key, format!("chunk {id} is not stored raw")));
    }
    let stored = read_stored(backend, id, loc)?;
    check_raw(&key, id, &loc.span, stored)
}

/// Manifest `id` as the bytes of its object (the stored bytes, then the trailer, which
/// is the id) and the name its errors give (the pack and the manifest): one ranged read
/// of `loc`, an entry stored as it is ([`Form::is_plain`]), checked against the id. The manifest itself is
/// parsed by the caller.
///
/// # Errors
///
/// [`Error::Io`]; [`Error::CorruptObject`] naming the pack for a coded entry, a pack
/// too short, or bytes that do not match the id.
pub(crate) fn read_packed_manifest(
    backend: &dyn Backend,
    id: &ContentHash,
    loc: &Loc,
) -> Result<(String, Vec<u8>)> {
    let name = format!("{} (manifest {id})", pack_key(&loc.pack));
    if !loc.span.form.is_plain() {
        return Err(corrupt(&name, "stored coded"));
    }
    let stored = read_stored(backend, id, loc)?;
    if ContentHash::of_bytes(&stored) != *id {
        return Err(corrupt(
            &name,
            format!(
                "the bytes at offset {} do not match its id",
                loc.span.offset
            ),
        ));
    }
    let mut object = Vec::with_capacity(stored.len() + TRAILER_LEN);
    object.extend_from_slice(&stored);
    object.extend_from_slice(id.as_bytes());
    Ok((name, object))
}

/// Read and check manifest `id`: from its pack when `loc` is an entry stored as it is
/// (a [`Form::Manifest`] entry, format 4), else from its own object. Returns the name errors give it (the object's
/// key, or the pack and the manifest) and the manifest.
///
/// # Errors
///
/// [`Error::Io`]; [`Error::CorruptObject`] naming the object or the pack for a manifest
/// missing, damaged or past a limit.
pub(crate) fn read_manifest(
    backend: &dyn Backend,
    id: &ContentHash,
    loc: Option<Loc>,
) -> Result<(String, Manifest)> {
    let (name, bytes) = match loc.filter(|l| l.span.form.is_plain()) {
        Some(loc) => read_packed_manifest(backend, id, &loc)?,
        None => {
            let key = manifest_key(id);
            let bytes = must_get(backend, &key)?;
            (key, bytes.to_vec())
        }
    };
    let manifest = parse_manifest(&name, &bytes, Some(id))?;
    Ok((name, manifest))
}

/// A pack's fixed header: the object header padded with zeros to [`PACK_ALIGN`].
fn pack_header(format: u16) -> [u8; PACK_ALIGN] {
    let mut h = [0u8; PACK_ALIGN];
    h[..HEADER_LEN].copy_from_slice(&header_in(Kind::Pack, format));
    h
}

/// The footer, offsets and trailer that end a pack whose chunks are `entries`, and the
/// pack's id (the trailer: BLAKE3 of the header, footer and offsets).
fn pack_tail(format: u16, footer_offset: u64, entries: &[PackEntry]) -> (Vec<u8>, ContentHash) {
    let mut tail = entries_wire(entries, format);
    let footer_len = tail.len() as u64;
    tail.extend_from_slice(&footer_offset.to_le_bytes());
    tail.extend_from_slice(&footer_len.to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&header_in(Kind::Pack, format));
    h.update(&tail);
    let id = ContentHash(*h.finalize().as_bytes());
    tail.extend_from_slice(id.as_bytes());
    (tail, id)
}

/// Write `chunks` (in their stored forms) as one pack of format `format`.
///
/// # Errors
///
/// [`Error::Io`].
pub(crate) fn write_pack(
    backend: &dyn Backend,
    format: u16,
    chunks: &[Stored<'_>],
) -> Result<WrittenPack> {
    static PAD: [u8; PACK_ALIGN] = [0; PACK_ALIGN];
    let header = pack_header(format);
    let mut offset = PACK_ALIGN as u64;
    let mut entries = Vec::with_capacity(chunks.len());
    let mut pads = Vec::with_capacity(chunks.len());
    for c in chunks {
        entries.push(PackEntry {
            id: c.id.0,
            span: Span {
                offset,
                len: c.bytes.len() as u64,
                raw_len: c.raw_len,
                form: c.form,
            },
        });
        offset += c.bytes.len() as u64;
        let pad = (PACK_ALIGN - (c.bytes.len() % PACK_ALIGN)) % PACK_ALIGN;
        offset += pad as u64;
        pads.push(pad);
    }
    let (tail, id) = pack_tail(format, offset, &entries);
    let mut parts: Vec<&[u8]> = Vec::with_capacity(chunks.len() * 2 + 2);
    parts.push(&header);
    for (c, pad) in chunks.iter().zip(&pads) {
        parts.push(&c.bytes);
        if *pad > 0 {
            parts.push(&PAD[..*pad]);
        }
    }
    parts.push(&tail);
    backend.put_parts(&pack_key(&id), &parts)?;
    Ok(WrittenPack {
        id,
        entries,
        size: offset + tail.len() as u64,
    })
}

/// Write `chunks` into packs of format `format` of about [`pack_target`] of their raw
/// bytes ([`PACK_TARGET_BYTES`], less for a small write) of stored bytes each (a chunk
/// larger than that gets a pack of its own), in order: groups of up to that many raw
/// bytes are loaded (chunks held by a repository are read first, and so are bases) and
/// encoded in parallel, and their stored forms gathered until a pack is full.
///
/// For several packs, a writer thread writes each full pack while the next group is
/// encoded, and a syncer thread makes the written packs durable (a backend barrier)
/// while the writer goes on with the next one, so that encoding, copying into the file
/// system and the device's writes overlap (the caller's own barrier then finds the packs
/// synced). Holds at most about three packs' worth of raw and stored bytes at a time: the
/// group being encoded, the pack being gathered, and the one being written. Chunks that
/// fill one pack at most are encoded, written and synced on the calling thread.
///
/// With `code` false every chunk is stored raw (no encoding), whatever the format.
/// `tail` (manifests, [`Form::Manifest`]) is written as it is after the chunks, in
/// the last pack while it has room.
///
/// # Errors
///
/// [`Error::Io`]; a stored chunk's read error. After an error no more packs are
/// written; those written before stay as garbage, as after a crash.
pub(crate) fn write_packs<'a>(
    backend: &dyn Backend,
    format: u16,
    chunks: &[NewChunk<'a>],
    tail: Vec<Stored<'a>>,
    code: bool,
) -> Result<Vec<WrittenPack>> {
    let raw: usize = chunks.iter().map(|c| c.chunk.len_bytes()).sum();
    if raw <= pack_target(raw) {
        // One pack: written and synced on this thread. A writer and a syncer thread
        // would overlap nothing, and each would wait for a core beside a busy process.
        let mut out = Vec::new();
        let mut failed = None;
        gather_packs(chunks, tail, format, code, |pack| {
            match write_pack(backend, format, &pack).and_then(|w| backend.barrier().map(|()| w)) {
                Ok(w) => out.push(w),
                Err(e) => failed = Some(e),
            }
            failed.is_none()
        })?;
        return failed.map_or(Ok(out), Err);
    }
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Stored<'a>>>(1);
        // Written packs are made durable by a syncer thread while the writer writes the
        // next one (on a local disk, an fsync waits for the device while the next pack
        // is copied into the page cache). One barrier covers every pack written before
        // it, so the syncer skips notices that queued up meanwhile.
        let (synced_tx, synced_rx) = std::sync::mpsc::channel::<()>();
        let syncer = scope.spawn(move || -> Result<()> {
            while synced_rx.recv().is_ok() {
                while synced_rx.try_recv().is_ok() {}
                backend.barrier()?;
            }
            Ok(())
        });
        let writer = scope.spawn(move || -> Result<Vec<WrittenPack>> {
            let mut out = Vec::new();
            for pack in rx {
                out.push(write_pack(backend, format, &pack)?);
                // The syncer ended early (an error): stop; its error is returned.
                if synced_tx.send(()).is_err() {
                    break;
                }
            }
            Ok(out)
        });
        // The writer ended early (an error) when a send fails: stop, and return its error.
        let gathered = gather_packs(chunks, tail, format, code, |pack| tx.send(pack).is_ok());
        drop(tx);
        let written = writer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        let synced = syncer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        match (gathered, written, synced) {
            (Err(e), _, _) | (Ok(()), Err(e), _) | (Ok(()), Ok(_), Err(e)) => Err(e),
            (Ok(()), Ok(out), Ok(())) => Ok(out),
        }
    })
}

/// Load and encode `chunks` group by group, and hand each full pack's stored forms to
/// `emit` in order, then `tail` as it is (the last pack too); stops when `emit`
/// returns `false`.
fn gather_packs<'a>(
    chunks: &[NewChunk<'a>],
    tail: Vec<Stored<'a>>,
    format: u16,
    code: bool,
    mut emit: impl FnMut(Vec<Stored<'a>>) -> bool,
) -> Result<()> {
    let target = pack_target(chunks.iter().map(|c| c.chunk.len_bytes()).sum());
    let mut pending: Vec<Stored<'a>> = Vec::new();
    let mut pending_bytes = 0;
    let mut start = 0;
    while start < chunks.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < chunks.len()
            && (end == start || bytes + chunks[end].chunk.len_bytes() <= target)
        {
            bytes += chunks[end].chunk.len_bytes();
            end += 1;
        }
        let group = &chunks[start..end];
        // Chunks held coded are written as they are (when this save codes at all, and
        // a delta is of the kind the repository's format stores: a format 2 repository
        // takes no difference delta).
        let coded = |c: &NewChunk<'a>| {
            c.coded.filter(|(bytes, _)| {
                code && format != FORMAT_V1
                    && Header::parse(bytes, usize::MAX).is_ok_and(|h| {
                        !h.method.is_delta() || h.method == delta_in(format).method()
                    })
            })
        };
        for c in group.iter().filter(|c| coded(c).is_none()) {
            c.chunk.load()?;
            if let Some((_, b)) = &c.base {
                // A base that does not read is no base: the chunk is stored whole.
                let _ = b.load();
            }
        }
        let jobs: Vec<_> = group
            .iter()
            .filter(|c| coded(c).is_none())
            .map(|c| {
                let chunk: &'a Chunk = c.chunk;
                let base = c
                    .base
                    .filter(|(_, b)| !b.is_unloaded())
                    .map(|(h, b): (ContentHash, &'a Chunk)| (h, b.data()));
                (c.id, chunk.data(), c.width, base)
            })
            .collect();
        let mut fresh = store_chunks(format, &jobs, code).into_iter();
        for c in group {
            let st = match coded(c) {
                Some((bytes, form)) => Stored {
                    id: c.id,
                    bytes: Cow::Borrowed(bytes),
                    raw_len: c.chunk.len_bytes() as u64,
                    form,
                },
                None => fresh.next().ok_or_else(|| Error::Internal {
                    reason: "fewer coded chunks than chunks to code".into(),
                })?,
            };
            if !gather(&mut pending, &mut pending_bytes, target, st, &mut emit) {
                return Ok(());
            }
        }
        start = end;
    }
    for st in tail {
        if !gather(&mut pending, &mut pending_bytes, target, st, &mut emit) {
            return Ok(());
        }
    }
    if !pending.is_empty() {
        emit(pending);
    }
    Ok(())
}

/// Add `st` to the pack being gathered (`pending`, of `pending_bytes` stored bytes),
/// first handing that pack to `emit` when `st` would take it past
/// [`PACK_TARGET_BYTES`]; `false` when `emit` says stop.
fn gather<'a>(
    pending: &mut Vec<Stored<'a>>,
    pending_bytes: &mut usize,
    target: usize,
    st: Stored<'a>,
    emit: &mut impl FnMut(Vec<Stored<'a>>) -> bool,
) -> bool {
    if !pending.is_empty() && *pending_bytes + st.bytes.len() > target {
        if !emit(std::mem::take(pending)) {
            return false;
        }
        *pending_bytes = 0;
    }
    *pending_bytes += st.bytes.len();
    pending.push(st);
    true
}

/// The footer offset and length in a pack's last [`PACK_TAIL_LEN`] bytes `tail`, checked
/// against the pack's `size`.
fn footer_bounds(path: &str, size: u64, tail: &[u8]) -> Result<(u64, u64)> {
    let num = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&tail[at..at + 8]);
        u64::from_le_bytes(b)
    };
    if tail.len() != PACK_TAIL_LEN || size < (PACK_ALIGN + PACK_TAIL_LEN) as u64 {
        return Err(corrupt(path, "truncated pack"));
    }
    let (off, len) = (num(0), num(8));
    let tail_start = size - PACK_TAIL_LEN as u64;
    if off < PACK_ALIGN as u64 || off.checked_add(len) != Some(tail_start) {
        return Err(corrupt(path, "pack footer offsets out of range"));
    }
    Ok((off, len))
}

/// Check a pack's id (its trailer, and `want` when given) over its object header
/// `header`, its footer and offsets `footer` (the bytes from the footer offset `off` to
/// the trailer) and `trailer`, and parse the footer's entries.
fn check_footer(
    path: &str,
    version: u16,
    header: &[u8],
    footer: &[u8],
    trailer: &[u8],
    off: u64,
    want: Option<&ContentHash>,
) -> Result<Vec<PackEntry>> {
    let mut h = blake3::Hasher::new();
    h.update(header);
    h.update(footer);
    let id = ContentHash(*h.finalize().as_bytes());
    if id.as_bytes()[..] != *trailer {
        return Err(corrupt(path, "pack checksum mismatch (torn or damaged)"));
    }
    if let Some(w) = want {
        if *w != id {
            return Err(corrupt(path, format!("holds pack {id}, not {w}")));
        }
    }
    let entries_bytes = footer
        .len()
        .checked_sub(16)
        .map(|n| &footer[..n])
        .ok_or_else(|| corrupt(path, "truncated pack"))?;
    let (entries, rest) = take_entries(entries_bytes, version)
        .ok_or_else(|| corrupt(path, "unreadable pack footer"))?;
    if !rest.is_empty() {
        return Err(corrupt(path, "trailing bytes after the pack footer"));
    }
    for e in &entries {
        let ok = e.plausible_in(version)
            && e.span.offset >= PACK_ALIGN as u64
            && e.span.offset.is_multiple_of(PACK_ALIGN as u64)
            && e.span.range().is_some_and(|r| r.end <= off);
        if !ok {
            return Err(corrupt(path, "pack entry outside the chunk area"));
        }
    }
    Ok(entries)
}

/// Parse a whole pack's header and footer (chunk data is checked by the chunks' own
/// hashes when read).
///
/// # Errors
///
/// [`Error::CorruptObject`], [`Error::UnsupportedFormat`].
pub(crate) fn parse_pack(
    path: &str,
    bytes: &[u8],
    want: Option<&ContentHash>,
) -> Result<Vec<PackEntry>> {
    let version = check_header(path, bytes, Kind::Pack)?;
    if bytes.len() < PACK_ALIGN + PACK_TAIL_LEN {
        return Err(corrupt(path, "truncated pack"));
    }
    let tail_start = bytes.len() - PACK_TAIL_LEN;
    let (off, _) = footer_bounds(path, bytes.len() as u64, &bytes[tail_start..])?;
    let trailer_start = bytes.len() - TRAILER_LEN;
    check_footer(
        path,
        version,
        &bytes[..HEADER_LEN],
        &bytes[off as usize..trailer_start],
        &bytes[trailer_start..],
        off,
        want,
    )
}

/// Read and check the footer of pack `key` of `size` bytes with three ranged reads
/// (tail, header, footer): its entries. No chunk data is read.
fn read_footer(backend: &dyn Backend, key: &str, size: u64) -> Result<Vec<PackEntry>> {
    if size < (PACK_ALIGN + PACK_TAIL_LEN) as u64 {
        return Err(corrupt(key, "truncated pack"));
    }
    let tail_start = size - PACK_TAIL_LEN as u64;
    let tail = backend.get_range(key, tail_start..size)?;
    let (off, _) = footer_bounds(key, size, &tail)?;
    let header = backend.get_range(key, 0..HEADER_LEN as u64)?;
    let version = check_header(key, &header, Kind::Pack)?;
    let footer = backend.get_range(key, off..size - TRAILER_LEN as u64)?;
    check_footer(
        key,
        version,
        &header,
        &footer,
        &tail[16..],
        off,
        id_of_key(key, "thpack").as_ref(),
    )
}

/// The key of a pack that holds chunk `id` although it is not in `indexed` (the packs
/// the index files read name: its own index file is missing), found from the packs'
/// own footers. Used to name the file at fault in an error; reads only the footers of
/// packs not in `indexed`, and skips any that does not read.
pub(crate) fn unindexed_pack_holding(
    backend: &dyn Backend,
    indexed: &HashSet<ContentHash>,
    id: &ContentHash,
) -> Option<String> {
    for o in backend.list(PACKS_PREFIX).ok()? {
        let Some(pack) = id_of_key(&o.key, "thpack") else {
            continue;
        };
        if indexed.contains(&pack) {
            continue;
        }
        let Ok(entries) = read_footer(backend, &o.key, o.size) else {
            continue;
        };
        if entries.iter().any(|e| e.id == id.0) {
            return Some(o.key);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::backend::MemoryBackend;
    use crate::repo::format::{ManifestBody, FORMAT_V2, FORMAT_V3, FORMAT_VERSION};

    #[test]
    fn an_entry_encodes_as_id_offset_len_and_in_format_2_raw_len_and_form() {
        let e = PackEntry {
            id: [7; 32],
            span: Span::raw(300, 5),
        };
        let mut want = vec![1u8];
        want.extend_from_slice(&[7u8; 32]);
        want.extend_from_slice(&[0xac, 0x02, 5]);
        assert_eq!(entries_wire(&[e], FORMAT_V1), want);
        want.extend_from_slice(&[5, 0]);
        assert_eq!(entries_wire(&[e], 2), want);
        let d = PackEntry {
            id: [7; 32],
            span: Span {
                offset: 64,
                len: 5,
                raw_len: 300,
                form: Form::Delta([9; 32]),
            },
        };
        let mut want = vec![1u8];
        want.extend_from_slice(&[7u8; 32]);
        want.extend_from_slice(&[64, 5, 0xac, 0x02, 2]);
        want.extend_from_slice(&[9u8; 32]);
        assert_eq!(entries_wire(&[d], 2), want);
        for format in [FORMAT_V1, FORMAT_V2, FORMAT_VERSION] {
            let bytes = entries_wire(&[e], format);
            assert_eq!(take_entries(&bytes, format).unwrap().0, vec![e]);
        }
        assert_eq!(take_entries(&want, 2).unwrap().0, vec![d]);
    }

    #[test]
    fn a_format_2_pack_stores_xor_deltas_and_a_format_3_pack_difference_deltas() {
        // f32 weights, each moved by a small relative step: a delta against the base
        // saves most of the chunk in both formats.
        let base: Vec<u8> = (0..16_384u32)
            .flat_map(|i| (((i * 7919) % 10_007) as f32 * 1e-5 + 0.01).to_le_bytes())
            .collect();
        let raw: Vec<u8> = base
            .chunks_exact(4)
            .enumerate()
            .flat_map(|(i, e)| {
                let x = f32::from_le_bytes(e.try_into().unwrap());
                (x * (1.0 + (i % 13) as f32 * 1e-5)).to_le_bytes()
            })
            .collect();
        let (bid, id) = (ContentHash::of_bytes(&base), ContentHash::of_bytes(&raw));
        for (format, want) in [
            (FORMAT_V2, Method::XorPlanes),
            (FORMAT_VERSION, Method::DiffPlanes),
        ] {
            let stored = store_chunks(format, &[(id, &raw[..], 4, Some((bid, &base[..])))], true);
            assert_eq!(stored[0].form, Form::Delta(bid.0), "format {format}");
            let header = Header::parse(&stored[0].bytes, raw.len()).unwrap();
            assert_eq!(header.method, want, "format {format}");
            assert!(stored[0].bytes.len() < raw.len() / 2, "format {format}");
        }
        let v1 = store_chunks(
            FORMAT_V1,
            &[(id, &raw[..], 4, Some((bid, &base[..])))],
            true,
        );
        assert_eq!(v1[0].form, Form::Raw);
    }

    #[test]
    fn entries_whose_lengths_do_not_fit_their_form_are_refused() {
        let raw = |len, raw_len| PackEntry {
            id: [1; 32],
            span: Span {
                offset: 64,
                len,
                raw_len,
                form: Form::Raw,
            },
        };
        assert!(raw(10, 10).plausible());
        assert!(!raw(10, 11).plausible());
        let coded = |len, raw_len, form| PackEntry {
            id: [1; 32],
            span: Span {
                offset: 64,
                len,
                raw_len,
                form,
            },
        };
        assert!(coded(10, 1000, Form::Planes).plausible());
        assert!(coded(1000 + MAX_CODED_OVERHEAD, 1000, Form::Delta([2; 32])).plausible());
        assert!(!coded(1001 + MAX_CODED_OVERHEAD, 1000, Form::Planes).plausible());
        assert!(!coded(0, 0, Form::Planes).plausible());
        // A chunk that is its own base.
        assert!(!coded(10, 1000, Form::Delta([1; 32])).plausible());
        // A manifest is stored as it is, and only from format 4.
        assert!(coded(10, 10, Form::Manifest).plausible_in(FORMAT_VERSION));
        assert!(!coded(10, 10, Form::Manifest).plausible_in(FORMAT_V3));
        assert!(!coded(10, 11, Form::Manifest).plausible_in(FORMAT_VERSION));
        assert!(!coded(0, 0, Form::Manifest).plausible_in(FORMAT_VERSION));
        assert!(coded(10, 1000, Form::Planes).plausible_in(FORMAT_V3));
    }

    #[test]
    fn manifests_written_after_the_chunks_read_back_from_the_pack_and_damage_is_typed() {
        let backend = MemoryBackend::new();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let chunks =
            [crate::chunk::Alloc::default().chunk_with(1000, |b| b.copy_from_slice(&data))];
        let id = ContentHash::of_bytes(&data);
        let new = new_chunks(&chunks);
        let body = ManifestBody {
            dtype: 8,
            shape: vec![1000],
            chunk_elems: 1000,
            chunks: vec![id.0],
        };
        let (object, mid) = crate::repo::format::encode(Kind::Manifest, &body);
        let stored = object[..object.len() - TRAILER_LEN].to_vec();
        let tail = vec![Stored {
            id: mid,
            raw_len: stored.len() as u64,
            bytes: Cow::Owned(stored),
            form: Form::Manifest,
        }];
        let packs = write_packs(&backend, FORMAT_VERSION, &new, tail, false).unwrap();
        assert_eq!(packs.len(), 1);
        let loc = |e: &PackEntry| Loc {
            pack: packs[0].id,
            span: e.span,
        };
        let [c, m] = &packs[0].entries[..] else {
            panic!("{:?}", packs[0].entries)
        };
        assert_eq!((c.id, m.id, m.span.form), (id.0, mid.0, Form::Manifest));
        let (name, manifest) = read_manifest(&backend, &mid, Some(loc(m))).unwrap();
        assert!(name.contains("(manifest "), "{name}");
        assert_eq!(manifest.chunks, vec![id]);
        // The chunk reads as a chunk; a manifest entry serves its bytes as a chunk too.
        assert_eq!(&read_chunk(&backend, &id, &loc(c)).unwrap()[..], &data[..]);
        assert!(read_chunk(&backend, &mid, &loc(m)).is_ok());
        // A damaged manifest: a typed error naming the pack and the manifest.
        let key = pack_key(&packs[0].id);
        let mut bytes = backend.get(&key).unwrap().to_vec();
        bytes[m.span.offset as usize + 12] ^= 1;
        backend.put(&key, &bytes).unwrap();
        match read_manifest(&backend, &mid, Some(loc(m))) {
            Err(Error::CorruptObject { path, .. }) => {
                assert!(
                    path.starts_with(&key) && path.contains("(manifest "),
                    "{path}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_written_pack_parses_whole_and_by_ranges_and_its_chunks_read_back() {
        let backend = MemoryBackend::new();
        let data: Vec<Vec<u8>> = [0usize, 1, 63, 64, 65, 1000]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let chunks: Vec<(ContentHash, &[u8])> = data
            .iter()
            .map(|d| (ContentHash::of_bytes(d), &d[..]))
            .collect();
        let stored: Vec<Stored<'_>> = chunks.iter().map(|(h, d)| Stored::raw(*h, d)).collect();
        let pack = write_pack(&backend, FORMAT_VERSION, &stored).unwrap();
        let key = pack_key(&pack.id);
        let bytes = backend.get(&key).unwrap();
        assert_eq!(bytes.len() as u64, pack.size);
        assert_eq!(
            parse_pack(&key, &bytes, Some(&pack.id)).unwrap(),
            pack.entries
        );
        assert_eq!(
            read_footer(&backend, &key, pack.size).unwrap(),
            pack.entries
        );
        for ((id, raw), e) in chunks.iter().zip(&pack.entries) {
            assert!(e.span.offset.is_multiple_of(PACK_ALIGN as u64));
            let loc = Loc {
                pack: pack.id,
                span: e.span,
            };
            assert_eq!(&read_chunk(&backend, id, &loc).unwrap()[..], *raw);
        }
        let (id, _) = chunks[5];
        let indexed = HashSet::new();
        assert_eq!(
            unindexed_pack_holding(&backend, &indexed, &id),
            Some(key.clone())
        );
        let indexed: HashSet<ContentHash> = [pack.id].into();
        assert_eq!(unindexed_pack_holding(&backend, &indexed, &id), None);
        // A chunk read from the wrong span fails its hash.
        let wrong = Loc {
            pack: pack.id,
            span: pack.entries[4].span,
        };
        assert!(matches!(
            read_chunk(&backend, &chunks[5].0, &wrong),
            Err(Error::CorruptObject { .. })
        ));
    }

    /// A memory backend that records its puts of packs and its barriers, in order, and
    /// fails barriers while `fail` is set.
    #[derive(Debug, Default)]
    struct Journal {
        inner: MemoryBackend,
        events: std::sync::Mutex<Vec<String>>,
        fail: std::sync::atomic::AtomicBool,
    }

    impl Backend for Journal {
        fn get(&self, key: &str) -> Result<Bytes> {
            self.inner.get(key)
        }
        fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
            self.inner.get_range(key, range)
        }
        fn put(&self, key: &str, data: &[u8]) -> Result<()> {
            self.inner.put(key, data)?;
            self.events.lock().unwrap().push(format!("put {key}"));
            Ok(())
        }
        fn put_if_absent(
            &self,
            key: &str,
            data: &[u8],
        ) -> Result<crate::repo::backend::PutOutcome> {
            self.inner.put_if_absent(key, data)
        }
        fn list(&self, prefix: &str) -> Result<Vec<crate::repo::backend::ObjectInfo>> {
            self.inner.list(prefix)
        }
        fn delete(&self, key: &str) -> Result<()> {
            self.inner.delete(key)
        }
        fn barrier(&self) -> Result<()> {
            if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::Io {
                    path: "barrier".into(),
                    kind: std::io::ErrorKind::Other,
                    message: "the device is gone".into(),
                });
            }
            self.events.lock().unwrap().push("barrier".into());
            Ok(())
        }
        fn location(&self) -> String {
            "journal".into()
        }
    }

    /// Three chunks that take a pack each (each over half of PACK_TARGET_BYTES).
    fn three_packs_of_chunks() -> Vec<Chunk> {
        let len = PACK_TARGET_BYTES / 2 + 4096;
        let alloc = crate::chunk::Alloc::default();
        (0..3u8)
            .map(|i| alloc.chunk_with(len, |b| b.fill(i + 1)))
            .collect()
    }

    fn new_chunks(chunks: &[Chunk]) -> Vec<NewChunk<'_>> {
        chunks
            .iter()
            .map(|c| NewChunk {
                id: c.hash(),
                chunk: c,
                width: 1,
                base: None,
                coded: None,
            })
            .collect()
    }

    /// `chunks` written raw (no coding), as new chunks without bases, into `backend`.
    fn write_raw(backend: &Journal, chunks: &[Chunk]) -> Result<Vec<WrittenPack>> {
        write_packs(
            backend,
            FORMAT_VERSION,
            &new_chunks(chunks),
            Vec::new(),
            false,
        )
    }

    /// Chunk `c` reads back, whole, from `span` of pack `pack`.
    fn assert_reads_back(backend: &Journal, c: &Chunk, pack: ContentHash, span: Span) {
        let loc = Loc { pack, span };
        assert_eq!(&read_chunk(backend, &c.hash(), &loc).unwrap()[..], c.data());
    }

    /// `got` is the error of a [`Journal`] whose barriers fail.
    fn assert_the_device_is_gone(got: Result<Vec<WrittenPack>>) {
        match got {
            Err(Error::Io { message, .. }) => assert_eq!(message, "the device is gone"),
            other => panic!(
                "expected the barrier's error, got {:?}",
                other.map(|w| w.len())
            ),
        }
    }

    #[test]
    fn written_packs_are_all_behind_a_barrier_when_write_packs_returns() {
        let chunks = three_packs_of_chunks();
        let backend = Journal::default();
        let written = write_raw(&backend, &chunks).unwrap();
        assert_eq!(written.len(), 3);
        let events = backend.events.lock().unwrap().clone();
        let puts: Vec<usize> = (0..events.len())
            .filter(|&i| events[i] != "barrier")
            .collect();
        assert_eq!(puts.len(), 3, "{events:?}");
        // Every pack is put before the last barrier: none is left unsynced.
        assert_eq!(
            events.last().map(String::as_str),
            Some("barrier"),
            "{events:?}"
        );
        for (p, w) in puts.iter().zip(&written) {
            assert_eq!(events[*p], format!("put {}", pack_key(&w.id)));
        }
        for (c, w) in chunks.iter().zip(&written) {
            assert_reads_back(&backend, c, w.id, w.entries[0].span);
        }
    }

    #[test]
    fn a_failing_barrier_is_the_error_of_write_packs_and_stops_the_writer() {
        let chunks = three_packs_of_chunks();
        let backend = Journal::default();
        backend
            .fail
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let got = write_raw(&backend, &chunks);
        assert_the_device_is_gone(got);
        assert!(!backend
            .events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e == "barrier"));
    }

    #[test]
    fn a_one_pack_write_is_put_then_synced_and_a_failing_barrier_is_its_error() {
        let alloc = crate::chunk::Alloc::default();
        let chunks: Vec<Chunk> = (0..3u8)
            .map(|i| alloc.chunk_with(64 << 10, |b| b.fill(i + 1)))
            .collect();
        let backend = Journal::default();
        let written = write_raw(&backend, &chunks).unwrap();
        assert_eq!(written.len(), 1);
        let events = backend.events.lock().unwrap().clone();
        assert_eq!(
            events,
            vec![
                format!("put {}", pack_key(&written[0].id)),
                "barrier".into()
            ]
        );
        for (c, e) in chunks.iter().zip(&written[0].entries) {
            assert_reads_back(&backend, c, written[0].id, e.span);
        }

        let failing = Journal::default();
        failing
            .fail
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert_the_device_is_gone(write_raw(&failing, &chunks));
    }

    #[test]
    fn a_small_write_is_cut_into_packs_of_an_eighth_and_a_large_one_at_the_target() {
        assert_eq!(pack_target(0), PACK_MIN_TARGET_BYTES);
        assert_eq!(pack_target(64 << 20), 8 << 20);
        assert_eq!(
            pack_target(PACKS_PER_WRITE * PACK_TARGET_BYTES),
            PACK_TARGET_BYTES
        );
        assert_eq!(pack_target(usize::MAX), PACK_TARGET_BYTES);

        // 64 chunks of 1 MiB stored raw: packs of at most 8 MiB, every chunk read back
        // from the pack its entry names, in order.
        let alloc = crate::chunk::Alloc::default();
        let chunks: Vec<Chunk> = (0..64u8)
            .map(|i| alloc.chunk_with(1 << 20, |b| b.fill(i)))
            .collect();
        let backend = Journal::default();
        let written = write_raw(&backend, &chunks).unwrap();
        assert!(written.len() >= 8, "{} packs", written.len());
        assert!(written.iter().all(|w| w.size <= (8 << 20) + (64 << 10)));
        let entries: Vec<(&WrittenPack, &PackEntry)> = written
            .iter()
            .flat_map(|w| w.entries.iter().map(move |e| (w, e)))
            .collect();
        assert_eq!(entries.len(), chunks.len());
        for (c, (w, e)) in chunks.iter().zip(entries) {
            assert_eq!(e.id, c.hash().0);
            let loc = Loc {
                pack: w.id,
                span: e.span,
            };
            assert_eq!(
                &read_chunk(&backend, &c.hash(), &loc).unwrap()[..],
                c.data()
            );
        }
    }
}
