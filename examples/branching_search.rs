//! Branching exploration: fork from one trained checkpoint into several variants, keep
//! the best half after each round (successive halving), and average the two best into a
//! model soup.
//!
//! Every variant trains on its own branch; losers are deleted and pruned, which frees the
//! memory only they held. The history tree is printed, written as Graphviz DOT, and the
//! store's memory is compared with one deep copy per version.
//!
//! With `--repo DIR` every round is saved to the repository at `DIR`, together with the
//! search's own state (the variants, their losses and data-order generators) as a small
//! `u8` tensor on a branch `search-state`. Killed and run again with the same flags, the
//! program resumes from the last saved round and ends with the same soup as a run that
//! was never interrupted; the soup is exported as a safetensors file (`--export PATH`,
//! default `DIR.soup.safetensors`).
//!
//! ```text
//! cargo run --release --example branching_search -- --hidden 256 --seed 42 --dot /tmp/h.dot
//! dot -Tsvg /tmp/h.dot > history.svg
//! cargo run --release --example branching_search -- --repo /tmp/search   # Ctrl-C, rerun
//! ```

mod common;

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};

use common::{Dataset, Flags, SplitMix64};
use serde::{Deserialize, Serialize};
use tensor_history::{Meta, Ref, Retention, Stats, Store, VersionId};

const USAGE: &str = "usage: branching_search [--hidden N] [--variants N] [--epochs N] [--seed N] \
     [--dot PATH] [--repo DIR] [--export PATH]";

/// The branch that holds the search state in a repository.
const STATE_BRANCH: &str = "search-state";

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
    /// The repository every round is saved to (and resumed from).
    pub repo: Option<PathBuf>,
    /// Where the soup is exported as safetensors (with a repository).
    pub export: Option<PathBuf>,
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
            repo: None,
            export: None,
        }
    }
}

impl Opts {
    fn from_args(args: impl IntoIterator<Item = String>) -> common::Result<Opts> {
        let flags = Flags::parse(
            args,
            &[
                "hidden", "variants", "epochs", "seed", "dot", "repo", "export",
            ],
        )?;
        let d = Opts::default();
        let opts = Opts {
            hidden: flags.number("hidden", d.hidden)?,
            variants: flags.number("variants", d.variants)?,
            epochs: flags.number("epochs", d.epochs)?,
            seed: flags.number("seed", d.seed)?,
            dot: flags.string("dot").map_or(d.dot.clone(), PathBuf::from),
            repo: flags.string("repo").map(PathBuf::from),
            export: flags.string("export").map(PathBuf::from),
            ..d
        };
        if opts.hidden == 0 || opts.hidden > 16384 {
            return Err(format!("--hidden {}: expected 1..=16384", opts.hidden).into());
        }
        if opts.variants < 2 {
            return Err("--variants: expected at least 2".into());
        }
        if opts.export.is_some() && opts.repo.is_none() {
            return Err("--export needs --repo".into());
        }
        Ok(opts)
    }

    /// Where the soup is exported: `--export`, or next to the repository.
    fn export_path(&self) -> Option<PathBuf> {
        let repo = self.repo.as_ref()?;
        Some(self.export.clone().unwrap_or_else(|| {
            let mut p = repo.as_os_str().to_owned();
            p.push(".soup.safetensors");
            PathBuf::from(p)
        }))
    }
}

/// One variant: a learning rate and a data-order seed on its own branch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Variant {
    pub branch: String,
    pub lr: f32,
    pub seed: u64,
    /// Held-out loss after each round it took part in (`None` for a diverged run).
    pub losses: Vec<Option<f32>>,
}

impl Variant {
    fn last_loss(&self) -> f32 {
        self.losses
            .last()
            .copied()
            .flatten()
            .filter(|l| l.is_finite())
            .unwrap_or(f32::MAX)
    }
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
    /// Rounds already saved in the repository when this run started.
    pub resumed_after: Option<usize>,
    /// Where the soup was exported as safetensors.
    pub exported: Option<PathBuf>,
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

/// The search between rounds: everything needed to go on, saved with each round.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Search {
    checkpoint_loss: f32,
    /// Epochs trained on the path to the current round.
    epoch: usize,
    /// Rounds done.
    rounds: usize,
    /// Whether the last round done trained the two finalists (the search then only
    /// makes the soup).
    finalists_trained: bool,
    /// Variants still in the race, with their data-order generator states and the content
    /// hash of their branch tip.
    alive: Vec<(Variant, u64, String)>,
    /// Variants out of the race, best first.
    out: Vec<Variant>,
    prunes: Vec<(usize, usize, usize)>,
}

