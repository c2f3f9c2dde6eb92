//! Read-only commands: `log`, `refs`, `show`, `stats`, `dot`.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value as Json};
use tensor_history::{Ref, VersionId};

use crate::error::{CliError, CliResult, Context};
use crate::format::{self, bytes, datetime, meta_json, one_line, value_cell, Align, Output, Table};
use crate::repo::Repo;

/// `log [REF] [--all] [--graph]`.
#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    /// Show this version and its ancestors (a branch, a tag, HEAD or an id like v12;
    /// default HEAD).
    #[arg(value_name = "REF", conflicts_with_all = ["all", "graph"])]
    refname: Option<String>,
    /// Every version of the tree, not only one line of ancestors.
    #[arg(long)]
    all: bool,
    /// Draw the whole tree like `git log --graph --oneline`, metadata after each message.
    #[arg(long)]
    graph: bool,
    /// Show at most N versions.
    #[arg(short = 'n', long, value_name = "N")]
    max_count: Option<usize>,
    /// Also show metadata keys that begin with `_` (a library's own records, such as
    /// the PyTorch tracker's optimizer settings), hidden by default.
    #[arg(long)]
    hidden: bool,
}

/// `show REF`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The version: a branch, a tag, HEAD or an id like v12.
    #[arg(value_name = "REF", default_value = "HEAD")]
    refname: String,
}

