//! `diff A B`: per tensor, the chunks and bytes that changed and, for float tensors, how
//! far the values moved.

use clap::Args;
use half::{bf16, f16};
use serde_json::{json, Value as Json};
use tensor_history::{DType, Snapshot, Tensor, VarDiff};

use crate::error::{CliError, CliResult, Context};
use crate::format::{bytes, count, number, one_line, Align, Output, Table};
use crate::repo::Repo;

/// `diff A B`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The first version (a branch, a tag, HEAD or an id like v12).
    #[arg(value_name = "A")]
    a: String,
    /// The second version.
    #[arg(value_name = "B")]
    b: String,
}

/// How far a float tensor's values moved between two versions of the same shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Moved {
    /// max |a - b| over all elements.
    pub(crate) max_abs: f64,
    /// mean |a - b| over all elements (unchanged chunks count as zeros).
    pub(crate) mean_abs: f64,
}

/// Decode little-endian float bytes of `dtype` into `f64`s.
fn floats(dtype: DType, raw: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => raw
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        DType::F64 => raw
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect(),
        DType::F16 => raw
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        DType::BF16 => raw
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64())
            .collect(),
        _ => Vec::new(),
    }
}

/// max and mean |a - b| of two float tensors of the same dtype and shape, reading only
/// the chunks listed in `changed` (the others are equal). `None` for other dtypes or
/// layouts. A NaN on either side makes the difference NaN.
pub(crate) fn moved(a: &Tensor, b: &Tensor, changed: &[usize]) -> CliResult<Option<Moved>> {
    let dtype = a.dtype();
    if !dtype.is_float()
        || dtype != b.dtype()
        || a.shape() != b.shape()
        || a.chunk_elems() != b.chunk_elems()
    {
        return Ok(None);
    }
    let (mut max_abs, mut sum) = (0.0f64, 0.0f64);
    for &i in changed {
        let (Some(ca), Some(cb)) = (a.chunk(i), b.chunk(i)) else {
            continue;
        };
        let xa = floats(dtype, ca.bytes().context("reading a chunk")?);
        let xb = floats(dtype, cb.bytes().context("reading a chunk")?);
        for (x, y) in xa.iter().zip(&xb) {
            let d = (x - y).abs();
            // NaN propagates through `max` only if asked: keep it visible.
            max_abs = if d.is_nan() || max_abs.is_nan() {
                f64::NAN
            } else {
                max_abs.max(d)
            };
            sum += d;
        }
    }
    let n = a.len().max(1) as f64;
    Ok(Some(Moved {
        max_abs,
        mean_abs: sum / n,
    }))
}

/// One row of the diff.
struct Row {
    name: String,
    status: &'static str,
    chunks_changed: usize,
    chunks_total: usize,
    bytes: usize,
    moved: Option<Moved>,
}

fn rows(a: &Snapshot, b: &Snapshot, diff: &tensor_history::Diff) -> CliResult<Vec<Row>> {
    let mut out = Vec::new();
    for (name, d) in &diff.vars {
        let ta = a.tensor(name).ok();
        let tb = b.tensor(name).ok();
        let total = tb.or(ta).map_or(0, Tensor::num_chunks);
        let row = match d {
            VarDiff::Added => Row {
                name: name.clone(),
                status: "added",
                chunks_changed: total,
                chunks_total: total,
                bytes: tb.map_or(0, Tensor::nbytes),
                moved: None,
            },
            VarDiff::Removed => Row {
                name: name.clone(),
                status: "removed",
                chunks_changed: total,
                chunks_total: total,
                bytes: ta.map_or(0, Tensor::nbytes),
                moved: None,
            },
            VarDiff::Unchanged => Row {
                name: name.clone(),
                status: "unchanged",
                chunks_changed: 0,
                chunks_total: total,
                bytes: 0,
                moved: ta.filter(|t| t.dtype().is_float()).map(|_| Moved {
                    max_abs: 0.0,
                    mean_abs: 0.0,
                }),
            },
            VarDiff::Changed(td) => {
                let moved = match (ta, tb) {
                    (Some(x), Some(y)) if !td.layout_changed => {
                        moved(x, y, &td.chunks).map_err(|e| with_name(e, name))?
                    }
                    _ => None,
                };
                Row {
                    name: name.clone(),
                    status: if td.layout_changed {
                        "reshaped"
                    } else {
                        "changed"
                    },
                    chunks_changed: td.chunks.len(),
                    chunks_total: total,
                    bytes: td.bytes,
                    moved,
                }
            }
        };
        out.push(row);
    }
    Ok(out)
}

