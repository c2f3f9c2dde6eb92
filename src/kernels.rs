//! Fused elementwise kernels: compute new values from old ones straight into a
//! destination buffer, with an inline change check (an OR of XORs of the bit patterns),
//! so that copy-on-write, the update and the "did anything change" test are one pass
//! over memory.

use crate::element::Element;

/// `dst[i] = f(src[i])`; returns whether any bit changed.
#[inline]
pub(crate) fn map_into<T: Element>(src: &[T], dst: &mut [T], f: &impl Fn(T) -> T) -> bool {
    debug_assert_eq!(
        src.len(),
        dst.len(),
        "map_into: source and destination lengths differ"
    );
    let mut acc = T::Bits::default();
    for (d, &s) in dst.iter_mut().zip(src) {
        let n = f(s);
        acc = acc | (n.to_bits() ^ s.to_bits());
        *d = n;
    }
    acc != T::Bits::default()
}

/// `dst[i] = f(src[i], other[i])`; returns whether any bit changed.
#[inline]
pub(crate) fn zip_into<T: Element>(
    src: &[T],
    other: &[T],
    dst: &mut [T],
    f: &impl Fn(T, T) -> T,
) -> bool {
    debug_assert_eq!(
        src.len(),
        dst.len(),
        "zip_into: source and destination lengths differ"
    );
    debug_assert_eq!(
        src.len(),
        other.len(),
        "zip_into: source and operand lengths differ"
    );
    let mut acc = T::Bits::default();
    for ((d, &s), &o) in dst.iter_mut().zip(src).zip(other) {
        let n = f(s, o);
        acc = acc | (n.to_bits() ^ s.to_bits());
        *d = n;
    }
    acc != T::Bits::default()
}

/// `buf[i] = f(buf[i])` in place.
#[inline]
pub(crate) fn map_in_place<T: Element>(buf: &mut [T], f: &impl Fn(T) -> T) {
    for x in buf.iter_mut() {
        *x = f(*x);
    }
}

/// `buf[i] = f(buf[i], other[i])` in place.
#[inline]
pub(crate) fn zip_in_place<T: Element>(buf: &mut [T], other: &[T], f: &impl Fn(T, T) -> T) {
    debug_assert_eq!(buf.len(), other.len(), "zip_in_place: lengths differ");
    for (x, &o) in buf.iter_mut().zip(other) {
        *x = f(*x, o);
    }
}
