//! Branching exploration: fork from one trained checkpoint into several variants, keep
//! the best half after each round (successive halving), and average the two best into a
//! model soup.
//!
//! Every variant trains on its own branch; losers are deleted and pruned, which frees the
//! memory only they held. The history tree is printed, written as Graphviz DOT, and the
//! store's memory is compared with one deep copy per version.
//!
//! ```text
//! cargo run --release --example branching_search -- --hidden 256 --seed 42 --dot /tmp/h.dot
//! dot -Tsvg /tmp/h.dot > history.svg
//! ```

mod common;

use std::error::Error;
use std::fmt;
use std::path::PathBuf;

use common::{Dataset, Flags, SplitMix64};
use tensor_history::{Meta, Retention, Stats, Store, VersionId};

const USAGE: &str =
    "usage: branching_search [--hidden N] [--variants N] [--epochs N] [--seed N] [--dot PATH]";

/// What to run.
#[derive(Clone, Debug)]
pub struct Opts {
    /// Width of the two hidden layers.
    pub hidden: usize,
    /// Variants forked from the checkpoint (halved after every round until two are left).
    pub variants: usize,
    /// Epochs per variant per round.
    pub epochs: usize,
    /// Epochs of training before the fork.
    pub pretrain: usize,
    /// Seed of the data and the initial weights.
    pub seed: u64,
    /// Training points.
    pub train_points: usize,
    /// Where to write the DOT file.
    pub dot: PathBuf,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            hidden: 256,
            variants: 8,
            epochs: 3,
            pretrain: 10,
            seed: 42,
            train_points: 2000,
            dot: std::env::temp_dir().join("history.dot"),
        }
    }
}

impl Opts {
    fn from_args(args: impl IntoIterator<Item = String>) -> common::Result<Opts> {
        let flags = Flags::parse(args, &["hidden", "variants", "epochs", "seed", "dot"])?;
        let d = Opts::default();
        let opts = Opts {
            hidden: flags.number("hidden", d.hidden)?,
            variants: flags.number("variants", d.variants)?,
            epochs: flags.number("epochs", d.epochs)?,
            seed: flags.number("seed", d.seed)?,
            dot: flags.string("dot").map_or(d.dot.clone(), PathBuf::from),
            ..d
        };
        if opts.hidden == 0 || opts.hidden > 16384 {
            return Err(format!("--hidden {}: expected 1..=16384", opts.hidden).into());
        }
        if opts.variants < 2 {
            return Err("--variants: expected at least 2".into());
        }
        Ok(opts)
    }
}

/// One variant: a learning rate and a data-order seed on its own branch.
#[derive(Clone, Debug)]
pub struct Variant {
    pub branch: String,
    pub lr: f32,
    pub seed: u64,
    /// Held-out loss after each round it took part in.
    pub losses: Vec<f32>,
}

/// What happened.
#[derive(Clone, Debug)]
pub struct Report {
    pub checkpoint: VersionId,
    pub checkpoint_loss: f32,
    /// Every variant, best first (finalists first, then the ones pruned last, ...).
    pub variants: Vec<Variant>,
    /// Per round: versions dropped and bytes freed by pruning the losers.
    pub prunes: Vec<(usize, usize, usize)>,
    /// The two finalists: (branch, version, held-out loss, test accuracy).
    pub parents: [(String, VersionId, f32, f32); 2],
    /// The soup: (version, held-out loss, test accuracy).
    pub soup: (VersionId, f32, f32),
    pub graph: String,
    pub dot: PathBuf,
    pub stats: Stats,
}

impl Report {
    /// Whether the soup's held-out loss is below each parent's.
    pub fn soup_beats_both(&self) -> bool {
        self.parents.iter().all(|p| self.soup.1 < p.2)
    }

    /// Whether the soup's held-out loss is below at least one parent's.
    pub fn soup_beats_one(&self) -> bool {
        self.parents.iter().any(|p| self.soup.1 < p.2)
    }
}

/// Plain minibatch SGD over one epoch, straight on the store's working state.
fn train_epoch(
    store: &mut Store,
    data: &Dataset,
    lr: f32,
    rng: &mut SplitMix64,
) -> common::Result<()> {
    let batch = 32;
    for _ in 0..data.len().div_ceil(batch) {
        let b = data.sample(batch, rng);
        let (_, grads) = common::gradients(store, &b)?;
        for (name, g) in &grads {
            store.zip_update(name, g, move |w, g| common::sgd(w, g, lr))?;
        }
    }
    Ok(())
}

