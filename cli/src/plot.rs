//! `plot --metric M -o FILE.svg`: a metric along every branch of the tree, one line per
//! branch, each line starting where its branch forks from one drawn before it.

use std::collections::HashSet;
use std::path::PathBuf;

use clap::Args;
use plotters::prelude::*;
use serde_json::json;
use tensor_history::{Ref, Store, VersionId};

use crate::error::{CliError, CliResult};
use crate::format::{count, one_line, Output};
use crate::repo::Repo;

/// `plot --metric M -o FILE.svg [--x KEY]`.
#[derive(Debug, Args)]
pub(crate) struct PlotArgs {
    /// The metadata key to plot (for example `loss`).
    #[arg(long, value_name = "KEY")]
    metric: String,
    /// The SVG file to write.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// The metadata key for the x axis (default: `step` when every plotted version has
    /// one, else the number of commits from the root).
    #[arg(long, value_name = "KEY")]
    x: Option<String>,
    /// Width and height in pixels.
    #[arg(long, value_name = "W,H", value_delimiter = ',', num_args = 2, default_values_t = [800u32, 500])]
    size: Vec<u32>,
}

/// One branch's line: its points (x, y, version) in commit order, and where it leaves
/// the line of a branch drawn earlier.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub(crate) branch: String,
    pub(crate) points: Vec<(f64, f64, VersionId)>,
    pub(crate) fork: Option<VersionId>,
}

/// The first-parent line from the root to `tip`, root first.
fn line_to(store: &Store, tip: VersionId) -> Vec<VersionId> {
    let mut line = vec![tip];
    while let Ok(Some(p)) = store.parent(*line.last().unwrap_or(&tip)) {
        line.push(p);
    }
    line.reverse();
    line
}

/// Every branch's series for `metric`, HEAD's branch first, then by name. `x` names the
/// x-axis key; `None` picks `step` when every point has it, else the depth.
pub(crate) fn series(store: &Store, metric: &str, x: Option<&str>) -> (Vec<Series>, String) {
    let mut branches: Vec<(String, VersionId)> = store
        .refs()
        .into_iter()
        .filter_map(|(name, r)| match r {
            Ref::Branch(v) => Some((name, v)),
            Ref::Tag(_) => None,
        })
        .collect();
    let head_branch = store.current_branch().map(str::to_owned);
    branches.sort_by_key(|(name, _)| (Some(name) != head_branch.as_ref(), name.clone()));
    let lines: Vec<(String, Vec<VersionId>)> = branches
        .into_iter()
        .map(|(name, tip)| (name, line_to(store, tip)))
        .collect();
    let number = |v: VersionId, key: &str| {
        store
            .metadata(v)
            .ok()
            .and_then(|m| m.number(key))
            .filter(|x| x.is_finite())
    };
    let x_key = match x {
        Some(k) => Some(k.to_owned()),
        None => {
            let all_have_step = lines
                .iter()
                .flat_map(|(_, l)| l)
                .all(|v| number(*v, metric).is_none() || number(*v, "step").is_some());
            all_have_step.then(|| "step".to_owned())
        }
    };
    let x_of = |v: VersionId, depth: usize| match &x_key {
        Some(k) => number(v, k),
        None => Some(depth as f64),
    };
    let mut drawn: HashSet<VersionId> = HashSet::new();
    let mut out = Vec::new();
    for (name, line) in lines {
        let points: Vec<(usize, (f64, f64, VersionId))> = line
            .iter()
            .enumerate()
            .filter_map(|(depth, v)| Some((depth, (x_of(*v, depth)?, number(*v, metric)?, *v))))
            .collect();
        // The last version this line shares with the lines drawn before it.
        let shared = line.iter().rposition(|v| drawn.contains(v));
        let (start, fork) = match shared {
            Some(k) if k + 1 < line.len() => {
                // Start at the last point at or before the fork, so the line joins.
                let anchor = points.iter().rposition(|(d, _)| *d <= k);
                (anchor.unwrap_or(0), Some(line[k]))
            }
            _ => (0, None),
        };
        drawn.extend(line.iter().copied());
        out.push(Series {
            branch: name,
            points: points[start.min(points.len())..]
                .iter()
                .map(|(_, p)| *p)
                .collect(),
            fork,
        });
    }
    let label = x_key.unwrap_or_else(|| "commits from the root".to_owned());
    (out, label)
}

fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return None;
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        lo.abs().max(1.0) * 0.05
    };
    Some((lo - pad, hi + pad))
}

fn draw(
    path: &PathBuf,
    size: (u32, u32),
    metric: &str,
    x_label: &str,
    series: &[Series],
) -> Result<(), String> {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let xr = range(all().map(|p| p.0)).ok_or("no points")?;
    let yr = range(all().map(|p| p.1)).ok_or("no points")?;
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{metric} by branch"), ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(xr.0..xr.1, yr.0..yr.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(metric)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line = s.points.iter().map(|p| (p.0, p.1));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(one_line(&s.branch))
            // A filled square in the legend (not a line, so the SVG holds one line per
            // branch).
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        if s.fork.is_some() {
            if let Some(first) = s.points.first() {
                chart
                    .draw_series(std::iter::once(Circle::new(
                        (first.0, first.1),
                        4,
                        color.filled(),
                    )))
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

pub(crate) fn plot(repo: &Repo, out: &Output, args: &PlotArgs) -> CliResult<()> {
    let (series, x_label) = series(&repo.store, &args.metric, args.x.as_deref());
    let points: usize = series.iter().map(|s| s.points.len()).sum();
    if points == 0 {
        let what = match &args.x {
            Some(x) => format!("both `{}` and `{x}`", one_line(&args.metric)),
            None => format!("the metric `{}`", one_line(&args.metric)),
        };
        return Err(CliError::usage(format!(
            "no version on a branch of `{}` records {what}",
            repo.location
        )));
    }
    let size = (args.size[0].max(200), args.size[1].max(150));
    draw(&args.output, size, &args.metric, &x_label, &series)
        .map_err(|e| CliError::failed(format!("writing `{}`: {e}", args.output.display())))?;
    if out.json {
        let list: Vec<serde_json::Value> = series
            .iter()
            .map(|s| {
                json!({
                    "branch": s.branch,
                    "fork": s.fork.map(|f| f.to_string()),
                    "points": s.points.iter().map(|(x, y, v)| json!([x, y, v.to_string()])).collect::<Vec<_>>(),
                })
            })
            .collect();
        return out.print_json(&json!({ "output": args.output, "x": x_label, "series": list }));
    }
    println!(
        "wrote {} ({}, {} of `{}` against {x_label})",
        args.output.display(),
        count(series.len(), "branch", "branches"),
        count(points, "point", "points"),
        one_line(&args.metric)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;
    use tensor_history::Meta;

    fn step(store: &mut Store, step: i64, loss: f64) -> VersionId {
        store.update_map::<f32>("w", |x| x + 1.0).unwrap();
        let meta = Meta::new().with("step", step).with("loss", loss);
        store.commit_with(&format!("step {step}"), meta).unwrap()
    }

    #[test]
    fn a_fork_starts_its_line_at_the_fork_point() {
        let mut store = Store::new();
        store.insert("w", &array![0.0f32]).unwrap();
        step(&mut store, 0, 1.0);
        let fork = step(&mut store, 1, 0.8);
        step(&mut store, 2, 0.7);
        store.branch("alt", fork).unwrap();
        store.checkout("alt").unwrap();
        let v = step(&mut store, 2, 0.6);
        store.checkout("main").unwrap();
        let (s, x) = series(&store, "loss", None);
        assert_eq!(x, "step");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].branch, "main");
        assert_eq!(s[0].points.len(), 3);
        assert_eq!(s[0].fork, None);
        assert_eq!(s[1].branch, "alt");
        assert_eq!(s[1].fork, Some(fork));
        assert_eq!(s[1].points, vec![(1.0, 0.8, fork), (2.0, 0.6, v)]);
    }

    #[test]
    fn without_steps_the_x_axis_is_the_depth() {
        let mut store = Store::new();
        store.insert("w", &array![0.0f32]).unwrap();
        store.commit("init").unwrap();
        store
            .commit_with("a", Meta::new().with("loss", 2.0))
            .unwrap();
        let (s, x) = series(&store, "loss", None);
        assert_eq!(x, "commits from the root");
        assert_eq!(
            s[0].points.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![1.0]
        );
    }
}
