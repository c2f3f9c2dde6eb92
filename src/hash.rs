//! The 32-byte BLAKE3 content hash newtype.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 32-byte BLAKE3 hash of content: of a chunk's bytes, or a Merkle root over a tensor or
/// a whole version.
///
/// `Copy`, ordered, shown and parsed as 64 lower-case hex digits, serialized as that string.
///
/// ```
/// use tensor_history::ContentHash;
/// let h = ContentHash::of_bytes(b"abc");
/// let text = h.to_string();
/// assert_eq!(text.len(), 64);
/// assert_eq!(text.parse::<ContentHash>().unwrap(), h);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// The BLAKE3 hash of `bytes`. O(len), one thread.
    #[must_use]
    pub fn of_bytes(bytes: &[u8]) -> Self {
        ContentHash(*blake3::hash(bytes).as_bytes())
    }

    /// The raw 32 bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({self})")
    }
}

/// Text that is not 64 hex digits, parsed as a [`ContentHash`]. Converts into
/// [`Error::InvalidHash`](crate::Error::InvalidHash) with the same text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a 64-digit hex content hash: `{}`", crate::text::escape(.text))]
pub struct ParseHashError {
    /// The text that was given.
    pub text: String,
}

impl FromStr for ContentHash {
    type Err = ParseHashError;

    fn from_str(s: &str) -> Result<Self, ParseHashError> {
        let bad = || ParseHashError { text: s.to_owned() };
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16).ok_or_else(bad)?;
            let lo = (pair[1] as char).to_digit(16).ok_or_else(bad)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Ok(ContentHash(out))
    }
}

impl Serialize for ContentHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ContentHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
