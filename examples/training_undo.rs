//! Undo inside a training loop: try a step, keep it if the held-out loss did not get
//! worse, else take it back.
//!
//! The same training runs twice from the same seed: once the way it is usually written
//! (clone every parameter before the step, assign the clone back to undo), once with
//! tensor-history (the parameters live in a `Store`; the step is a fused copy-on-write
//! update, `commit` keeps it, `discard` takes it back). The two runs must end bit for bit
//! equal; the table shows what each spent on keeping old values.
//!
//! ```text
//! cargo run --release --example training_undo -- --hidden 1024 --steps 300 --seed 42
//! ```

mod common;

use std::error::Error;
use std::fmt;
use std::time::{Duration, Instant};

use common::{Dataset, Flags, Params, SplitMix64, Weights};
use tensor_history::{Config, Store};

const USAGE: &str = "usage: training_undo [--hidden N] [--steps N] [--seed N]";

/// What to run.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Trial steps.
    pub steps: usize,
    /// Seed of the data, the initial weights and the minibatches.
    pub seed: u64,
    /// Points per training minibatch.
    pub batch: usize,
    /// Points in the held-out batch that decides accept or reject.
    pub heldout: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            hidden: 1024,
            steps: 300,
            seed: 42,
            batch: 32,
            heldout: 256,
        }
    }
}

impl Opts {
    fn from_args(args: impl IntoIterator<Item = String>) -> common::Result<Opts> {
        let flags = Flags::parse(args, &["hidden", "steps", "seed"])?;
        let d = Opts::default();
        let opts = Opts {
            hidden: flags.number("hidden", d.hidden)?,
            steps: flags.number("steps", d.steps)?,
            seed: flags.number("seed", d.seed)?,
            ..d
        };
        if opts.hidden == 0 || opts.hidden > 16384 {
            return Err(format!("--hidden {}: expected 1..=16384", opts.hidden).into());
        }
        Ok(opts)
    }
}

/// Time spent, by kind of work.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// Keeping the values to go back to: clone before the step / commit after it.
    pub snapshot: Duration,
    /// Going back: assign the clone / discard.
    pub restore: Duration,
    /// Applying `w -= lr * g` (for the store, this includes the copy-on-write).
    pub update: Duration,
    /// The whole run, evaluation and gradients included.
    pub total: Duration,
}

/// One run's outcome.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub method: &'static str,
    pub heldout_loss: f32,
    pub test_loss: f32,
    pub test_accuracy: f32,
    pub accepted: usize,
    pub rejected: usize,
    pub time: Timings,
    /// Most bytes held at once for old values (see [`OLD_BYTES`]).
    pub peak_old_bytes: usize,
    /// Every final parameter's bits, in model order.
    pub bits: Vec<u32>,
}

/// What "bytes held for old values" means for each run.
pub const OLD_BYTES: &str = "\
old values = deep copy: bytes of the parameter clones alive;
             store: stats().unique_bytes + stats().pooled_bytes minus the working
             state's own bytes (versions kept, max_versions = 1, plus freed chunk
             buffers the store keeps for reuse); sampled after every step and decision";

/// Both runs and whether they agree.
#[derive(Clone, Debug)]
pub struct Report {
    pub opts: Opts,
    pub param_bytes: usize,
    pub deep: RunReport,
    pub store: RunReport,
}

impl Report {
    /// Whether both runs ended with the same bits in every parameter, loss and accuracy.
    pub fn identical(&self) -> bool {
        let (a, b) = (&self.deep, &self.store);
        a.bits == b.bits
            && a.heldout_loss.to_bits() == b.heldout_loss.to_bits()
            && a.test_loss.to_bits() == b.test_loss.to_bits()
            && a.test_accuracy.to_bits() == b.test_accuracy.to_bits()
            && (a.accepted, a.rejected) == (b.accepted, b.rejected)
    }
}

/// The two ways to take a step back, behind one small trait so that the training loop
/// is written once.
trait Undo {
    type P: Params;
    fn params(&self) -> &Self::P;
    /// Apply `w = w - lr * g` to every parameter, remembering how to go back.
    fn try_step(&mut self, grads: &Weights, lr: f32, t: &mut Timings) -> common::Result<()>;
    /// Keep the step.
    fn keep(&mut self, t: &mut Timings) -> common::Result<()>;
    /// Take the step back.
    fn revert(&mut self, t: &mut Timings) -> common::Result<()>;
    /// Bytes held for old values right now.
    fn old_bytes(&self) -> usize;
}

/// The baseline: a deep copy of every parameter before every step.
struct DeepCopy {
    params: Weights,
    backup: Option<Weights>,
}

