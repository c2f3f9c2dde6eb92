//! `export` and `import`: versions to and from `.safetensors` files.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;
use tensor_history::{Meta, Value};

use crate::error::{CliError, CliResult, Context};
use crate::format::{bytes, one_line, Output};
use crate::progress;
use crate::repo::Repo;

/// `export REF -o FILE`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// The version to write (a branch, a tag, HEAD or an id like v12).
    #[arg(value_name = "REF")]
    refname: String,
    /// The .safetensors file to write (replaced atomically if it exists).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// For a version saved through torch.distributed.checkpoint: write its shards as
    /// they are stored (`<name>@<offsets>`, and `.dcp/metadata`) instead of whole
    /// tensors assembled from them.
    #[arg(long)]
    as_stored: bool,
}

/// `import FILE -m MESSAGE [--meta KEY=VALUE]...`.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// The .safetensors file to read.
    #[arg(value_name = "FILE")]
    input: PathBuf,
    /// The new version's commit message.
    #[arg(short, long)]
    message: String,
    /// Metadata for the new version, e.g. `--meta step=100 --meta loss=0.25` (integers,
    /// floats and true/false are recognized; anything else is text).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta_pair)]
    meta: Vec<(String, Value)>,
}

/// `KEY=VALUE` with the value typed: an integer, a float, `true`/`false`, else text.
fn parse_meta_pair(s: &str) -> Result<(String, Value), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))?;
    let value = if let Ok(i) = v.parse::<i64>() {
        Value::Int(i)
    } else if let Ok(x) = v.parse::<f64>() {
        Value::Float(x)
    } else if let Ok(b) = v.parse::<bool>() {
        Value::Bool(b)
    } else {
        Value::Str(v.to_owned())
    };
    Ok((k.to_owned(), value))
}

pub(crate) fn export(repo: &Repo, out: &Output, args: &ExportArgs) -> CliResult<()> {
    let id = repo.resolve(&args.refname)?;
    let snap = repo
        .store
        .snapshot(id)
        .context(&format!("repository `{}`", repo.location))?;
    // A version written by the DCP storage layer holds shards: whole tensors are what
    // one process wants back (see `Snapshot::whole_tensors`).
    let whole = snap.is_dcp() && !args.as_stored;
    let bar = progress::spinner(&format!("exporting {id}"));
    let context = format!("exporting {id} to `{}`", args.output.display());
    let done = if whole {
        snap.whole_tensors().context(&context).and_then(|t| {
            tensor_history::write_safetensors(t.iter().map(|(n, t)| (n.as_str(), t)), &args.output)
                .context(&context)
                .map(|()| (t.len(), t.iter().map(|(_, t)| t.nbytes()).sum::<usize>()))
        })
    } else {
        repo.store
            .export_safetensors(id, &args.output)
            .context(&context)
            .map(|()| (snap.names().len(), snap.nbytes()))
    };
    bar.finish_and_clear();
    let (tensors, nbytes) = done?;
    if out.json {
        return out.print_json(&json!({
            "version": id.to_string(),
            "output": args.output,
            "tensors": tensors,
            "bytes": nbytes,
            "assembled_from_shards": whole,
        }));
    }
    let how = if whole {
        ", assembled from its DCP shards"
    } else {
        ""
    };
    println!(
        "wrote {id} to {} ({tensors} tensors, {}{how})",
        args.output.display(),
        bytes(nbytes as u64)
    );
    Ok(())
}

/// Commit the file's tensors as a new version on HEAD: the version holds exactly the
/// file's tensors (chunks equal to saved ones are stored once).
pub(crate) fn import(location: &str, out: &Output, args: &ImportArgs) -> CliResult<()> {
    let path = &args.input;
    if !path.is_file() {
        return Err(CliError::usage(format!(
            "`{}`: no such file",
            path.display()
        )));
    }
    let meta: Meta = args.meta.iter().cloned().collect();
    meta.validate().context("--meta")?;
    let mut repo = Repo::open_or_create(location)?;
    let ctx = format!("repository `{}`", repo.location);
    for name in repo.store.names() {
        repo.store.remove(&name).context(&ctx)?;
    }
    let bar = progress::spinner(&format!("importing {}", path.display()));
    let names = repo
        .store
        .import_safetensors(path)
        .context(&format!("importing `{}`", path.display()));
    bar.finish_and_clear();
    let names = names?;
    let id = repo.store.commit_with(&args.message, meta).context(&ctx)?;
    repo.save()?;
    let nbytes: usize = names
        .iter()
        .filter_map(|n| repo.store.tensor(n).ok())
        .map(tensor_history::Tensor::nbytes)
        .sum();
    if out.json {
        return out.print_json(&json!({
            "version": id.to_string(),
            "tensors": names,
            "bytes": nbytes,
        }));
    }
    let branch = repo.store.current_branch().unwrap_or("detached HEAD");
    println!(
        "committed {id} on {} ({} tensors, {}): {}",
        one_line(branch),
        names.len(),
        bytes(nbytes as u64),
        one_line(&args.message)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_pairs_are_typed() {
        assert_eq!(
            parse_meta_pair("step=3"),
            Ok(("step".into(), Value::Int(3)))
        );
        assert_eq!(
            parse_meta_pair("loss=0.5"),
            Ok(("loss".into(), Value::Float(0.5)))
        );
        assert_eq!(
            parse_meta_pair("ok=true"),
            Ok(("ok".into(), Value::Bool(true)))
        );
        assert_eq!(
            parse_meta_pair("note=a=b"),
            Ok(("note".into(), Value::Str("a=b".into())))
        );
        assert!(parse_meta_pair("nokey").is_err());
    }
}
