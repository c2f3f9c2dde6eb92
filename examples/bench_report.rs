//! Side-by-side report of tensor-history against deep copies of the same tensors.
//!
//! Runs every scenario of the benchmark issue in one process, alternating the baseline
//! and the store run by run (the order rotates every repetition, after one untimed
//! warm-up run of each), and prints one tab-separated line per scenario:
//!
//! `scenario`, `metric`, `baseline`, `store`, `ratio` (the header line names them),
//!
//! `metric` is `ms` (the median of the runs) or `bytes`; `ratio` = baseline / store, so
//! above 1 means the store wins. Machine facts go to stderr, the table alone to stdout.
//!
//! ```text
//! cargo run --release --example bench_report                 # 1 GiB in 64 f32 tensors
//! cargo run --release --example bench_report -- --quick      # 256 MiB, well under a minute
//! cargo run --release --example bench_report -- --quick --chunk-bytes 131072
//! cargo run --release --example bench_report -- --repo-only   # the repository rows
//! ```
//!
//! Options: `--quick`, `--size-mib N`, `--chunk-bytes N`, `--reps N` (runs per side,
//! default 11), `--serial-baseline` (the baseline on one thread; by default it runs on
//! as many threads as the store: rayon over the 64 tensors), `--repo-only` (only the
//! rows that save to a repository, against safetensors files), `--dense-only` (only the
//! rows of dense histories: `memory_dense_100v`, `restore_encoded`, `disk_dense_10v`,
//! `save_dense_vs_safetensors`), `--dir PATH` (where the repository rows write; default
//! the system's temporary directory).
//!
//! `memory_dense_100v_peak_rss` runs in a child process (this program again, with the
//! internal flag `--dense-memory-child`), which builds the dense history of
//! `memory_dense_100v` and reads its peak resident set (`VmHWM` of `/proc/self/status`):
//! baseline = the budget plus one model (what the budget promises to hold at most, with
//! room for the model being trained), store = that peak; a ratio of 1 or more means the
//! budget held. `memory_dense_100v_saved_peak_rss` is the same with the store bound to a
//! repository (in `--dir`) and every version saved in the background as it is
//! committed: the budget may then evict what the repository holds, as
//! `Config::memory_budget` documents. Linux only (elsewhere the rows are left out).
//!
//! `--minilm DIR` (or the environment variable `TH_MINILM_DIR`) adds, to `--dense-only`,
//! the same two measures on real training data: the first 10 checkpoints
//! (`step-0001.safetensors` ... in file-name order) that
//! `bindings/python/benches/minilm_checkpoints.py DIR --steps 10` writes (all-MiniLM-L6-v2
//! fine-tuned with AdamW, every parameter and its AdamW state, 260 MiB per step), in
//! float32 and rounded to bfloat16: `minilm_memory_10v_*` (10 versions under a budget of
//! 3 checkpoints: deep copies / held bytes) and `minilm_restore_encoded_*` (restore and
//! read the 5th version, encoded, against HEAD). Not run in CI (the files take 2.6 GB).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;
use tensor_history::{Config, Store, VersionId, DEFAULT_CHUNK_BYTES};

mod repo_bench;
mod timing;

use timing::{clock, interleave, timed, Res};

/// Scenario names, in the order the report prints them.
const SCENARIOS: [&str; 19] = [
    "commit_unchanged",
    "trial_sparse_0.1pct",
    "trial_sparse_1pct",
    "trial_sparse_10pct",
    "trial_dense_vs_update",
    "trial_dense_vs_deep_copy",
    "restore_into_1pct",
    "write_unchanged",
    "diff_1pct",
    "memory_100v_1pct",
    "memory_dense_100v",
    "memory_dense_100v_peak_rss",
    "memory_dense_100v_saved_peak_rss",
    "restore_encoded",
    "minilm_memory_10v_f32",
    "minilm_restore_encoded_f32",
    "minilm_memory_10v_bf16",
    "minilm_restore_encoded_bf16",
    "verify_throughput",
];

const TENSORS: usize = 64;
const COLS: usize = 1024;
const LR: f32 = 1e-3;

struct Opts {
    size_mib: usize,
    chunk_bytes: usize,
    reps: usize,
    serial_baseline: bool,
    repo_only: bool,
    dense_only: bool,
    dense_memory_child: bool,
    /// The child saves each version into a repository in this directory (in the
    /// background, as it is committed): `memory_dense_100v_saved_peak_rss`.
    dense_memory_saved: Option<PathBuf>,
    minilm: Option<PathBuf>,
    dir: PathBuf,
}