impl Undo for DeepCopy {
    type P = Weights;
    fn params(&self) -> &Weights {
        &self.params
    }
    fn try_step(&mut self, grads: &Weights, lr: f32, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        self.backup = Some(self.params.clone());
        t.snapshot += start.elapsed();
        let start = Instant::now();
        for ((_, w), (_, g)) in self.params.iter_mut().zip(grads) {
            w.zip_mut_with(g, |w, &g| *w = common::sgd(*w, g, lr));
        }
        t.update += start.elapsed();
        Ok(())
    }
    fn keep(&mut self, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        self.backup = None;
        t.snapshot += start.elapsed();
        Ok(())
    }
    fn revert(&mut self, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        self.params = self.backup.take().ok_or("no backup to restore")?;
        t.restore += start.elapsed();
        Ok(())
    }
    fn old_bytes(&self) -> usize {
        self.backup.as_ref().map_or(0, common::nbytes)
    }
}

/// tensor-history: HEAD is the last accepted state; the step writes the working state.
struct History {
    store: Store,
}

impl Undo for History {
    type P = Store;
    fn params(&self) -> &Store {
        &self.store
    }
    fn try_step(&mut self, grads: &Weights, lr: f32, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        for (name, g) in grads {
            self.store
                .zip_update(name, g, move |w, g| common::sgd(w, g, lr))?;
        }
        t.update += start.elapsed();
        Ok(())
    }
    fn keep(&mut self, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        self.store.commit("accepted step")?;
        t.snapshot += start.elapsed();
        Ok(())
    }
    fn revert(&mut self, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        self.store.discard()?;
        t.restore += start.elapsed();
        Ok(())
    }
    fn old_bytes(&self) -> usize {
        let stats = self.store.stats();
        let working: usize = self
            .store
            .names()
            .iter()
            .filter_map(|n| self.store.tensor(n).ok())
            .map(|t| t.nbytes())
            .sum();
        (stats.unique_bytes + stats.pooled_bytes).saturating_sub(working)
    }
}

/// The data both runs see.
struct Data {
    train: Dataset,
    heldout: Dataset,
    test: Dataset,
}

/// The accept/reject loop, written once for both methods.
fn train(
    method: &'static str,
    model: &mut impl Undo,
    data: &Data,
    opts: &Opts,
) -> common::Result<RunReport> {
    let started = Instant::now();
    let mut time = Timings::default();
    let mut rng = SplitMix64::new(opts.seed ^ 0x5EED);
    let (mut best, _) = common::evaluate(model.params(), &data.heldout)?;
    let mut lr = 0.05f32;
    let (mut accepted, mut rejected, mut peak) = (0, 0, 0);
    for _ in 0..opts.steps {
        let batch = data.train.sample(opts.batch, &mut rng);
        let (_, grads) = common::gradients(model.params(), &batch)?;
        model.try_step(&grads, lr, &mut time)?;
        peak = peak.max(model.old_bytes());
        let (loss, _) = common::evaluate(model.params(), &data.heldout)?;
        if loss <= best {
            model.keep(&mut time)?;
            best = loss;
            lr *= 1.2;
            accepted += 1;
        } else {
            model.revert(&mut time)?;
            lr *= 0.5;
            rejected += 1;
        }
        peak = peak.max(model.old_bytes());
    }
    time.total = started.elapsed();
    let (test_loss, test_accuracy) = common::evaluate(model.params(), &data.test)?;
    let mut bits = Vec::new();
    for name in ["w1", "b1", "w2", "b2", "w3", "b3"] {
        for (_, tile) in model.params().tiles(name)? {
            bits.extend(tile.iter().map(|v| v.to_bits()));
        }
    }
    Ok(RunReport {
        method,
        heldout_loss: best,
        test_loss,
        test_accuracy,
        accepted,
        rejected,
        time,
        peak_old_bytes: peak,
        bits,
    })
}

