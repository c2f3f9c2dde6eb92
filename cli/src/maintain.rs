//! Commands that change or check the repository: `branch`, `tag`, `delete`, `prune`,
//! `gc`, `verify`.

use std::collections::HashSet;

use clap::Args;
use serde_json::json;
use tensor_history::{ContentHash, Goal, Ref, Retention, VersionId};

use crate::error::{CliError, CliResult, Context};
use crate::format::{bytes, one_line, Output};
use crate::progress;
use crate::repo::Repo;

/// `branch NAME [AT]` and `tag NAME [AT]`.
#[derive(Debug, Args)]
pub(crate) struct RefArgs {
    /// The new ref's name.
    name: String,
    /// Where it points (a branch, a tag, HEAD or an id like v12; default HEAD).
    #[arg(value_name = "AT")]
    at: Option<String>,
}

/// `delete NAME`.
#[derive(Debug, Args)]
pub(crate) struct DeleteArgs {
    /// The branch or tag to delete.
    name: String,
}

/// `prune --keep-last N | --keep-best N --metric M [--min|--max]`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("policy").required(true).multiple(true))]
pub(crate) struct PruneArgs {
    /// Keep the last N versions of every branch.
    #[arg(long, value_name = "N", group = "policy")]
    keep_last: Option<usize>,
    /// Keep the best N versions by the metric `--metric`.
    #[arg(long, value_name = "N", group = "policy", requires = "metric")]
    keep_best: Option<usize>,
    /// The metadata key `--keep-best` ranks by (for example `loss`).
    #[arg(long, value_name = "KEY", requires = "keep_best")]
    metric: Option<String>,
    /// Lower is better (the default).
    #[arg(long, conflicts_with = "max", requires = "keep_best")]
    min: bool,
    /// Higher is better.
    #[arg(long, requires = "keep_best")]
    max: bool,
    /// Also drop versions that no branch, tag or HEAD reaches.
    #[arg(long, group = "policy")]
    drop_unreachable: bool,
}

/// `gc [--dry-run] [--rebase]`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Report what would be deleted without deleting or writing anything.
    #[arg(long)]
    dry_run: bool,
    /// Also store chunks that were saved whole (DCP saves, parts, histories saved
    /// without deltas) as deltas against their parent version's chunks where that
    /// is smaller, rewriting their packs (decodes and encodes those chunks).
    #[arg(long, conflicts_with = "dry_run")]
    rebase: bool,
    /// Keep the chunks of pruned versions that kept versions' delta chains need,
    /// instead of coding those kept chunks again (against the nearest kept version's,
    /// or whole) so that the pruned ones go.
    #[arg(long)]
    keep_chains: bool,
    /// Delete only data that a previous gc found unreferenced at least this many seconds
    /// ago, so that a save running in another process never loses data. 0 deletes at
    /// once: only safe when nothing else writes to the repository.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    grace: u64,
    /// How long the run may go on deleting once it announced its deletions; a save in
    /// another process that writes again what the run may delete waits until the run is
    /// done or past this deadline (plus a margin for clocks).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    delete_within: u64,
}

pub(crate) fn new_ref(mut repo: Repo, out: &Output, args: &RefArgs, tag: bool) -> CliResult<()> {
    let at = repo.resolve_or_head(args.at.as_deref())?;
    let ctx = format!("repository `{}`", repo.location);
    if tag {
        repo.store.tag(&args.name, at).context(&ctx)?;
    } else {
        repo.store.branch(&args.name, at).context(&ctx)?;
    }
    repo.save()?;
    let kind = if tag { "tag" } else { "branch" };
    if out.json {
        return out
            .print_json(&json!({ "created": kind, "name": args.name, "version": at.to_string() }));
    }
    println!("created {kind} {} at {at}", one_line(&args.name));
    Ok(())
}

pub(crate) fn delete(mut repo: Repo, out: &Output, args: &DeleteArgs) -> CliResult<()> {
    let ctx = format!("repository `{}`", repo.location);
    let kind = repo
        .store
        .refs()
        .into_iter()
        .find(|(n, _)| *n == args.name)
        .map(|(_, r)| r)
        .ok_or_else(|| {
            CliError::usage(format!(
                "{ctx}: unknown ref `{}` (no branch or tag of that name)",
                one_line(&args.name)
            ))
        })?;
    let (kind, at) = match kind {
        Ref::Branch(v) => {
            repo.store.delete_branch(&args.name).context(&ctx)?;
            ("branch", v)
        }
        Ref::Tag(v) => {
            repo.store.delete_tag(&args.name).context(&ctx)?;
            ("tag", v)
        }
    };
    repo.save()?;
    if out.json {
        return out
            .print_json(&json!({ "deleted": kind, "name": args.name, "version": at.to_string() }));
    }
    println!("deleted {kind} {} (was at {at})", one_line(&args.name));
    Ok(())
}

pub(crate) fn prune(mut repo: Repo, out: &Output, args: &PruneArgs) -> CliResult<()> {
    let mut policy = Retention::default().drop_unreachable(args.drop_unreachable);
    policy.last = args.keep_last;
    if let (Some(n), Some(metric)) = (args.keep_best, &args.metric) {
        let goal = if args.max { Goal::Max } else { Goal::Min };
        policy = policy.keep_best(n, metric, goal);
    }
    let ctx = format!("repository `{}`", repo.location);
    let stats = repo.store.prune(&policy).context(&ctx)?;
    repo.save()?;
    let dropped: Vec<String> = stats.dropped.iter().map(VersionId::to_string).collect();
    if out.json {
        return out.print_json(&json!({ "dropped": dropped, "kept": stats.kept }));
    }
    if dropped.is_empty() {
        println!("nothing to prune: {} versions kept", stats.kept);
    } else {
        println!(
            "pruned {} versions ({}); {} kept",
            dropped.len(),
            dropped.join(", "),
            stats.kept
        );
        println!("run `tensor-history gc` to free their data on disk");
    }
    Ok(())
}