fn parse_args() -> Res<Opts> {
    let mut o = Opts {
        size_mib: 1024,
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        reps: 11,
        serial_baseline: false,
        repo_only: false,
        dense_only: false,
        dense_memory_child: false,
        dense_memory_saved: None,
        minilm: std::env::var_os("TH_MINILM_DIR").map(PathBuf::from),
        dir: std::env::temp_dir(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> Res<usize> {
            let v = args.next().ok_or(format!("{what} needs a value"))?;
            Ok(v.parse().map_err(|e| format!("{what} {v}: {e}"))?)
        };
        match a.as_str() {
            "--quick" => o.size_mib = 256,
            "--size-mib" => o.size_mib = num("--size-mib")?,
            "--chunk-bytes" => o.chunk_bytes = num("--chunk-bytes")?,
            "--reps" => o.reps = num("--reps")?.max(1),
            "--serial-baseline" => o.serial_baseline = true,
            "--repo-only" => o.repo_only = true,
            "--dense-only" => o.dense_only = true,
            "--dense-memory-child" => o.dense_memory_child = true,
            "--dense-memory-saved" => {
                o.dense_memory_saved = Some(
                    args.next()
                        .ok_or("--dense-memory-saved needs a value")?
                        .into(),
                )
            }
            "--minilm" => o.minilm = Some(args.next().ok_or("--minilm needs a value")?.into()),
            "--dir" => o.dir = args.next().ok_or("--dir needs a value")?.into(),
            "--bench" => {} // passed by `cargo bench --examples`; ignore
            other => return Err(format!("unknown argument `{other}`").into()),
        }
    }
    if o.size_mib == 0 {
        return Err("--size-mib must be at least 1".into());
    }
    Ok(o)
}

/// The model as the baseline holds it: 64 flat row-major f32 arrays of `rows x COLS`.
struct Model {
    rows: usize,
    names: Vec<String>,
    data: Vec<Vec<f32>>,
}

impl Model {
    fn new(size_mib: usize) -> Model {
        let elems = (size_mib << 20) / TENSORS / std::mem::size_of::<f32>();
        let rows = (elems / COLS).max(1);
        let names = (0..TENSORS)
            .map(|t| format!("layer{t:02}.weight"))
            .collect();
        let data = (0..TENSORS)
            .into_par_iter()
            .map(|t| {
                (0..rows * COLS)
                    .map(|i| 1.0 + ((i * 31 + t * 7) % 997) as f32 * 1e-3)
                    .collect()
            })
            .collect();
        Model { rows, names, data }
    }

    fn bytes(&self) -> usize {
        self.data.iter().map(|d| d.len() * 4).sum()
    }

    fn view(&self, t: usize) -> ArrayView2<'_, f32> {
        ArrayView2::from_shape((self.rows, COLS), &self.data[t][..]).expect("shape fits")
    }

    /// A zeroed buffer of the same shape, touched once so that no run pays page faults.
    fn zeroed_like(&self) -> Vec<Vec<f32>> {
        self.data
            .par_iter()
            .map(|d| vec![1.0f32; d.len()])
            .collect()
    }

    fn store(&self, config: Config) -> Res<Store> {
        let mut s = Store::with_config(config)?;
        for t in 0..TENSORS {
            s.insert(&self.names[t], &self.view(t))?;
        }
        Ok(s)
    }
}

/// `share` of all chunks (at least one), spread evenly over the model; `salt` shifts the
/// choice so that successive versions change different chunks. Each entry is a tensor
/// index and the chunk's flat element range (the store's own chunk boundaries).
fn pick_chunks(
    store: &Store,
    model: &Model,
    share: f64,
    salt: usize,
) -> Res<Vec<(usize, Range<usize>)>> {
    let t0 = store.tensor(&model.names[0])?;
    let per = t0.num_chunks();
    let total = per * TENSORS;
    let n = ((total as f64 * share).round() as usize).clamp(1, total);
    let stride = total / n;
    Ok((0..n)
        .map(|k| {
            let g = (k * stride + salt % stride.max(1)) % total;
            (g / per, t0.chunk_range(g % per))
        })
        .collect())
}

fn bump(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x += 1.0);
}