/// Pretrain, fork, halve, soup.
pub fn run(opts: &Opts) -> common::Result<Report> {
    run_until(opts, None)?.ok_or_else(|| "the search stopped early".into())
}

/// [`run`], stopping (as a kill would) right after round `stop_after` is saved; `None`
/// then. Round 0 is the fork.
pub fn run_until(opts: &Opts, stop_after: Option<usize>) -> common::Result<Option<Report>> {
    let mut rng = SplitMix64::new(opts.seed);
    let train = Dataset::two_spirals(opts.train_points, 0.05, &mut rng);
    let heldout = Dataset::two_spirals(512, 0.05, &mut rng);
    let test = Dataset::two_spirals(2000, 0.05, &mut rng);

    let (mut store, mut search, resumed_after) = match &opts.repo {
        Some(dir) if dir.exists() => {
            let (store, search) = resume(dir)?;
            let rounds = search.rounds;
            (store, search, Some(rounds))
        }
        _ => {
            let (mut store, search) = fork(opts, &train, &heldout, &mut rng)?;
            match &opts.repo {
                Some(dir) => {
                    save_first(&mut store, &search, dir)?;
                    if stop_after == Some(0) {
                        return Ok(None);
                    }
                    let (store, search) = resume(dir)?;
                    (store, search, None)
                }
                None => (store, search, None),
            }
        }
    };
    let checkpoint = store.resolve("checkpoint")?;
    let mut rngs: Vec<SplitMix64> = search
        .alive
        .iter()
        .map(|(_, state, _)| SplitMix64::new(*state))
        .collect();
    let mut alive: Vec<Variant> = search.alive.iter().map(|(v, _, _)| v.clone()).collect();

    // Successive halving: train every variant a few epochs, keep the better half, until
    // the two finalists have trained a round.
    while !search.finalists_trained {
        for (v, r) in alive.iter_mut().zip(&mut rngs) {
            store.checkout(&v.branch)?;
            for e in 1..=opts.epochs {
                train_epoch(&mut store, &train, v.lr, r)?;
                let mut meta = Meta::new()
                    .with("epoch", (search.epoch + e) as i64)
                    .with("lr", v.lr)
                    .with("seed", v.seed as i64);
                if e == opts.epochs {
                    meta.insert("heldout_loss", common::evaluate(&store, &heldout)?.0);
                }
                store.commit_with(
                    &format!("lr={} seed={} epoch {}", v.lr, v.seed, search.epoch + e),
                    meta,
                )?;
            }
        }
        // Read each branch's held-out loss back from the metadata of its tip.
        for v in &mut alive {
            let tip = store.resolve(&v.branch)?;
            let loss = store.metadata(tip)?.number("heldout_loss");
            v.losses
                .push(loss.map(|l| l as f32).filter(|l| l.is_finite()));
        }
        search.epoch += opts.epochs;
        search.rounds += 1;
        search.finalists_trained = alive.len() <= 2;
        if !search.finalists_trained {
            // Rank by the last held-out loss (NaN, a diverged run, ranks last).
            let mut order: Vec<usize> = (0..alive.len()).collect();
            order.sort_by(|&a, &b| alive[a].last_loss().total_cmp(&alive[b].last_loss()));
            let keep = alive.len().div_ceil(2).max(2);
            store.checkout("main")?;
            for &i in &order[keep..] {
                store.delete_branch(&alive[i].branch)?;
            }
            let pruned = store.prune(&Retention::default().drop_unreachable(true))?;
            search.prunes.push((
                pruned.dropped.len(),
                pruned.bytes_before,
                pruned.bytes_after,
            ));
            let mut losers: Vec<Variant> =
                order[keep..].iter().map(|&i| alive[i].clone()).collect();
            losers.append(&mut search.out);
            search.out = losers;
            rngs = order[..keep].iter().map(|&i| rngs[i].clone()).collect();
            alive = order[..keep].iter().map(|&i| alive[i].clone()).collect();
        }
        if opts.repo.is_some() {
            search.alive = alive
                .iter()
                .zip(&rngs)
                .map(|(v, r)| Ok((v.clone(), r.state(), tip_hash(&store, &v.branch)?)))
                .collect::<common::Result<_>>()?;
            commit_state(&mut store, &search)?;
            store.save()?;
            if stop_after == Some(search.rounds) {
                return Ok(None);
            }
        }
    }
    alive.sort_by(|a, b| a.last_loss().total_cmp(&b.last_loss()));

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
    let exported = opts.export_path();
    if let Some(path) = &exported {
        store.save()?;
        store.export_safetensors(soup_id, path)?;
    }

    std::fs::write(&opts.dot, store.to_dot())?;
    alive.append(&mut search.out);
    let parents: [(String, VersionId, f32, f32); 2] = [parents[0].clone(), parents[1].clone()];
    Ok(Some(Report {
        checkpoint,
        checkpoint_loss: search.checkpoint_loss,
        variants: alive,
        prunes: search.prunes,
        parents,
        soup: (soup_id, soup_loss, soup_acc),
        graph: store.log_graph(),
        dot: opts.dot.clone(),
        stats: store.stats(),
        resumed_after,
        exported,
    }))
}

