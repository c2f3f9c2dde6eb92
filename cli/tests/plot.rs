//! `plot`: the SVG is well-formed XML with one line per branch, and the JSON lists the
//! points of each branch from its fork.

mod common;

use common::{sample_repo, th};

/// The data lines of the SVG: polylines drawn 2 px wide (axes and ticks are 1 px), and
/// how many colors they use.
fn data_lines(svg: &str) -> (usize, usize) {
    let doc = roxmltree::Document::parse(svg).expect("the SVG parses as XML");
    let lines: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .collect();
    let colors: std::collections::HashSet<&str> =
        lines.iter().filter_map(|n| n.attribute("stroke")).collect();
    (lines.len(), colors.len())
}

/// The trimmed text of every `<text>` element.
fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_owned())
        .collect()
}

#[test]
fn plot_writes_an_svg_with_one_line_per_branch() {
    let (d, repo, _) = sample_repo();
    let out = d.path().join("loss.svg");
    let text = th(
        Some(&repo),
        &["plot", "--metric", "loss", "-o", out.to_str().unwrap()],
    )
    .ok()
    .stdout;
    assert!(text.contains("2 branches"), "{text}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(data_lines(&svg), (2, 2), "{svg}");
    let texts = texts(&svg);
    assert!(texts.contains(&"main".to_owned()), "{texts:?}");
    assert!(texts.contains(&"alt".to_owned()), "{texts:?}");
    assert!(texts.contains(&"loss by branch".to_owned()), "{texts:?}");
    // A third branch forking from alt adds one line.
    th(Some(&repo), &["branch", "third", "alt"]).ok();
    th(
        Some(&repo),
        &["plot", "--metric", "loss", "-o", out.to_str().unwrap()],
    )
    .ok();
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(data_lines(&svg), (3, 3));
}

#[test]
fn plot_json_gives_each_branch_from_its_fork() {
    let (d, repo, ids) = sample_repo();
    let out = d.path().join("loss.svg");
    let v = th(
        Some(&repo),
        &[
            "--json",
            "plot",
            "--metric",
            "loss",
            "-o",
            out.to_str().unwrap(),
        ],
    )
    .ok()
    .json();
    assert_eq!(v["x"], "step");
    let series = v["series"].as_array().unwrap();
    assert_eq!(series[0]["branch"], "main");
    assert_eq!(
        series[0]["points"],
        serde_json::json!([
            [1.0, 0.9, ids.main[0].to_string()],
            [2.0, 0.7, ids.main[1].to_string()],
            [3.0, 0.5, ids.main[2].to_string()]
        ])
    );
    assert_eq!(series[1]["branch"], "alt");
    assert_eq!(series[1]["fork"], ids.main[0].to_string());
    assert_eq!(
        series[1]["points"],
        serde_json::json!([
            [1.0, 0.9, ids.main[0].to_string()],
            [2.0, 0.8, ids.alt[0].to_string()],
            [3.0, 0.4, ids.alt[1].to_string()]
        ])
    );
}
