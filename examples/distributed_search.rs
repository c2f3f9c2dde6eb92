//! Distributed exploration over one shared repository: a coordinator trains and tags a
//! checkpoint, starts N worker processes (this program again, with `--worker`), and each
//! worker opens the same repository, trains its own branch from the checkpoint with its
//! own learning rate and data order, and saves. The coordinator then refreshes, ranks the
//! branches by held-out loss, deletes the losing half, averages the two best into a
//! soup, saves and tags it, and prints the history tree.
//!
//! ```text
//! cargo run --release --example distributed_search -- --workers 4
//! cargo run --release --features s3 --example distributed_search -- \
//!     --repo s3://bucket/search --workers 8     # AWS_* variables name the server
//! ```
//!
//! Without `--repo` the repository is a new local directory, so no server is needed.

mod common;

use std::error::Error;
use std::process::{Child, Command};

use common::{Dataset, Flags, SplitMix64};
use tensor_history::{Meta, Retention, Store};

const USAGE: &str = "usage: distributed_search [--repo LOCATION] [--workers N] [--hidden N] \
                     [--epochs N] [--seed N]";

/// Learning rates the workers cycle through.
const LRS: [f32; 4] = [0.02, 0.05, 0.1, 0.2];

#[derive(Clone, Debug)]
struct Opts {
    repo: String,
    workers: usize,
    hidden: usize,
    epochs: usize,
    seed: u64,
    /// `Some(i)`: run as worker `i`.
    worker: Option<usize>,
}

fn parse(args: impl IntoIterator<Item = String>) -> common::Result<Opts> {
    let flags = Flags::parse(
        args,
        &["repo", "workers", "hidden", "epochs", "seed", "worker"],
    )?;
    let seed = flags.number("seed", 42u64)?;
    let opts = Opts {
        repo: flags.string("repo").map_or_else(
            || {
                std::env::temp_dir()
                    .join(format!("distributed-search-{}-{seed}", std::process::id()))
                    .to_string_lossy()
                    .into_owned()
            },
            str::to_owned,
        ),
        workers: flags.number("workers", 4usize)?,
        hidden: flags.number("hidden", 64usize)?,
        epochs: flags.number("epochs", 3usize)?,
        seed,
        worker: match flags.string("worker") {
            None => None,
            Some(_) => Some(flags.number("worker", 0usize)?),
        },
    };
    if opts.workers < 2 || opts.workers > 64 {
        return Err(format!("--workers {}: expected 2..=64", opts.workers).into());
    }
    if opts.hidden == 0 || opts.hidden > 4096 {
        return Err(format!("--hidden {}: expected 1..=4096", opts.hidden).into());
    }
    Ok(opts)
}

/// The data every process derives from the seed: training and held-out sets.
fn data(seed: u64) -> (Dataset, Dataset) {
    let mut rng = SplitMix64::new(seed);
    let train = Dataset::two_spirals(1500, 0.05, &mut rng);
    let heldout = Dataset::two_spirals(512, 0.05, &mut rng);
    (train, heldout)
}

fn train_epoch(s: &mut Store, data: &Dataset, lr: f32, rng: &mut SplitMix64) -> common::Result<()> {
    for _ in 0..data.len().div_ceil(32) {
        let batch = data.sample(32, rng);
        let (_, grads) = common::gradients(s, &batch)?;
        for (name, g) in &grads {
            s.zip_update(name, g, move |w, g| common::sgd(w, g, lr))?;
        }
    }
    Ok(())
}

/// A worker: its own branch from the checkpoint, trained and saved.
fn worker(opts: &Opts, i: usize) -> common::Result<()> {
    let (train, heldout) = data(opts.seed);
    let mut s = Store::open(&opts.repo)?;
    let checkpoint = s.resolve("checkpoint")?;
    let branch = format!("worker-{i}");
    let lr = LRS[i % LRS.len()];
    s.branch(&branch, checkpoint)?;
    s.checkout(&branch)?;
    let mut rng = SplitMix64::new(opts.seed ^ (1000 + i as u64));
    for e in 1..=opts.epochs {
        train_epoch(&mut s, &train, lr, &mut rng)?;
        let mut meta = Meta::new().with("lr", lr).with("epoch", e as i64);
        if e == opts.epochs {
            meta.insert("heldout_loss", common::evaluate(&s, &heldout)?.0);
        }
        s.commit_with(&format!("{branch}: lr={lr} epoch {e}"), meta)?;
    }
    s.save()?;
    Ok(())
}