/// Pretrain, tag the checkpoint, and put every variant on a branch at it: round 0.
fn fork(
    opts: &Opts,
    train: &Dataset,
    heldout: &Dataset,
    rng: &mut SplitMix64,
) -> common::Result<(Store, Search)> {
    let mut store = Store::new();
    for (name, array) in common::init_mlp(opts.hidden, rng) {
        store.insert(&name, &array)?;
    }
    store.commit("init")?;
    for epoch in 1..=opts.pretrain {
        train_epoch(&mut store, train, 0.1, rng)?;
        store.commit(&format!("pretrain epoch {epoch}"))?;
    }
    let checkpoint = store.head().ok_or("no commit")?;
    store.tag("checkpoint", checkpoint)?;
    let (checkpoint_loss, _) = common::evaluate(&store, heldout)?;

    // Fork: learning rates x data-order seeds, each on a branch at the checkpoint.
    let lrs = [0.02f32, 0.05, 0.1, 0.2];
    let mut alive = Vec::new();
    for i in 0..opts.variants {
        let lr = lrs[i % lrs.len()];
        let seed = (i / lrs.len()) as u64 + 1;
        let v = Variant {
            branch: format!("lr{lr}-s{seed}"),
            lr,
            seed,
            losses: Vec::new(),
        };
        store.branch(&v.branch, checkpoint)?;
        alive.push((v, seed, String::new()));
    }
    let search = Search {
        checkpoint_loss,
        epoch: opts.pretrain,
        rounds: 0,
        finalists_trained: false,
        alive,
        out: Vec::new(),
        prunes: Vec::new(),
    };
    Ok((store, search))
}

/// The content hash of a branch's tip: its identity in any process.
fn tip_hash(store: &Store, branch: &str) -> common::Result<String> {
    Ok(store.version_hash(store.resolve(branch)?)?.to_string())
}

/// Commit the search state on [`STATE_BRANCH`] (a single `u8` tensor of JSON), so that
/// the next save writes the round and its state together.
fn commit_state(store: &mut Store, search: &Search) -> common::Result<()> {
    let json = serde_json::to_vec(search)?;
    if store.resolve(STATE_BRANCH).is_err() {
        store.branch(STATE_BRANCH, store.resolve("checkpoint")?)?;
    }
    store.checkout(STATE_BRANCH)?;
    for name in store.names() {
        store.remove(&name)?;
    }
    store.insert("state", &ndarray::Array1::from(json))?;
    store.commit(&format!("search state after round {}", search.rounds))?;
    Ok(())
}

/// Save round 0 into `dir` whole or not at all: into a sibling directory, renamed into
/// place once saved.
fn save_first(store: &mut Store, search: &Search, dir: &Path) -> common::Result<()> {
    let mut partial = dir.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    let mut search = search.clone();
    search.alive = search
        .alive
        .iter()
        .map(|(v, r, _)| Ok((v.clone(), *r, tip_hash(store, &v.branch)?)))
        .collect::<common::Result<_>>()?;
    commit_state(store, &search)?;
    store.save_as(&partial)?;
    std::fs::rename(&partial, dir)?;
    Ok(())
}

