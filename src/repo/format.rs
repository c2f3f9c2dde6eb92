//! The repository's file formats: the envelope every binary object shares, the object
//! bodies, the small JSON files, object keys, and packs. `docs/FORMAT.md` describes the
//! same in prose.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::backend::{is_not_found, Backend, Bytes};
use super::pack::{parse_pack, PackEntry};
use crate::element::DType;
use crate::error::{Error, Result};
use crate::hash::ContentHash;
use crate::meta::Meta;
use crate::tensor::shape_len;
use crate::version::RefKind;

/// The format version this build writes, and the only one it reads.
pub(crate) const FORMAT_VERSION: u16 = 1;

/// The format name in `config.json`.
pub(crate) const FORMAT_NAME: &str = "tensor-history";

/// First 7 bytes of every binary object (PNG-style: a high byte, the name, CR LF, ^Z, LF).
pub(crate) const MAGIC: [u8; 7] = *b"\x89TH\r\n\x1a\n";

/// Bytes before an object's body: magic, kind, version.
pub(crate) const HEADER_LEN: usize = 10;

/// Bytes of the BLAKE3 trailer.
pub(crate) const TRAILER_LEN: usize = 32;

pub(crate) use crate::tensor::MAX_DIMS;

/// The kind byte after the magic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Pack = b'P' as isize,
    Index = b'I' as isize,
    Manifest = b'M' as isize,
    Version = b'V' as isize,
    Gc = b'G' as isize,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pack => "pack",
            Kind::Index => "index",
            Kind::Manifest => "manifest",
            Kind::Version => "version",
            Kind::Gc => "gc record",
        }
    }
}

pub(crate) fn corrupt(path: &str, reason: impl Into<String>) -> Error {
    Error::CorruptObject {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// Read an object that another object names, turning "not found" into a
/// corrupt-repository error naming it.
pub(crate) fn must_get(backend: &dyn Backend, key: &str) -> Result<Bytes> {
    backend.get(key).map_err(|e| {
        if is_not_found(&e) {
            corrupt(key, "missing (the repository refers to it)")
        } else {
            e
        }
    })
}

pub(crate) fn header(kind: Kind) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..7].copy_from_slice(&MAGIC);
    h[7] = kind as u8;
    h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Check magic, kind and version of the first bytes of an object.
pub(crate) fn check_header(path: &str, bytes: &[u8], kind: Kind) -> Result<()> {
    if bytes.len() < HEADER_LEN || bytes[..7] != MAGIC {
        return Err(corrupt(path, "not a tensor-history object (bad magic)"));
    }
    if bytes[7] != kind as u8 {
        return Err(corrupt(
            path,
            format!(
                "expected a {} object, found kind byte {}",
                kind.name(),
                bytes[7]
            ),
        ));
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != FORMAT_VERSION {
        return Err(Error::UnsupportedFormat {
            path: path.to_owned(),
            found: format!("{} format version {version}", kind.name()),
        });
    }
    Ok(())
}

/// Header, postcard body, BLAKE3 trailer. Returns the bytes and their id (the trailer).
pub(crate) fn encode<T: Serialize>(kind: Kind, body: &T) -> (Vec<u8>, ContentHash) {
    let mut out = header(kind).to_vec();
    // Serializing plain data structures to a Vec cannot fail.
    out = postcard::to_extend(body, out).unwrap_or_default();
    let id = ContentHash::of_bytes(&out);
    out.extend_from_slice(id.as_bytes());
    (out, id)
}

/// Check an object's envelope (and, when `want` is given, that its id is `want`) and
/// parse its body.
pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    path: &str,
    bytes: &[u8],
    kind: Kind,
    want: Option<&ContentHash>,
) -> Result<T> {
    decode_body(path, body_of(path, bytes, kind, want)?)
}

/// The body of an object whose envelope checks out (see [`decode`]).
fn body_of<'a>(
    path: &str,
    bytes: &'a [u8],
    kind: Kind,
    want: Option<&ContentHash>,
) -> Result<&'a [u8]> {
    check_header(path, bytes, kind)?;
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(corrupt(path, "truncated (shorter than header and trailer)"));
    }
    let (content, trailer) = bytes.split_at(bytes.len() - TRAILER_LEN);
    let id = ContentHash::of_bytes(content);
    if id.as_bytes() != trailer {
        return Err(corrupt(path, "checksum mismatch (torn or damaged)"));
    }
    if let Some(w) = want {
        if *w != id {
            return Err(corrupt(path, format!("holds object {id}, not {w}")));
        }
    }
    Ok(&content[HEADER_LEN..])
}

