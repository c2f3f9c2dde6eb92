//! The chunk codec: every dtype and chunk length through every method decodes bit for
//! bit (NaN payloads, infinities, denormals and negative zero included), the method is
//! chosen by what it saves, and damaged input gives a typed error, never a panic or
//! wrong bytes.

use crate::common::CODEC_CHUNK_LENS;
use proptest::prelude::*;
use tensor_history::codec::{
    decode, decode_all, decode_chain, encode, encode_all, encode_as, encode_with, CodecError,
    DecodeJob, Delta, EncodeJob, Header, Method, DELTA_HEADER_LEN, HEADER_LEN,
};
use tensor_history::{ContentHash, DType};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Bit patterns every float codec path must keep: NaNs with payloads and signs,
/// infinities, the smallest and largest denormals, negative zero, extremes.
fn specials(dtype: DType) -> Vec<u64> {
    match dtype {
        DType::F32 => vec![
            0x7fc0_0000,
            0x7f80_0001,
            0xffc0_0001,
            0x7f80_0000,
            0xff80_0000,
            0x8000_0000,
            0x0000_0001,
            0x007f_ffff,
            0x8000_0001,
            0x7f7f_ffff,
            0x0080_0000,
        ],
        DType::F64 => vec![
            0x7ff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            0xfff8_0000_0000_0001,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0x8000_0000_0000_0000,
            0x0000_0000_0000_0001,
            0x000f_ffff_ffff_ffff,
            0x7fef_ffff_ffff_ffff,
        ],
        // f16 and bf16: NaNs, infinities, -0, denormals.
        DType::F16 => vec![
            0x7e00, 0x7c01, 0xfe01, 0x7c00, 0xfc00, 0x8000, 0x0001, 0x03ff, 0x7bff,
        ],
        DType::BF16 => vec![
            0x7fc0, 0x7f81, 0xffc1, 0x7f80, 0xff80, 0x8000, 0x0001, 0x007f, 0x7f7f,
        ],
        _ => vec![0, u64::MAX, 1, 1 << (dtype.size() * 8 - 1)],
    }
}

/// `len` bytes of `dtype` elements: trained-weight-like values (small floats of one
/// sign and magnitude range, or small integers), with every special value mixed in.
fn values(dtype: DType, len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let w = dtype.size();
    let sp = specials(dtype);
    let mut out = Vec::with_capacity(len + 8);
    let mut i = 0;
    while out.len() < len {
        let bits: u64 = if i % 7 == 3 {
            sp[(i / 7) % sp.len()]
        } else {
            let r = rng.next();
            match dtype {
                DType::F32 => u64::from((((r % 2000) as f32 - 1000.0) * 1e-5).to_bits()),
                DType::F64 => (((r % 2000) as f64 - 1000.0) * 1e-5).to_bits(),
                DType::F16 => {
                    u64::from(half::f16::from_f32(((r % 2000) as f32 - 1000.0) * 1e-3).to_bits())
                }
                DType::BF16 => {
                    u64::from(half::bf16::from_f32(((r % 2000) as f32 - 1000.0) * 1e-5).to_bits())
                }
                _ => r % 100,
            }
        };
        out.extend_from_slice(&bits.to_le_bytes()[..w]);
        i += 1;
    }
    out.truncate(len);
    out
}

/// Every method, deltas included.
const ALL_METHODS: [Method; 4] = [
    Method::Raw,
    Method::Planes,
    Method::XorPlanes,
    Method::DiffPlanes,
];

/// `raw` after a dense "training step": every element's lowest mantissa bits changed.
fn stepped(raw: &[u8], width: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let mut out = raw.to_vec();
    for e in out.chunks_mut(width) {
        e[0] ^= rng.next() as u8;
        if e.len() > 2 {
            e[1] ^= (rng.next() & 0x3f) as u8;
        }
    }
    out
}

fn id(bytes: &[u8]) -> ContentHash {
    ContentHash::of_bytes(bytes)
}

fn round_trip(method: Method, raw: &[u8], width: usize, base: &[u8]) {
    let base_id = id(base);
    let e = encode_as(method, raw, width, Some((&base_id, base)));
    assert_eq!(e.method(), method);
    assert_eq!(e.header().raw_len, raw.len());
    let back = decode(e.as_bytes(), &id(raw), raw.len(), Some(base))
        .unwrap_or_else(|err| panic!("{method} of {} bytes, width {width}: {err}", raw.len()));
    assert_eq!(
        &*back,
        raw,
        "{method} of {} bytes, width {width}",
        raw.len()
    );
    assert_eq!(
        back.as_ptr() as usize % 8,
        0,
        "decoded bytes are 8-byte aligned"
    );
}

