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
//! # The stored-chunk seam
//!
//! A chunk's raw bytes (what its id, the BLAKE3 of those bytes, names) become the bytes a
//! pack stores in one function, [`store_chunk`] (raw bytes → stored bytes + the
//! [`PackEntry`] describing them), and stored bytes become raw bytes again in one,
//! [`load_chunk`] (entry + stored bytes → raw bytes, checked against the id). What an
//! entry records of a stored chunk is the [`Span`], written in pack footers and index
//! files alike; its wire reader for the index fast path is
//! [`PackEntry::read_wire`]. A chunk codec, encryption or any other stored form changes
//! these (this file) and the format version (`FORMAT_VERSION` in `format/envelope.rs`),
//! nothing else: save, open, gc and repack handle spans opaquely and ask
//! [`Span::raw_len`] for a chunk's length in its tensor. A different pack size is
//! [`PACK_TARGET_BYTES`].

use std::borrow::Cow;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::backend::{Backend, Bytes};
use super::format::{
    check_header, corrupt, header, id_of_key, pack_key, Kind, RawHash, Wire, HEADER_LEN,
    PACKS_PREFIX, TRAILER_LEN,
};
use crate::buffer::AlignedBuf;
use crate::chunk::Chunk;
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// Chunk data in a pack starts at multiples of this.
pub(crate) const PACK_ALIGN: usize = 64;

/// Packs are cut at about this size.
pub(crate) const PACK_TARGET_BYTES: usize = 32 << 20;

/// Bytes after a pack's footer: footer offset, footer length (u64 LE each), trailer.
pub(crate) const PACK_TAIL_LEN: usize = 16 + TRAILER_LEN;

/// What an entry records of one stored chunk: where its stored bytes are in its pack.
/// Raw and stored bytes are the same today (see the module docs for the seam a codec
/// takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Span {
    /// Offset of the stored bytes in the pack (a multiple of [`PACK_ALIGN`]).
    pub(crate) offset: u64,
    /// Length of the stored bytes.
    pub(crate) len: u64,
}

impl Span {
    /// Bytes of the chunk in its tensor (its raw bytes).
    pub(crate) fn raw_len(&self) -> u64 {
        self.len
    }

    /// Bytes the chunk takes in its pack.
    pub(crate) fn stored_len(&self) -> u64 {
        self.len
    }

    /// The byte range of the stored bytes in the pack, if it does not overflow.
    fn range(&self) -> Option<std::ops::Range<u64>> {
        Some(self.offset..self.offset.checked_add(self.len)?)
    }
}

/// One chunk in a pack footer or an index file: its id and its span. Encoded as the id's
/// 32 bytes followed by the span's fields (postcard writes nested structs field after
/// field, so this is the flat `{ id, offset, len }` of `docs/FORMAT.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PackEntry {
    pub(crate) id: RawHash,
    pub(crate) span: Span,
}

impl PackEntry {
    /// Fewest bytes an entry takes on the wire (for bounding sequence lengths).
    pub(crate) const MIN_WIRE_LEN: usize = 32 + 2;

