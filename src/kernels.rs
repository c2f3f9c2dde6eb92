//! Fused elementwise kernels: compute new values from old ones straight into a
//! destination buffer, with an inline change check (an OR of XORs of the bit patterns),
//! so that copy-on-write, the update and the "did anything change" test are one pass
//! over memory.
//!
//! New values are computed block by block into a small buffer that stays in L1 and then
//! stored. With [`WriteMode::Streaming`] the stores are non-temporal: they do not read the
//! destination's cache lines first, a quarter less memory traffic when the data is larger
//! than the last-level cache, and slower when it is not (the store decides by the working
//! state's size, see `Config::stream_threshold_bytes`).

use std::ops::Range;

use crate::element::Element;

/// How the kernels write their destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Ordinary stores.
    Normal,
    /// Non-temporal stores (x86_64; elsewhere ordinary).
    Streaming,
}

/// Bytes computed per block before they are streamed to the destination. Measured on the
/// benchmark machine (AMD EPYC, 2 cores): with 2 KiB blocks and 16-byte streaming stores
/// the dense update ran at 0.78x of an in-place update, 16 KiB blocks at 0.50x, AVX-512
/// blocks with 64-byte streaming stores at 0.63x, ordinary stores at 0.68x.
const BLOCK_BYTES: usize = 2048;

// The loops below are `#[inline(never)]` on purpose: as functions of their own, their
// `&mut [T]` argument is known not to alias anything the closure captured by reference
// (say `lr` in `|w, g| w - lr * g`), so the compiler hoists those loads and vectorizes.
// Inlined into their callers they ran such a closure 3x slower (measured), and a copy
// through a stack block, the other cure, halved the speed on data that fits in cache.

/// `dst[i] = f(src[i])`; returns whether any bit changed.
#[inline]
pub(crate) fn map_into<T: Element>(
    src: &[T],
    dst: &mut [T],
    f: &impl Fn(T) -> T,
    mode: WriteMode,
) -> bool {
    debug_assert_eq!(
        src.len(),
        dst.len(),
        "map_into: source and destination lengths differ"
    );
    match mode {
        WriteMode::Normal => map_block(src, dst, f),
        WriteMode::Streaming => streamed(dst, |r, out| map_block(&src[r], out, f)),
    }
}

/// `dst[i] = f(src[i], other[i])`; returns whether any bit changed.
#[inline]
pub(crate) fn zip_into<T: Element>(
    src: &[T],
    other: &[T],
    dst: &mut [T],
    f: &impl Fn(T, T) -> T,
    mode: WriteMode,
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
    match mode {
        WriteMode::Normal => zip_block(src, other, dst, f),
        WriteMode::Streaming => {
            streamed(dst, |r, out| zip_block(&src[r.clone()], &other[r], out, f))
        }
    }
}

/// `buf[i] = f(buf[i])` in place; returns whether any bit changed.
#[inline(never)]
pub(crate) fn map_in_place<T: Element>(buf: &mut [T], f: &impl Fn(T) -> T) -> bool {
    let mut acc = T::Bits::default();
    for x in buf.iter_mut() {
        let n = f(*x);
        acc = acc | (n.to_bits() ^ x.to_bits());
        *x = n;
    }
    acc != T::Bits::default()
}

/// `buf[i] = f(buf[i], other[i])` in place; returns whether any bit changed.
#[inline(never)]
pub(crate) fn zip_in_place<T: Element>(buf: &mut [T], other: &[T], f: &impl Fn(T, T) -> T) -> bool {
    debug_assert_eq!(buf.len(), other.len(), "zip_in_place: lengths differ");
    let mut acc = T::Bits::default();
    for (x, &o) in buf.iter_mut().zip(other) {
        let n = f(*x, o);
        acc = acc | (n.to_bits() ^ x.to_bits());
        *x = n;
    }
    acc != T::Bits::default()
}

#[inline(never)]
fn map_block<T: Element>(src: &[T], dst: &mut [T], f: &impl Fn(T) -> T) -> bool {
    let mut acc = T::Bits::default();
    for (d, &s) in dst.iter_mut().zip(src) {
        let n = f(s);
        acc = acc | (n.to_bits() ^ s.to_bits());
        *d = n;
    }
    acc != T::Bits::default()
}

#[inline(never)]
fn zip_block<T: Element>(src: &[T], other: &[T], dst: &mut [T], f: &impl Fn(T, T) -> T) -> bool {
    let mut acc = T::Bits::default();
    for ((d, &s), &o) in dst.iter_mut().zip(src).zip(other) {
        let n = f(s, o);
        acc = acc | (n.to_bits() ^ s.to_bits());
        *d = n;
    }
    acc != T::Bits::default()
}