/// `dot [REF] -o FILE`.
#[derive(Debug, Args)]
pub(crate) struct DotArgs {
    /// Only this version and its ancestors (default: the whole tree).
    #[arg(value_name = "REF")]
    refname: Option<String>,
    /// Where to write the DOT text (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// One version as `log` and `show` print it in JSON.
pub(crate) fn version_json(repo: &Repo, id: VersionId) -> CliResult<Json> {
    let s = &repo.store;
    let ctx = format!("repository `{}`", repo.location);
    let snap = s.snapshot(id).context(&ctx)?;
    let parents: Vec<String> = s
        .parents(id)
        .context(&ctx)?
        .iter()
        .map(ToString::to_string)
        .collect();
    Ok(json!({
        "id": id.to_string(),
        "parents": parents,
        "time": format::unix_seconds(snap.time()),
        "refs": repo.labels(id),
        "message": snap.message(),
        "meta": meta_json(snap.metadata()),
    }))
}

pub(crate) fn log(repo: &Repo, out: &Output, args: &LogArgs) -> CliResult<()> {
    let s = &repo.store;
    let mut ids: Vec<VersionId> = if args.all || args.graph {
        s.versions().into_iter().rev().collect()
    } else {
        let tip = repo.resolve_or_head(args.refname.as_deref())?;
        s.log(tip)
            .context(&format!("repository `{}`", repo.location))?
    };
    if let Some(n) = args.max_count {
        ids.truncate(n);
    }
    if out.json {
        let list: Vec<Json> = ids
            .iter()
            .map(|id| version_json(repo, *id))
            .collect::<CliResult<_>>()?;
        return out.print_json(&list);
    }
    if args.graph {
        let graph = s.log_graph();
        let lines: Vec<&str> = graph.lines().collect();
        let shown = args.max_count.unwrap_or(lines.len()).min(lines.len());
        for line in &lines[..shown] {
            println!("{}", one_line(line));
        }
        return Ok(());
    }
    let keys: BTreeSet<String> = ids
        .iter()
        .filter_map(|id| s.metadata(*id).ok())
        .flat_map(|m| m.iter().map(|(k, _)| k.to_owned()).collect::<Vec<_>>())
        .filter(|k| args.hidden || !k.starts_with('_'))
        .collect();
    let mut table = Table::new(&[
        ("version", Align::Left),
        ("refs", Align::Left),
        ("date (UTC)", Align::Left),
    ]);
    for k in &keys {
        table.column(k, Align::Right);
    }
    table.column("message", Align::Left);
    for id in &ids {
        let snap = s
            .snapshot(*id)
            .context(&format!("repository `{}`", repo.location))?;
        let mut row = vec![
            id.to_string(),
            repo.labels(*id).join(", "),
            datetime(snap.time()),
        ];
        for k in &keys {
            row.push(snap.metadata().get(k).map_or_else(String::new, value_cell));
        }
        row.push(one_line(snap.message()));
        table.row(row);
    }
    print!("{}", table.render());
    Ok(())
}

pub(crate) fn refs(repo: &Repo, out: &Output) -> CliResult<()> {
    let s = &repo.store;
    let head = s.head();
    let branch = s.current_branch();
    let list: Vec<(String, &'static str, VersionId)> = s
        .refs()
        .into_iter()
        .map(|(name, r)| match r {
            Ref::Branch(v) => (name, "branch", v),
            Ref::Tag(v) => (name, "tag", v),
        })
        .collect();
    if out.json {
        let refs: Vec<Json> = list
            .iter()
            .map(|(name, kind, v)| {
                json!({
                    "name": name,
                    "kind": kind,
                    "version": v.to_string(),
                    "head": *kind == "branch" && branch == Some(name.as_str()),
                })
            })
            .collect();
        return out.print_json(&json!({
            "head": { "version": head.map(|h| h.to_string()), "branch": branch },
            "refs": refs,
        }));
    }
    let mut table = Table::new(&[
        ("", Align::Left),
        ("name", Align::Left),
        ("kind", Align::Left),
        ("version", Align::Left),
        ("message", Align::Left),
    ]);
    for (name, kind, v) in &list {
        let mark = if branch == Some(name.as_str()) {
            "*"
        } else {
            ""
        };
        let message = s.message(*v).map(one_line).unwrap_or_default();
        table.row(vec![
            mark.into(),
            one_line(name),
            (*kind).into(),
            v.to_string(),
            message,
        ]);
    }
    print!("{}", table.render());
    match (branch, head) {
        (Some(b), _) => println!("HEAD -> {}", one_line(b)),
        (None, Some(h)) => println!("HEAD detached at {h}"),
        (None, None) => println!("HEAD: no commit yet"),
    }
    Ok(())
}

pub(crate) fn show(repo: &Repo, out: &Output, args: &ShowArgs) -> CliResult<()> {
    let id = repo.resolve(&args.refname)?;
    let snap = repo
        .store
        .snapshot(id)
        .context(&format!("repository `{}`", repo.location))?;
    let tensors: Vec<(String, String, Vec<usize>, usize, usize, String)> = snap
        .tensors()
        .map(|(name, t)| {
            (
                name.to_owned(),
                t.dtype().to_string(),
                t.shape().to_vec(),
                t.nbytes(),
                t.num_chunks(),
                t.content_hash().to_string(),
            )
        })
        .collect();
    if out.json {
        let mut v = version_json(repo, id)?;
        v["tensors"] = tensors
            .iter()
            .map(|(name, dtype, shape, nbytes, chunks, hash)| {
                json!({
                    "name": name, "dtype": dtype, "shape": shape, "bytes": nbytes,
                    "chunks": chunks, "content_hash": hash,
                })
            })
            .collect();
        v["bytes"] = snap.nbytes().into();
        return out.print_json(&v);
    }
    let labels = repo.labels(id);
    let refs = if labels.is_empty() {
        String::new()
    } else {
        format!(" ({})", labels.join(", "))
    };
    let parents: Vec<String> = repo
        .store
        .parents(id)
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect();
    println!("version  {id}{refs}");
    println!("parents  {}", or_dash(&parents.join(", ")));
    println!("date     {} UTC", datetime(snap.time()));
    println!("message  {}", one_line(snap.message()));
    println!("meta     {}", or_dash(&snap.metadata().to_string()));
    println!();
    let mut table = Table::new(&[
        ("tensor", Align::Left),
        ("dtype", Align::Left),
        ("shape", Align::Left),
        ("bytes", Align::Right),
        ("chunks", Align::Right),
        ("content hash", Align::Left),
    ]);
    for (name, dtype, shape, nbytes, chunks, hash) in &tensors {
        table.row(vec![
            one_line(name),
            dtype.clone(),
            format!("{shape:?}"),
            bytes(*nbytes as u64),
            chunks.to_string(),
            hash[..16].to_owned(),
        ]);
    }
    print!("{}", table.render());
    println!("{} tensors, {}", tensors.len(), bytes(snap.nbytes() as u64));
    Ok(())
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() {
        "-"
    } else {
        s
    }
}

pub(crate) fn stats(repo: &Repo, out: &Output) -> CliResult<()> {
    let s = &repo.store;
    let ctx = format!("repository `{}`", repo.location);
    let versions = s.versions();
    let mut full = 0u64;
    for id in &versions {
        full += s.snapshot(*id).context(&ctx)?.nbytes() as u64;
    }
    let disk = repo.disk_bytes()?;
    let (branches, tags) = s.refs().iter().fold((0, 0), |(b, t), (_, r)| match r {
        Ref::Branch(_) => (b + 1, t),
        Ref::Tag(_) => (b, t + 1),
    });
    let head = s.head();
    let head_bytes = match head {
        Some(h) => s.snapshot(h).context(&ctx)?.nbytes() as u64,
        None => 0,
    };
    let ratio = if disk == 0 {
        1.0
    } else {
        full as f64 / disk as f64
    };
    // The distinct chunks of every version: their raw bytes, and what the packs store
    // of them (byte planes and deltas take less).
    let held = s.stats();
    let (chunks_raw, chunks_disk) = (held.stored_bytes as u64, held.stored_pack_bytes as u64);
    if out.json {
        return out.print_json(&json!({
            "versions": versions.len(),
            "branches": branches,
            "tags": tags,
            "head": head.map(|h| h.to_string()),
            "head_bytes": head_bytes,
            "disk_bytes": disk,
            "full_checkpoint_bytes": full,
            "chunk_bytes_raw": chunks_raw,
            "chunk_bytes_on_disk": chunks_disk,
            "sharing_ratio": ratio,
        }));
    }
    let mut table = Table::new(&[("", Align::Left), ("", Align::Right)]);
    table.row(vec!["versions".into(), versions.len().to_string()]);
    table.row(vec!["branches".into(), branches.to_string()]);
    table.row(vec!["tags".into(), tags.to_string()]);
    table.row(vec!["one checkpoint (HEAD)".into(), bytes(head_bytes)]);
    table.row(vec!["bytes on disk".into(), bytes(disk)]);
    table.row(vec!["distinct chunks, raw".into(), bytes(chunks_raw)]);
    table.row(vec!["distinct chunks, on disk".into(), bytes(chunks_disk)]);
    table.row(vec![
        format!("{} full checkpoints would take", versions.len()),
        bytes(full),
    ]);
    table.row(vec!["sharing ratio".into(), format!("{ratio:.2}x")]);
    // The header row is empty: print only the rows.
    let text = table.render();
    for line in text.lines().skip(1) {
        println!("{line}");
    }
    Ok(())
}

pub(crate) fn dot(repo: &Repo, out: &Output, args: &DotArgs) -> CliResult<()> {
    let text = match &args.refname {
        None => repo.store.to_dot(),
        Some(r) => {
            let id = repo.resolve(r)?;
            repo.store
                .to_dot_from(id)
                .context(&format!("repository `{}`", repo.location))?
        }
    };
    match &args.output {
        None => print!("{text}"),
        Some(path) => {
            std::fs::write(path, &text)
                .map_err(|e| CliError::failed(format!("writing `{}`: {e}", path.display())))?;
            if out.json {
                out.print_json(&json!({ "output": path, "bytes": text.len() }))?;
            } else {
                println!("wrote {} ({} bytes)", path.display(), text.len());
            }
        }
    }
    Ok(())
}