/// Open the repository and put it in the state of its last saved round: the branches of
/// the variants still in the race at their saved tips (a save interrupted while it
/// moved refs may have moved some and not others), and no other branch.
fn resume(dir: &Path) -> common::Result<(Store, Search)> {
    let mut store = Store::open(dir)?;
    let state = store
        .snapshot(store.resolve(STATE_BRANCH)?)?
        .get::<u8>("state")?;
    let search: Search = serde_json::from_slice(&state.into_raw_vec_and_offset().0)?;
    store.checkout(STATE_BRANCH)?;
    let mut tips = std::collections::BTreeMap::new();
    for (v, _, tip) in &search.alive {
        tips.insert(v.branch.clone(), store.resolve(tip)?);
    }
    for (name, r) in store.refs() {
        let keep = match r {
            Ref::Branch(at) => {
                name == STATE_BRANCH || name == "main" || tips.get(&name) == Some(&at)
            }
            _ => true,
        };
        if !keep {
            store.delete_branch(&name)?;
        }
    }
    for (branch, at) in tips {
        if store.resolve(&branch).is_err() {
            store.branch(&branch, at)?;
        }
    }
    Ok((store, search))
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
            let losses: Vec<String> = v
                .losses
                .iter()
                .map(|l| l.map_or("  nan ".into(), |l| format!("{l:.4}")))
                .collect();
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
        if let Some(rounds) = self.resumed_after {
            writeln!(f, "resumed from the repository after round {rounds}")?;
        }
        if let Some(path) = &self.exported {
            writeln!(f, "soup exported to {}", path.display())?;
        }
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
            repo: None,
            export: None,
        }
    }

    /// With 4 variants the search saves round 0 (the fork), round 1 (4 -> 2) and round 2
    /// (the finalists). Stopped right after each save and run again, it resumes and ends
    /// with the soup of a run that was never interrupted, exported as safetensors.
    #[test]
    fn stopped_after_any_saved_round_resumes_to_the_same_soup() {
        let plain = run(&small("plain")).unwrap();
        let _ = std::fs::remove_file(&plain.dot);
        for stop in 0..=2 {
            let dir = tempfile::tempdir().unwrap();
            let mut opts = small(&format!("resume{stop}"));
            opts.repo = Some(dir.path().join("search"));
            assert!(run_until(&opts, Some(stop)).unwrap().is_none());
            let report = run(&opts).unwrap();
            let _ = std::fs::remove_file(&report.dot);
            assert_eq!(report.resumed_after, Some(stop));
            assert_eq!(
                report.soup.1.to_bits(),
                plain.soup.1.to_bits(),
                "stop {stop}"
            );
            assert_eq!(report.checkpoint_loss, plain.checkpoint_loss);
            let losses = |r: &Report| -> Vec<(String, Vec<Option<f32>>)> {
                r.variants
                    .iter()
                    .map(|v| (v.branch.clone(), v.losses.clone()))
                    .collect()
            };
            assert_eq!(losses(&report), losses(&plain), "stop {stop}");
            assert_eq!(report.prunes.len(), plain.prunes.len());

            // The repository holds the soup; the exported file holds the same tensors.
            let path = report.exported.clone().unwrap();
            let saved = Store::open(dir.path().join("search")).unwrap();
            let soup = saved.snapshot(saved.resolve("soup").unwrap()).unwrap();
            let mut imported = Store::new();
            let names = imported.import_safetensors(&path).unwrap();
            assert_eq!(names, soup.names());
            for name in &names {
                assert_eq!(
                    imported.get::<f32>(name).unwrap(),
                    soup.get::<f32>(name).unwrap(),
                    "{name}"
                );
            }
            saved.verify().unwrap();
        }
    }

    #[test]
    fn a_finished_search_rerun_makes_the_same_soup_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = small("rerun");
        opts.repo = Some(dir.path().join("search"));
        let first = run(&opts).unwrap();
        assert_eq!(first.resumed_after, None);
        let again = run(&opts).unwrap();
        let _ = std::fs::remove_file(&opts.dot);
        assert_eq!(again.resumed_after, Some(2));
        assert_eq!(again.soup.1.to_bits(), first.soup.1.to_bits());
        assert!(!dir.path().join("search.partial").exists());
    }

    #[test]
    fn export_without_a_repository_is_a_usage_error() {
        let args = ["--export", "x.safetensors"].map(String::from);
        assert!(Opts::from_args(args).is_err());
        let args = ["--repo", "/tmp/r"].map(String::from);
        let opts = Opts::from_args(args).unwrap();
        assert_eq!(
            opts.export_path(),
            Some(PathBuf::from("/tmp/r.soup.safetensors"))
        );
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