#[test]
fn every_dtype_and_chunk_length_round_trips_bit_for_bit_through_every_method() {
    for dtype in DType::ALL {
        for &len in CODEC_CHUNK_LENS {
            let raw = values(dtype, len, len as u64 + 7);
            let base = stepped(&raw, dtype.size(), len as u64);
            for method in ALL_METHODS {
                round_trip(method, &raw, dtype.size(), &base);
            }
            // The chosen encoding too, with and without a base.
            for base in [None, Some(&base)] {
                let bid = base.map(|b| id(b));
                let e = encode(&raw, dtype.size(), bid.as_ref().zip(base.map(|b| &b[..])));
                let back = decode(e.as_bytes(), &id(&raw), len, base.map(|b| &b[..])).unwrap();
                assert_eq!(&*back, &raw[..], "{dtype}, {len} bytes, {}", e.method());
            }
        }
    }
}

#[test]
fn boolean_and_odd_widths_are_grouped_as_bytes() {
    let raw: Vec<u8> = (0..4099u32).map(|i| u8::from(i % 3 == 0)).collect();
    for width in [1, 3, 5, 16] {
        let e = encode(&raw, width, None);
        assert_eq!(e.method(), Method::Planes, "a bool mask compresses");
        assert_eq!(e.header().width, 1);
        assert_eq!(
            &*decode(e.as_bytes(), &id(&raw), raw.len(), None).unwrap(),
            &raw[..]
        );
    }
}

#[test]
fn a_dense_step_is_stored_as_a_delta_smaller_than_planes_alone() {
    let raw = values(DType::F32, 256 * 1024, 1);
    let next = stepped(&raw, 4, 2);
    let base_id = id(&raw);
    let p = encode_as(Method::Planes, &next, 4, None);
    for (delta, method) in [
        (Delta::Diff, Method::DiffPlanes),
        (Delta::Xor, Method::XorPlanes),
    ] {
        let d = encode_with(&next, 4, Some((&base_id, &raw)), delta);
        assert_eq!(d.method(), method);
        assert_eq!(d.base(), Some(base_id));
        assert!(
            d.len() * 3 < p.len() * 2,
            "{method} {} vs planes {}",
            d.len(),
            p.len()
        );
        assert_eq!(
            &*decode(d.as_bytes(), &id(&next), next.len(), Some(&raw)).unwrap(),
            &next[..]
        );
    }
    assert_eq!(
        encode(&next, 4, Some((&base_id, &raw))).method(),
        Method::DiffPlanes
    );
}

/// f32 weights after an optimizer-like step: each element moved by up to a relative
/// `rel` (a different factor per element), as `bench_report`'s dense step.
fn scaled(raw: &[u8], rel: f32, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    raw.chunks_exact(4)
        .flat_map(|e| {
            let x = f32::from_le_bytes(e.try_into().unwrap());
            let u = (rng.next() % 2001) as f32 / 1000.0 - 1.0;
            (x - rel * x * u).to_le_bytes()
        })
        .collect()
}

#[test]
fn a_difference_delta_of_a_small_relative_step_is_smaller_than_its_xor_delta() {
    // Weights of one sign and varied magnitudes, moved by up to 1e-4 of their value: the
    // differences are a few hundred units in the last place, where the XOR also flips
    // the high bits the subtraction carries through.
    let mut rng = Rng(3);
    let raw: Vec<u8> = (0..64 * 1024)
        .flat_map(|_| (((rng.next() % 1_000_000) as f32 + 1.0) * 1e-7).to_le_bytes())
        .collect();
    let next = scaled(&raw, 1e-4, 4);
    let bid = id(&raw);
    let d = encode_as(Method::DiffPlanes, &next, 4, Some((&bid, &raw)));
    let x = encode_as(Method::XorPlanes, &next, 4, Some((&bid, &raw)));
    assert!(
        d.len() * 100 < x.len() * 97,
        "difference {} vs XOR {}",
        d.len(),
        x.len()
    );
    for e in [&d, &x] {
        assert_eq!(
            &*decode(e.as_bytes(), &id(&next), next.len(), Some(&raw)).unwrap(),
            &next[..]
        );
    }
}