/// Fill `dst` block by block: `compute(range, block)` writes the new values of
/// `dst[range]` into an L1-resident stack block, which is then streamed out.
#[inline]
fn streamed<T: Element>(
    dst: &mut [T],
    mut compute: impl FnMut(Range<usize>, &mut [T]) -> bool,
) -> bool {
    let mut tmp = [0u64; BLOCK_BYTES / 8];
    let per = BLOCK_BYTES / std::mem::size_of::<T>();
    let mut changed = false;
    let mut start = 0;
    while start < dst.len() {
        let end = (start + per).min(dst.len());
        let block: &mut [T] = &mut bytemuck::cast_slice_mut(&mut tmp[..])[..end - start];
        changed |= compute(start..end, block);
        stream::copy(
            bytemuck::cast_slice_mut(&mut dst[start..end]),
            bytemuck::cast_slice(block),
        );
        start = end;
    }
    stream::fence();
    changed
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod stream {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128};
    #[cfg(not(miri))]
    use std::arch::x86_64::{_mm_sfence, _mm_stream_si128};

    /// Copy `src` to `dst` with non-temporal stores for the 16-byte aligned body.
    #[inline]
    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "stream::copy: lengths differ");
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body_end = head + (dst.len() - head) / 16 * 16;
        let mut i = head;
        while i < body_end {
            // SAFETY: `i + 16 <= body_end <= len` for both slices (equal lengths, checked
            // above), so both 16-byte accesses are in bounds; `dst + i` is 16-byte aligned
            // because `dst + head` is and `i - head` is a multiple of 16, as
            // `_mm_stream_si128` requires; `_mm_loadu_si128` accepts any alignment; SSE2
            // is part of the x86_64 baseline.
            unsafe {
                let v = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
                let to = dst.as_mut_ptr().add(i).cast::<__m128i>();
                // Miri cannot run the non-temporal store (inline assembly); an aligned
                // ordinary store has the same bounds and alignment requirements, so Miri
                // checks those.
                #[cfg(not(miri))]
                _mm_stream_si128(to, v);
                #[cfg(miri)]
                to.write(v);
            }
            i += 16;
        }
        dst[body_end..].copy_from_slice(&src[body_end..]);
    }

    /// Order the streaming stores before any later store (publishing the chunk).
    #[inline]
    pub(super) fn fence() {
        // SAFETY: `sfence` has no preconditions; SSE is part of the x86_64 baseline.
        #[cfg(not(miri))]
        unsafe {
            _mm_sfence()
        }
        // Ordinary stores (see `copy`) need no fence.
        #[cfg(miri)]
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod stream {
    /// Portable fallback: ordinary stores.
    #[inline]
    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        dst.copy_from_slice(src);
    }

    #[inline]
    pub(super) fn fence() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lengths around the block and alignment boundaries.
    const LENS: &[usize] = &[0, 1, 3, 4, 5, 15, 16, 17, 511, 512, 513, 1024, 4099];

    #[test]
    fn streaming_kernels_match_plain_kernels() {
        for &n in LENS {
            for offset in 0..4 {
                let src: Vec<f32> = (0..n + offset).map(|i| i as f32 * 0.25 - 3.0).collect();
                let g: Vec<f32> = (0..n + offset).map(|i| (i % 7) as f32).collect();
                let f = |w: f32, g: f32| w - 0.5 * g;
                let mut plain = vec![0f32; n + offset];
                let mut streamed = vec![0f32; n + offset];
                let a = zip_into(
                    &src[offset..],
                    &g[offset..],
                    &mut plain[offset..],
                    &f,
                    WriteMode::Normal,
                );
                let b = zip_into(
                    &src[offset..],
                    &g[offset..],
                    &mut streamed[offset..],
                    &f,
                    WriteMode::Streaming,
                );
                assert_eq!(plain, streamed, "n={n} offset={offset}");
                assert_eq!(a, b, "change flag n={n} offset={offset}");
                let expect_changed = g[offset..].iter().any(|&x| x != 0.0);
                assert_eq!(a, expect_changed, "n={n} offset={offset}");

                let m = |x: f32| x * 2.0;
                let mut plain = vec![0f32; n + offset];
                let mut streamed = vec![0f32; n + offset];
                let a = map_into(&src[offset..], &mut plain[offset..], &m, WriteMode::Normal);
                let b = map_into(
                    &src[offset..],
                    &mut streamed[offset..],
                    &m,
                    WriteMode::Streaming,
                );
                assert_eq!(plain, streamed, "map n={n} offset={offset}");
                assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn in_place_kernels_report_whether_a_bit_changed() {
        for &n in LENS {
            let mut buf: Vec<f32> = (0..n).map(|i| i as f32 - 2.0).collect();
            let before = buf.clone();
            assert!(!map_in_place(&mut buf, &|x| x));
            assert!(!zip_in_place(&mut buf, &vec![0.0; n], &|x, g| x - g));
            assert_eq!(buf, before);
            if n > 0 {
                // -0.0 == 0.0 as floats, but the bits differ: a change.
                let last = n - 1;
                let flip = |x: f32| if x == before[last] { -x } else { x };
                assert!(map_in_place(&mut buf, &flip), "n={n}");
                assert_eq!(buf[last].to_bits(), (-before[last]).to_bits());
                assert!(zip_in_place(&mut buf, &vec![1.0; n], &|x, g| x + g));
            }
        }
    }

    #[test]
    fn change_check_sees_a_single_flipped_bit() {
        let src: Vec<u16> = (0..3000).collect();
        for mode in [WriteMode::Normal, WriteMode::Streaming] {
            let mut dst = vec![0u16; 3000];
            assert!(!map_into(&src, &mut dst, &|x| x, mode));
            assert_eq!(dst, src);
            for flip in [0usize, 1023, 1024, 2999] {
                let changed = map_into(
                    &src,
                    &mut dst,
                    &|x| {
                        if usize::from(x) == flip {
                            x ^ 0x8000
                        } else {
                            x
                        }
                    },
                    mode,
                );
                assert!(changed, "flip at {flip}");
                assert_eq!(dst[flip], src[flip] ^ 0x8000);
            }
        }
    }
}
