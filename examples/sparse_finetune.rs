//! Sparse fine-tuning of a large embedding table: each step touches a few hundred rows
//! and commits. A version then costs the chunks those rows live in, not the table; a
//! deep copy per version costs the whole table every time.
//!
//! The store keeps its default configuration (256 KiB chunks, which suit dense
//! updates); the table alone gets small chunks with [`Store::insert_chunked`], since a
//! row update copies its whole chunk.
//!
//! ```text
//! cargo run --release --example sparse_finetune -- --rows 1000000 --touch 256 --steps 20
//! ```

mod common;

use std::error::Error;
use std::fmt;
use std::time::{Duration, Instant};

use common::{Flags, SplitMix64};
use ndarray::{s, Array2};
use tensor_history::{Meta, Store, DEFAULT_CHUNK_BYTES};

const USAGE: &str = "usage: sparse_finetune [--rows N] [--touch N] [--steps N] [--chunk-kib N] \
                     [--seed N]";

/// Floats per embedding row.
pub const DIM: usize = 64;

/// What to run.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Rows of the table.
    pub rows: usize,
    /// Rows touched per step.
    pub touch: usize,
    /// Steps (one commit each).
    pub steps: usize,
    /// The table's chunk size in KiB (`Store::insert_chunked`): small chunks suit sparse
    /// row updates. The store's other variables would use its default chunk size.
    pub chunk_kib: usize,
    pub seed: u64,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            rows: 1_000_000,
            touch: 256,
            steps: 20,
            chunk_kib: 4,
            seed: 42,
        }
    }
}

impl Opts {
    fn from_args(args: impl IntoIterator<Item = String>) -> common::Result<Opts> {
        let flags = Flags::parse(args, &["rows", "touch", "steps", "chunk-kib", "seed"])?;
        let d = Opts::default();
        let opts = Opts {
            rows: flags.number("rows", d.rows)?,
            touch: flags.number("touch", d.touch)?,
            steps: flags.number("steps", d.steps)?,
            chunk_kib: flags.number("chunk-kib", d.chunk_kib)?,
            seed: flags.number("seed", d.seed)?,
        };
        if opts.rows == 0 || opts.touch == 0 || opts.touch > opts.rows {
            return Err("expected --rows >= --touch >= 1".into());
        }
        if opts.chunk_kib == 0 {
            return Err("--chunk-kib: expected at least 1".into());
        }
        Ok(opts)
    }
}

/// One step, measured both ways.
#[derive(Clone, Debug, Default)]
pub struct Step {
    /// Distinct rows written.
    pub rows: usize,
    /// Chunks copied by copy-on-write.
    pub chunks_copied: usize,
    /// Writing the rows into the store (copy-on-write included).
    pub store_update: Duration,
    pub store_commit: Duration,
    /// `stats().unique_bytes` after the commit minus before the step.
    pub store_new_bytes: usize,
    /// What the step would newly hold had the table been inserted with the store's
    /// default chunk size: the bytes of the default-size chunks its rows fall in
    /// (computed, not measured).
    pub default_chunk_new_bytes: usize,
    /// Writing the same rows into a plain array, in place.
    pub deep_update: Duration,
    /// Cloning the whole table (the deep-copy snapshot).
    pub deep_clone: Duration,
    pub deep_new_bytes: usize,
}

/// What happened.
#[derive(Clone, Debug)]
pub struct Report {
    pub opts: Opts,
    pub table_bytes: usize,
    /// Bytes per chunk of the table (`insert_chunked`).
    pub chunk_bytes: usize,
    /// The store's default chunk size (`config().chunk_bytes`), used by `insert`.
    pub store_chunk_bytes: usize,
    pub steps: Vec<Step>,
    /// `stats().unique_bytes` at the end (all versions and the working state).
    pub store_total: usize,
    pub versions: usize,
    /// Whether the store's working table equals the plain array at the end.
    pub equal: bool,
}

/// Bytes of the chunks that rows `ids` (sorted) fall in, for a table of `rows` rows cut
/// into chunks of `rows_per_chunk` rows (the last chunk may be shorter).
fn bytes_of_chunks_touched(ids: &[usize], rows: usize, rows_per_chunk: usize) -> usize {
    let mut chunks: Vec<usize> = ids.iter().map(|r| r / rows_per_chunk).collect();
    chunks.dedup();
    chunks
        .iter()
        .map(|c| (rows - c * rows_per_chunk).min(rows_per_chunk) * DIM * 4)
        .sum()
}