fn coordinator(opts: &Opts) -> common::Result<()> {
    let (train, heldout) = data(opts.seed);
    let mut rng = SplitMix64::new(opts.seed);
    let mut s = Store::new();
    for (name, array) in common::init_mlp(opts.hidden, &mut rng) {
        s.insert(&name, &array)?;
    }
    s.commit("init")?;
    for e in 1..=5 {
        train_epoch(&mut s, &train, 0.1, &mut rng)?;
        s.commit(&format!("pretrain epoch {e}"))?;
    }
    let checkpoint = s.head().ok_or("no commit")?;
    s.tag("checkpoint", checkpoint)?;
    let saved = s.save_as(&opts.repo)?;
    println!(
        "repository {}: checkpoint saved ({} versions, {} chunks)",
        opts.repo, saved.versions_written, saved.chunks_written
    );

    // The workers: this program again, each its own process.
    let exe = std::env::current_exe()?;
    let children: Vec<(usize, Child)> = (0..opts.workers)
        .map(|i| {
            let child = Command::new(&exe)
                .args(["--worker", &i.to_string(), "--repo", &opts.repo])
                .args(["--hidden", &opts.hidden.to_string()])
                .args(["--epochs", &opts.epochs.to_string()])
                .args(["--seed", &opts.seed.to_string()])
                .spawn()?;
            Ok((i, child))
        })
        .collect::<std::io::Result<_>>()?;
    for (i, mut child) in children {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("worker {i} failed: {status}").into());
        }
    }

    // Take in what the workers saved, rank by the held-out loss each recorded.
    let refreshed = s.refresh()?;
    println!(
        "{} workers saved; refresh loaded {} versions",
        opts.workers, refreshed.versions_loaded
    );
    let mut ranked: Vec<(String, f64)> = Vec::new();
    for (name, _) in s.refs() {
        if name.starts_with("worker-") {
            let tip = s.resolve(&name)?;
            let loss = s.metadata(tip)?.number("heldout_loss").unwrap_or(f64::MAX);
            ranked.push((name, loss));
        }
    }
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
    println!("\n| rank | branch | held-out loss |\n| --- | --- | --- |");
    for (r, (name, loss)) in ranked.iter().enumerate() {
        println!("| {} | {name} | {loss:.4} |", r + 1);
    }
    let keep = (ranked.len() / 2).max(2);
    s.checkout("main")?;
    for (name, _) in &ranked[keep..] {
        s.delete_branch(name)?;
    }
    s.prune(&Retention::default().drop_unreachable(true))?;

    // The soup of the two best, on its own branch, tagged.
    let best: Vec<_> = ranked[..2]
        .iter()
        .map(|(name, _)| s.resolve(name))
        .collect::<Result<_, _>>()?;
    s.branch("soup", best[0])?;
    s.checkout("soup")?;
    let soup = s.average(&best, None)?;
    let (soup_loss, soup_acc) = common::evaluate(&s, &heldout)?;
    s.tag("soup-1", soup)?;
    let saved = s.save()?;
    println!(
        "\nsoup of {} and {}: held-out loss {soup_loss:.4}, accuracy {:.1}%; saved {} versions",
        ranked[0].0,
        ranked[1].0,
        soup_acc * 100.0,
        saved.versions_written
    );
    println!("deleted {} losing branches\n", ranked.len() - keep);
    println!("{}", s.log_graph());

    // Anyone opening the repository now sees the same tree.
    let again = Store::open(&opts.repo)?;
    assert_eq!(again.resolve("soup-1")?, soup);
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let opts = common::opts_or_exit(parse(std::env::args().skip(1)), USAGE);
    match opts.worker {
        Some(i) => worker(&opts, i)?,
        None => coordinator(&opts)?,
    }
    Ok(())
}