/// Step `step` of the dense history: at 0, pseudo-random weights (those of a trained
/// layer look random, not like the sweep model's ramp); after, every element changed by
/// up to a relative 1e-4 (an optimizer step's magnitude, a different factor per element
/// and step).
fn dense_step(store: &mut Store, dense: &Model, step: usize) -> Res<()> {
    for (t, name) in dense.names.iter().enumerate() {
        store.update::<f32>(name, |off, xs| {
            for (k, x) in xs.iter_mut().enumerate() {
                if step == 0 {
                    *x = noise(t, off + k, 0) * 0.05;
                } else {
                    *x -= 1e-4 * *x * noise(t, off + k, step);
                }
            }
        })?;
    }
    Ok(())
}

/// A pseudo-random value in [-1, 1) for element `i` of tensor `t` at `step` (splitmix64).
fn noise(t: usize, i: usize, step: usize) -> f32 {
    let mut z = (t as u64) << 48 ^ (step as u64) << 32 ^ i as u64;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

// ---- memory_dense_100v and restore_encoded: 100 dense steps under a budget --------
// A model of at most 64 MiB (a quarter of --size-mib), pseudo-random weights, every
// element changed by up to a relative 1e-4 per step (an optimizer step's magnitude,
// a different factor per element and step),
// each step committed with a memory budget of 3 model sizes. Deep copies hold 101
// models; the store, after the background passes and a final
// enforce_memory_budget, holds `held_bytes`. Then restore + read of an encoded
// version (the 50th, inside a delta chain) against HEAD (raw), decoded afresh each
// run.
/// The dense history of `memory_dense_100v`: the model, and a store with a budget of 3
/// model sizes holding 101 dense versions, each tagged (the background passes done, the
/// budget enforced), with the ids of versions 1..=100.
///
/// With `saved`, the store is bound to a new repository there and every version is
/// saved in the background as it is committed (a save still running when the next
/// version is committed is waited for by the next `save_in_background`); the last save
/// is waited for before the budget is enforced.
fn dense_history(
    opts: &Opts,
    cfg: &dyn Fn(Option<usize>) -> Config,
    keep_model: bool,
    saved: Option<&std::path::Path>,
) -> Res<(Model, usize, Store, Vec<tensor_history::VersionId>)> {
    let mut dense = Model::new((opts.size_mib / 4).clamp(1, 64));
    let dsize = dense.bytes();
    let mut store = dense.store(Config {
        memory_budget: Some(3 * dsize),
        ..cfg(None)
    })?;
    if !keep_model {
        // The child measuring peak memory holds the model once: in the store.
        dense.data = Vec::new();
    }
    dense_step(&mut store, &dense, 0)?;
    let v0 = store.commit("v0")?;
    // Every version is tagged: the budget then keeps all 101 (encoded), as this row
    // measures, instead of letting the oldest go once the encoded history passes it.
    store.tag("dense-0", v0)?;
    if let Some(dir) = saved {
        store.save_as(dir)?;
    }
    let mut ids = Vec::new();
    let mut pending = None;
    for step in 1..=100 {
        dense_step(&mut store, &dense, step)?;
        let id = store.commit(&format!("v{step}"))?;
        store.tag(&format!("dense-{step}"), id)?;
        ids.push(id);
        if saved.is_some() {
            // The previous save's outcome (it has ended: this call waits for it).
            let next = store.save_in_background()?;
            if let Some(p) = pending.replace(next) {
                tensor_history::PendingSave::wait(p)?;
            }
        }
    }
    if let Some(p) = pending {
        p.wait()?;
    }
    store.enforce_memory_budget();
    Ok((dense, dsize, store, ids))
}

/// CPU time of this process (all threads), in seconds: on a machine shared with other
/// work, per-core rates are bytes per CPU second, not per wall second.
fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts)
    };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// A line of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), if there is one.
fn proc_status_bytes(key: &str) -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    let kb: usize = line[key.len()..]
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The child of `memory_dense_100v_peak_rss`: build the dense history with the model
/// held only by the store, and print `peak_rss budget model held` (bytes) on stdout.
fn dense_memory_child(opts: &Opts) -> Res<()> {
    let cfg = |max_versions| Config {
        chunk_bytes: opts.chunk_bytes,
        max_versions,
        ..Config::default()
    };
    let before = proc_status_bytes("VmRSS").ok_or("no VmRSS in /proc/self/status")?;
    let (_, dsize, store, _) =
        dense_history(opts, &cfg, false, opts.dense_memory_saved.as_deref())?;
    let peak = proc_status_bytes("VmHWM").ok_or("no VmHWM in /proc/self/status")?;
    println!(
        "{peak} {} {dsize} {} {before}",
        3 * dsize,
        store.stats().held_bytes
    );
    Ok(())
}