#[test]
fn difference_deltas_wrap_and_keep_every_bit_pattern() {
    // Elements at the ends of the integer range and across the sign: the difference
    // wraps, its zigzag maps the extremes, and decoding gives every pattern back.
    for width in [1usize, 2, 4, 8] {
        let top = if width == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * width)) - 1
        };
        let half = 1u64 << (8 * width - 1);
        let pats = [0, 1, top, top - 1, half, half - 1, half + 1, 0x55, top / 3];
        let mut raw = Vec::new();
        let mut base = Vec::new();
        for a in pats {
            for b in pats {
                raw.extend_from_slice(&a.to_le_bytes()[..width]);
                base.extend_from_slice(&b.to_le_bytes()[..width]);
            }
        }
        raw.extend_from_slice(&[7, 9, 250][..width.min(3)]);
        base.extend_from_slice(&[1, 200, 3][..width.min(3)]);
        round_trip(Method::DiffPlanes, &raw, width, &base);
    }
}

#[test]
fn a_delta_that_saves_less_than_a_tenth_is_weighed_against_planes_alone() {
    // A base of noise (the chunk held unrelated bytes before): the XOR and the difference
    // are noise too, so the delta saves little, and planes alone (which code the
    // exponents) win.
    let weights = |seed| -> Vec<u8> {
        let mut rng = Rng(seed);
        (0..64 * 1024)
            .flat_map(|_| ((rng.next() % 100_000) as f32 * 1e-6 - 0.05).to_le_bytes())
            .collect()
    };
    let mut rng = Rng(7);
    let base: Vec<u8> = (0..256 * 1024).map(|_| rng.next() as u8).collect();
    let raw = weights(5);
    let bid = id(&base);
    let p = encode_as(Method::Planes, &raw, 4, None);
    for delta in [Delta::Diff, Delta::Xor] {
        let d = encode_as(delta.method(), &raw, 4, Some((&bid, &base)));
        assert!(
            d.len() * 10 > raw.len() * 9,
            "the unrelated base's delta saves {} of {}",
            raw.len() - d.len(),
            raw.len()
        );
        assert!(p.len() < d.len(), "planes {} vs delta {}", p.len(), d.len());
        let e = encode_with(&raw, 4, Some((&bid, &base)), delta);
        assert_eq!(e.method(), Method::Planes);
        assert_eq!(e.len(), p.len());
    }
    let e = encode(&raw, 4, Some((&bid, &base)));
    assert_eq!(
        &*decode(e.as_bytes(), &id(&raw), raw.len(), None).unwrap(),
        &raw[..]
    );
}

#[test]
fn incompressible_bytes_are_stored_raw() {
    let mut rng = Rng(99);
    let raw: Vec<u8> = (0..65_536).map(|_| rng.next() as u8).collect();
    let e = encode(&raw, 4, None);
    assert_eq!(e.method(), Method::Raw);
    assert_eq!(e.len(), HEADER_LEN + raw.len());
    // An unrelated base does not help either.
    let other: Vec<u8> = (0..65_536).map(|_| rng.next() as u8).collect();
    let oid = id(&other);
    assert_eq!(encode(&raw, 4, Some((&oid, &other))).method(), Method::Raw);
}

#[test]
fn a_base_of_another_length_is_not_used() {
    let raw = values(DType::F32, 4096, 3);
    let short = raw[..4092].to_vec();
    let sid = id(&short);
    let e = encode(&raw, 4, Some((&sid, &short)));
    assert!(!e.method().is_delta());
    assert_eq!(e.base(), None);
}

#[test]
fn encode_all_and_decode_all_match_one_by_one() {
    let raws: Vec<Vec<u8>> = (0..9)
        .map(|i| values(DType::BF16, 10_000 + i, i as u64))
        .collect();
    let bases: Vec<Vec<u8>> = raws.iter().map(|r| stepped(r, 2, 5)).collect();
    let bids: Vec<ContentHash> = bases.iter().map(|b| id(b)).collect();
    let items: Vec<_> = raws
        .iter()
        .zip(&bases)
        .zip(&bids)
        .enumerate()
        .map(|(i, ((r, b), bid))| EncodeJob {
            raw: r,
            width: 2,
            base: Some((bid, &b[..])),
            delta: if i % 2 == 0 { Delta::Diff } else { Delta::Xor },
        })
        .collect();
    let encoded = encode_all(&items);
    for (i, ((e, r), b)) in encoded.iter().zip(&raws).zip(&bases).enumerate() {
        let delta = if i % 2 == 0 { Delta::Diff } else { Delta::Xor };
        assert_eq!(*e, encode_with(r, 2, Some((&id(b), b)), delta));
    }
    let jobs: Vec<DecodeJob<'_>> = encoded
        .iter()
        .zip(&raws)
        .zip(&bases)
        .map(|((e, r), b)| DecodeJob {
            encoded: e.as_bytes(),
            id: id(r),
            base: Some(b),
        })
        .collect();
    for (out, r) in decode_all(&jobs, 1 << 20).into_iter().zip(&raws) {
        assert_eq!(&*out.unwrap(), &r[..]);
    }
}

