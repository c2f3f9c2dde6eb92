//! The envelope every binary object shares: magic, kind byte, format version, a postcard
//! body, and a BLAKE3 trailer that is also the object's id.

use serde::{Deserialize, Serialize};

use super::corrupt;
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// The repository format version this build creates repositories with (`config.json`),
/// and the highest it reads. Version 2 records each chunk's stored form (raw, planes or
/// delta) in pack footers and index files; version 3 has the same objects and adds
/// difference deltas ([`crate::codec::Method::DiffPlanes`]) to the chunk encodings
/// packs may hold; version 4 stores the manifests a save writes as entries of its packs
/// ([`manifests_packed`]). Manifests, versions and gc records did not change and keep
/// envelope version [`FORMAT_V1`], so their ids (and the versions' content addresses)
/// are the same in repositories of every version.
pub(crate) const FORMAT_VERSION: u16 = 4;

/// Format version 3: chunks raw, as byte planes, or as XOR or difference deltas; every
/// manifest its own object. Repositories of this version are read, and written to in
/// this version, so that the builds that wrote them keep reading them.
pub(crate) const FORMAT_V3: u16 = 3;

/// Whether a save into a repository of format `format` stores the manifests it writes
/// as pack entries (`Form::Manifest`, format 4) rather than as objects of their own.
pub(crate) fn manifests_packed(format: u16) -> bool {
    format > FORMAT_V3
}

/// Format version 2: chunks raw, as byte planes or as XOR deltas. Repositories of this
/// version are read, and written to in this version (no difference deltas), so that
/// the builds that wrote them keep reading them.
pub(crate) const FORMAT_V2: u16 = 2;

/// The delta the packs of a repository of format `format` may hold.
pub(crate) fn delta_in(format: u16) -> crate::codec::Delta {
    if format > FORMAT_V2 {
        crate::codec::Delta::Diff
    } else {
        crate::codec::Delta::Xor
    }
}

/// Format version 1: raw chunks only. Repositories of this version are read, and
/// written to in this version (raw chunks), so that the builds that wrote them keep
/// reading them.
pub(crate) const FORMAT_V1: u16 = 1;

/// First 7 bytes of every binary object (PNG-style: a high byte, the name, CR LF, ^Z, LF).
pub(crate) const MAGIC: [u8; 7] = *b"\x89TH\r\n\x1a\n";

/// Bytes before an object's body: magic, kind, version.
pub(crate) const HEADER_LEN: usize = 10;

/// Bytes of the BLAKE3 trailer.
pub(crate) const TRAILER_LEN: usize = 32;

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
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Pack => "pack",
            Kind::Index => "index",
            Kind::Manifest => "manifest",
            Kind::Version => "version",
            Kind::Gc => "gc record",
        }
    }
}

impl Kind {
    /// The envelope versions readers accept for objects of this kind: packs and index
    /// files changed in version 2 (and may hold difference deltas from version 3), the
    /// others did not.
    fn reads(self, version: u16) -> bool {
        match self {
            Kind::Pack | Kind::Index => (FORMAT_V1..=FORMAT_VERSION).contains(&version),
            Kind::Manifest | Kind::Version | Kind::Gc => version == FORMAT_V1,
        }
    }

    /// The envelope version of objects of this kind in a repository of format
    /// `format`.
    pub(crate) fn version_in(self, format: u16) -> u16 {
        match self {
            Kind::Pack | Kind::Index => format,
            Kind::Manifest | Kind::Version | Kind::Gc => FORMAT_V1,
        }
    }
}

/// The header of an object of `kind` in a repository of format `format`.
pub(crate) fn header_in(kind: Kind, format: u16) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..7].copy_from_slice(&MAGIC);
    h[7] = kind as u8;
    h[8..10].copy_from_slice(&kind.version_in(format).to_le_bytes());
    h
}

/// Check magic, kind and version of the first bytes of an object; its envelope version.
pub(crate) fn check_header(path: &str, bytes: &[u8], kind: Kind) -> Result<u16> {
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
    if !kind.reads(version) {
        return Err(Error::UnsupportedFormat {
            path: path.to_owned(),
            found: format!("{} format version {version}", kind.name()),
        });
    }
    Ok(version)
}

/// Header, postcard body, BLAKE3 trailer. Returns the bytes and their id (the trailer).
pub(crate) fn encode<T: Serialize>(kind: Kind, body: &T) -> (Vec<u8>, ContentHash) {
    encode_in(kind, FORMAT_V1, body)
}

/// [`encode`] for a repository of format `format`.
pub(crate) fn encode_in<T: Serialize>(kind: Kind, format: u16, body: &T) -> (Vec<u8>, ContentHash) {
    let mut out = header_in(kind, format).to_vec();
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
pub(crate) fn body_of<'a>(
    path: &str,
    bytes: &'a [u8],
    kind: Kind,
    want: Option<&ContentHash>,
) -> Result<&'a [u8]> {
    body_and_version(path, bytes, kind, want).map(|(b, _)| b)
}

/// [`body_of`], and the object's envelope version.
pub(crate) fn body_and_version<'a>(
    path: &str,
    bytes: &'a [u8],
    kind: Kind,
    want: Option<&ContentHash>,
) -> Result<(&'a [u8], u16)> {
    let version = check_header(path, bytes, kind)?;
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
    Ok((&content[HEADER_LEN..], version))
}

/// A postcard body that must fill `body` exactly.
pub(crate) fn decode_body<T: for<'de> Deserialize<'de>>(path: &str, body: &[u8]) -> Result<T> {
    let (value, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|e| corrupt(path, format!("unreadable body: {e}")))?;
    if !rest.is_empty() {
        return Err(corrupt(path, "trailing bytes after the body"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repo::format::{parse_gc, GcBody};

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
}
