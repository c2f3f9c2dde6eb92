//! Single-thread decode speed of the chunk codec on a delta chain, by depth.
//!
//! One 256 KiB f32 chunk of pseudo-random weights (uniform in ±0.05, as a trained
//! layer's look), then `MAX` dense steps (every element changed by up to a relative
//! 1e-4, a different factor per element and step, as `bench_report`'s dense rows), each
//! step encoded as a delta on the one before (the first in full; `encode` takes
//! difference deltas). For each depth `d` (0 = the full chunk), the chain of `d` deltas
//! on the full chunk is decoded with
//! `codec::decode_chain` on this thread: the median time per chain and the rate in GB/s
//! of decoded bytes (one chunk out per chain) and of links decoded (one chunk's length
//! per link). Also the time of a memcpy and a BLAKE3 hash of one chunk, as floors.
//! Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that other programs
//! on a loaded machine do not count: per-core rates. Last, for each bound `K` on the
//! deltas of a chain, what versions cost on average when a chain is a full chunk and `K`
//! deltas: encoded bytes and decode time per version. Encoding is timed too: a full
//! chunk and a delta, per core.
//!
//! ```text
//! cargo run --release --example codec_speed [-- --width 2] [--reps 200]
//! ```

use std::hint::black_box;

/// This thread's CPU time in seconds.
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

use tensor_history::codec::{decode_chain, encode};
use tensor_history::ContentHash;

const CHUNK: usize = 256 * 1024;
const MAX: usize = 8;