// ---- damaged input ----

fn sample() -> (Vec<u8>, Vec<u8>, Vec<Vec<u8>>) {
    let base = values(DType::F32, 2048, 11);
    let raw = stepped(&base, 4, 12);
    let bid = id(&base);
    let all = ALL_METHODS
        .iter()
        .map(|&m| encode_as(m, &raw, 4, Some((&bid, &base))).into_bytes())
        .collect();
    (raw, base, all)
}

#[test]
fn truncated_input_is_a_typed_error_at_every_length() {
    let (raw, base, all) = sample();
    for enc in &all {
        for cut in 0..enc.len() {
            let r = decode(&enc[..cut], &id(&raw), raw.len(), Some(&base));
            assert!(
                matches!(
                    r,
                    Err(CodecError::Truncated { .. } | CodecError::BadPayload { .. })
                ),
                "cut at {cut} of {}: {r:?}",
                enc.len()
            );
        }
    }
}

#[test]
fn every_flipped_byte_gives_an_error_or_the_same_bytes() {
    let (raw, base, all) = sample();
    for enc in &all {
        for i in 0..enc.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = enc.clone();
                bad[i] ^= bit;
                if let Ok(b) = decode(&bad, &id(&raw), raw.len(), Some(&base)) {
                    assert_eq!(&*b, &raw[..], "flip at {i} gave other bytes");
                }
            }
        }
    }
}

#[test]
fn a_stated_length_above_the_bound_is_refused_before_allocating() {
    let (raw, base, all) = sample();
    for enc in &all {
        let r = decode(enc, &id(&raw), raw.len() - 1, Some(&base));
        assert!(
            matches!(r, Err(CodecError::TooLarge { max, .. }) if max == raw.len() - 1),
            "{r:?}"
        );
        // A header claiming an enormous chunk, with the bound wide open: still no
        // allocation of that size (the payload cannot hold it).
        let mut huge = enc.clone();
        huge[4..12].copy_from_slice(&(1u64 << 50).to_le_bytes());
        let r = decode(&huge, &id(&raw), usize::MAX, Some(&base));
        assert!(r.is_err(), "{r:?}");
    }
    // The same with every plane zstd-coded (no raw plane whose length gives it away):
    // each frame states the plane's length, checked before anything is allocated.
    let zeros = vec![0u8; 4096];
    let mut huge = encode_as(Method::Planes, &zeros, 4, None).into_bytes();
    assert_eq!(huge[3], 0, "all planes zstd-coded");
    huge[4..12].copy_from_slice(&(1u64 << 50).to_le_bytes());
    let r = decode(&huge, &id(&zeros), usize::MAX, None);
    assert!(matches!(r, Err(CodecError::BadPayload { .. })), "{r:?}");
}

#[test]
fn bad_header_fields_are_typed_errors() {
    let (raw, base, all) = sample();
    let planes = &all[1];
    let check = |i: usize, v: u8| {
        let mut bad = planes.clone();
        bad[i] = v;
        decode(&bad, &id(&raw), raw.len(), Some(&base)).unwrap_err()
    };
    assert_eq!(check(0, 9), CodecError::UnsupportedVersion { found: 9 });
    assert_eq!(check(1, 7), CodecError::UnknownMethod { found: 7 });
    assert!(matches!(check(2, 3), CodecError::BadHeader { .. }));
    // Raw-plane flags naming a plane the width does not have.
    assert!(matches!(check(3, 0x10), CodecError::BadHeader { .. }));
    // Raw-plane flags on a raw chunk.
    let mut raw_flagged = all[0].clone();
    raw_flagged[3] = 1;
    let r = decode(&raw_flagged, &id(&raw), raw.len(), Some(&base));
    assert!(matches!(r, Err(CodecError::BadHeader { .. })), "{r:?}");
    // A zstd plane flagged raw: its stored length is not the plane's.
    let mut delta = all[2].clone();
    let h = Header::parse(&delta, usize::MAX).unwrap();
    let zstd_plane = (0..4).find(|p| h.raw_planes >> p & 1 == 0).unwrap();
    delta[3] |= 1 << zstd_plane;
    let r = decode(&delta, &id(&raw), raw.len(), Some(&base));
    assert!(matches!(r, Err(CodecError::BadHeader { .. })), "{r:?}");
    assert_eq!(
        Header::parse(&planes[..HEADER_LEN + 4 * 4], usize::MAX)
            .unwrap()
            .method,
        Method::Planes
    );
}