/// `memory_dense_100v_peak_rss`: the child's peak resident set against the budget plus
/// one model. With `saved` (a directory for the repository, removed after),
/// `memory_dense_100v_saved_peak_rss`: the same with every version saved as it is
/// committed, so that the budget can evict what the repository holds.
fn dense_peak_rss_row(
    opts: &Opts,
    saved: Option<&std::path::Path>,
    report: &mut Report,
) -> Res<()> {
    if !cfg!(target_os = "linux") {
        return Ok(());
    }
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args([
        "--dense-memory-child",
        "--size-mib",
        &opts.size_mib.to_string(),
        "--chunk-bytes",
        &opts.chunk_bytes.to_string(),
    ]);
    if let Some(dir) = saved {
        cmd.arg("--dense-memory-saved").arg(dir);
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output()?;
    if let Some(dir) = saved {
        let _ = std::fs::remove_dir_all(dir);
    }
    if !out.status.success() {
        return Err(format!("dense memory child: {}", out.status).into());
    }
    let text = String::from_utf8(out.stdout)?;
    let v: Vec<usize> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [peak, budget, model, held, start] = v[..] else {
        return Err(format!("dense memory child printed `{text}`").into());
    };
    let row = if saved.is_some() {
        "memory_dense_100v_saved_peak_rss"
    } else {
        "memory_dense_100v_peak_rss"
    };
    eprintln!(
        "  {row}: peak RSS {peak} bytes ({start} before the model), budget {budget}, model {model}, held at the end {held}"
    );
    report.add(row, "bytes", (budget + model) as f64, peak as f64);
    Ok(())
}

fn dense_rows(
    opts: &Opts,
    cfg: &dyn Fn(Option<usize>) -> Config,
    reps: usize,
    root: &std::path::Path,
    report: &mut Report,
) -> Res<()> {
    let (dense, dsize, store, ids) = dense_history(opts, cfg, true, None)?;
    let stats = store.stats();
    eprintln!(
        "  memory_dense_100v: model {dsize} bytes, {} versions, held {} bytes ({} encoded raw bytes in {})",
        stats.versions, stats.held_bytes, stats.encoded_bytes, stats.encoded_held_bytes
    );
    report.add(
        "memory_dense_100v",
        "bytes",
        (101 * dsize) as f64,
        stats.held_bytes as f64,
    );
    let (head, old) = (ids[99], ids[49]);
    let dnames = &dense.names;
    let store = std::cell::RefCell::new(store);
    let read = |s: &Store| -> Res<()> {
        for n in dnames {
            black_box(s.get::<f32>(n)?);
        }
        Ok(())
    };
    let m = restore_raw_vs_encoded(&store, head, old, &read, reps)?;
    report.add("restore_encoded", "ms", m[0], m[1]);
    {
        // Where an encoded restore's time goes: decoding (loading every chunk), then the
        // copies out; and the decoded bytes per second per thread.
        let mut s = store.borrow_mut();
        s.restore(head)?;
        s.enforce_memory_budget();
        let (mut load, mut load_cpu, mut copy) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            s.restore(head)?;
            s.enforce_memory_budget();
            s.restore(old)?;
            let cpu = process_cpu_seconds();
            load.push(
                timed(|| {
                    for n in dnames {
                        s.tensor(n)?;
                    }
                    Ok(())
                })?
                .as_secs_f64(),
            );
            load_cpu.push(process_cpu_seconds() - cpu);
            copy.push(timed(|| read(&s))?.as_secs_f64());
        }
        let (l, lc, c) = (
            timing::median(load),
            timing::median(load_cpu),
            timing::median(copy),
        );
        eprintln!(
            "  restore_encoded: decode {:.1} ms wall ({:.2} GB/s), {:.1} ms of CPU ({:.2} GB/s per core busy); copies out {:.1} ms",
            l * 1e3,
            dsize as f64 / l / 1e9,
            lc * 1e3,
            dsize as f64 / lc / 1e9,
            c * 1e3
        );
    }
    drop(store);
    dense_peak_rss_row(opts, None, report)?;
    std::fs::create_dir_all(root)?;
    dense_peak_rss_row(opts, Some(&root.join("saved_peak_rss")), report)?;
    repo_bench::dense(&dense, cfg, reps, root, report)
}

/// One checkpoint of `--minilm`: each tensor's name, shape and float32 values.
type Checkpoint = Vec<(String, Vec<usize>, Vec<f32>)>;

