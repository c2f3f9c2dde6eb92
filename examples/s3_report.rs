//! The repository on object storage, measured against plain requests of the same bytes
//! through the same client (feature `s3`):
//!
//! 1. first save of a model vs plain PUTs of the same bytes in 32 MiB objects (the pack
//!    size) with the same part size;
//! 2. save after changing 1% of the chunks: bytes and requests sent;
//! 3. reading every tensor of the saved version from a fresh `open` vs plain ranged GETs
//!    of the same chunk ranges.
//!
//! ```text
//! cargo run --release --features s3 --example s3_report -- --repo s3://bucket/bench --mib 1024
//! ```
//!
//! Buffers are filled (prefaulted) before each timed step; each pair runs side by side.

mod common;

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use common::Flags;
use ndarray::{Array, IxDyn};
use tensor_history::{Backend, Config, ObjectStoreBackend, RequestStats, Store};

const USAGE: &str = "usage: s3_report --repo s3://bucket/prefix [--mib N]";
const TENSOR_MIB: usize = 64;
const PACK: usize = 32 << 20;

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn line(what: &str, r: &RequestStats) {
    println!(
        "{what}: {} requests ({} PUT, {} POST, {} GET, {} list), {:.2} MiB sent, {:.2} MiB received",
        r.requests(),
        r.puts,
        r.posts,
        r.gets,
        r.lists,
        mib(r.bytes_sent),
        mib(r.bytes_received)
    );
}

fn main() -> Result<(), Box<dyn Error>> {
    let flags = common::opts_or_exit(
        Flags::parse(std::env::args().skip(1), &["repo", "mib"]),
        USAGE,
    );
    let repo = flags
        .string("repo")
        .ok_or("--repo s3://bucket/prefix is required")?;
    let total_mib: usize = flags.number("mib", 1024)?;
    let tensors = (total_mib / TENSOR_MIB).max(1);
    let n = TENSOR_MIB << 18; // f32 elements per tensor
    let backend = Arc::new(ObjectStoreBackend::open(&format!("{repo}/repo"))?);
    let plain = ObjectStoreBackend::open(&format!("{repo}/plain"))?;
    let config = Config::default();
    let chunk = config.chunk_bytes;
    println!(
        "model: {tensors} tensors x {TENSOR_MIB} MiB = {} MiB, chunks of {} KiB, parts of {} MiB",
        tensors * TENSOR_MIB,
        chunk >> 10,
        backend.options().part_size >> 20
    );

    // 1. First save vs plain PUTs of the same bytes.
    let mut s = Store::with_config(config.clone())?;
    for t in 0..tensors {
        let a = Array::from_shape_fn(IxDyn(&[n]), |i| (i[0] * 7 + t * 13) as f32 * 1e-3);
        s.insert(&format!("layer{t:03}"), &a)?;
    }
    s.commit("model")?;
    let blob: Vec<u8> = (0..PACK).map(|i| (i * 31 % 251) as u8).collect();
    let r0 = backend.stats();
    let t = Instant::now();
    let saved = s.save_to(backend.clone() as Arc<dyn Backend>)?;
    let save_s = t.elapsed().as_secs_f64();
    let first = backend.stats().since(&r0);
    let t = Instant::now();
    let objects = ((tensors * TENSOR_MIB) << 20).div_ceil(PACK);
    for i in 0..objects {
        plain.put(&format!("obj{i}"), &blob)?;
    }
    let plain_s = t.elapsed().as_secs_f64();
    println!(
        "\nfirst save: {save_s:.2} s ({} packs, {:.0} MiB); plain PUTs of {objects} x 32 MiB: {plain_s:.2} s; throughput ratio {:.2} (target >= 0.8)",
        saved.packs_written,
        mib(saved.bytes_written),
        plain_s / save_s
    );
    line("  save requests", &first);

    // 2. Change 1% of the chunks (spread over all tensors), save again.
    let per_chunk = chunk / 4;
    let mut changed_chunks = 0usize;
    for t in 0..tensors {
        let name = format!("layer{t:03}");
        let chunks_here = n / per_chunk;
        let step = 100;
        let mut k = t % step;
        while k < chunks_here {
            s.update_range::<f32>(&name, k * per_chunk..k * per_chunk + 1, |_, v| v[0] += 1.0)?;
            changed_chunks += 1;
            k += step;
        }
    }
    s.commit("1% change")?;
    let r1 = backend.stats();
    let t = Instant::now();
    let saved = s.save()?;
    let sparse_s = t.elapsed().as_secs_f64();
    let sparse = backend.stats().since(&r1);
    let changed_bytes = (changed_chunks * chunk) as u64;
    println!(
        "\n1% save: {changed_chunks} changed chunks = {:.2} MiB; sent {:.2} MiB = {:.3} x changed ({}); {} PUTs; {sparse_s:.2} s",
        mib(changed_bytes),
        mib(sparse.bytes_sent),
        sparse.bytes_sent as f64 / changed_bytes as f64,
        if sparse.bytes_sent as f64 <= 1.1 * changed_bytes as f64 + f64::from(1u32 << 20) {
            "within 1.1 x + 1 MiB"
        } else {
            "OVER 1.1 x + 1 MiB"
        },
        sparse.puts,
    );
    println!(
        "  (saved {} chunks in {} packs)",
        saved.chunks_written, saved.packs_written
    );
    line("  1% save requests", &sparse);
    drop(s);

    // 3. Read every tensor from a fresh open vs plain ranged GETs of the same ranges.
    let r2 = backend.stats();
    let t = Instant::now();
    let fresh = Store::open_backend(backend.clone() as Arc<dyn Backend>, config)?;
    let mut sum = 0f64;
    for name in fresh.names() {
        let a = fresh.get::<f32>(&name)?;
        sum += f64::from(a[[0]]);
    }
    let read_s = t.elapsed().as_secs_f64();
    let read = backend.stats().since(&r2);
    let packs = backend.list("packs/")?;
    let t = Instant::now();
    let mut got = 0u64;
    for p in &packs {
        let mut off = 0;
        while off + chunk as u64 <= p.size {
            got += backend.get_range(&p.key, off..off + chunk as u64)?.len() as u64;
            off += chunk as u64;
        }
    }
    let plain_read_s = t.elapsed().as_secs_f64();
    println!(
        "\nread all tensors: {read_s:.2} s; plain ranged GETs of {:.0} MiB in {} KiB ranges: {plain_read_s:.2} s; ratio {:.2} (target >= 0.8) [checksum {sum:.1}]",
        mib(got),
        chunk >> 10,
        plain_read_s / read_s
    );
    line("  read requests", &read);
    Ok(())
}