    /// Read one entry as postcard encodes it (`None` for anything it does not accept:
    /// the caller then asks postcard).
    pub(crate) fn read_wire(w: &mut Wire<'_>) -> Option<PackEntry> {
        Some(PackEntry {
            id: w.hash()?,
            span: Span {
                offset: w.varint()?,
                len: w.varint()?,
            },
        })
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

/// The stored form of chunk `id` whose raw bytes are `raw`, to be written at `offset`
/// of a pack, and the entry that describes it. The one way into a pack (see the module
/// docs).
fn store_chunk<'a>(id: &ContentHash, raw: &'a [u8], offset: u64) -> (Cow<'a, [u8]>, PackEntry) {
    let entry = PackEntry {
        id: id.0,
        span: Span {
            offset,
            len: raw.len() as u64,
        },
    };
    (Cow::Borrowed(raw), entry)
}

/// The raw bytes of chunk `id` from its stored bytes `stored` (read from `span` of
/// pack `key`), checked against the id. The one way out of a pack (see the module docs).
fn load_chunk(key: &str, id: &ContentHash, span: &Span, stored: Bytes) -> Result<Bytes> {
    if stored.len() as u64 != span.stored_len() {
        return Err(corrupt(key, format!("chunk {id}: short read")));
    }
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

/// Read chunk `id` from where `loc` says it is (one ranged read) and check it.
///
/// # Errors
///
/// [`Error::Io`]; [`Error::CorruptObject`] naming the pack for a pack too short for the
/// chunk or bytes that do not match the chunk's hash.
pub(crate) fn read_chunk(backend: &dyn Backend, id: &ContentHash, loc: &Loc) -> Result<Bytes> {
    let key = pack_key(&loc.pack);
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
    load_chunk(&key, id, &loc.span, stored)
}

/// A pack's fixed header: the object header padded with zeros to [`PACK_ALIGN`].
fn pack_header() -> [u8; PACK_ALIGN] {
    let mut h = [0u8; PACK_ALIGN];
    h[..HEADER_LEN].copy_from_slice(&header(Kind::Pack));
    h
}

/// The footer, offsets and trailer that end a pack whose chunks are `entries`, and the
/// pack's id (the trailer: BLAKE3 of the header, footer and offsets).
fn pack_tail(footer_offset: u64, entries: &[PackEntry]) -> (Vec<u8>, ContentHash) {
    let footer = postcard::to_stdvec(entries).unwrap_or_default();
    let mut tail = footer;
    let footer_len = tail.len() as u64;
    tail.extend_from_slice(&footer_offset.to_le_bytes());
    tail.extend_from_slice(&footer_len.to_le_bytes());
    let mut h = blake3::Hasher::new();
    h.update(&header(Kind::Pack));
    h.update(&tail);
    let id = ContentHash(*h.finalize().as_bytes());
    tail.extend_from_slice(id.as_bytes());
    (tail, id)
}

/// Write `chunks` (id and raw bytes) as one pack.
///
/// # Errors
///
/// [`Error::Io`].
pub(crate) fn write_pack(
    backend: &dyn Backend,
    chunks: &[(ContentHash, &[u8])],
) -> Result<WrittenPack> {
    static PAD: [u8; PACK_ALIGN] = [0; PACK_ALIGN];
    let header = pack_header();
    let mut stored = Vec::with_capacity(chunks.len());
    let mut offset = PACK_ALIGN as u64;
    let mut entries = Vec::with_capacity(chunks.len());
    for (id, raw) in chunks {
        let (bytes, entry) = store_chunk(id, raw, offset);
        offset += bytes.len() as u64;
        let pad = (PACK_ALIGN - (bytes.len() % PACK_ALIGN)) % PACK_ALIGN;
        offset += pad as u64;
        entries.push(entry);
        stored.push((bytes, pad));
    }
    let (tail, id) = pack_tail(offset, &entries);
    let mut parts: Vec<&[u8]> = Vec::with_capacity(chunks.len() * 2 + 2);
    parts.push(&header);
    for (bytes, pad) in &stored {
        parts.push(bytes);
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

/// Write `chunks` into packs of about [`PACK_TARGET_BYTES`] each (a chunk larger than
/// that gets a pack of its own), in order. Chunks held by a repository are read first.
///
/// # Errors
///
/// [`Error::Io`]; a stored chunk's read error.
pub(crate) fn write_packs(
    backend: &dyn Backend,
    chunks: &[(ContentHash, &Chunk)],
) -> Result<Vec<WrittenPack>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < chunks.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < chunks.len()
            && (end == start || bytes + chunks[end].1.len_bytes() <= PACK_TARGET_BYTES)
        {
            bytes += chunks[end].1.len_bytes();
            end += 1;
        }
        let group: Vec<(ContentHash, &[u8])> = chunks[start..end]
            .iter()
            .map(|(h, c)| c.load().map(|()| (*h, c.data())))
            .collect::<Result<_>>()?;
        out.push(write_pack(backend, &group)?);
        start = end;
    }
    Ok(out)
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
    let (entries, rest) = postcard::take_from_bytes::<Vec<PackEntry>>(entries_bytes)
        .map_err(|e| corrupt(path, format!("unreadable pack footer: {e}")))?;
    if !rest.is_empty() {
        return Err(corrupt(path, "trailing bytes after the pack footer"));
    }
    for e in &entries {
        let ok = e.span.offset >= PACK_ALIGN as u64
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
    check_header(path, bytes, Kind::Pack)?;
    if bytes.len() < PACK_ALIGN + PACK_TAIL_LEN {
        return Err(corrupt(path, "truncated pack"));
    }
    let tail_start = bytes.len() - PACK_TAIL_LEN;
    let (off, _) = footer_bounds(path, bytes.len() as u64, &bytes[tail_start..])?;
    let trailer_start = bytes.len() - TRAILER_LEN;
    check_footer(
        path,
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
    check_header(key, &header, Kind::Pack)?;
    let footer = backend.get_range(key, off..size - TRAILER_LEN as u64)?;
    check_footer(
        key,
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

    #[test]
    fn an_entry_encodes_as_id_offset_len() {
        let e = PackEntry {
            id: [7; 32],
            span: Span {
                offset: 300,
                len: 5,
            },
        };
        let mut want = vec![7u8; 32];
        want.extend_from_slice(&[0xac, 0x02, 5]);
        assert_eq!(postcard::to_stdvec(&e).unwrap(), want);
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
        let pack = write_pack(&backend, &chunks).unwrap();
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
}