#[test]
fn a_delta_stores_random_planes_raw_and_the_others_zstd_coded() {
    let (raw, base, all) = sample();
    let delta = &all[2];
    let h = Header::parse(delta, usize::MAX).unwrap();
    // The step changed every element's lowest byte at random (plane 0: raw), 6 bits of
    // the next (plane 1: compressible), nothing above (planes 2 and 3: compressible).
    assert_eq!(h.raw_planes, 0b0001);
    let n = raw.len() / 4;
    assert_eq!(h.plane_lens[0] as usize, n);
    assert!(
        h.plane_lens[1..4].iter().all(|&l| (l as usize) < n),
        "{h:?}"
    );
    assert_eq!(
        delta.len(),
        h.len() + h.plane_lens[..4].iter().map(|&l| l as usize).sum::<usize>()
    );
    let back = decode(delta, &id(&raw), raw.len(), Some(&base)).unwrap();
    assert_eq!(&*back, &raw[..]);
    // Random bytes in every plane: all stored raw, and still decoded bit for bit.
    let mut rng = Rng(5);
    let noise: Vec<u8> = (0..1027).map(|_| rng.next() as u8).collect();
    for width in [2, 4, 8] {
        let e = encode_as(Method::Planes, &noise, width, None);
        assert_eq!(u32::from(e.header().raw_planes), (1u32 << width) - 1);
        let back = decode(e.as_bytes(), &id(&noise), noise.len(), None).unwrap();
        assert_eq!(&*back, &noise[..]);
    }
}

#[test]
fn damage_in_a_raw_plane_is_a_hash_mismatch_never_other_bytes() {
    let (raw, base, all) = sample();
    let delta = &all[2];
    let h = Header::parse(delta, usize::MAX).unwrap();
    assert_eq!(h.raw_planes & 1, 1, "plane 0 is stored raw");
    let start = h.len();
    for i in (start..start + h.plane_lens[0] as usize).step_by(13) {
        let mut bad = delta.clone();
        bad[i] ^= 0x01;
        let r = decode(&bad, &id(&raw), raw.len(), Some(&base));
        assert!(
            matches!(r, Err(CodecError::HashMismatch { expected, .. }) if expected == id(&raw)),
            "flip at {i}: {r:?}"
        );
    }
    // The same in a link of a chain below the chunk (its planes XOR-ed into the chunk's).
    let (v, links) = chain(4, 4096, Method::Planes, &[4]);
    let h = Header::parse(&links[1], usize::MAX).unwrap();
    assert_eq!(h.raw_planes & 1, 1, "the link's plane 0 is stored raw");
    let mut bad = links.clone();
    bad[1][h.len() + 7] ^= 0x80;
    let refs: Vec<&[u8]> = bad.iter().map(|x| &x[..]).collect();
    let r = decode_chain(&refs, None, &id(&v[3]), 4096);
    assert!(
        matches!(r, Err(CodecError::HashMismatch { expected, .. }) if expected == id(&v[3])),
        "{r:?}"
    );
}

#[test]
fn a_payload_longer_than_its_planes_is_an_error() {
    let (raw, base, all) = sample();
    for enc in &all[1..] {
        let mut long = enc.clone();
        long.push(0);
        let r = decode(&long, &id(&raw), raw.len(), Some(&base));
        assert!(matches!(r, Err(CodecError::BadPayload { .. })), "{r:?}");
    }
}

