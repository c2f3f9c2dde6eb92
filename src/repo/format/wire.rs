//! A direct reader of postcard's wire encoding, for the bodies an open parses by the
//! thousands.

/// A 32-byte hash as stored in bodies.
pub(crate) type RawHash = [u8; 32];

/// A reader of postcard's encoding, for the bodies an open parses by the thousands
/// (manifests, indexes): serde's element-by-element path for `[u8; 32]` was most of
/// their parse time. Every method returns `None` for anything it does not accept; the
/// caller then asks postcard, so the result never differs from postcard's (tests check
/// both ways).
pub(crate) struct Wire<'a>(pub(crate) &'a [u8]);

impl Wire<'_> {
    pub(crate) fn byte(&mut self) -> Option<u8> {
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
    pub(crate) fn len(&mut self, min_elem: usize) -> Option<usize> {
        let n = usize::try_from(self.varint()?).ok()?;
        (n.checked_mul(min_elem)? <= self.0.len()).then_some(n)
    }

    pub(crate) fn hash(&mut self) -> Option<RawHash> {
        let (h, rest) = self.0.split_first_chunk::<32>()?;
        self.0 = rest;
        Some(*h)
    }

    pub(crate) fn hashes(&mut self) -> Option<Vec<RawHash>> {
        let n = self.len(32)?;
        (0..n).map(|_| self.hash()).collect()
    }

    /// `value` if every byte was read.
    pub(crate) fn done<T>(self, value: T) -> Option<T> {
        self.0.is_empty().then_some(value)
    }
}