fn read_checkpoint(path: &std::path::Path) -> Res<Checkpoint> {
    let data = std::fs::read(path)?;
    let st = safetensors::SafeTensors::deserialize(&data)?;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let t = st.tensor(&n)?;
        if t.dtype() != safetensors::Dtype::F32 {
            return Err(
                format!("{}: tensor {n} is {:?}, not F32", path.display(), t.dtype()).into(),
            );
        }
        let v = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.push((n, t.shape().to_vec(), v));
    }
    Ok(out)
}

/// Put checkpoint `ck` into `store` as `T` (insert at the first, write after).
fn put_checkpoint<T: tensor_history::Element>(
    store: &mut Store,
    ck: &Checkpoint,
    first: bool,
    conv: fn(f32) -> T,
) -> Res<()> {
    for (name, shape, v) in ck {
        let a = ndarray::ArrayD::from_shape_vec(
            ndarray::IxDyn(shape),
            v.iter().map(|x| conv(*x)).collect(),
        )?;
        if first {
            store.insert(name, &a)?;
        } else {
            store.write(name, &a)?;
        }
    }
    Ok(())
}

// ---- minilm_*: the dense rows on real AdamW checkpoints (--minilm DIR) ---------------
fn minilm_rows(dir: &std::path::Path, opts: &Opts, reps: usize, report: &mut Report) -> Res<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files.truncate(10);
    if files.len() < 2 {
        return Err(format!("--minilm {}: fewer than 2 checkpoints", dir.display()).into());
    }
    for bf16 in [false, true] {
        let (mem_row, restore_row, width) = if bf16 {
            ("minilm_memory_10v_bf16", "minilm_restore_encoded_bf16", 2)
        } else {
            ("minilm_memory_10v_f32", "minilm_restore_encoded_f32", 4)
        };
        let mut store: Option<Store> = None;
        let mut size = 0;
        let mut ids = Vec::new();
        for (k, f) in files.iter().enumerate() {
            let ck = read_checkpoint(f)?;
            if k == 0 {
                size = ck.iter().map(|(_, _, v)| v.len() * width).sum::<usize>();
                store = Some(Store::with_config(Config {
                    chunk_bytes: opts.chunk_bytes,
                    memory_budget: Some(3 * size),
                    ..Config::default()
                })?);
            }
            let s = store.as_mut().expect("made at the first checkpoint");
            if bf16 {
                put_checkpoint(s, &ck, k == 0, half::bf16::from_f32)?;
            } else {
                put_checkpoint(s, &ck, k == 0, |x| x)?;
            }
            ids.push(s.commit(&format!("step {}", k + 1))?);
        }
        let mut s = store.expect("at least 2 checkpoints");
        s.enforce_memory_budget();
        let stats = s.stats();
        let n = ids.len();
        eprintln!(
            "  {mem_row}: {n} checkpoints of {size} bytes, held {} bytes ({} encoded raw bytes in {})",
            stats.held_bytes, stats.encoded_bytes, stats.encoded_held_bytes
        );
        report.add(mem_row, "bytes", (n * size) as f64, stats.held_bytes as f64);
        let names: Vec<String> = s.names();
        let (head, old) = (ids[n - 1], ids[(n - 1) / 2]);
        let read = |s: &Store| -> Res<()> {
            for name in &names {
                if bf16 {
                    black_box(s.get::<half::bf16>(name)?);
                } else {
                    black_box(s.get::<f32>(name)?);
                }
            }
            Ok(())
        };
        let store = std::cell::RefCell::new(s);
        let m = restore_raw_vs_encoded(&store, head, old, &read, reps)?;
        report.add(restore_row, "ms", m[0], m[1]);
        let mut s = store.into_inner();
        let mut cpu = Vec::new();
        for _ in 0..reps {
            s.restore(head)?;
            s.enforce_memory_budget();
            s.restore(old)?;
            let c = process_cpu_seconds();
            for name in &names {
                s.tensor(name)?;
            }
            cpu.push(process_cpu_seconds() - c);
        }
        let c = timing::median(cpu);
        eprintln!(
            "  {restore_row}: decode {:.1} ms of CPU ({:.2} GB/s per core busy)",
            c * 1e3,
            size as f64 / c / 1e9
        );
    }
    Ok(())
}

fn copy_all(src: &[Vec<f32>], dst: &mut [Vec<f32>]) {
    dst.par_iter_mut()
        .zip(src.par_iter())
        .for_each(|(d, s)| d.copy_from_slice(s));
}

fn sgd_in_place(w: &mut [Vec<f32>], g: &[Vec<f32>]) {
    w.par_iter_mut().zip(g.par_iter()).for_each(|(w, g)| {
        for (w, g) in w.iter_mut().zip(g) {
            *w -= LR * *g;
        }
    });
}

