//! What the chunk codec saves on real training checkpoints, against plain zstd.
//!
//! Reads the safetensors checkpoints that `bindings/python/benches/minilm_checkpoints.py`
//! writes (all-MiniLM-L6-v2 parameters and AdamW state after each fine-tuning step), cuts
//! every tensor into 256 KiB chunks, and codes two sequences of 10 checkpoints (steps
//! 1..=10, and steps 5, 10, ..., 50) in float32 and in bfloat16 (the float32 values
//! rounded), each way:
//!
//! - `zstd`: every chunk zstd-compressed alone (level 3), no byte planes;
//! - `planes`: every chunk grouped into byte planes, then zstd;
//! - `xor+zstd`: every chunk XOR-ed with the same chunk of the previous checkpoint, then
//!   zstd, no planes (the first checkpoint plain zstd);
//! - `codec`: `tensor_history::codec::encode` with the previous checkpoint's chunk as
//!   base (difference delta + planes + zstd where that saves most, the first
//!   checkpoint planes): what format 3 repositories and the memory budget store;
//! - `codec_xor`: the same with XOR deltas (`Delta::Xor`), what format 2 stores.
//!
//! Output: one tab-separated line per sequence and method: raw bytes, coded bytes, and
//! raw / coded; then single-thread encode and decode rates of the codec with each delta,
//! measured alternately in the same run (noise on a loaded machine: compare only the
//! ratios). Every coded chunk is decoded and compared.
//! A sequence whose checkpoints are not all there (`--steps 10` writes the first only)
//! is skipped with a note.
//!
//! ```text
//! HF_HUB_OFFLINE=1 python bindings/python/benches/minilm_checkpoints.py /tmp/ckpt --steps 50
//! cargo run --release --example codec_ratios -- /tmp/ckpt
//! ```

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use safetensors::SafeTensors;
use tensor_history::codec::{decode, encode, encode_with, Delta};
use tensor_history::ContentHash;

const CHUNK: usize = 256 * 1024;

/// One checkpoint: its chunks, in file order, and the element width.
struct Checkpoint {
    chunks: Vec<Vec<u8>>,
}

fn load(path: &Path, bf16: bool) -> Result<Checkpoint, Box<dyn Error>> {
    let data = std::fs::read(path)?;
    let st = SafeTensors::deserialize(&data)?;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let mut chunks = Vec::new();
    for n in names {
        let t = st.tensor(&n)?;
        let bytes: Vec<u8> = if bf16 {
            t.data()
                .chunks_exact(4)
                .flat_map(|b| {
                    let x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    half::bf16::from_f32(x).to_le_bytes()
                })
                .collect()
        } else {
            t.data().to_vec()
        };
        chunks.extend(bytes.chunks(CHUNK).map(<[u8]>::to_vec));
    }
    Ok(Checkpoint { chunks })
}

fn zstd3(b: &[u8]) -> usize {
    zstd::bulk::compress(b, 3).map_or(b.len(), |v| v.len().min(b.len()))
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: codec_ratios CHECKPOINT_DIR")?,
    );
    let seqs: [(&str, Vec<u32>); 2] = [
        ("every_step", (1..=10).collect()),
        ("every_5_steps", (1..=10).map(|i| i * 5).collect()),
    ];
    println!("sequence\tdtype\tmethod\traw_bytes\tcoded_bytes\tratio");
    // Encode and decode time of each delta ([difference, XOR]).
    let (mut enc_time, mut dec_time) = ([Duration::ZERO; 2], [Duration::ZERO; 2]);
    let mut timed_bytes = 0usize;
    for (seq, steps) in &seqs {
        let last = dir.join(format!("step-{:04}.safetensors", steps[steps.len() - 1]));
        if !last.exists() {
            eprintln!("{seq}: skipped ({} is missing)", last.display());
            continue;
        }
        for bf16 in [false, true] {
            let dtype = if bf16 { "bf16" } else { "f32" };
            let width = if bf16 { 2 } else { 4 };
            let (mut raw, mut plain, mut planes, mut xor) = (0, 0, 0, 0);
            let mut codec = [0usize; 2];
            let mut prev: Option<Checkpoint> = None;
            for s in steps {
                let ck = load(&dir.join(format!("step-{s:04}.safetensors")), bf16)?;
                for (i, c) in ck.chunks.iter().enumerate() {
                    raw += c.len();
                    plain += zstd3(c);
                    let p = encode(c, width, None);
                    planes += p.len();
                    let base = prev.as_ref().map(|p| &p.chunks[i][..]);
                    let x: Vec<u8> = match base {
                        Some(b) => c.iter().zip(b).map(|(a, b)| a ^ b).collect(),
                        None => c.clone(),
                    };
                    xor += zstd3(&x);
                    let bid = base.map(ContentHash::of_bytes);
                    for (k, delta) in [Delta::Diff, Delta::Xor].into_iter().enumerate() {
                        let t0 = Instant::now();
                        let e = encode_with(c, width, bid.as_ref().zip(base), delta);
                        let t1 = Instant::now();
                        let back = decode(e.as_bytes(), &ContentHash::of_bytes(c), c.len(), base)?;
                        let t2 = Instant::now();
                        enc_time[k] += t1 - t0;
                        dec_time[k] += t2 - t1;
                        assert_eq!(&*back, &c[..], "a decoded chunk differs");
                        codec[k] += e.len();
                    }
                    timed_bytes += c.len();
                }
                prev = Some(ck);
            }
            for (m, v) in [
                ("none", raw),
                ("zstd", plain),
                ("planes", planes),
                ("xor+zstd", xor),
                ("codec", codec[0]),
                ("codec_xor", codec[1]),
            ] {
                println!(
                    "{seq}\t{dtype}\t{m}\t{raw}\t{v}\t{:.3}",
                    raw as f64 / v as f64
                );
            }
        }
    }
    let mb = timed_bytes as f64 / 1e6;
    for (k, name) in ["difference deltas", "XOR deltas"].iter().enumerate() {
        eprintln!(
            "codec with {name}, one thread: encode {:.0} MB/s, decode {:.0} MB/s (decode \
             includes the BLAKE3 check)",
            mb / enc_time[k].as_secs_f64(),
            mb / dec_time[k].as_secs_f64()
        );
    }
    Ok(())
}
