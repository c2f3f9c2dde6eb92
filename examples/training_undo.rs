//! Undo inside a training loop: try a step, keep it if the held-out loss did not get
//! worse, else take it back.
//!
//! A trial step is a few minibatch SGD updates; the learning rate grows after a kept
//! step and shrinks after a rejected one (within a floor and a ceiling). The same
//! training runs twice from the same seed: once the way it is usually written (clone
//! every parameter before the step, assign the clone back to undo), once with
//! tensor-history (the parameters live in a `Store`; the first update of a step is a
//! fused copy-on-write update, `commit` keeps the step, `discard` takes it back). The two
//! runs must end bit for bit equal; the table shows what each spent on keeping old values.
//!
//! ```text
//! cargo run --release --example training_undo -- --hidden 1024 --steps 150 --seed 42
//! ```

mod common;

use std::error::Error;
use std::fmt;
use std::time::{Duration, Instant};

use common::{Dataset, Flags, Params, SplitMix64, Weights};
use tensor_history::{Config, Meta, Store};

const USAGE: &str = "usage: training_undo [--hidden N] [--steps N] [--seed N]";

/// What to run.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Trial steps (each one kept or taken back as a whole).
    pub steps: usize,
    /// Minibatch SGD updates per trial step.
    pub updates: usize,
    /// Seed of the data, the initial weights and the minibatches.
    pub seed: u64,
    /// Points per training minibatch.
    pub batch: usize,
    /// Points in the held-out batch that decides accept or reject.
    pub heldout: usize,
    /// Learning rate of the first trial step.
    pub lr: f32,
    /// Factor applied to the learning rate after a kept step (> 1).
    pub lr_grow: f32,
    /// Factor applied to the learning rate after a rejected step (< 1).
    pub lr_shrink: f32,
    /// Floor and ceiling of the learning rate.
    pub lr_min: f32,
    pub lr_max: f32,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            hidden: 1024,
            steps: 150,
            updates: 10,
            seed: 42,
            batch: 32,
            heldout: 256,
            lr: 0.1,
            lr_grow: 1.2,
            lr_shrink: 0.5,
            lr_min: 0.01,
            lr_max: 0.5,
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
    /// Applying `w -= lr * g` (for the store, this includes the copy-on-write of the
    /// first update of every trial step).
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
    /// Bytes copied to keep old values: the clones for the deep copy, the copy-on-write
    /// of the updates (`WriteStats::bytes_copied`) for the store.
    pub copied_bytes: usize,
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
    /// Remember the current values: a trial step begins.
    fn begin(&mut self, t: &mut Timings) -> common::Result<()>;
    /// Apply `w = w - lr * g` to every parameter.
    fn update(&mut self, grads: &Weights, lr: f32, t: &mut Timings) -> common::Result<()>;
    /// Keep the step (the store records its held-out loss and learning rate with it).
    fn keep(&mut self, loss: f32, lr: f32, t: &mut Timings) -> common::Result<()>;
    /// Take the step back.
    fn revert(&mut self, t: &mut Timings) -> common::Result<()>;
    /// Bytes held for old values right now.
    fn old_bytes(&self) -> usize;
    /// Bytes copied so far to keep old values.
    fn copied_bytes(&self) -> usize;
}

/// The baseline: a deep copy of every parameter before every step.
struct DeepCopy {
    params: Weights,
    backup: Option<Weights>,
    copied: usize,
}

