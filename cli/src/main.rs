//! `tensor-history`: look into, compare, prune, export and plot a saved tensor history.
//!
//! Every command takes `--repo LOCATION` (default: the current directory) and `--json`
//! (machine-readable output on stdout). Exit codes: 0 ok, 1 a check or operation failed
//! (damaged data, I/O, a concurrent writer), 2 bad usage or input (unknown arguments,
//! refs or variables; no repository at the location).

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod diff;
mod error;
mod format;
mod inspect;
mod maintain;
mod plot;
mod progress;
mod repo;
mod transfer;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::error::CliResult;
use crate::repo::Repo;

/// Look into, compare, prune, export and plot a saved tensor history.
#[derive(Debug, Parser)]
#[command(name = "tensor-history", version, about, max_term_width = 100)]
#[command(after_help = "Exit codes: 0 ok, 1 failed check or operation, 2 bad usage or input.")]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
struct Global {
    /// The repository: a directory (default: the current one).
    #[arg(long, global = true, value_name = "LOCATION", default_value = ".")]
    repo: String,
    /// Print JSON on stdout instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List versions, newest first, with their metadata (step, loss, ...) as columns.
    Log(inspect::LogArgs),
    /// List branches and tags, and where HEAD is.
    Refs,
    /// A version's message, metadata and tensors (dtype, shape, bytes, chunks, hash).
    Show(inspect::ShowArgs),
    /// Per tensor: changed chunks and bytes, and for floats the max and mean |a - b|.
    Diff(diff::DiffArgs),
    /// Versions, bytes on disk against full checkpoints, and the sharing ratio.
    Stats,
    /// Create a branch at a version (default HEAD).
    Branch(maintain::RefArgs),
    /// Create a tag at a version (default HEAD).
    Tag(maintain::RefArgs),
    /// Delete a branch or a tag (its versions stay until pruned).
    Delete(maintain::DeleteArgs),
    /// Drop versions by policy: the last N per branch and/or the best N by a metric.
    Prune(maintain::PruneArgs),
    /// Delete repository data that no ref, tag or HEAD reaches.
    Gc(maintain::GcArgs),
    /// Read every saved chunk, check its hash, and check the version tree.
    Verify,
    /// Write one version's tensors to a .safetensors file.
    Export(transfer::ExportArgs),
    /// Commit the tensors of a .safetensors file as a new version (creating the
    /// repository if the location is new or empty).
    Import(transfer::ImportArgs),
    /// Plot a metric along every branch of the tree as an SVG chart.
    Plot(plot::PlotArgs),
    /// Write the version tree (or one version's ancestry) as Graphviz DOT.
    Dot(inspect::DotArgs),
}

fn run(cli: Cli) -> CliResult<()> {
    let g = &cli.global;
    let out = format::Output::new(g.json);
    match cli.command {
        Command::Import(args) => transfer::import(&g.repo, &out, &args),
        command => {
            let repo = Repo::open(&g.repo)?;
            match command {
                Command::Log(args) => inspect::log(&repo, &out, &args),
                Command::Refs => inspect::refs(&repo, &out),
                Command::Show(args) => inspect::show(&repo, &out, &args),
                Command::Diff(args) => diff::diff(&repo, &out, &args),
                Command::Stats => inspect::stats(&repo, &out),
                Command::Branch(args) => maintain::new_ref(repo, &out, &args, false),
                Command::Tag(args) => maintain::new_ref(repo, &out, &args, true),
                Command::Delete(args) => maintain::delete(repo, &out, &args),
                Command::Prune(args) => maintain::prune(repo, &out, &args),
                Command::Gc(args) => maintain::gc(repo, &out, &args),
                Command::Verify => maintain::verify(&repo, &out),
                Command::Export(args) => transfer::export(&repo, &out, &args),
                Command::Plot(args) => plot::plot(&repo, &out, &args),
                Command::Dot(args) => inspect::dot(&repo, &out, &args),
                Command::Import(_) => unreachable!("handled above"),
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with success; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    // A bug must still end in one line on stderr, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!(
            "tensor-history: error: internal error: {}",
            format::one_line(&what)
        );
    }));
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("tensor-history: {e}");
            ExitCode::from(e.exit_code())
        }
        Err(_) => ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_are_not_printed_as_successes() {
        let e = Cli::try_parse_from(["tensor-history", "prune"]).unwrap_err();
        assert!(e.use_stderr());
        let e = Cli::try_parse_from(["tensor-history", "--help"]).unwrap_err();
        assert!(!e.use_stderr());
    }
}