/// Build the table, then run the steps against the store and a plain array side by side.
pub fn run(opts: &Opts) -> common::Result<Report> {
    let mut rng = SplitMix64::new(opts.seed);
    let mut table = Array2::from_shape_simple_fn((opts.rows, DIM), || 0.1 * rng.normal());
    // Default configuration; small chunks for the table only.
    let mut store = Store::new();
    store.insert_chunked("embedding", &table, opts.chunk_kib * 1024)?;
    store.commit("pretrained table")?;
    let chunk_bytes = store.tensor("embedding")?.chunk_elems() * 4;
    // Rows per chunk had the table been inserted with `insert` (the default size).
    let default_rows = (DEFAULT_CHUNK_BYTES / (DIM * 4)).max(1);

    let lr = 0.1f32;
    let mut steps = Vec::new();
    for step in 1..=opts.steps {
        // A minibatch's rows (distinct, sorted) and their gradient rows.
        let mut ids: Vec<usize> = (0..opts.touch).map(|_| rng.below(opts.rows)).collect();
        ids.sort_unstable();
        ids.dedup();
        let grads = Array2::from_shape_simple_fn((ids.len(), DIM), || 0.01 * rng.normal());
        let before = store.stats().unique_bytes;

        let mut m = Step {
            rows: ids.len(),
            default_chunk_new_bytes: bytes_of_chunks_touched(&ids, opts.rows, default_rows),
            ..Step::default()
        };
        let start = Instant::now();
        for (i, &row) in ids.iter().enumerate() {
            let g = grads.row(i);
            let g = g.as_slice().ok_or("gradient rows are contiguous")?;
            let w =
                store.update_range::<f32>("embedding", row * DIM..(row + 1) * DIM, |_, xs| {
                    for (x, g) in xs.iter_mut().zip(g) {
                        *x = common::sgd(*x, *g, lr);
                    }
                })?;
            m.chunks_copied += usize::from(w.bytes_copied > 0);
        }
        m.store_update = start.elapsed();
        let start = Instant::now();
        let meta = Meta::new()
            .with("step", step as i64)
            .with("rows", ids.len() as i64);
        store.commit_with(&format!("step {step}: {} rows", ids.len()), meta)?;
        m.store_commit = start.elapsed();
        m.store_new_bytes = store.stats().unique_bytes.saturating_sub(before);

        // The same step on a plain array, keeping history with one clone per step.
        let start = Instant::now();
        for (i, &row) in ids.iter().enumerate() {
            let mut r = table.slice_mut(s![row, ..]);
            r.zip_mut_with(&grads.row(i), |x, &g| *x = common::sgd(*x, g, lr));
        }
        m.deep_update = start.elapsed();
        let start = Instant::now();
        let copy = table.clone();
        m.deep_clone = start.elapsed();
        m.deep_new_bytes = copy.len() * 4;
        drop(copy); // a real history would keep it; this machine could not keep them all
        steps.push(m);
    }
    let stats = store.stats();
    let equal = store.get::<f32>("embedding")? == table.into_dyn();
    Ok(Report {
        opts: opts.clone(),
        table_bytes: opts.rows * DIM * 4,
        chunk_bytes,
        store_chunk_bytes: store.config().chunk_bytes,
        steps,
        store_total: stats.unique_bytes,
        versions: stats.versions,
        equal,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.opts;
        writeln!(
            f,
            "embedding table {} x {DIM} f32 = {}; {} rows touched per step",
            o.rows,
            common::human(self.table_bytes),
            o.touch
        )?;
        writeln!(
            f,
            "store: default config ({} chunks); the table inserted with insert_chunked,\n\
             chunks of {} ({} rows)\n",
            common::human(self.store_chunk_bytes),
            common::human(self.chunk_bytes),
            (self.chunk_bytes / (DIM * 4)).max(1),
        )?;
        writeln!(
            f,
            "{:>4} {:>5} {:>7} | {:>10} {:>10} {:>11} | {:>10} {:>10}",
            "step", "rows", "chunks", "update", "commit", "new bytes", "clone", "new bytes"
        )?;
        writeln!(
            f,
            "{:>18} | {:^34} | {:^21}",
            "", "tensor-history", "deep copy"
        )?;
        let shown = 5.min(self.steps.len());
        for (i, m) in self.steps.iter().enumerate().take(shown) {
            writeln!(
                f,
                "{:>4} {:>5} {:>7} | {:>10} {:>10} {:>11} | {:>10} {:>10}",
                i + 1,
                m.rows,
                m.chunks_copied,
                ms(m.store_update),
                format!("{:.1} us", m.store_commit.as_secs_f64() * 1e6),
                common::human(m.store_new_bytes),
                ms(m.deep_clone),
                common::human(m.deep_new_bytes),
            )?;
        }
        if self.steps.len() > shown {
            writeln!(f, "   ... ({} more steps)", self.steps.len() - shown)?;
        }
        let n = self.steps.len().max(1) as f64;
        let avg = |g: &dyn Fn(&Step) -> f64| self.steps.iter().map(g).sum::<f64>() / n;
        let store_time = avg(&|m| (m.store_update + m.store_commit).as_secs_f64());
        let deep_time = avg(&|m| (m.deep_update + m.deep_clone).as_secs_f64());
        let store_bytes = avg(&|m| m.store_new_bytes as f64);
        let default_bytes = avg(&|m| m.default_chunk_new_bytes as f64);
        let deep_bytes = avg(&|m| m.deep_new_bytes as f64);
        writeln!(f, "\nper step, mean over {} steps:", self.steps.len())?;
        writeln!(
            f,
            "  tensor-history: {:>9} (rows written + commit), {:>10} newly held",
            ms(Duration::from_secs_f64(store_time)),
            common::human(store_bytes as usize)
        )?;
        writeln!(
            f,
            "  deep copy:      {:>9} (rows written + clone),  {:>10} newly held",
            ms(Duration::from_secs_f64(deep_time)),
            common::human(deep_bytes as usize)
        )?;
        writeln!(
            f,
            "  => {:.0}x less time, {:.0}x less memory per version",
            deep_time / store_time.max(1e-9),
            deep_bytes / store_bytes.max(1.0)
        )?;
        writeln!(
            f,
            "  with the default {} chunks (plain insert) a version would newly hold {}\n  \
             (computed from the rows touched: the chunks they fall in)",
            common::human(self.store_chunk_bytes),
            common::human(default_bytes as usize)
        )?;
        writeln!(
            f,
            "\nafter {} steps: the store holds {} for {} versions; deep copies would hold {}",
            self.steps.len(),
            common::human(self.store_total),
            self.versions,
            common::human(self.table_bytes * self.versions)
        )?;
        let same = if self.equal { "yes" } else { "NO" };
        writeln!(f, "store table equals the plain array: {same}")
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let opts = common::opts_or_exit(Opts::from_args(std::env::args().skip(1)), USAGE);
    let report = run(&opts)?;
    print!("{report}");
    if !report.equal {
        eprintln!("error: the store and the plain array differ");
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Opts {
        Opts {
            rows: 4096,
            touch: 20,
            steps: 6,
            chunk_kib: 4,
            seed: 3,
        }
    }

    #[test]
    fn a_step_holds_only_the_chunks_of_its_rows() {
        let report = run(&small()).unwrap();
        assert!(report.equal);
        assert_eq!(report.chunk_bytes, 4 * 1024);
        assert_eq!(report.store_chunk_bytes, DEFAULT_CHUNK_BYTES);
        for m in &report.steps {
            assert!(m.chunks_copied >= 1 && m.chunks_copied <= m.rows);
            assert_eq!(m.store_new_bytes, m.chunks_copied * report.chunk_bytes);
            assert_eq!(m.deep_new_bytes, report.table_bytes);
        }
        let new: usize = report.steps.iter().map(|m| m.store_new_bytes).sum();
        assert_eq!(report.store_total, report.table_bytes + new);
        assert_eq!(report.versions, 7);
    }

    #[test]
    fn default_chunk_bytes_are_what_a_default_store_holds() {
        // 3000 rows: two full 256 KiB chunks of 1024 rows and a short one of 952.
        let rows = 3000;
        let mut store = Store::new();
        store
            .insert("t", &Array2::<f32>::zeros((rows, DIM)))
            .unwrap();
        store.commit("zeros").unwrap();
        let per = store.tensor("t").unwrap().rows_per_chunk().unwrap();
        assert_eq!(per, DEFAULT_CHUNK_BYTES / (DIM * 4)); // what `run` assumes
        for ids in [vec![5, 17], vec![5, 1500], vec![0, 2999], vec![2048]] {
            let before = store.stats().unique_bytes;
            for &r in &ids {
                store
                    .update_range::<f32>("t", r * DIM..(r + 1) * DIM, |_, xs| xs[0] += 1.0)
                    .unwrap();
            }
            store.commit("rows").unwrap();
            let new = store.stats().unique_bytes - before;
            assert_eq!(new, bytes_of_chunks_touched(&ids, rows, per), "{ids:?}");
        }
    }

    #[test]
    fn rows_straddling_chunks_still_match() {
        // 3 KiB chunks hold 12 rows: row ranges start at odd places inside chunks.
        let report = run(&Opts {
            chunk_kib: 3,
            rows: 1000,
            ..small()
        })
        .unwrap();
        assert!(report.equal);
    }

    #[test]
    fn bad_flags_are_errors() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(Opts::from_args(args(&["--rows", "-1"])).is_err());
        assert!(Opts::from_args(args(&["--rows", "10", "--touch", "11"])).is_err());
        assert!(Opts::from_args(args(&["--chunk-kib", "0"])).is_err());
        assert_eq!(Opts::from_args(args(&["--rows", "999"])).unwrap().rows, 999);
    }
}
