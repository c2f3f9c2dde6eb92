//! The bodies of the binary objects: manifests, versions, index files and gc records,
//! with their checked parsers (a direct wire reader first for manifests and indexes).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::corrupt;
use super::envelope::{body_and_version, body_of, decode, decode_body, encode_in, Kind, FORMAT_V1};
use super::wire::{RawHash, Wire};
use crate::element::DType;
use crate::error::Result;
use crate::hash::ContentHash;
use crate::meta::Meta;
use crate::repo::pack::{EntryV1, PackEntry};
use crate::tensor::shape_len;

pub(crate) use crate::tensor::MAX_DIMS;

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

fn index_body_fast(bytes: &[u8], version: u16) -> Option<IndexBody> {
    let mut w = Wire(bytes);
    let supersedes = w.hashes()?;
    let n = w.len(33)?;
    let mut packs = Vec::with_capacity(n);
    for _ in 0..n {
        let pack = w.hash()?;
        let m = w.len(PackEntry::MIN_WIRE_LEN)?;
        let chunks = (0..m)
            .map(|_| PackEntry::read_wire(&mut w, version))
            .collect::<Option<Vec<_>>>()?;
        packs.push(IndexPack { pack, chunks });
    }
    w.done(IndexBody { supersedes, packs })
}

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

/// An index body of format version 1 (raw chunks: entries `{ id, offset, len }`).
#[derive(Serialize, Deserialize)]
struct IndexBodyV1 {
    supersedes: Vec<RawHash>,
    packs: Vec<IndexPackV1>,
}

#[derive(Serialize, Deserialize)]
struct IndexPackV1 {
    pack: RawHash,
    chunks: Vec<EntryV1>,
}

/// An index file of a repository of format `format`: its bytes and id. A format-1
/// index holds raw chunks only (format-1 repositories are written raw).
pub(crate) fn encode_index_in(format: u16, body: &IndexBody) -> (Vec<u8>, ContentHash) {
    if format == FORMAT_V1 {
        let v1 = IndexBodyV1 {
            supersedes: body.supersedes.clone(),
            packs: body
                .packs
                .iter()
                .map(|p| IndexPackV1 {
                    pack: p.pack,
                    chunks: p.chunks.iter().map(PackEntry::v1).collect(),
                })
                .collect(),
        };
        encode_in(Kind::Index, format, &v1)
    } else {
        encode_in(Kind::Index, format, body)
    }
}

pub(crate) fn parse_index(
    path: &str,
    bytes: &[u8],
    want: Option<&ContentHash>,
) -> Result<IndexBody> {
    let (raw, version) = body_and_version(path, bytes, Kind::Index, want)?;
    let body = match index_body_fast(raw, version) {
        Some(body) => body,
        None if version == FORMAT_V1 => {
            let v1: IndexBodyV1 = decode_body(path, raw)?;
            IndexBody {
                supersedes: v1.supersedes,
                packs: v1
                    .packs
                    .into_iter()
                    .map(|p| IndexPack {
                        pack: p.pack,
                        chunks: p.chunks.into_iter().map(PackEntry::from).collect(),
                    })
                    .collect(),
            }
        }
        None => decode_body(path, raw)?,
    };
    if body
        .packs
        .iter()
        .flat_map(|p| &p.chunks)
        .any(|e| !e.plausible_in(version))
    {
        return Err(corrupt(
            path,
            "an entry's lengths do not fit its stored form",
        ));
    }
    Ok(body)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::format::FORMAT_VERSION;
    use crate::repo::pack::{Form, Span};

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
                raw_len: 3 << (i % 40),
                form: match i % 3 {
                    0 => Form::Raw,
                    1 => Form::Planes,
                    _ => Form::Delta([i + 1; 32]),
                },
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
                            span: Span::raw(u64::MAX, u64::MAX),
                        }],
                    },
                ],
            },
        ];
        for body in &bodies {
            agrees_with_postcard(body, |b| index_body_fast(b, FORMAT_VERSION));
        }
    }
}