fn with_name(e: CliError, name: &str) -> CliError {
    match e {
        CliError::Failed(m) => CliError::failed(format!("tensor `{name}`: {m}")),
        CliError::Usage(m) => CliError::usage(format!("tensor `{name}`: {m}")),
    }
}

/// A float for JSON: `null` when it is not finite.
fn finite(x: f64) -> Json {
    if x.is_finite() {
        x.into()
    } else {
        Json::Null
    }
}

pub(crate) fn diff(repo: &Repo, out: &Output, args: &DiffArgs) -> CliResult<()> {
    let (a, b) = (repo.resolve(&args.a)?, repo.resolve(&args.b)?);
    let ctx = format!("repository `{}`", repo.location);
    let s = &repo.store;
    let d = s.diff(a, b).context(&ctx)?;
    let (sa, sb) = (s.snapshot(a).context(&ctx)?, s.snapshot(b).context(&ctx)?);
    let rows = rows(&sa, &sb, &d)?;
    let total_bytes: usize = rows.iter().map(|r| r.bytes).sum();
    let total_chunks: usize = rows.iter().map(|r| r.chunks_changed).sum();
    if out.json {
        let tensors: Vec<Json> = rows
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "status": r.status,
                    "chunks_changed": r.chunks_changed,
                    "chunks_total": r.chunks_total,
                    "bytes_changed": r.bytes,
                    "max_abs_diff": r.moved.map(|m| finite(m.max_abs)),
                    "mean_abs_diff": r.moved.map(|m| finite(m.mean_abs)),
                })
            })
            .collect();
        return out.print_json(&json!({
            "a": a.to_string(),
            "b": b.to_string(),
            "tensors": tensors,
            "chunks_changed": total_chunks,
            "bytes_changed": total_bytes,
        }));
    }
    println!("diff {a} {b}");
    let mut table = Table::new(&[
        ("tensor", Align::Left),
        ("status", Align::Left),
        ("chunks", Align::Right),
        ("bytes", Align::Right),
        ("max |a-b|", Align::Right),
        ("mean |a-b|", Align::Right),
    ]);
    for r in &rows {
        let (max, mean) = r.moved.map_or(("-".into(), "-".into()), |m| {
            (number(m.max_abs), number(m.mean_abs))
        });
        table.row(vec![
            one_line(&r.name),
            r.status.into(),
            format!("{}/{}", r.chunks_changed, r.chunks_total),
            bytes(r.bytes as u64),
            max,
            mean,
        ]);
    }
    print!("{}", table.render());
    let changed = rows.iter().filter(|r| r.status != "unchanged").count();
    println!(
        "{changed} of {} differ: {}, {}",
        count(rows.len(), "tensor", "tensors"),
        count(total_chunks, "chunk", "chunks"),
        bytes(total_bytes as u64)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;
    use tensor_history::Store;

    #[test]
    fn moved_reads_changed_chunks_and_averages_over_all_elements() {
        let mut store = Store::new();
        store
            .insert_chunked("w", &array![1.0f32, 2.0, 3.0, 4.0], 8)
            .unwrap();
        let a = store.commit("a").unwrap();
        store.update::<f32>("w", |_, xs| xs[0] += 0.5).unwrap();
        let b = store.commit("b").unwrap();
        let (sa, sb) = (store.snapshot(a).unwrap(), store.snapshot(b).unwrap());
        let (ta, tb) = (sa.tensor("w").unwrap(), sb.tensor("w").unwrap());
        let m = moved(ta, tb, &[0]).unwrap().unwrap();
        assert_eq!(m.max_abs, 0.5);
        assert_eq!(m.mean_abs, 0.5 / 4.0);
    }

    #[test]
    fn half_floats_decode() {
        let one = f16::from_f32(1.0).to_le_bytes();
        assert_eq!(floats(DType::F16, &one), vec![1.0]);
        let two = bf16::from_f32(-2.0).to_le_bytes();
        assert_eq!(floats(DType::BF16, &two), vec![-2.0]);
        assert!(floats(DType::I32, &[0; 4]).is_empty());
    }
}