impl Undo for DeepCopy {
    type P = Weights;
    fn params(&self) -> &Weights {
        &self.params
    }
    fn begin(&mut self, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        self.backup = Some(self.params.clone());
        t.snapshot += start.elapsed();
        self.copied += common::nbytes(&self.params);
        Ok(())
    }
    fn update(&mut self, grads: &Weights, lr: f32, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        for ((_, w), (_, g)) in self.params.iter_mut().zip(grads) {
            w.zip_mut_with(g, |w, &g| *w = common::sgd(*w, g, lr));
        }
        t.update += start.elapsed();
        Ok(())
    }
    fn keep(&mut self, _loss: f32, _lr: f32, t: &mut Timings) -> common::Result<()> {
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
    fn copied_bytes(&self) -> usize {
        self.copied
    }
}

/// tensor-history: HEAD is the last accepted state; the step writes the working state.
struct History {
    store: Store,
    copied: usize,
}

impl Undo for History {
    type P = Store;
    fn params(&self) -> &Store {
        &self.store
    }
    fn begin(&mut self, _: &mut Timings) -> common::Result<()> {
        // Nothing to do: HEAD holds the values to go back to.
        Ok(())
    }
    fn update(&mut self, grads: &Weights, lr: f32, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        let mut copied = 0;
        for (name, g) in grads {
            copied += self
                .store
                .zip_update(name, g, move |w, g| common::sgd(w, g, lr))?
                .bytes_copied;
        }
        t.update += start.elapsed();
        self.copied += copied;
        Ok(())
    }
    fn keep(&mut self, loss: f32, lr: f32, t: &mut Timings) -> common::Result<()> {
        let start = Instant::now();
        let meta = Meta::new().with("heldout_loss", loss).with("lr", lr);
        self.store.commit_with("accepted step", meta)?;
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
    fn copied_bytes(&self) -> usize {
        self.copied
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
    let mut lr = opts.lr;
    let (mut accepted, mut rejected, mut peak) = (0, 0, 0);
    for _ in 0..opts.steps {
        model.begin(&mut time)?;
        for _ in 0..opts.updates {
            let batch = data.train.sample(opts.batch, &mut rng);
            let (_, grads) = common::gradients(model.params(), &batch)?;
            model.update(&grads, lr, &mut time)?;
        }
        peak = peak.max(model.old_bytes());
        let (loss, _) = common::evaluate(model.params(), &data.heldout)?;
        if loss <= best {
            model.keep(loss, lr, &mut time)?;
            best = loss;
            lr *= opts.lr_grow;
            accepted += 1;
        } else {
            model.revert(&mut time)?;
            lr *= opts.lr_shrink;
            rejected += 1;
        }
        lr = lr.clamp(opts.lr_min, opts.lr_max);
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
        copied_bytes: model.copied_bytes(),
        peak_old_bytes: peak,
        bits,
    })
}

/// Draw the first layer's biases uniformly in `[-2, 2]` (the data's radius) instead of
/// zero. With every bias at zero the ReLU network is positively homogeneous,
/// `f(c x) = c f(x)` for `c > 0`, so its class depends only on the angle of `x`: a spiral
/// needs the radius too, and an accept-only-if-better loop cannot cross the plateau
/// that sits there (held-out loss about 0.55) while the biases slowly grow.
fn spread_first_biases(params: &mut Weights, rng: &mut SplitMix64) -> common::Result<()> {
    let (_, b1) = params
        .iter_mut()
        .find(|(n, _)| n == "b1")
        .ok_or("no parameter `b1`")?;
    b1.mapv_inplace(|_| 2.0 * (2.0 * rng.uniform() - 1.0));
    Ok(())
}

/// Train with deep copies, then with tensor-history, from the same seed.
pub fn run(opts: &Opts) -> common::Result<Report> {
    let mut rng = SplitMix64::new(opts.seed);
    let data = Data {
        train: Dataset::two_spirals(4000, 0.05, &mut rng),
        heldout: Dataset::two_spirals(opts.heldout, 0.05, &mut rng),
        test: Dataset::two_spirals(2000, 0.05, &mut rng),
    };
    let mut init = common::init_mlp(opts.hidden, &mut rng);
    spread_first_biases(&mut init, &mut rng)?;
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
        copied: 0,
    };
    let deep = train("deep copy", &mut deep, &data, opts)?;
    let mut history = History { store, copied: 0 };
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

const LABELS: [&str; 12] = [
    "held-out loss",
    "test loss / accuracy",
    "steps accepted / rejected",
    "time snapshotting",
    "time restoring",
    "snapshot + restore per step",
    "time applying updates",
    "snapshot + restore + update",
    "total training time",
    "bytes copied per step",
    "peak bytes of old values",
    "final weights",
];

/// One column of the table, in the order of [`LABELS`].
fn cells(r: &RunReport) -> [String; 12] {
    let steps = (r.accepted + r.rejected).max(1);
    let per_step = (r.time.snapshot + r.time.restore).as_secs_f64() * 1e6 / steps as f64;
    [
        format!("{:.6}", r.heldout_loss),
        format!("{:.4} / {:.1}%", r.test_loss, 100.0 * r.test_accuracy),
        format!("{} / {}", r.accepted, r.rejected),
        ms(r.time.snapshot),
        ms(r.time.restore),
        format!("{per_step:.1} us"),
        ms(r.time.update),
        ms(r.time.snapshot + r.time.restore + r.time.update),
        ms(r.time.total),
        common::human(r.copied_bytes / steps),
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
            "step: {} SGD updates on minibatches of {}; keep it if the loss on {} held-out\n\
             points did not get worse, else take it back; lr starts at {}, x{} after a kept\n\
             step, x{} after a rejected one, within [{}, {}]\n",
            o.updates, o.batch, o.heldout, o.lr, o.lr_grow, o.lr_shrink, o.lr_min, o.lr_max
        )?;
        writeln!(
            f,
            "{:<28} {:>18} {:>18}",
            "", self.deep.method, self.store.method
        )?;
        let (a, b) = (cells(&self.deep), cells(&self.store));
        for (i, label) in LABELS.iter().enumerate() {
            writeln!(f, "{label:<28} {:>18} {:>18}", a[i], b[i])?;
        }
        writeln!(f, "\n{OLD_BYTES}")?;
        writeln!(
            f,
            "time snapshotting / restoring: clone / assign the clone back for deep copy;\n\
             \x20            commit / discard for the store (no tensor data copied)\n\
             time applying updates: in place for deep copy; for the store the first update\n\
             \x20            of each step also copies every chunk (copy-on-write, fused with\n\
             \x20            the update in one pass over memory), the others write in place\n\
             bytes copied: the clone for deep copy; WriteStats::bytes_copied for the store"
        )?;
        writeln!(
            f,
            "\nThe store's win is in snapshot/restore time (commit and discard copy no data)\n\
             and in memory when versions share unchanged chunks; here every step changes\n\
             every chunk, so the one version kept holds as much as the one clone. It does\n\
             not win on updates: a dense update pays one copy-on-write of the whole model\n\
             per trial step (each step is a new version, kept or discarded), as many bytes\n\
             as the clone, fused with the update instead of a separate pass."
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
    let opts = common::opts_or_exit(Opts::from_args(std::env::args().skip(1)), USAGE);
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
            updates: 2,
            seed: 7,
            batch: 16,
            heldout: 64,
            ..Opts::default()
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
    fn learns_the_spirals_and_takes_both_branches() {
        let report = run(&Opts {
            hidden: 64,
            steps: 100,
            seed: 7,
            ..Opts::default()
        })
        .unwrap();
        assert!(report.identical(), "{report}");
        let r = &report.store;
        assert!(r.test_accuracy > 0.9, "{report}");
        assert!(r.accepted >= 20 && r.rejected >= 20, "{report}");
    }

    #[test]
    fn tiles_span_several_chunks_and_still_agree() {
        // 512 rows of 512 floats: with 256 KiB chunks, 4 chunks of 128 rows in W2, so
        // the backward pass sums over several tiles.
        let hidden = 512;
        assert!(
            common::tile_rows(&[hidden, hidden]) < hidden,
            "W2 fits one chunk"
        );
        let report = run(&Opts {
            hidden,
            steps: 3,
            ..small()
        })
        .unwrap();
        assert!(report.identical(), "{report}");
    }

    #[test]
    fn the_store_copies_the_model_once_per_trial_step() {
        let report = run(&small()).unwrap();
        let steps = report.opts.steps;
        assert_eq!(report.deep.copied_bytes, steps * report.param_bytes);
        // Every chunk changes in a dense step; a chunk that came out equal stays shared.
        assert!(report.store.copied_bytes <= steps * report.param_bytes);
        assert!(report.store.copied_bytes >= steps * report.param_bytes / 2);
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
        assert_eq!((o.hidden, o.seed, o.steps), (64, 3, 150));
    }
}