/// Train with deep copies, then with tensor-history, from the same seed.
pub fn run(opts: &Opts) -> common::Result<Report> {
    let mut rng = SplitMix64::new(opts.seed);
    let data = Data {
        train: Dataset::two_spirals(4000, 0.05, &mut rng),
        heldout: Dataset::two_spirals(opts.heldout, 0.05, &mut rng),
        test: Dataset::two_spirals(2000, 0.05, &mut rng),
    };
    let init = common::init_mlp(opts.hidden, &mut rng);
    let param_bytes = common::nbytes(&init);

    // Keep one version (HEAD), like the baseline keeps one clone.
    let mut store = Store::with_config(Config {
        max_versions: Some(1),
        ..Config::default()
    })?;
    for (name, array) in &init {
        store.insert(name, array)?;
        if !common::same_tiling(store.tensor(name)?) {
            return Err(format!("`{name}` is not chunked in whole-row tiles").into());
        }
    }
    store.commit("init")?;

    let mut deep = DeepCopy {
        params: init,
        backup: None,
    };
    let deep = train("deep copy", &mut deep, &data, opts)?;
    let mut history = History { store };
    let store = train("tensor-history", &mut history, &data, opts)?;
    history.store.verify()?;
    Ok(Report {
        opts: opts.clone(),
        param_bytes,
        deep,
        store,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

const LABELS: [&str; 10] = [
    "held-out loss",
    "test loss / accuracy",
    "steps accepted / rejected",
    "time snapshotting",
    "time restoring",
    "snapshot + restore per step",
    "time applying updates",
    "total training time",
    "peak bytes of old values",
    "final weights",
];

/// One column of the table, in the order of [`LABELS`].
fn cells(r: &RunReport) -> [String; 10] {
    let steps = (r.accepted + r.rejected).max(1) as f64;
    let per_step = (r.time.snapshot + r.time.restore).as_secs_f64() * 1e6 / steps;
    [
        format!("{:.6}", r.heldout_loss),
        format!("{:.4} / {:.1}%", r.test_loss, 100.0 * r.test_accuracy),
        format!("{} / {}", r.accepted, r.rejected),
        ms(r.time.snapshot),
        ms(r.time.restore),
        format!("{per_step:.1} us"),
        ms(r.time.update),
        ms(r.time.total),
        common::human(r.peak_old_bytes),
        format!("{} f32 values", r.bits.len()),
    ]
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.opts;
        writeln!(
            f,
            "MLP 2-{h}-{h}-2 on two spirals ({} of parameters), {} trial steps, seed {}",
            common::human(self.param_bytes),
            o.steps,
            o.seed,
            h = o.hidden,
        )?;
        writeln!(
            f,
            "step: minibatch of {}, keep it if the loss on {} held-out points did not get worse\n",
            o.batch, o.heldout
        )?;
        writeln!(
            f,
            "{:<28} {:>18} {:>18}",
            "", self.deep.method, self.store.method
        )?;
        for (i, label) in LABELS.iter().enumerate() {
            let (a, b) = (cells(&self.deep), cells(&self.store));
            writeln!(f, "{label:<28} {:>18} {:>18}", a[i], b[i])?;
        }
        writeln!(f, "\n{OLD_BYTES}")?;
        writeln!(
            f,
            "time applying updates: in place for deep copy; for the store it includes the\n\
             copy-on-write of every chunk, fused with the update (one pass over memory)"
        )?;
        let same = if self.identical() {
            "yes: every weight, loss and accuracy has the same f32 bits"
        } else {
            "NO: the runs differ"
        };
        writeln!(f, "\nbit-identical results: {same}")
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let opts = match Opts::from_args(std::env::args().skip(1)) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let report = run(&opts)?;
    print!("{report}");
    if !report.identical() {
        eprintln!("error: the deep-copy run and the tensor-history run differ");
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Opts {
        Opts {
            hidden: 48,
            steps: 40,
            seed: 7,
            batch: 16,
            heldout: 64,
        }
    }

    #[test]
    fn both_runs_end_bit_identical() {
        let report = run(&small()).unwrap();
        assert!(report.identical(), "{report}");
        assert!(report.deep.accepted > 0 && report.deep.rejected > 0);
        assert!(report.deep.heldout_loss.is_finite());
    }

    #[test]
    fn tiles_span_several_chunks_and_still_agree() {
        // 256 rows of 256 floats: 4 chunks of 64 rows in W2, so the backward pass sums
        // over several tiles.
        let report = run(&Opts {
            hidden: 256,
            steps: 6,
            ..small()
        })
        .unwrap();
        assert!(report.identical(), "{report}");
    }

    #[test]
    fn store_holds_no_more_old_values_than_one_copy() {
        let report = run(&small()).unwrap();
        // One version kept, plus pooled buffers of at most one model (and chunk rounding).
        assert!(report.store.peak_old_bytes <= 2 * report.param_bytes + (1 << 17));
        assert_eq!(report.deep.peak_old_bytes, report.param_bytes);
    }

    #[test]
    fn bad_flags_are_errors() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(Opts::from_args(args(&["--hidden", "x"])).is_err());
        assert!(Opts::from_args(args(&["--steps"])).is_err());
        assert!(Opts::from_args(args(&["--lr", "1"])).is_err());
        assert!(Opts::from_args(args(&["--hidden", "0"])).is_err());
        let o = Opts::from_args(args(&["--hidden", "64", "--seed", "3"])).unwrap();
        assert_eq!((o.hidden, o.seed, o.steps), (64, 3, 300));
    }
}