/// A postcard body that must fill `body` exactly.
fn decode_body<T: for<'de> Deserialize<'de>>(path: &str, body: &[u8]) -> Result<T> {
    let (value, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|e| corrupt(path, format!("unreadable body: {e}")))?;
    if !rest.is_empty() {
        return Err(corrupt(path, "trailing bytes after the body"));
    }
    Ok(value)
}

/// A reader of postcard's encoding, for the bodies an open parses by the thousands
/// (manifests, indexes): serde's element-by-element path for `[u8; 32]` was most of
/// their parse time. Every method returns `None` for anything it does not accept; the
/// caller then asks postcard, so the result never differs from postcard's (tests check
/// both ways).
pub(crate) struct Wire<'a>(&'a [u8]);

impl Wire<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    pub(crate) fn varint(&mut self) -> Option<u64> {
        let mut out = 0u64;
        for i in 0..10 {
            let byte = self.byte()?;
            if i == 9 && byte > 1 {
                return None;
            }
            out |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(out);
            }
        }
        None
    }

    /// A sequence length, for elements of at least `min_elem` bytes: never more than the
    /// bytes left could hold, so no allocation is sized by an unchecked length.
    fn len(&mut self, min_elem: usize) -> Option<usize> {
        let n = usize::try_from(self.varint()?).ok()?;
        (n.checked_mul(min_elem)? <= self.0.len()).then_some(n)
    }

    pub(crate) fn hash(&mut self) -> Option<RawHash> {
        let (h, rest) = self.0.split_first_chunk::<32>()?;
        self.0 = rest;
        Some(*h)
    }

    fn hashes(&mut self) -> Option<Vec<RawHash>> {
        let n = self.len(32)?;
        (0..n).map(|_| self.hash()).collect()
    }

    /// `value` if every byte was read.
    fn done<T>(self, value: T) -> Option<T> {
        self.0.is_empty().then_some(value)
    }
}

fn manifest_body_fast(bytes: &[u8]) -> Option<ManifestBody> {
    let mut w = Wire(bytes);
    let dtype = w.byte()?;
    let dims = w.len(1)?;
    if dims > MAX_DIMS {
        return None;
    }
    let shape = (0..dims)
        .map(|_| w.varint())
        .collect::<Option<Vec<u64>>>()?;
    let chunk_elems = w.varint()?;
    let chunks = w.hashes()?;
    w.done(ManifestBody {
        dtype,
        shape,
        chunk_elems,
        chunks,
    })
}

fn index_body_fast(bytes: &[u8]) -> Option<IndexBody> {
    let mut w = Wire(bytes);
    let supersedes = w.hashes()?;
    let n = w.len(33)?;
    let mut packs = Vec::with_capacity(n);
    for _ in 0..n {
        let pack = w.hash()?;
        let m = w.len(PackEntry::MIN_WIRE_LEN)?;
        let chunks = (0..m)
            .map(|_| PackEntry::read_wire(&mut w))
            .collect::<Option<Vec<_>>>()?;
        packs.push(IndexPack { pack, chunks });
    }
    w.done(IndexBody { supersedes, packs })
}

/// A 32-byte hash as stored in bodies.
pub(crate) type RawHash = [u8; 32];

/// One tensor: layout and chunk ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ManifestBody {
    pub(crate) dtype: u8,
    pub(crate) shape: Vec<u64>,
    pub(crate) chunk_elems: u64,
    pub(crate) chunks: Vec<RawHash>,
}

/// A checked manifest.
#[derive(Clone, Debug)]
pub(crate) struct Manifest {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) chunk_elems: usize,
    pub(crate) chunks: Vec<ContentHash>,
}

impl Manifest {
    /// Bytes of chunk `i`.
    pub(crate) fn chunk_len(&self, i: usize) -> usize {
        let len: usize = self.shape.iter().product();
        let start = (i * self.chunk_elems).min(len);
        let end = (start + self.chunk_elems).min(len);
        (end - start) * self.dtype.size()
    }
}

