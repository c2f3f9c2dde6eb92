//! The commands that change or check a repository: `branch`, `tag`, `delete`, `prune`,
//! `gc`, `verify`, `export`, `import`; each change read back by opening the repository.

mod common;

use common::{dir_bytes, files, sample_repo, th};
use tensor_history::{Ref, Store, Value};

#[test]
fn branch_and_tag_are_saved() {
    let (_d, repo, ids) = sample_repo();
    th(Some(&repo), &["branch", "try", &ids.main[1].to_string()]).ok();
    let v = th(Some(&repo), &["--json", "tag", "release"]).ok().json();
    assert_eq!(v["version"], ids.main[2].to_string());
    let store = Store::open(&repo).unwrap();
    assert_eq!(store.resolve("try").unwrap(), ids.main[1]);
    let refs = store.refs();
    assert!(refs.contains(&("release".to_owned(), Ref::Tag(ids.main[2]))));
    assert!(refs.contains(&("try".to_owned(), Ref::Branch(ids.main[1]))));
}

#[test]
fn delete_removes_a_branch_or_a_tag() {
    let (_d, repo, _) = sample_repo();
    th(Some(&repo), &["delete", "best"]).ok();
    let out = th(Some(&repo), &["delete", "alt"]).ok().stdout;
    assert!(out.contains("deleted branch alt"), "{out}");
    let store = Store::open(&repo).unwrap();
    let names: Vec<String> = store.refs().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["main".to_owned()]);
}

#[test]
fn prune_keep_best_keeps_the_lowest_losses_and_the_tips() {
    let (_d, repo, ids) = sample_repo();
    let v = th(
        Some(&repo),
        &["--json", "prune", "--keep-best", "1", "--metric", "loss"],
    )
    .ok()
    .json();
    // Kept: v5 (alt tip, loss 0.4, also the best), v3 (main tip and tag).
    let want: Vec<String> = [ids.init, ids.main[0], ids.main[1], ids.alt[0]]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(v["dropped"], serde_json::json!(want));
    let store = Store::open(&repo).unwrap();
    assert_eq!(store.versions(), vec![ids.main[2], ids.alt[1]]);
    assert_eq!(
        store.metadata(ids.alt[1]).unwrap().get("loss"),
        Some(&Value::Float(0.4))
    );
}

#[test]
fn prune_keep_best_max_and_keep_last_combine() {
    let (_d, repo, ids) = sample_repo();
    th(
        Some(&repo),
        &[
            "prune",
            "--keep-last",
            "2",
            "--keep-best",
            "1",
            "--metric",
            "loss",
            "--max",
        ],
    )
    .ok();
    let store = Store::open(&repo).unwrap();
    // last 2 of main: v3 v2; of alt: v5 v4; best by max loss: v1 (0.9).
    assert_eq!(
        store.versions(),
        vec![
            ids.main[0],
            ids.main[1],
            ids.main[2],
            ids.alt[0],
            ids.alt[1]
        ]
    );
}

/// The sample repository with branch `alt` deleted and all but HEAD pruned: data for gc.
fn pruned_sample_repo() -> (tempfile::TempDir, std::path::PathBuf) {
    let (d, repo, _) = sample_repo();
    th(Some(&repo), &["delete", "alt"]).ok();
    th(
        Some(&repo),
        &["prune", "--keep-last", "1", "--drop-unreachable"],
    )
    .ok();
    (d, repo)
}