struct Report {
    rows: BTreeMap<&'static str, (&'static str, f64, f64)>,
}

impl Report {
    fn add(&mut self, name: &'static str, metric: &'static str, base: f64, store: f64) {
        eprintln!(
            "  {name:<26} baseline {:>12} {metric}  store {:>12} {metric}  ratio {:.2}",
            fmt_num(base),
            fmt_num(store),
            base / store
        );
        self.rows.insert(name, (metric, base, store));
    }

    fn print(&self) {
        println!("scenario\tmetric\tbaseline\tstore\tratio");
        for name in SCENARIOS.iter().chain(&repo_bench::SCENARIOS) {
            if let Some((metric, b, s)) = self.rows.get(name) {
                println!(
                    "{name}\t{metric}\t{}\t{}\t{:.2}",
                    fmt_num(*b),
                    fmt_num(*s),
                    b / s
                );
            }
        }
    }
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{v:.0}")
    } else if v >= 100.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.6}")
    }
}

/// Medians of a restore of `head` (held raw) and then `read`, against the same of `old`
/// (held encoded), interleaved: the two sides of `restore_encoded`.
fn restore_raw_vs_encoded(
    store: &std::cell::RefCell<Store>,
    head: VersionId,
    old: VersionId,
    read: &dyn Fn(&Store) -> Res<()>,
    reps: usize,
) -> Res<Vec<f64>> {
    let mut base = || {
        let mut s = store.borrow_mut();
        timed(|| {
            s.restore(head)?;
            read(&s)
        })
    };
    let mut st = || {
        let mut s = store.borrow_mut();
        // Back to HEAD, and drop the decoded bytes the last run kept.
        s.restore(head)?;
        s.enforce_memory_budget();
        timed(|| {
            s.restore(old)?;
            read(&s)
        })
    };
    interleave(reps, &mut [&mut base, &mut st])
}