pub(crate) fn parse_manifest(
    path: &str,
    bytes: &[u8],
    want: Option<&ContentHash>,
) -> Result<Manifest> {
    let raw = body_of(path, bytes, Kind::Manifest, want)?;
    let body: ManifestBody = match manifest_body_fast(raw) {
        Some(body) => body,
        None => decode_body(path, raw)?,
    };
    let dtype = DType::from_tag(body.dtype)
        .ok_or_else(|| corrupt(path, format!("unknown dtype tag {}", body.dtype)))?;
    if body.shape.len() > MAX_DIMS {
        return Err(corrupt(path, format!("{} dimensions", body.shape.len())));
    }
    let shape: Vec<usize> = body
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| corrupt(path, "dimension overflows")))
        .collect::<Result<_>>()?;
    let len = shape_len(&shape)
        .and_then(|n| n.checked_mul(dtype.size()).map(|_| n))
        .ok_or_else(|| corrupt(path, "shape overflows"))?;
    let chunk_elems = usize::try_from(body.chunk_elems)
        .ok()
        .filter(|&c| c >= 1)
        .ok_or_else(|| corrupt(path, "bad chunk size"))?;
    if chunk_elems.checked_mul(dtype.size()).is_none() {
        return Err(corrupt(path, "chunk size overflows"));
    }
    if body.chunks.len() != len.div_ceil(chunk_elems) {
        return Err(corrupt(
            path,
            format!(
                "{} chunk ids for {len} elements of {chunk_elems} per chunk",
                body.chunks.len()
            ),
        ));
    }
    Ok(Manifest {
        dtype,
        shape,
        chunk_elems,
        chunks: body.chunks.into_iter().map(ContentHash).collect(),
    })
}

/// One version: its place in the tree, its message and time, and its variables.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VersionBody {
    /// The id the writing store gave it (its creation order there).
    pub(crate) seq: u64,
    pub(crate) parents: Vec<RawHash>,
    pub(crate) time_secs: u64,
    pub(crate) time_nanos: u32,
    pub(crate) message: String,
    /// The version's metadata (named numbers, text and flags).
    pub(crate) meta: Meta,
    /// Variable name → manifest id, sorted by name.
    pub(crate) vars: Vec<(String, RawHash)>,
}

impl VersionBody {
    pub(crate) fn time(&self) -> SystemTime {
        UNIX_EPOCH
            .checked_add(Duration::new(
                self.time_secs,
                self.time_nanos.min(999_999_999),
            ))
            .unwrap_or(UNIX_EPOCH)
    }
}

pub(crate) fn time_parts(t: SystemTime) -> (u64, u32) {
    t.duration_since(UNIX_EPOCH)
        .map_or((0, 0), |d| (d.as_secs(), d.subsec_nanos()))
}

pub(crate) fn parse_version(
    path: &str,
    bytes: &[u8],
    want: Option<&ContentHash>,
) -> Result<VersionBody> {
    let body: VersionBody = decode(path, bytes, Kind::Version, want)?;
    if !body.vars.windows(2).all(|w| w[0].0 < w[1].0) {
        return Err(corrupt(path, "variable names not sorted and unique"));
    }
    Ok(body)
}

/// Where chunks live: per pack, each chunk's id, offset and length.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexBody {
    /// Index files this one replaces (written by gc when it rewrites packs).
    pub(crate) supersedes: Vec<RawHash>,
    pub(crate) packs: Vec<IndexPack>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IndexPack {
    pub(crate) pack: RawHash,
    pub(crate) chunks: Vec<PackEntry>,
}

pub(crate) fn parse_index(
    path: &str,
    bytes: &[u8],
    want: Option<&ContentHash>,
) -> Result<IndexBody> {
    let raw = body_of(path, bytes, Kind::Index, want)?;
    match index_body_fast(raw) {
        Some(body) => Ok(body),
        None => decode_body(path, raw),
    }
}

/// A gc run's record: candidates for deletion, and when they were found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GcBody {
    /// When the candidates were found, in nanoseconds since the Unix epoch.
    pub(crate) time_ns: u64,
    pub(crate) keys: Vec<String>,
    pub(crate) chunks: Vec<RawHash>,
}

pub(crate) fn parse_gc(path: &str, bytes: &[u8], want: Option<&ContentHash>) -> Result<GcBody> {
    decode(path, bytes, Kind::Gc, want)
}

// ---- JSON files -------------------------------------------------------------------