#[test]
fn a_delta_without_its_base_or_with_a_wrong_one_is_an_error() {
    let (raw, base, all) = sample();
    let delta = &all[2];
    assert_eq!(delta[1], 2);
    assert!(delta.len() > DELTA_HEADER_LEN);
    let r = decode(delta, &id(&raw), raw.len(), None);
    assert_eq!(r.unwrap_err(), CodecError::MissingBase { base: id(&base) });
    let r = decode(delta, &id(&raw), raw.len(), Some(&base[..base.len() - 4]));
    assert!(matches!(r, Err(CodecError::BaseLength { .. })), "{r:?}");
    let mut wrong = base.clone();
    wrong[100] ^= 1;
    let r = decode(delta, &id(&raw), raw.len(), Some(&wrong));
    assert!(
        matches!(r, Err(CodecError::HashMismatch { expected, .. }) if expected == id(&raw)),
        "{r:?}"
    );
}

#[test]
fn bytes_that_do_not_hash_to_the_id_are_an_error() {
    let (raw, base, all) = sample();
    for enc in &all {
        let r = decode(enc, &id(b"something else"), raw.len(), Some(&base));
        assert!(matches!(r, Err(CodecError::HashMismatch { .. })), "{r:?}");
    }
}

// ---- chains ----

/// Versions `v[0..n]` of one chunk, each a step from the one before, and their encoded
/// forms: `links[0]` the newest (a delta on the one before), down to `v[0]` encoded with
/// `first` (raw or planes); each link of width `widths[k]` (cycled), XOR deltas.
fn chain(n: usize, len: usize, first: Method, widths: &[usize]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    chain_of(n, len, first, widths, &[Method::XorPlanes])
}

/// [`chain`], link `k` a delta of method `deltas[k]` (cycled).
fn chain_of(
    n: usize,
    len: usize,
    first: Method,
    widths: &[usize],
    deltas: &[Method],
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut v = vec![values(DType::F32, len, 41)];
    for k in 1..n {
        let next = stepped(&v[k - 1], 4, 100 + k as u64);
        v.push(next);
    }
    let mut links: Vec<Vec<u8>> = (0..n)
        .map(|k| {
            let w = widths[k % widths.len()];
            if k == 0 {
                encode_as(first, &v[0], w, None).into_bytes()
            } else {
                let b = id(&v[k - 1]);
                let m = deltas[k % deltas.len()];
                encode_as(m, &v[k], w, Some((&b, &v[k - 1]))).into_bytes()
            }
        })
        .collect();
    links.reverse();
    (v, links)
}

