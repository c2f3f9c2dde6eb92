//! The chunk decoder (`tensor_history::codec::decode`) on arbitrary bytes: `Ok` only with
//! the chunk's exact bytes, otherwise a typed `CodecError`; never a panic, never an
//! allocation beyond the bound given.
//!
//! The first input byte picks the mode. With its high bit clear the rest is an encoded
//! chunk, decoded with a 64 KiB bound against a fixed pattern as long as the header
//! states (or no base, when bit 6 is set) and checked against an id (the BLAKE3 of the input), which only the right
//! bytes can match. With the high bit set the rest is a raw chunk: it is encoded
//! (element width from the low bits, a difference delta or, with bit 2 set, an XOR
//! delta against a base derived from it) and must decode to itself, also after the
//! encoded form is cut at a point the next input byte picks.
//! Shared by the cargo-fuzz target
//! and `tests/oracles/fuzz_replay.rs`.

use tensor_history::codec::{decode, encode_with, CodecError, Delta, Header};
use tensor_history::ContentHash;

/// The bound on decoded lengths.
const MAX_RAW: usize = 64 * 1024;

fn base_for(raw: &[u8]) -> Vec<u8> {
    raw.iter()
        .enumerate()
        .map(|(i, b)| if i % 4 == 0 { b ^ 0x5a } else { *b })
        .collect()
}

/// Check `data` as described above.
pub fn run(data: &[u8]) {
    let Some((&select, rest)) = data.split_first() else {
        return;
    };
    if select & 0x80 == 0 {
        let len = Header::parse(rest, MAX_RAW).map_or(0, |h| h.raw_len);
        let base: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let id = ContentHash::of_bytes(rest);
        let given = (select & 0x40 == 0).then_some(&base[..]);
        match decode(rest, &id, MAX_RAW, given) {
            // Only the bytes that hash to the id may come back.
            Ok(b) => assert_eq!(ContentHash::of_bytes(&b), id, "decoded bytes of another id"),
            Err(e) => check_error(&e),
        }
        return;
    }
    let width = [1, 2, 4, 8][usize::from(select & 3)];
    let (cut, raw) = match rest.split_first() {
        Some((&c, raw)) if raw.len() <= MAX_RAW => (c, raw),
        _ => return,
    };
    let base = base_for(raw);
    let bid = ContentHash::of_bytes(&base);
    let id = ContentHash::of_bytes(raw);
    let delta = if select & 4 == 0 {
        Delta::Diff
    } else {
        Delta::Xor
    };
    let e = encode_with(raw, width, Some((&bid, &base)), delta);
    let back = decode(e.as_bytes(), &id, raw.len(), Some(&base)).expect("an encoded chunk decodes");
    assert_eq!(&*back, raw, "a round trip changed the bytes");
    let at = usize::from(cut) * e.len() / 256;
    match decode(&e.as_bytes()[..at], &id, raw.len(), Some(&base)) {
        Ok(b) => assert_eq!(&*b, raw),
        Err(err) => check_error(&err),
    }
}

fn check_error(e: &CodecError) {
    // Every variant is a typed error; its message is one line.
    assert!(!e.to_string().contains('\n'), "{e}");
}