fn main() -> Res<()> {
    let opts = parse_args()?;
    if opts.dense_memory_child {
        return dense_memory_child(&opts);
    }
    let start = Instant::now();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let base_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(if opts.serial_baseline { 1 } else { cores })
        .build()?;
    let base_threads = base_pool.current_num_threads();

    let mut model = base_pool.install(|| Model::new(opts.size_mib));
    let size = model.bytes();
    let cfg = |max_versions| Config {
        chunk_bytes: opts.chunk_bytes,
        max_versions,
        ..Config::default()
    };
    let mut bufs = base_pool.install(|| model.zeroed_like());
    base_pool.install(|| copy_all(&model.data, &mut bufs));

    {
        let probe = model.store(cfg(None))?;
        let t = probe.tensor(&model.names[0])?;
        eprintln!(
            "machine: {cores} cores (available_parallelism); baseline on {base_threads} thread(s), store on rayon's global pool ({} threads)",
            rayon::current_num_threads()
        );
        eprintln!(
            "model: {} MiB in {TENSORS} f32 tensors of shape [{}, {COLS}]; chunk_bytes {} ({} elements, {} chunks per tensor, {} in all); {} runs per side",
            size >> 20,
            model.rows,
            opts.chunk_bytes,
            t.chunk_elems(),
            t.num_chunks(),
            t.num_chunks() * TENSORS,
            opts.reps
        );
    }
    let reps = opts.reps;
    let mut report = Report {
        rows: BTreeMap::new(),
    };
    let names = model.names.clone();
    let repo_root = opts
        .dir
        .join(format!("tensor-history-bench-{}", std::process::id()));
    if opts.dense_only {
        dense_rows(&opts, &cfg, reps, &repo_root.join("dense"), &mut report)?;
        if let Some(dir) = &opts.minilm {
            minilm_rows(dir, &opts, reps, &mut report)?;
        }
        let _ = std::fs::remove_dir_all(&repo_root);
        report.print();
        eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
        return Ok(());
    }
    if opts.repo_only {
        repo_bench::run(&model, &cfg, reps, &repo_root, &mut report)?;
        let _ = std::fs::remove_dir_all(&repo_root);
        report.print();
        eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
        return Ok(());
    }

    // ---- commit_unchanged: commit with nothing changed vs one deep copy -------------
    {
        let mut store = model.store(cfg(None))?;
        store.commit("init")?;
        let data = &model.data;
        let mut base = || clock(|| base_pool.install(|| copy_all(data, black_box(&mut bufs))));
        let mut st = || {
            timed(|| {
                black_box(store.commit("unchanged")?);
                Ok(())
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("commit_unchanged", "ms", m[0], m[1]);
    }

    // ---- write_unchanged: write of equal arrays vs a copy ----------------------------
    {
        let mut store = model.store(cfg(None))?;
        store.commit("init")?;
        let m_ref = &model;
        let mut base =
            || clock(|| base_pool.install(|| copy_all(&m_ref.data, black_box(&mut bufs))));
        let mut st = || {
            timed(|| {
                let mut changed = 0;
                for t in 0..TENSORS {
                    changed += store.write(&m_ref.names[t], &m_ref.view(t))?.chunks_changed;
                }
                assert_eq!(black_box(changed), 0, "write of equal data changed chunks");
                Ok(())
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("write_unchanged", "ms", m[0], m[1]);
    }

    // ---- verify_throughput: verify() vs blake3 over the same bytes on one thread -----
    {
        let mut store = model.store(cfg(None))?;
        store.commit("init")?;
        let data = &model.data;
        let mut base = || {
            timed(|| {
                let mut h = blake3::Hasher::new();
                for d in data {
                    h.update(bytemuck::cast_slice(d));
                }
                black_box(h.finalize());
                Ok(())
            })
        };
        let mut st = || timed(|| Ok(store.verify()?));
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("verify_throughput", "ms", m[0], m[1]);
    }

    // ---- restore_into_1pct and diff_1pct: versions A and B differ in 1% of chunks ----
    {
        let mut store = model.store(cfg(None))?;
        let va = store.commit("A")?;
        let sel = pick_chunks(&store, &model, 0.01, 0)?;
        for (t, r) in &sel {
            store.update_range::<f32>(&names[*t], r.clone(), |_, xs| bump(xs))?;
        }
        let vb = store.commit("B")?;
        let (sa, sb) = (store.snapshot(va)?, store.snapshot(vb)?);
        let n_changed = sel.len();

        // The framework-owned buffers, known to hold A.
        let mut out = base_pool.install(|| model.zeroed_like());
        base_pool.install(|| copy_all(&model.data, &mut out));
        let data = &model.data;
        let rows = model.rows;
        let mut base = || clock(|| base_pool.install(|| copy_all(data, black_box(&mut bufs))));
        let mut to_b = true;
        let mut st = || {
            timed(|| {
                let (target, known) = if to_b { (&sb, &sa) } else { (&sa, &sb) };
                to_b = !to_b;
                let mut changed = 0;
                for (t, name) in names.iter().enumerate() {
                    let mut v = ArrayViewMut2::from_shape((rows, COLS), &mut out[t][..])?;
                    changed += target
                        .tensor(name)?
                        .copy_changed_into(&mut v, known.tensor(name)?)?
                        .chunks_changed;
                }
                assert_eq!(
                    black_box(changed),
                    n_changed,
                    "copy_changed_into copied a different number of chunks"
                );
                Ok(())
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("restore_into_1pct", "ms", m[0], m[1]);

        // `out` holds A or B depending on the run count: make it B, then compare deep
        // copies of A (the model) and B chunk by chunk.
        for (t, name) in names.iter().enumerate() {
            let mut v = ArrayViewMut2::from_shape((rows, COLS), &mut out[t][..])?;
            sb.tensor(name)?.copy_into(&mut v)?;
        }
        let ce = sa.tensor(&names[0])?.chunk_elems();
        let out_ref = &out;
        let mut base = || {
            timed(|| {
                let changed: usize = base_pool.install(|| {
                    data.par_iter()
                        .zip(out_ref.par_iter())
                        .map(|(a, b)| {
                            a.chunks(ce)
                                .zip(b.chunks(ce))
                                .filter(|(x, y)| {
                                    bytemuck::cast_slice::<f32, u8>(x)
                                        != bytemuck::cast_slice::<f32, u8>(y)
                                })
                                .count()
                        })
                        .sum()
                });
                assert_eq!(black_box(changed), n_changed, "baseline diff miscounted");
                Ok(())
            })
        };
        let mut st = || {
            timed(|| {
                let d = store.diff(va, vb)?;
                assert_eq!(black_box(d.changed_chunks()), n_changed, "diff miscounted");
                Ok(())
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add("diff_1pct", "ms", m[0], m[1]);
    }

    // ---- memory_100v_1pct: 100 versions each changing 1% of chunks -------------------
    {
        let mut store = model.store(cfg(None))?;
        store.commit("v0")?;
        for k in 1..=100 {
            for (t, r) in pick_chunks(&store, &model, 0.01, k)? {
                store.update_range::<f32>(&names[t], r, |_, xs| bump(xs))?;
            }
            store.commit(&format!("v{k}"))?;
        }
        let stats = store.stats();
        eprintln!(
            "  memory: {} versions, {} unique chunks, {} unique bytes, {} pooled bytes",
            stats.versions, stats.unique_chunks, stats.unique_bytes, stats.pooled_bytes
        );
        report.add(
            "memory_100v_1pct",
            "bytes",
            (101 * size) as f64,
            stats.unique_bytes as f64,
        );
    }

    dense_rows(&opts, &cfg, reps, &repo_root.join("dense"), &mut report)?;

    // ---- trial_sparse_*: change a share of chunks, commit, restore the previous ------
    // The store keeps at most two versions (a trial loop's steady state: the rejected
    // trial is pruned at the next commit and its buffers recycled). The baseline copies
    // the model out, changes it, and copies it back.
    for (name, share) in [
        ("trial_sparse_0.1pct", 0.001),
        ("trial_sparse_1pct", 0.01),
        ("trial_sparse_10pct", 0.1),
    ] {
        let mut store = model.store(cfg(Some(2)))?;
        let v0 = store.commit("base")?;
        let sel = pick_chunks(&store, &model, share, 0)?;
        let data = &mut model.data;
        let bufs = &mut bufs;
        let sel_ref = &sel;
        let mut base = || {
            timed(|| {
                base_pool.install(|| copy_all(data, bufs));
                for (t, r) in sel_ref {
                    bump(&mut data[*t][r.clone()]);
                }
                black_box(&mut *data);
                base_pool.install(|| copy_all(bufs, data));
                Ok(())
            })
        };
        let names = &names;
        let mut st = || {
            timed(|| {
                for (t, r) in sel_ref {
                    store.update_range::<f32>(&names[*t], r.clone(), |_, xs| bump(xs))?;
                }
                black_box(store.commit("trial")?);
                store.restore(v0)?;
                Ok(())
            })
        };
        let m = interleave(reps, &mut [&mut base, &mut st])?;
        report.add(name, "ms", m[0], m[1]);
    }

    // ---- trial_dense_*: w -= lr * g over every element --------------------------------
    // Store: zip_update every tensor, then commit keeping at most two versions (undo of
    // the last step stays possible). Baselines: the same update in place with no undo,
    // and a deep copy into preallocated buffers followed by that update.
    {
        let grads: Vec<Vec<f32>> = base_pool.install(|| {
            model
                .data
                .par_iter()
                .enumerate()
                .map(|(t, d)| {
                    (0..d.len())
                        .map(|i| 0.5 + ((i * 13 + t) % 101) as f32 * 1e-2)
                        .collect()
                })
                .collect()
        });
        let mut store = model.store(cfg(Some(2)))?;
        store.commit("init")?;
        // Two untimed steps so the pool holds the buffers of a pruned version.
        let g_views: Vec<ArrayView2<'_, f32>> = grads
            .iter()
            .map(|g| ArrayView2::from_shape((model.rows, COLS), &g[..]))
            .collect::<Result<_, _>>()?;
        let mut store_step = move || -> Res<Duration> {
            timed(|| {
                for (t, g) in g_views.iter().enumerate() {
                    store.zip_update::<f32, _, _>(&names[t], g, |w, g| w - LR * g)?;
                }
                black_box(store.commit("step")?);
                Ok(())
            })
        };
        store_step()?;
        store_step()?;
        let g = &grads;
        let data = &mut model.data;
        let bufs = &mut bufs;
        // Both baselines update the same arrays; they run in sequence, never at once.
        let m = {
            let cell = std::cell::RefCell::new((data, bufs));
            let mut upd = || {
                let mut b = cell.borrow_mut();
                let (d, _) = &mut *b;
                clock(|| base_pool.install(|| sgd_in_place(black_box(d), g)))
            };
            let mut copy_upd = || {
                let mut b = cell.borrow_mut();
                let (d, bf) = &mut *b;
                timed(|| {
                    base_pool.install(|| {
                        copy_all(d, bf);
                        sgd_in_place(black_box(d), g);
                    });
                    Ok(())
                })
            };
            interleave(reps, &mut [&mut upd, &mut copy_upd, &mut store_step])?
        };
        report.add("trial_dense_vs_update", "ms", m[0], m[2]);
        report.add("trial_dense_vs_deep_copy", "ms", m[1], m[2]);
    }

    drop(bufs);
    repo_bench::run(&model, &cfg, reps, &repo_root, &mut report)?;
    let _ = std::fs::remove_dir_all(&repo_root);
    report.print();
    eprintln!("total {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}