/// Pretrain, fork, halve, soup.
pub fn run(opts: &Opts) -> common::Result<Report> {
    let mut rng = SplitMix64::new(opts.seed);
    let train = Dataset::two_spirals(opts.train_points, 0.05, &mut rng);
    let heldout = Dataset::two_spirals(512, 0.05, &mut rng);
    let test = Dataset::two_spirals(2000, 0.05, &mut rng);

    let mut store = Store::new();
    for (name, array) in common::init_mlp(opts.hidden, &mut rng) {
        store.insert(&name, &array)?;
    }
    store.commit("init")?;
    for epoch in 1..=opts.pretrain {
        train_epoch(&mut store, &train, 0.1, &mut rng)?;
        store.commit(&format!("pretrain epoch {epoch}"))?;
    }
    let checkpoint = store.head().ok_or("no commit")?;
    store.tag("checkpoint", checkpoint)?;
    let (checkpoint_loss, _) = common::evaluate(&store, &heldout)?;

    // Fork: learning rates x data-order seeds, each on a branch at the checkpoint.
    let lrs = [0.02f32, 0.05, 0.1, 0.2];
    let mut alive: Vec<Variant> = (0..opts.variants)
        .map(|i| {
            let lr = lrs[i % lrs.len()];
            let seed = (i / lrs.len()) as u64 + 1;
            Variant {
                branch: format!("lr{lr}-s{seed}"),
                lr,
                seed,
                losses: Vec::new(),
            }
        })
        .collect();
    let mut rngs: Vec<SplitMix64> = alive.iter().map(|v| SplitMix64::new(v.seed)).collect();
    for v in &alive {
        store.branch(&v.branch, checkpoint)?;
    }

    // Successive halving: train every variant a few epochs, keep the better half.
    let mut out: Vec<Variant> = Vec::new();
    let mut prunes = Vec::new();
    let mut epoch = opts.pretrain;
    loop {
        for (v, r) in alive.iter_mut().zip(&mut rngs) {
            store.checkout(&v.branch)?;
            for e in 1..=opts.epochs {
                train_epoch(&mut store, &train, v.lr, r)?;
                let mut meta = Meta::new()
                    .with("epoch", (epoch + e) as i64)
                    .with("lr", v.lr)
                    .with("seed", v.seed as i64);
                if e == opts.epochs {
                    meta.insert("heldout_loss", common::evaluate(&store, &heldout)?.0);
                }
                store.commit_with(
                    &format!("lr={} seed={} epoch {}", v.lr, v.seed, epoch + e),
                    meta,
                )?;
            }
        }
        // Read each branch's held-out loss back from the metadata of its tip.
        for v in &mut alive {
            let tip = store.resolve(&v.branch)?;
            let loss = store.metadata(tip)?.number("heldout_loss");
            v.losses.push(loss.map_or(f32::NAN, |l| l as f32));
        }
        epoch += opts.epochs;
        if alive.len() <= 2 {
            break;
        }
        // Rank by the last held-out loss (NaN, a diverged run, ranks last).
        let mut order: Vec<usize> = (0..alive.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (alive[a].losses.last(), alive[b].losses.last());
            let key = |l: Option<&f32>| l.copied().filter(|l| l.is_finite()).unwrap_or(f32::MAX);
            key(x).total_cmp(&key(y))
        });
        let keep = alive.len().div_ceil(2).max(2);
        store.checkout("main")?;
        for &i in &order[keep..] {
            store.delete_branch(&alive[i].branch)?;
        }
        let pruned = store.prune(&Retention::default().drop_unreachable(true))?;
        prunes.push((
            pruned.dropped.len(),
            pruned.bytes_before,
            pruned.bytes_after,
        ));
        let mut losers: Vec<Variant> = order[keep..].iter().map(|&i| alive[i].clone()).collect();
        losers.extend(out);
        out = losers;
        rngs = order[..keep].iter().map(|&i| rngs[i].clone()).collect();
        alive = order[..keep].iter().map(|&i| alive[i].clone()).collect();
    }
    alive.sort_by(|a, b| {
        let (x, y) = (a.losses.last(), b.losses.last());
        x.copied()
            .unwrap_or(f32::MAX)
            .total_cmp(&y.copied().unwrap_or(f32::MAX))
    });

    // The soup: the weighted mean (equal weights) of the two finalists.
    let mut parents = Vec::new();
    for v in &alive[..2] {
        store.checkout(&v.branch)?;
        let id = store.head().ok_or("no commit")?;
        let (loss, _) = common::evaluate(&store, &heldout)?;
        let (_, acc) = common::evaluate(&store, &test)?;
        parents.push((v.branch.clone(), id, loss, acc));
    }
    store.branch("soup", parents[0].1)?;
    store.checkout("soup")?;
    let soup_id = store.average(&[parents[0].1, parents[1].1], None)?;
    let (soup_loss, _) = common::evaluate(&store, &heldout)?;
    let (_, soup_acc) = common::evaluate(&store, &test)?;
    store.verify()?;

    std::fs::write(&opts.dot, store.to_dot())?;
    alive.extend(out);
    let parents: [(String, VersionId, f32, f32); 2] = [parents[0].clone(), parents[1].clone()];
    Ok(Report {
        checkpoint,
        checkpoint_loss,
        variants: alive,
        prunes,
        parents,
        soup: (soup_id, soup_loss, soup_acc),
        graph: store.log_graph(),
        dot: opts.dot.clone(),
        stats: store.stats(),
    })
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "checkpoint {} (tag `checkpoint`): held-out loss {:.4}\n",
            self.checkpoint, self.checkpoint_loss
        )?;
        writeln!(
            f,
            "{:<12} {:>6} {:>5}  held-out loss after each round",
            "branch", "lr", "seed"
        )?;
        for v in &self.variants {
            let losses: Vec<String> = v.losses.iter().map(|l| format!("{l:.4}")).collect();
            writeln!(
                f,
                "{:<12} {:>6} {:>5}  {}",
                v.branch,
                v.lr,
                v.seed,
                losses.join("  ")
            )?;
        }
        writeln!(f)?;
        for (round, (dropped, before, after)) in self.prunes.iter().enumerate() {
            writeln!(
                f,
                "round {}: deleted the worse half, prune dropped {dropped} versions, \
                 held {} -> {}",
                round + 1,
                common::human(*before),
                common::human(*after)
            )?;
        }
        writeln!(f, "\nmodel soup = average of the two finalists:")?;
        for (branch, id, loss, acc) in &self.parents {
            writeln!(
                f,
                "  {branch:<12} {id:>4}  held-out loss {loss:.4}  test accuracy {:.1}%",
                100.0 * acc
            )?;
        }
        let (id, loss, acc) = self.soup;
        writeln!(
            f,
            "  {:<12} {id:>4}  held-out loss {loss:.4}  test accuracy {:.1}%",
            "soup",
            100.0 * acc
        )?;
        let verdict = if self.soup_beats_both() {
            "the soup beats both parents"
        } else if self.soup_beats_one() {
            "the soup beats one parent, not the other"
        } else {
            "the soup beats neither parent"
        };
        writeln!(f, "  => {verdict} (held-out loss)\n")?;
        writeln!(f, "history (log_graph):\n{}", self.graph)?;
        writeln!(f, "DOT written to {}", self.dot.display())?;
        let s = &self.stats;
        writeln!(
            f,
            "\nstats: {} versions, {} variables, {} unique chunks\n  \
             held by the whole tree:        {}\n  \
             one deep copy per version:     {} (working state included)\n  \
             sharing ratio:                 {:.2}x\n\
             (every SGD step rewrites every chunk, so versions share little but the fork\n\
             point; deleting a branch and pruning frees exactly what only it held)",
            s.versions,
            s.variables,
            s.unique_chunks,
            common::human(s.unique_bytes),
            common::human(s.logical_bytes),
            s.sharing_ratio
        )
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let opts = common::opts_or_exit(Opts::from_args(std::env::args().skip(1)), USAGE);
    let report = run(&opts)?;
    print!("{report}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(name: &str) -> Opts {
        Opts {
            hidden: 16,
            variants: 4,
            epochs: 1,
            pretrain: 1,
            seed: 5,
            train_points: 128,
            dot: std::env::temp_dir().join(format!("branching_search_test_{name}.dot")),
        }
    }

    #[test]
    fn halving_keeps_two_finalists_and_prunes_the_rest() {
        let opts = small("halving");
        let report = run(&opts).unwrap();
        assert_eq!(report.variants.len(), 4);
        assert_eq!(report.prunes.len(), 1);
        let (dropped, before, after) = report.prunes[0];
        assert_eq!(dropped, 2, "one epoch version per pruned variant");
        assert!(after < before);
        assert!(report.graph.contains("soup"));
        let dot = std::fs::read_to_string(&opts.dot).unwrap();
        assert!(dot.starts_with("digraph"));
        std::fs::remove_file(&opts.dot).unwrap();
    }

    #[test]
    fn soup_is_the_elementwise_mean_of_its_parents() {
        let mut store = Store::new();
        let mut rng = SplitMix64::new(1);
        for (name, a) in common::init_mlp(8, &mut rng) {
            store.insert(&name, &a).unwrap();
        }
        let base = store.commit("base").unwrap();
        let data = Dataset::two_spirals(64, 0.05, &mut rng);
        train_epoch(&mut store, &data, 0.1, &mut rng).unwrap();
        let a = store.commit("a").unwrap();
        store.restore(base).unwrap();
        train_epoch(&mut store, &data, 0.3, &mut rng).unwrap();
        let b = store.commit("b").unwrap();
        let soup = store.average(&[a, b], None).unwrap();
        assert_eq!(store.parents(soup).unwrap(), vec![b, a]);
        let (sa, sb) = (store.snapshot(a).unwrap(), store.snapshot(b).unwrap());
        for name in store.names() {
            let want = (sa.get::<f32>(&name).unwrap() + sb.get::<f32>(&name).unwrap()) / 2.0;
            assert_eq!(store.get::<f32>(&name).unwrap(), want, "{name}");
        }
        store.verify().unwrap();
    }

    #[test]
    fn pruned_variants_are_gone() {
        let opts = small("pruned");
        let report = run(&opts).unwrap();
        let _ = std::fs::remove_file(&opts.dot);
        let losers = &report.variants[2..];
        assert!(losers.iter().all(|v| v.losses.len() == 1));
        assert!(report.variants[..2].iter().all(|v| v.losses.len() == 2));
        for v in losers {
            assert!(!report.graph.contains(&v.branch), "{}", report.graph);
        }
    }
}
