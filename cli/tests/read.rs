//! The read-only commands on a saved history: `log`, `refs`, `show`, `diff`, `stats`,
//! `dot`, in table and JSON form.

mod common;

use common::{dir_bytes, sample_repo, sample_store, th};
use tensor_history::Store;

#[test]
fn log_lists_the_ancestors_of_head_with_metric_columns() {
    let (_d, repo, ids) = sample_repo();
    let out = th(Some(&repo), &["log"]).ok().stdout;
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("version"), "{out}");
    assert!(
        lines[0].contains("loss") && lines[0].contains("step"),
        "{out}"
    );
    assert_eq!(lines.len(), 5, "{out}");
    assert!(lines[1].starts_with(&ids.main[2].to_string()));
    assert!(lines[1].contains("HEAD -> main, tag: best"), "{out}");
    assert!(
        lines[1].contains("0.5") && lines[1].contains("step 3"),
        "{out}"
    );
    assert!(lines[4].starts_with(&ids.init.to_string()));
}

#[test]
fn log_json_has_ids_parents_refs_and_typed_metadata() {
    let (_d, repo, ids) = sample_repo();
    let v = th(Some(&repo), &["--json", "log", "alt"]).ok().json();
    let list = v.as_array().unwrap();
    let got: Vec<&str> = list.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let want: Vec<String> = [ids.alt[1], ids.alt[0], ids.main[0], ids.init]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(got, want);
    assert_eq!(list[0]["meta"]["loss"], serde_json::json!(0.4));
    assert_eq!(list[0]["meta"]["step"], serde_json::json!(3));
    assert_eq!(list[0]["refs"], serde_json::json!(["alt"]));
    assert_eq!(
        list[0]["parents"],
        serde_json::json!([ids.alt[0].to_string()])
    );
    assert_eq!(list[3]["meta"], serde_json::json!({}));
    assert!(list[0]["time"].as_f64().unwrap() > 1.0e9);
}

#[test]
fn log_all_and_max_count() {
    let (_d, repo, _) = sample_repo();
    let v = th(Some(&repo), &["--json", "log", "--all"]).ok().json();
    assert_eq!(v.as_array().unwrap().len(), 6);
    let v = th(Some(&repo), &["--json", "log", "-n", "2"]).ok().json();
    assert_eq!(v.as_array().unwrap().len(), 2);
}

#[test]
fn log_graph_draws_the_fork_and_the_metadata() {
    let (_d, repo, _) = sample_repo();
    let (store, _) = sample_store();
    let out = th(Some(&repo), &["log", "--graph"]).ok().stdout;
    assert_eq!(out, store.log_graph());
    assert!(out.contains("|/"), "{out}");
    assert!(out.contains("[loss=0.4 step=3]"), "{out}");
}

#[test]
fn refs_lists_branches_and_tags_and_head() {
    let (_d, repo, ids) = sample_repo();
    let out = th(Some(&repo), &["refs"]).ok().stdout;
    assert!(
        out.contains("alt") && out.contains("best") && out.contains("main"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("HEAD -> main"), "{out}");
    let v = th(Some(&repo), &["refs", "--json"]).ok().json();
    assert_eq!(v["head"]["branch"], "main");
    assert_eq!(v["head"]["version"], ids.main[2].to_string());
    let refs = v["refs"].as_array().unwrap();
    let names: Vec<(&str, &str)> = refs
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        vec![("alt", "branch"), ("best", "tag"), ("main", "branch")]
    );
    assert_eq!(refs[1]["version"], ids.main[2].to_string());
}

#[test]
fn show_lists_tensors_with_dtype_shape_bytes_chunks_and_hash() {
    let (_d, repo, ids) = sample_repo();
    let store = Store::open(&repo).unwrap();
    let snap = store.snapshot(ids.alt[1]).unwrap();
    let v = th(Some(&repo), &["show", "alt", "--json"]).ok().json();
    assert_eq!(v["id"], ids.alt[1].to_string());
    assert_eq!(v["message"], "alt step 3");
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 3);
    for t in tensors {
        let name = t["name"].as_str().unwrap();
        let want = snap.tensor(name).unwrap();
        assert_eq!(t["dtype"], want.dtype().to_string());
        assert_eq!(t["shape"], serde_json::json!(want.shape()));
        assert_eq!(t["bytes"], want.nbytes());
        assert_eq!(t["chunks"], want.num_chunks());
        assert_eq!(t["content_hash"], want.content_hash().to_string());
    }
    let out = th(Some(&repo), &["show", &ids.main[0].to_string()])
        .ok()
        .stdout;
    assert!(out.contains("loss=0.9 step=1"), "{out}");
    assert!(
        out.contains("[64, 32]") && out.contains("8.0 KiB") && out.contains("i64"),
        "{out}"
    );
}