#[test]
fn gc_dry_run_changes_nothing_and_gc_frees_pruned_data() {
    let (_d, repo) = pruned_sample_repo();
    let before = files(&repo);
    let bytes_before = dir_bytes(&repo);
    let v = th(Some(&repo), &["--json", "gc", "--dry-run", "--grace", "0"])
        .ok()
        .json();
    assert_eq!(v["dry_run"], true);
    assert!(v["objects_deleted"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(files(&repo), before, "a dry run writes and deletes nothing");
    let v = th(Some(&repo), &["--json", "gc", "--grace", "0"])
        .ok()
        .json();
    assert!(v["bytes_deleted"].as_u64().unwrap() > 0, "{v}");
    assert!(dir_bytes(&repo) < bytes_before);
    th(Some(&repo), &["verify"]).ok();
    let store = Store::open(&repo).unwrap();
    assert_eq!(store.versions().len(), 1);
    let snap = store.snapshot(store.head().unwrap()).unwrap();
    assert_eq!(snap.get::<f32>("b").unwrap()[0], 3.0);
}

#[test]
fn gc_delete_within_sets_the_runs_deletion_deadline_and_zero_is_refused() {
    let (_d, repo) = pruned_sample_repo();
    let before = files(&repo);
    // refused by the argument parser (its own usage message), before anything is opened
    let out = th(Some(&repo), &["gc", "--grace", "0", "--delete-within", "0"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--delete-within"), "{}", out.stderr);
    assert_eq!(
        files(&repo),
        before,
        "a refused gc writes and deletes nothing"
    );
    let v = th(
        Some(&repo),
        &["--json", "gc", "--grace", "0", "--delete-within", "9"],
    )
    .ok()
    .json();
    assert!(v["objects_deleted"].as_u64().unwrap() > 0, "{v}");
    let dir = repo.join("gc").join("generations");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    let entry: serde_json::Value =
        serde_json::from_slice(&std::fs::read(entries.last().unwrap()).unwrap()).unwrap();
    let span = entry["deadline_ns"].as_u64().unwrap() - entry["time_ns"].as_u64().unwrap();
    assert_eq!(span, 9_000_000_000, "{entry}");
    th(Some(&repo), &["verify"]).ok();
}

#[test]
fn verify_passes_on_a_sound_repository() {
    let (_d, repo, _) = sample_repo();
    let out = th(Some(&repo), &["verify"]).ok().stdout;
    assert!(out.starts_with("ok: "), "{out}");
    let v = th(Some(&repo), &["verify", "--json"]).ok().json();
    assert_eq!(v["ok"], true);
    assert_eq!(v["versions"], 6);
    assert!(v["chunks"].as_u64().unwrap() >= 8);
}

#[test]
fn verify_fails_with_exit_1_naming_a_damaged_pack() {
    let (_d, repo, _) = sample_repo();
    let pack = files(&repo)
        .into_iter()
        .find(|p| p.starts_with("packs"))
        .expect("a pack");
    let path = repo.join(&pack);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[200] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let name = pack.file_name().unwrap().to_str().unwrap().to_owned();
    let run = th(Some(&repo), &["verify"]).fails(1, &["verify found", &name[..16]]);
    assert!(run.stdout.contains(&name[..16]), "{}", run.stdout);
    let v = th(Some(&repo), &["verify", "--json"]).json();
    assert_eq!(v["ok"], false);
    assert!(!v["problems"].as_array().unwrap().is_empty());
}

#[test]
fn export_then_import_round_trips_the_tensors() {
    let (d, repo, ids) = sample_repo();
    let file = d.path().join("alt.safetensors");
    let v = th(
        Some(&repo),
        &["--json", "export", "alt", "-o", file.to_str().unwrap()],
    )
    .ok()
    .json();
    assert_eq!(v["version"], ids.alt[1].to_string());
    assert_eq!(v["tensors"], 3);
    let other = d.path().join("other");
    let v = th(
        Some(&other),
        &[
            "--json",
            "import",
            file.to_str().unwrap(),
            "-m",
            "from alt",
            "--meta",
            "step=3",
            "--meta",
            "loss=0.4",
            "--meta",
            "source=alt",
        ],
    )
    .ok()
    .json();
    assert_eq!(v["tensors"], serde_json::json!(["b", "count", "w"]));
    let a = Store::open(&repo).unwrap();
    let b = Store::open(&other).unwrap();
    let head = b.head().unwrap();
    assert_eq!(b.message(head).unwrap(), "from alt");
    let meta = b.metadata(head).unwrap();
    assert_eq!(meta.get("step"), Some(&Value::Int(3)));
    assert_eq!(meta.get("loss"), Some(&Value::Float(0.4)));
    assert_eq!(meta.get("source"), Some(&Value::Str("alt".into())));
    assert_eq!(
        b.snapshot(head).unwrap().get::<f32>("w").unwrap(),
        a.snapshot(ids.alt[1]).unwrap().get::<f32>("w").unwrap()
    );
}

#[test]
fn import_replaces_the_tensors_of_head_in_a_new_version() {
    let (d, repo, ids) = sample_repo();
    let file = d.path().join("v1.safetensors");
    th(
        Some(&repo),
        &[
            "export",
            &ids.main[0].to_string(),
            "-o",
            file.to_str().unwrap(),
        ],
    )
    .ok();
    let out = th(
        Some(&repo),
        &["import", file.to_str().unwrap(), "-m", "back to v1"],
    )
    .ok()
    .stdout;
    assert!(out.contains("on main"), "{out}");
    let store = Store::open(&repo).unwrap();
    let head = store.head().unwrap();
    assert_eq!(store.parent(head).unwrap(), Some(ids.main[2]));
    // The same values (in the import's own chunking).
    let (old, new) = (
        store.snapshot(ids.main[0]).unwrap(),
        store.snapshot(head).unwrap(),
    );
    assert_eq!(new.names(), old.names());
    for name in ["w", "b"] {
        assert_eq!(new.get::<f32>(name).unwrap(), old.get::<f32>(name).unwrap());
    }
    assert_eq!(
        new.get::<i64>("count").unwrap(),
        old.get::<i64>("count").unwrap()
    );
}

#[test]
fn metadata_round_trips_through_save_and_open() {
    let (_d, repo, ids) = sample_repo();
    let (store, _) = common::sample_store();
    let opened = Store::open(&repo).unwrap();
    for id in store.versions() {
        assert_eq!(
            opened.metadata(id).unwrap(),
            store.metadata(id).unwrap(),
            "{id}"
        );
    }
    assert_eq!(opened.log_graph(), store.log_graph());
    let v = th(Some(&repo), &["--json", "show", &ids.main[1].to_string()])
        .ok()
        .json();
    assert_eq!(v["meta"], serde_json::json!({"loss": 0.7, "step": 2}));
}

#[test]
fn import_into_a_new_relative_repository_path_creates_it() {
    // `--repo repo` names a directory relative to the working directory, whose parent
    // is the empty path: the new repository is created and synced there.
    let cwd = tempfile::tempdir().unwrap();
    let mut src = Store::new();
    src.insert("w", &ndarray::array![1.0f32, 2.0, 3.0]).unwrap();
    let v = src.commit("w").unwrap();
    src.export_safetensors(v, cwd.path().join("in.safetensors"))
        .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensor-history"))
        .current_dir(cwd.path())
        .args([
            "--repo",
            "repo",
            "import",
            "in.safetensors",
            "-m",
            "imported",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = Store::open(cwd.path().join("repo")).unwrap();
    assert_eq!(
        store.get::<f32>("w").unwrap(),
        ndarray::array![1.0f32, 2.0, 3.0].into_dyn()
    );
}

#[test]
fn export_of_a_dcp_version_writes_whole_tensors_unless_asked_for_the_shards() {
    use ndarray::{s, ArrayD, IxDyn};
    let d = tempfile::tempdir().unwrap();
    let repo = d.path().join("dcp");
    let w = ArrayD::from_shape_fn(IxDyn(&[4, 6]), |ix| (ix[0] * 6 + ix[1]) as f32);
    let mut s = Store::new();
    // Two ranks' row shards, as the DCP storage layer names them, and its metadata.
    s.insert("w@0,0", &w.slice(s![0..2, ..]).to_owned().into_dyn())
        .unwrap();
    s.insert("w@2,0", &w.slice(s![2..4, ..]).to_owned().into_dyn())
        .unwrap();
    s.insert(
        tensor_history::DCP_METADATA,
        &ArrayD::from_elem(IxDyn(&[3]), 9u8),
    )
    .unwrap();
    s.commit("dcp save").unwrap();
    s.save_as(&repo).unwrap();
    let whole = d.path().join("whole.safetensors");
    let v = th(
        Some(&repo),
        &["--json", "export", "main", "-o", whole.to_str().unwrap()],
    )
    .ok()
    .json();
    assert_eq!(v["tensors"], 1);
    assert_eq!(v["bytes"], 4 * 6 * 4);
    assert_eq!(v["assembled_from_shards"], true);
    let mut back = Store::new();
    assert_eq!(back.import_safetensors(&whole).unwrap(), ["w"]);
    assert_eq!(back.get::<f32>("w").unwrap(), w);
    let stored = d.path().join("stored.safetensors");
    let out = th(
        Some(&repo),
        &[
            "export",
            "main",
            "-o",
            stored.to_str().unwrap(),
            "--as-stored",
        ],
    )
    .ok()
    .stdout;
    assert!(!out.contains("assembled"), "{out}");
    let mut back = Store::new();
    assert_eq!(
        back.import_safetensors(&stored).unwrap(),
        [".dcp/metadata", "w@0,0", "w@2,0"]
    );
}

#[test]
fn gc_rebase_stores_parts_written_whole_as_deltas_and_refuses_a_dry_run() {
    // Dense steps written as parts (every chunk whole, as DCP saves write them).
    let d = tempfile::tempdir().unwrap();
    let repo = d.path().join("repo");
    let loc = repo.to_str().unwrap();
    let mut c = Store::open(&repo).unwrap();
    let mut w: Vec<f32> = (0..200_000).map(|i| (i as f32 * 0.01).sin()).collect();
    for step in 0..3 {
        let mut writer = Store::new();
        writer
            .insert("w", &ndarray::Array1::from_vec(w.clone()))
            .unwrap();
        let part = writer.write_part(loc).unwrap().part;
        c.commit_parts("main", &[part], &format!("step {step}"), Default::default())
            .unwrap();
        c.save().unwrap();
        w.iter_mut().for_each(|x| *x *= 1.0 - 3e-5);
    }
    drop(c);
    let before = files(&repo);
    let out = th(Some(&repo), &["gc", "--rebase", "--dry-run"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(files(&repo), before, "a refused gc writes nothing");
    let bytes_before = dir_bytes(&repo);
    let v = th(Some(&repo), &["--json", "gc", "--grace", "0", "--rebase"])
        .ok()
        .json();
    assert_eq!(v["chunks_rebased"], 2 * 4, "{v}");
    assert!(dir_bytes(&repo) * 4 < bytes_before * 3, "{v}");
    th(Some(&repo), &["verify"]).ok();
    let out = th(Some(&repo), &["gc", "--grace", "0", "--rebase"])
        .ok()
        .stdout;
    assert!(out.contains("0 packs rewritten"), "{out}");
}

#[test]
fn gc_unchains_kept_versions_off_pruned_ones_unless_told_to_keep_chains() {
    // Dense steps saved with deltas; every version but the last two pruned: their
    // chunks' chains run through the pruned ones.
    let d = tempfile::tempdir().unwrap();
    let repo = d.path().join("repo");
    let mut s = Store::open(&repo).unwrap();
    let mut w: Vec<f32> = (0..200_000).map(|i| (i as f32 * 0.01).sin()).collect();
    s.insert("w", &ndarray::Array1::from_vec(w.clone()))
        .unwrap();
    for step in 0..6 {
        s.write("w", &ndarray::Array1::from_vec(w.clone())).unwrap();
        s.commit(&format!("step {step}")).unwrap();
        s.save().unwrap();
        w.iter_mut().for_each(|x| *x *= 1.0 - 3e-5);
    }
    s.prune(&tensor_history::Retention::keep_last(2)).unwrap();
    s.save().unwrap();
    drop(s);
    let kept = th(
        Some(&repo),
        &["--json", "gc", "--grace", "0", "--keep-chains"],
    )
    .ok()
    .json();
    assert_eq!(kept["chunks_unchained"], 0, "{kept}");
    let bytes_before = dir_bytes(&repo);
    let v = th(Some(&repo), &["--json", "gc", "--grace", "0"])
        .ok()
        .json();
    // Step 4 is coded again (whole: no kept version is older), step 5 stays its delta.
    assert_eq!(v["chunks_unchained"], 4, "{v}");
    th(Some(&repo), &["gc", "--grace", "0"]).ok();
    assert!(dir_bytes(&repo) < bytes_before, "{v}");
    th(Some(&repo), &["verify"]).ok();
}

/// An exported file is created as other tools create files: 0666 less the umask (0644
/// under the usual 022), not the 0600 of a temporary file.
#[cfg(unix)]
#[test]
fn export_creates_a_file_with_the_permissions_the_umask_gives() {
    use std::os::unix::fs::PermissionsExt;
    let (d, repo, _) = sample_repo();
    let file = d.path().join("main.safetensors");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("umask 022 && exec \"$0\" --repo \"$1\" export main -o \"$2\"")
        .arg(env!("CARGO_BIN_EXE_tensor-history"))
        .arg(&repo)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "{mode:o}");
}