/// `config.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ConfigJson {
    pub(crate) format: String,
    pub(crate) version: u64,
    /// A random id given at creation, so that a store can tell a repository created
    /// again at the same location from the one it connected to (absent in older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
}

/// A new repository id: 32 hex digits, from the time, the process and a counter.
pub(crate) fn new_repository_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let local = 0u8;
    h.update(&(std::ptr::addr_of!(local) as usize).to_le_bytes());
    h.finalize().to_hex()[..32].to_owned()
}

/// One entry of a ref's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RefEntry {
    pub(crate) kind: EntryKind,
    /// The version (absent for `deleted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<ContentHash>,
}

/// What a ref log entry records: the ref is a branch or a tag (with a version), or was
/// deleted (without one). Written as `"branch"`, `"tag"` or `"deleted"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EntryKind {
    Branch,
    Tag,
    Deleted,
}

impl EntryKind {
    /// The kind as written on disk.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            EntryKind::Branch => "branch",
            EntryKind::Tag => "tag",
            EntryKind::Deleted => "deleted",
        }
    }
}

impl From<RefKind> for EntryKind {
    fn from(k: RefKind) -> EntryKind {
        match k {
            RefKind::Branch => EntryKind::Branch,
            RefKind::Tag => EntryKind::Tag,
        }
    }
}

/// `HEAD.json`: attached to a branch, or detached at a version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum HeadJson {
    Branch(String),
    Detached(ContentHash),
}

/// `pruned/<2hex>/<id>.json`: a version dropped by `prune`, with its parents, so that
/// its children can be linked past it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PrunedJson {
    pub(crate) parents: Vec<ContentHash>,
}

/// `gc/generations/<seq:020>.json`: created by a gc run before it deletes anything.
/// Readers use only the key (the highest `seq` is the repository's gc generation); the
/// body is for people and tools.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GenerationJson {
    /// When the gc run started deleting, in nanoseconds since the Unix epoch.
    pub(crate) time_ns: u64,
}

pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(path: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(path, format!("unreadable JSON: {e}")))
}

pub(crate) fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}

// ---- keys -------------------------------------------------------------------------

pub(crate) const CONFIG_KEY: &str = "config.json";
pub(crate) const HEAD_KEY: &str = "HEAD.json";
pub(crate) const REFS_PREFIX: &str = "refs/";
pub(crate) const INDEX_PREFIX: &str = "index/";
pub(crate) const PACKS_PREFIX: &str = "packs/";
pub(crate) const MANIFESTS_PREFIX: &str = "manifests/";
pub(crate) const VERSIONS_PREFIX: &str = "versions/";
pub(crate) const PRUNED_PREFIX: &str = "pruned/";
pub(crate) const GC_PREFIX: &str = "gc/";
pub(crate) const GENERATIONS_PREFIX: &str = "gc/generations/";

fn fanout(prefix: &str, id: &ContentHash, ext: &str) -> String {
    let hex = id.to_string();
    format!("{prefix}{}/{hex}.{ext}", &hex[..2])
}

pub(crate) fn pack_key(id: &ContentHash) -> String {
    fanout(PACKS_PREFIX, id, "thpack")
}
pub(crate) fn manifest_key(id: &ContentHash) -> String {
    fanout(MANIFESTS_PREFIX, id, "thman")
}
pub(crate) fn version_key(id: &ContentHash) -> String {
    fanout(VERSIONS_PREFIX, id, "thver")
}
pub(crate) fn pruned_key(id: &ContentHash) -> String {
    fanout(PRUNED_PREFIX, id, "json")
}
pub(crate) fn index_key(id: &ContentHash) -> String {
    format!("{INDEX_PREFIX}{id}.thidx")
}
pub(crate) fn gc_key(id: &ContentHash) -> String {
    format!("{GC_PREFIX}{id}.thgc")
}

/// `gc/generations/<seq:020>.json`.
pub(crate) fn generation_key(seq: u64) -> String {
    format!("{GENERATIONS_PREFIX}{seq:020}.json")
}