pub(crate) fn gc(mut repo: Repo, out: &Output, args: &GcArgs) -> CliResult<()> {
    let ctx = format!("gc of `{}`", repo.location);
    let bar = progress::spinner(if args.dry_run { "gc (dry run)" } else { "gc" });
    let mut options = tensor_history::GcOptions::default();
    options.grace = std::time::Duration::from_secs(args.grace);
    options.delete_within = std::time::Duration::from_secs(args.delete_within);
    options.dry_run = args.dry_run;
    options.rebase = args.rebase;
    options.unchain = !args.keep_chains;
    let stats = repo.store.gc_with(&options).context(&ctx);
    bar.finish_and_clear();
    let stats = stats?;
    if out.json {
        return out.print_json(&json!({
            "dry_run": args.dry_run,
            "versions_live": stats.versions_live,
            "chunks_live": stats.chunks_live,
            "candidates_recorded": stats.candidates_recorded,
            "objects_deleted": stats.objects_deleted,
            "bytes_deleted": stats.bytes_deleted,
            "packs_rewritten": stats.packs_rewritten,
            "chunks_rebased": stats.chunks_rebased,
            "chunks_unchained": stats.chunks_unchained,
            "rewritten_bytes_before": stats.rewritten_bytes_before,
            "rewritten_bytes_after": stats.rewritten_bytes_after,
            "indexes_merged": stats.indexes_merged,
        }));
    }
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    println!(
        "{} live versions, {} live chunks; {verb} {} objects ({}), {} packs rewritten",
        stats.versions_live,
        stats.chunks_live,
        stats.objects_deleted,
        bytes(stats.bytes_deleted),
        stats.packs_rewritten
    );
    if stats.packs_rewritten > 0 {
        println!(
            "rewritten packs: {} -> {} ({} chunks re-based as deltas, {} coded again off \
             pruned versions' chains)",
            bytes(stats.rewritten_bytes_before),
            bytes(stats.rewritten_bytes_after),
            stats.chunks_rebased,
            stats.chunks_unchained
        );
    }
    if stats.indexes_merged > 0 {
        println!("{} index files merged into one", stats.indexes_merged);
    }
    if stats.candidates_recorded > 0 {
        println!(
            "{} unreferenced objects recorded; a gc {}s or more from now deletes them",
            stats.candidates_recorded, args.grace
        );
    }
    Ok(())
}

pub(crate) fn verify(repo: &Repo, out: &Output) -> CliResult<()> {
    let mut problems: Vec<String> = Vec::new();
    // 1. Every object in the repository: its envelope and checksum.
    let objects = match repo.store.backend() {
        Some(b) => b
            .list("")
            .context(&format!("listing `{}`", repo.location))?,
        None => Vec::new(),
    };
    let total: u64 = objects.iter().map(|o| o.size).sum();
    let bar = progress::bytes_bar(total, "files");
    if let Some(backend) = repo.store.backend() {
        for o in &objects {
            match backend.get(&o.key) {
                Ok(data) => {
                    if let Err(e) = tensor_history::parse_object(&o.key, &data) {
                        problems.push(format!("{}: {e}", o.key));
                    }
                }
                Err(e) => problems.push(format!("{}: {e}", o.key)),
            }
            bar.inc(o.size);
        }
    }
    bar.finish_and_clear();
    // 2. Every chunk of every live version: read and checked against its hash.
    let s = &repo.store;
    let mut seen: HashSet<ContentHash> = HashSet::new();
    let mut chunks = Vec::new();
    let mut checked_bytes = 0u64;
    for id in s.versions() {
        let snap = s
            .snapshot(id)
            .context(&format!("repository `{}`", repo.location))?;
        for (name, t) in snap.tensors() {
            for (i, c) in t.chunks().enumerate() {
                if seen.insert(c.hash()) {
                    chunks.push((id, name.to_owned(), i, c.clone()));
                }
            }
        }
    }
    let total: u64 = chunks.iter().map(|(.., c)| c.len_bytes() as u64).sum();
    let bar = progress::bytes_bar(total, "chunks");
    for (id, name, i, c) in &chunks {
        if let Err(e) = c.load() {
            problems.push(format!("{id} `{}` chunk {i}: {e}", one_line(name)));
        }
        checked_bytes += c.len_bytes() as u64;
        bar.inc(c.len_bytes() as u64);
    }
    bar.finish_and_clear();
    // 3. The tree's invariants and every hash (only when every chunk could be read).
    if problems.is_empty() {
        if let Err(e) = s.verify() {
            problems.push(e.to_string());
        }
    }
    if out.json {
        out.print_json(&json!({
            "ok": problems.is_empty(),
            "objects": objects.len(),
            "versions": s.versions().len(),
            "chunks": chunks.len(),
            "chunk_bytes": checked_bytes,
            "problems": problems,
        }))?;
    } else {
        for p in &problems {
            println!("{}", one_line(p));
        }
        if problems.is_empty() {
            println!(
                "ok: {} files, {} versions, {} chunks ({}) checked",
                objects.len(),
                s.versions().len(),
                chunks.len(),
                bytes(checked_bytes)
            );
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "verify found {} problem(s) in `{}`; the first: {}",
            problems.len(),
            repo.location,
            problems[0]
        )))
    }
}