#[test]
fn a_chain_decodes_in_one_pass_to_every_version_bit_for_bit() {
    let (xor, diff) = (Method::XorPlanes, Method::DiffPlanes);
    for first in [Method::Raw, Method::Planes] {
        // One width throughout (the one-pass path) and mixed widths (decoded apart);
        // XOR deltas only, difference deltas only, and the two mixed.
        for widths in [&[4usize][..], &[4, 2], &[1, 4, 8]] {
            for deltas in [&[xor][..], &[diff], &[xor, diff], &[diff, diff, xor]] {
                for len in [0usize, 3, 64, 1001, 4096] {
                    let n = 9;
                    let (v, links) = chain_of(n, len, first, widths, deltas);
                    let refs: Vec<&[u8]> = links.iter().map(|l| &l[..]).collect();
                    for k in 0..n {
                        // Version k is links[n - 1 - k..].
                        let from = n - 1 - k;
                        let back = decode_chain(&refs[from..], None, &id(&v[k]), len)
                            .unwrap_or_else(|e| panic!("{first} {widths:?} len {len} v{k}: {e}"));
                        assert_eq!(&*back, &v[k][..], "{first} {widths:?} len {len} v{k}");
                        assert_eq!(back.as_ptr() as usize % 8, 0);
                        // Cut short at any link, with that link's base given raw.
                        for stop in from + 1..n {
                            let back = decode_chain(
                                &refs[from..stop],
                                Some(&v[n - 1 - stop]),
                                &id(&v[k]),
                                len,
                            )
                            .unwrap();
                            assert_eq!(&*back, &v[k][..]);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_chain_missing_its_end_names_the_base_it_needs() {
    for deltas in [&[Method::XorPlanes][..], &[Method::DiffPlanes]] {
        let (v, links) = chain_of(4, 512, Method::Planes, &[4], deltas);
        let refs: Vec<&[u8]> = links.iter().map(|l| &l[..]).collect();
        let r = decode_chain(&refs[..2], None, &id(&v[3]), 512);
        assert_eq!(r.unwrap_err(), CodecError::MissingBase { base: id(&v[1]) });
        let r = decode_chain(&refs[..2], Some(&v[1][..100]), &id(&v[3]), 512);
        assert!(matches!(r, Err(CodecError::BaseLength { .. })), "{r:?}");
    }
}

#[test]
fn a_chain_link_of_another_length_is_an_error() {
    for deltas in [&[Method::XorPlanes][..], &[Method::DiffPlanes]] {
        let (v, links) = chain_of(3, 512, Method::Planes, &[4], deltas);
        let other = encode_as(Method::Planes, &values(DType::F32, 256, 3), 4, None).into_bytes();
        let r = decode_chain(&[&links[0], &other], None, &id(&v[2]), 512);
        assert_eq!(
            r.unwrap_err(),
            CodecError::BaseLength {
                expected: 512,
                found: 256
            }
        );
    }
}

#[test]
fn a_damaged_link_anywhere_in_a_chain_is_an_error_never_other_bytes() {
    let (v, links) = chain_of(
        4,
        1024,
        Method::Planes,
        &[4],
        &[Method::DiffPlanes, Method::XorPlanes],
    );
    for (l, link) in links.iter().enumerate() {
        for i in (0..link.len()).step_by(7) {
            let mut bad = links.clone();
            bad[l][i] ^= 0x10;
            let refs: Vec<&[u8]> = bad.iter().map(|x| &x[..]).collect();
            if let Ok(b) = decode_chain(&refs, None, &id(&v[3]), 1024) {
                assert_eq!(&*b, &v[3][..], "flip at {i} of link {l} gave other bytes");
            }
        }
    }
}

fn width() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(2), Just(3), Just(4), Just(8)]
}

proptest! {
    #[test]
    fn arbitrary_bytes_round_trip_through_every_method(
        raw in proptest::collection::vec(any::<u8>(), 0..600),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..40),
        width in width(),
    ) {
        let mut base = raw.clone();
        if !base.is_empty() {
            for (i, x) in &flips {
                let i = i.index(base.len());
                base[i] ^= x;
            }
        }
        for method in ALL_METHODS {
            round_trip(method, &raw, width, &base);
        }
        let bid = id(&base);
        let e = encode(&raw, width, Some((&bid, &base)));
        prop_assert!(e.len() <= DELTA_HEADER_LEN + raw.len());
        let back = decode(e.as_bytes(), &id(&raw), raw.len(), Some(&base)).unwrap();
        prop_assert_eq!(&*back, &raw[..]);
    }

    #[test]
    fn special_floats_round_trip_bit_for_bit(
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 1..300),
        dtype in prop_oneof![Just(DType::F16), Just(DType::BF16), Just(DType::F32), Just(DType::F64)],
    ) {
        let sp = specials(dtype);
        let mut raw = Vec::new();
        for p in &picks {
            raw.extend_from_slice(&sp[p.index(sp.len())].to_le_bytes()[..dtype.size()]);
        }
        let base = stepped(&raw, dtype.size(), picks.len() as u64);
        for method in ALL_METHODS {
            round_trip(method, &raw, dtype.size(), &base);
        }
    }
}

#[test]
fn a_chain_at_its_bound_of_every_width_decodes_special_values_bit_for_bit() {
    // Full chunk + 8 deltas (the bound of the in-memory chains), every element width,
    // lengths with and without trailing bytes; each step flips bits in every byte of
    // some elements (sign, exponent, NaN payloads, denormals) and the low bytes of all.
    let mut rng = Rng(0x5eed);
    for dtype in [DType::U8, DType::BF16, DType::F16, DType::F32, DType::F64] {
        let w = dtype.size();
        for len in [w * 1000, w * 1000 + w.saturating_sub(1), 8 * 1024 + 3] {
            let mut v = vec![values(dtype, len, len as u64)];
            for k in 1..9 {
                let mut next = v[k - 1].clone();
                for (i, e) in next.chunks_mut(w).enumerate() {
                    e[0] ^= rng.next() as u8;
                    if i % 13 == k {
                        let sp = specials(dtype);
                        let bits = sp[(i + k) % sp.len()].to_le_bytes();
                        e.copy_from_slice(&bits[..e.len()]);
                    }
                }
                v.push(next);
            }
            let mut links: Vec<Vec<u8>> =
                vec![encode_as(Method::Planes, &v[0], w, None).into_bytes()];
            for k in 1..9 {
                let b = id(&v[k - 1]);
                // Difference deltas, and one XOR link inside the chain.
                let m = if k == 4 {
                    Method::XorPlanes
                } else {
                    Method::DiffPlanes
                };
                links.push(encode_as(m, &v[k], w, Some((&b, &v[k - 1]))).into_bytes());
            }
            links.reverse();
            let refs: Vec<&[u8]> = links.iter().map(|l| &l[..]).collect();
            for k in 0..9 {
                let back = decode_chain(&refs[8 - k..], None, &id(&v[k]), len)
                    .unwrap_or_else(|e| panic!("{dtype} len {len} v{k}: {e}"));
                assert_eq!(&*back, &v[k][..], "{dtype} len {len} v{k}");
            }
        }
    }
}

#[test]
fn small_tensors_keep_their_matches_and_large_planes_use_the_fast_level() {
    // A small periodic i16 buffer (a ramp, as position ids or counters): its planes are
    // under SMALL_PLANE_BYTES, coded at zstd's default level, whose match search finds
    // the period (at the fast level it coded to 1687 bytes of 6000).
    let ramp: Vec<u8> = (0..3000usize)
        .flat_map(|i| ((i * 7) as i16).to_le_bytes())
        .collect();
    let e = encode(&ramp, 2, None);
    assert!(e.len() < 600, "{} bytes", e.len());
    assert_eq!(
        &*decode(e.as_bytes(), &id(&ramp), ramp.len(), None).unwrap(),
        &ramp[..]
    );
}

#[test]
fn large_planes_that_look_random_are_stored_raw_and_others_are_coded() {
    // One plane (width 1) of 64 KiB: over SMALL_PLANE_BYTES, so sampled first.
    let len = 64 << 10;
    let mut rng = Rng(11);
    let plane = |f: &mut dyn FnMut() -> u8| -> Vec<u8> { (0..len).map(|_| f()).collect() };
    let coded = |bytes: &[u8]| {
        let e = encode_as(Method::Planes, bytes, 1, None);
        let back = decode(e.as_bytes(), &id(bytes), bytes.len(), None).unwrap();
        assert_eq!(&*back, bytes);
        e.header().raw_planes == 0
    };
    // 8 bits per byte: raw.
    assert!(!coded(&plane(&mut || rng.next() as u8)));
    // 7 bits per byte (128 values): entropy coding saves an eighth, so it is coded.
    assert!(coded(&plane(&mut || (rng.next() % 128) as u8)));
    // What the sampling gives up: a random 4 KiB block repeated is stored raw, where
    // zstd's matches would have coded it to a sixteenth.
    let block: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
    let repeated: Vec<u8> = block.iter().copied().cycle().take(len).collect();
    assert!(!coded(&repeated));
}

#[test]
fn planes_of_one_repeated_byte_code_to_a_few_bytes_at_every_frame_size_boundary() {
    // A plane of one byte repeated is a zstd frame of RLE blocks (at most 128 KiB each)
    // whose content size field takes 1, 2 or 4 bytes by the plane's length; each length
    // on and around those boundaries decodes bit for bit, through planes and deltas.
    for n in [
        1usize, 2, 255, 256, 257, 4095, 4096, 65535, 65536, 65791, 65792, 131071, 131072, 131073,
        262144, 300001,
    ] {
        for value in [0.0f32, 1.0, -2.5e-3] {
            let raw: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), n)
                .flatten()
                .collect();
            let e = encode_as(Method::Planes, &raw, 4, None);
            let blocks = n.div_ceil(128 << 10);
            assert!(
                e.len() <= HEADER_LEN + 4 * (4 + 1 + 4 + 4 * blocks) + 64,
                "{n} elements of {value}: {} bytes",
                e.len()
            );
            assert_eq!(
                &*decode(e.as_bytes(), &id(&raw), raw.len(), None).unwrap(),
                &raw[..],
                "{n} elements of {value}"
            );
            // The same as a delta against a base that differs in its low byte only:
            // the three high planes repeat one byte.
            let base: Vec<u8> = raw
                .chunks_exact(4)
                .enumerate()
                .flat_map(|(i, c)| {
                    let mut c = [c[0], c[1], c[2], c[3]];
                    c[0] ^= (i % 251) as u8;
                    c
                })
                .collect();
            for method in [Method::XorPlanes, Method::DiffPlanes] {
                round_trip(method, &raw, 4, &base);
            }
        }
    }
}