/// The sequence number of a gc generation key.
pub(crate) fn parse_generation_key(key: &str) -> Option<u64> {
    let seq = key
        .strip_prefix(GENERATIONS_PREFIX)?
        .strip_suffix(".json")?;
    if seq.len() != 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// The id in a content-addressed key (`.../<64 hex>.<ext>`), if it is one.
pub(crate) fn id_of_key(key: &str, ext: &str) -> Option<ContentHash> {
    let name = key.rsplit('/').next()?;
    let hex = name.strip_suffix(ext)?.strip_suffix('.')?;
    hex.parse().ok()
}

/// A ref name as one key component: ASCII letters, digits, `-` and `_` as they are,
/// every other byte as `%XX`.
pub(crate) fn encode_ref_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(crate) fn decode_ref_name(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `refs/<name>/<seq:020>.json`.
pub(crate) fn ref_key(name: &str, seq: u64) -> String {
    format!("{REFS_PREFIX}{}/{seq:020}.json", encode_ref_name(name))
}

/// The name and sequence number of a ref log key.
pub(crate) fn parse_ref_key(key: &str) -> Option<(String, u64)> {
    let rest = key.strip_prefix(REFS_PREFIX)?;
    let (enc, file) = rest.split_once('/')?;
    let seq = file.strip_suffix(".json")?;
    if seq.len() != 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((decode_ref_name(enc)?, seq.parse().ok()?))
}

/// Parse any repository object from its key and bytes, for fuzzing and tools: every
/// parser behind `Store::open` is reached from here. Never panics; garbage gives
/// [`Error::CorruptObject`] or [`Error::UnsupportedFormat`].
///
/// # Errors
///
/// As described.
#[doc(hidden)]
pub fn parse_object(key: &str, bytes: &[u8]) -> Result<()> {
    if key == CONFIG_KEY {
        parse_json::<ConfigJson>(key, bytes).map(|_| ())
    } else if key == HEAD_KEY {
        parse_json::<HeadJson>(key, bytes).map(|_| ())
    } else if key.starts_with(REFS_PREFIX) {
        parse_json::<RefEntry>(key, bytes).map(|_| ())
    } else if key.starts_with(PRUNED_PREFIX) {
        parse_json::<PrunedJson>(key, bytes).map(|_| ())
    } else if key.starts_with(GENERATIONS_PREFIX) {
        if parse_generation_key(key).is_none() {
            return Err(corrupt(key, "not a gc generation key"));
        }
        parse_json::<GenerationJson>(key, bytes).map(|_| ())
    } else if key.ends_with(".thpack") {
        parse_pack(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thidx") {
        parse_index(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thman") {
        parse_manifest(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thver") {
        parse_version(key, bytes, None).map(|_| ())
    } else if key.ends_with(".thgc") {
        parse_gc(key, bytes, None).map(|_| ())
    } else {
        Err(corrupt(key, "not a repository object key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::pack::Span;

    /// Check a direct reader against postcard on `body`'s encoding and on every flip of
    /// one of the first 300 bytes (three bits each) and every cut.
    fn agrees_with_postcard<T>(body: &T, fast: fn(&[u8]) -> Option<T>)
    where
        T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug,
    {
        let check = |raw: &[u8]| {
            if let Some(f) = fast(raw) {
                let slow: T = decode_body("x", raw).expect("postcard accepts");
                assert_eq!(f, slow, "{raw:?}");
            }
        };
        let raw = postcard::to_allocvec(body).expect("encodes");
        assert_eq!(
            fast(&raw).as_ref(),
            Some(body),
            "accepts a well-formed body"
        );
        for i in 0..raw.len().min(300) {
            for bit in [0x01, 0x40, 0x80] {
                let mut b = raw.clone();
                b[i] ^= bit;
                check(&b);
            }
            check(&raw[..i]);
        }
        let mut longer = raw.clone();
        longer.push(0);
        assert_eq!(fast(&longer), None, "refuses trailing bytes");
    }

    #[test]
    fn manifest_fast_path_agrees_with_postcard() {
        let bodies = [
            ManifestBody {
                dtype: 3,
                shape: vec![4096, 1024],
                chunk_elems: 65536,
                chunks: (0..64u8).map(|i| [i; 32]).collect(),
            },
            ManifestBody {
                dtype: 0,
                shape: vec![],
                chunk_elems: 1,
                chunks: vec![[0xff; 32]],
            },
            ManifestBody {
                dtype: 255,
                shape: vec![u64::MAX, 0, 127, 128, 1 << 35],
                chunk_elems: u64::MAX,
                chunks: vec![],
            },
        ];
        for body in &bodies {
            agrees_with_postcard(body, manifest_body_fast);
        }
        // Overlong and overflowing varints.
        for raw in [
            &[3, 0x80, 0x00, 1, 0][..],
            &[
                3, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0,
            ],
            &[
                3, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0,
            ],
        ] {
            if let Some(f) = manifest_body_fast(raw) {
                assert_eq!(Some(f), decode_body::<ManifestBody>("x", raw).ok());
            }
        }
    }

    #[test]
    fn index_fast_path_agrees_with_postcard() {
        let entry = |i: u8| PackEntry {
            id: [i; 32],
            span: Span {
                offset: 64 * u64::from(i),
                len: 1 << (i % 40),
            },
        };
        let bodies = [
            IndexBody::default(),
            IndexBody {
                supersedes: vec![[1; 32], [2; 32]],
                packs: vec![],
            },
            IndexBody {
                supersedes: vec![],
                packs: vec![
                    IndexPack {
                        pack: [9; 32],
                        chunks: (0..5).map(entry).collect(),
                    },
                    IndexPack {
                        pack: [8; 32],
                        chunks: vec![],
                    },
                    IndexPack {
                        pack: [7; 32],
                        chunks: vec![PackEntry {
                            id: [0; 32],
                            span: Span {
                                offset: u64::MAX,
                                len: u64::MAX,
                            },
                        }],
                    },
                ],
            },
        ];
        for body in &bodies {
            agrees_with_postcard(body, index_body_fast);
        }
    }

    #[test]
    fn ref_names_round_trip_through_keys() {
        for name in ["main", "a/b", "../x", "v1.0", "ünï", "%41", "a b"] {
            let key = ref_key(name, 7);
            assert_eq!(parse_ref_key(&key), Some((name.to_owned(), 7)), "{key}");
            assert_eq!(key.matches('/').count(), 2, "{key}");
        }
    }

    #[test]
    fn the_ref_name_length_check_agrees_with_the_encoder() {
        for name in ["main", "a/b", "ünï", "%41", "a b", "x-y_z", "日本", ""] {
            assert_eq!(
                crate::history::ref_name_key_len(name),
                encode_ref_name(name).len(),
                "{name}"
            );
        }
    }

    #[test]
    fn generation_keys_round_trip_and_reject_other_names() {
        for seq in [0, 1, 42, u64::MAX] {
            assert_eq!(parse_generation_key(&generation_key(seq)), Some(seq));
        }
        for key in [
            "gc/generations/1.json",
            "gc/generations/0000000000000000000a.json",
            "gc/generations/00000000000000000001.json.tmp",
            "gc/00000000000000000001.json",
            "gc/generations/99999999999999999999.json",
        ] {
            assert_eq!(parse_generation_key(key), None, "{key}");
        }
    }

    #[test]
    fn envelope_round_trips_and_rejects_damage() {
        let body = GcBody {
            time_ns: 5,
            keys: vec!["a".into()],
            chunks: vec![[7; 32]],
        };
        let (bytes, id) = encode(Kind::Gc, &body);
        assert_eq!(parse_gc("x", &bytes, Some(&id)).unwrap(), body);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(parse_gc("x", &b, None).is_err(), "flip at {i}");
        }
        for n in 0..bytes.len() {
            assert!(parse_gc("x", &bytes[..n], None).is_err(), "cut at {n}");
        }
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(
            parse_gc("x", &v2, None),
            Err(Error::UnsupportedFormat { .. })
        ));
    }

    #[test]
    fn every_parser_survives_garbage() {
        let keys = [
            CONFIG_KEY,
            HEAD_KEY,
            "refs/main/00000000000000000000.json",
            "pruned/ab/x.json",
            "packs/ab/x.thpack",
            "index/x.thidx",
            "manifests/ab/x.thman",
            "versions/ab/x.thver",
            "gc/x.thgc",
            "gc/generations/00000000000000000001.json",
        ];
        let mut seed = 1u64;
        for key in keys {
            for len in [0usize, 1, 10, 42, 100, 300] {
                let mut bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        (seed >> 33) as u8
                    })
                    .collect();
                assert!(parse_object(key, &bytes).is_err());
                if bytes.len() >= HEADER_LEN {
                    bytes[..7].copy_from_slice(&MAGIC);
                    bytes[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                    assert!(parse_object(key, &bytes).is_err());
                }
            }
        }
    }
}