#[test]
fn diff_counts_changed_chunks_and_measures_float_changes() {
    let (_d, repo, ids) = sample_repo();
    // main v3 against alt v5: w differs in chunk 0 (+1.0 on main since v1) and chunk 7
    // (-2.0 on alt); b and count differ on main.
    let v = th(Some(&repo), &["--json", "diff", "main", "alt"])
        .ok()
        .json();
    assert_eq!(v["a"], ids.main[2].to_string());
    let tensors = v["tensors"].as_array().unwrap();
    let w = tensors.iter().find(|t| t["name"] == "w").unwrap();
    assert_eq!(w["status"], "changed");
    assert_eq!(w["chunks_changed"], 2);
    assert_eq!(w["chunks_total"], 8);
    assert_eq!(w["bytes_changed"], 2048);
    assert_eq!(w["max_abs_diff"].as_f64().unwrap(), 2.0);
    // 256 elements moved by 1.0 and 256 by 2.0 out of 2048.
    // (f32 rounding of x + 0.5 + 0.5 moves some elements by 1 +- 1 ulp)
    assert!((w["mean_abs_diff"].as_f64().unwrap() - 768.0 / 2048.0).abs() < 1e-5);
    let count = tensors.iter().find(|t| t["name"] == "count").unwrap();
    assert_eq!(count["chunks_changed"], 1);
    assert!(
        count["max_abs_diff"].is_null(),
        "integers have no float difference"
    );
    assert_eq!(v["chunks_changed"], 4);
    let out = th(Some(&repo), &["diff", "main", "alt"]).ok().stdout;
    assert!(
        out.contains("2/8") && out.contains("3 of 3 tensors differ"),
        "{out}"
    );
}

#[test]
fn diff_of_a_version_with_itself_is_empty() {
    let (_d, repo, _) = sample_repo();
    let v = th(Some(&repo), &["--json", "diff", "best", "main"])
        .ok()
        .json();
    assert_eq!(v["chunks_changed"], 0);
    assert!(v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["status"] == "unchanged"));
}

#[test]
fn stats_compares_bytes_on_disk_with_full_checkpoints() {
    let (_d, repo, _) = sample_repo();
    let (store, _) = sample_store();
    let full: usize = store
        .versions()
        .iter()
        .map(|v| store.snapshot(*v).unwrap().nbytes())
        .sum();
    let v = th(Some(&repo), &["stats", "--json"]).ok().json();
    assert_eq!(v["versions"], 6);
    assert_eq!(v["branches"], 2);
    assert_eq!(v["tags"], 1);
    assert_eq!(v["full_checkpoint_bytes"], full);
    let disk = v["disk_bytes"].as_u64().unwrap();
    assert_eq!(disk, dir_bytes(&repo));
    let ratio = v["sharing_ratio"].as_f64().unwrap();
    assert!((ratio - full as f64 / disk as f64).abs() < 1e-9);
    // The distinct chunks' raw bytes (each once), and what the packs store of them.
    let raw = v["chunk_bytes_raw"].as_u64().unwrap();
    let on_disk = v["chunk_bytes_on_disk"].as_u64().unwrap();
    assert!(raw > 0 && raw <= full as u64, "{v}");
    assert!(on_disk > 0 && on_disk <= disk, "{v}");
    let out = th(Some(&repo), &["stats"]).ok().stdout;
    assert!(out.contains("6 full checkpoints would take"), "{out}");
    assert!(out.contains("distinct chunks, raw"), "{out}");
    assert!(out.contains("distinct chunks, on disk"), "{out}");
}

#[test]
fn dot_writes_the_tree_or_one_ancestry() {
    let (d, repo, ids) = sample_repo();
    let all = th(Some(&repo), &["dot"]).ok().stdout;
    assert!(all.starts_with("digraph history {"), "{all}");
    assert!(all.contains(&format!("{} -> {};", ids.alt[1].0, ids.alt[0].0)));
    let path = d.path().join("main.dot");
    th(Some(&repo), &["dot", "main", "-o", path.to_str().unwrap()]).ok();
    let main = std::fs::read_to_string(&path).unwrap();
    assert!(main.contains(&format!("{} -> {};", ids.main[2].0, ids.main[1].0)));
    assert!(
        !main.contains(&format!("  {} [label", ids.alt[0].0)),
        "{main}"
    );
    assert!(!main.contains("ref:alt"), "{main}");
    assert!(main.contains("loss=0.5 step=3"), "{main}");
}

#[test]
fn log_hides_metadata_keys_that_begin_with_an_underscore_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let mut s = Store::new();
    s.insert("w", &ndarray::arr1(&[1.0f32, 2.0])).unwrap();
    let record = format!("{{\"groups\": [{}]}}", "0.001, ".repeat(40));
    let meta = tensor_history::Meta::new()
        .with("loss", 0.5)
        .with("_torch.scalars", record.as_str());
    s.commit_with("step", meta).unwrap();
    s.save_as(&repo).unwrap();
    let out = th(Some(&repo), &["log"]).ok().stdout;
    assert!(out.contains("loss") && out.contains("0.5"), "{out}");
    assert!(!out.contains("_torch") && !out.contains("groups"), "{out}");
    let out = th(Some(&repo), &["log", "--hidden"]).ok().stdout;
    assert!(
        out.contains("_torch.scalars") && out.contains("groups"),
        "{out}"
    );
    // JSON is for programs: every key, as saved.
    let v = th(Some(&repo), &["--json", "log"]).ok().json();
    assert!(v[0]["meta"]["_torch.scalars"].is_string(), "{v}");
}