fn noise(i: usize, step: usize) -> f32 {
    let mut z = (step as u64) << 32 ^ i as u64;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut width = 4;
    let mut reps = 200;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--width" => width = args[i + 1].parse().expect("--width N"),
            "--reps" => reps = args[i + 1].parse().expect("--reps N"),
            a => panic!("unknown argument {a}"),
        }
        i += 2;
    }
    let n = CHUNK / 4;
    let mut x: Vec<f32> = (0..n).map(|i| noise(i, 0) * 0.05).collect();
    let to_bytes = |x: &[f32]| -> Vec<u8> {
        if width == 2 {
            x.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect()
        } else {
            x.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
    };
    let mut raws = vec![to_bytes(&x)];
    for step in 1..=MAX {
        for (i, v) in x.iter_mut().enumerate() {
            *v -= 1e-4 * *v * noise(i, step);
        }
        raws.push(to_bytes(&x));
    }
    let ids: Vec<ContentHash> = raws.iter().map(|r| ContentHash::of_bytes(r)).collect();
    let mut links = vec![encode(&raws[0], width, None)];
    for s in 1..=MAX {
        links.push(encode(&raws[s], width, Some((&ids[s - 1], &raws[s - 1]))));
    }
    let len = raws[0].len();
    println!(
        "chunk {len} bytes, width {width}; encoded: full {} bytes, deltas {:?}",
        links[0].len(),
        links[1..].iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    let time = |f: &mut dyn FnMut()| -> f64 {
        let v = (0..reps)
            .map(|_| {
                let t = cpu_now();
                f();
                cpu_now() - t
            })
            .collect();
        median(v)
    };
    let mut dst = vec![0u8; len];
    let t_copy = time(&mut || {
        dst.copy_from_slice(black_box(&raws[0]));
        black_box(&dst);
    });
    let t_hash = time(&mut || {
        black_box(ContentHash::of_bytes(black_box(&raws[0])));
    });
    println!(
        "memcpy {:.1} us ({:.2} GB/s), blake3 {:.1} us ({:.2} GB/s)",
        t_copy * 1e6,
        len as f64 / t_copy / 1e9,
        t_hash * 1e6,
        len as f64 / t_hash / 1e9
    );
    // Encoding (what a save spends per chunk): the full chunk, and a delta on its
    // predecessor, each chosen by `encode` as a save chooses.
    let t_enc_full = time(&mut || {
        black_box(encode(black_box(&raws[0]), width, None));
    });
    let t_enc_delta = time(&mut || {
        black_box(encode(
            black_box(&raws[1]),
            width,
            Some((&ids[0], &raws[0])),
        ));
    });
    println!(
        "encode: full {:.1} us ({:.2} GB/s), delta {:.1} us ({:.2} GB/s)",
        t_enc_full * 1e6,
        len as f64 / t_enc_full / 1e9,
        t_enc_delta * 1e6,
        len as f64 / t_enc_delta / 1e9
    );
    // Each plane of the full chunk and of the first delta: stored bytes and the time
    // of decompressing it alone (zstd planes).
    for (k, l) in links[..2].iter().enumerate() {
        let h = l.header();
        let mut at = h.len();
        for p in 0..h.width {
            let sl = h.plane_lens[p] as usize;
            let src = &l.as_bytes()[at..at + sl];
            at += sl;
            // The plane itself, to time compressing it (what the encoder tries).
            let n = len / h.width;
            let mut plane = vec![0u8; n];
            for (i, b) in plane.iter_mut().enumerate() {
                let at = i * h.width + p;
                *b = raws[k][at] ^ if k == 0 { 0 } else { raws[k - 1][at] };
            }
            // The codec's settings (see `codec::ZSTD_LEVEL`).
            use zstd::zstd_safe::{CParameter, ParamSwitch};
            let mut c =
                zstd::bulk::Compressor::new(tensor_history::codec::ZSTD_LEVEL).expect("zstd");
            c.set_parameter(CParameter::MinMatch(tensor_history::codec::ZSTD_MIN_MATCH))
                .expect("zstd");
            c.set_parameter(CParameter::LiteralCompressionMode(ParamSwitch::Enable))
                .expect("zstd");
            let tc = time(&mut || {
                black_box(c.compress(black_box(&plane)).expect("compress"));
            });
            if h.raw_planes >> p & 1 == 1 {
                println!(
                    "link {k} plane {p}: raw {sl} bytes (compress tried {:.1} us)",
                    tc * 1e6
                );
                continue;
            }
            let mut out = vec![0u8; len / h.width];
            let mut d = zstd::bulk::Decompressor::new().expect("zstd");
            let t = time(&mut || {
                d.decompress_to_buffer(src, &mut out[..]).expect("frame");
                black_box(&out);
            });
            println!(
                "link {k} plane {p}: zstd {sl} bytes ({:.3}), compress {:.1} us, decompress {:.1} us ({:.2} GB/s)",
                sl as f64 / out.len() as f64,
                tc * 1e6,
                t * 1e6,
                out.len() as f64 / t / 1e9
            );
        }
    }
    println!("depth\tus_per_chain\tGB/s_out\tGB/s_links");
    let mut per_depth = Vec::new();
    for (d, id) in ids.iter().enumerate() {
        let chain: Vec<&[u8]> = (0..=d).rev().map(|s| links[s].as_bytes()).collect();
        let t = time(&mut || {
            let b = decode_chain(&chain, None, id, len).expect("decodes");
            black_box(b);
        });
        println!(
            "{d}\t{:.1}\t{:.3}\t{:.3}",
            t * 1e6,
            len as f64 / t / 1e9,
            (len * (d + 1)) as f64 / t / 1e9
        );
        per_depth.push(t);
    }
    println!("K\tbytes_per_version\tus_per_version\tGB/s_out");
    for k in 1..=MAX {
        let bytes = links[..=k].iter().map(|l| l.len()).sum::<usize>() as f64 / (k + 1) as f64;
        let t = per_depth[..=k].iter().sum::<f64>() / (k + 1) as f64;
        println!(
            "{k}\t{bytes:.0} ({:.3})\t{:.1}\t{:.3}",
            bytes / len as f64,
            t * 1e6,
            len as f64 / t / 1e9
        );
    }
}
