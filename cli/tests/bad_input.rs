//! Bad input gives one clear line on stderr and exit code 2 (bad usage or input) or 1 (a
//! failed check or operation), never a panic or a backtrace; and changes nothing.

mod common;

use common::{files, sample_repo, th};

#[test]
fn a_missing_repository_is_exit_2_naming_it() {
    let dir = tempfile::TempDir::new().unwrap();
    let missing = dir.path().join("nope");
    for args in [&["log"][..], &["refs"], &["stats"], &["verify"], &["gc"]] {
        th(Some(&missing), args).fails(2, &["no repository", "nope"]);
    }
    assert!(!missing.exists(), "nothing is created");
}

#[test]
fn a_directory_that_is_not_a_repository_is_exit_2() {
    let dir = tempfile::TempDir::new().unwrap();
    th(Some(dir.path()), &["log"]).fails(2, &["not a tensor-history repository"]);
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    th(Some(dir.path()), &["refs"]).fails(2, &["not a tensor-history repository"]);
    let file = dir.path().join("notes.txt");
    th(Some(&file), &["log"]).fails(2, &["not a repository", "notes.txt"]);
    // import refuses to turn a non-empty directory into a repository
    th(
        Some(dir.path()),
        &["import", file.to_str().unwrap(), "-m", "x"],
    )
    .fails(2, &["not a tensor-history repository"]);
    assert_eq!(files(dir.path()).len(), 1);
}

#[test]
fn the_current_directory_is_the_default_repository() {
    let (_d, repo, _) = sample_repo();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tensor-history"))
        .arg("refs")
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("HEAD -> main"));
}

#[test]
fn an_unknown_ref_is_exit_2_naming_it() {
    let (_d, repo, _) = sample_repo();
    th(Some(&repo), &["show", "nosuch"]).fails(2, &["unknown ref `nosuch`"]);
    th(Some(&repo), &["diff", "main", "nosuch"]).fails(2, &["`nosuch`"]);
    th(Some(&repo), &["log", "v99"]).fails(2, &["v99"]);
    th(Some(&repo), &["export", "nosuch", "-o", "x.safetensors"]).fails(2, &["nosuch"]);
    th(Some(&repo), &["delete", "nosuch"]).fails(2, &["nosuch"]);
    th(Some(&repo), &["branch", "b2", "nosuch"]).fails(2, &["nosuch"]);
    th(Some(&repo), &["dot", "nosuch"]).fails(2, &["nosuch"]);
}

#[test]
fn ref_errors_are_exit_2_and_change_nothing() {
    let (_d, repo, _) = sample_repo();
    let before = files(&repo);
    th(Some(&repo), &["branch", "alt"]).fails(2, &["`alt` already exists"]);
    th(Some(&repo), &["tag", "bad name"]).fails(2, &["invalid ref name"]);
    th(Some(&repo), &["delete", "main"]).fails(2, &["`main` is checked out"]);
    assert_eq!(files(&repo), before);
}

#[test]
fn usage_errors_are_exit_2() {
    let (_d, repo, _) = sample_repo();
    for args in [
        &["frobnicate"][..],
        &["prune"],
        &["prune", "--keep-best", "2"],
        &["prune", "--keep-last", "x"],
        &["log", "--graph", "main"],
        &["diff", "main"],
        &["import", "x.safetensors"],
        &["plot", "-o", "x.svg"],
    ] {
        let run = th(Some(&repo), args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains("error"), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
    let run = th(None, &["--help"]);
    assert_eq!(run.code, 0);
    assert!(run.stdout.contains("Exit codes"));
}

#[test]
fn a_corrupt_safetensors_file_is_exit_1_naming_it_and_changes_nothing() {
    let (d, repo, _) = sample_repo();
    let before = files(&repo);
    let bad = d.path().join("broken.safetensors");
    std::fs::write(&bad, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all").unwrap();
    th(Some(&repo), &["import", bad.to_str().unwrap(), "-m", "x"])
        .fails(1, &["broken.safetensors"]);
    assert_eq!(files(&repo), before);
    let missing = d.path().join("missing.safetensors");
    th(
        Some(&repo),
        &["import", missing.to_str().unwrap(), "-m", "x"],
    )
    .fails(2, &["missing.safetensors", "no such file"]);
}

#[test]
fn a_corrupt_repository_file_is_a_clear_error() {
    let (_d, repo, _) = sample_repo();
    std::fs::write(repo.join("config.json"), b"{\"format\": 7").unwrap();
    th(Some(&repo), &["log"]).fails(1, &["config.json"]);
}

#[test]
fn a_damaged_version_file_names_the_file() {
    let (_d, repo, _) = sample_repo();
    let version = files(&repo)
        .into_iter()
        .find(|p| p.starts_with("versions"))
        .expect("a version file");
    let path = repo.join(&version);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let name = version.file_name().unwrap().to_str().unwrap();
    let run = th(Some(&repo), &["log", "--all"]);
    assert_ne!(run.code, 0);
    run.fails(1, &[&name[..12]]);
}

#[test]
fn bad_metadata_keys_on_import_are_exit_2() {
    let (d, repo, _) = sample_repo();
    let file = d.path().join("m.safetensors");
    th(
        Some(&repo),
        &["export", "main", "-o", file.to_str().unwrap()],
    )
    .ok();
    th(
        Some(&repo),
        &[
            "import",
            file.to_str().unwrap(),
            "-m",
            "x",
            "--meta",
            "a b=1",
        ],
    )
    .fails(2, &["metadata key"]);
    let run = th(
        Some(&repo),
        &[
            "import",
            file.to_str().unwrap(),
            "-m",
            "x",
            "--meta",
            "novalue",
        ],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("not KEY=VALUE"), "{}", run.stderr);
}

#[test]
fn plot_of_a_metric_nobody_recorded_is_exit_2() {
    let (d, repo, _) = sample_repo();
    let out = d.path().join("acc.svg");
    th(
        Some(&repo),
        &["plot", "--metric", "accuracy", "-o", out.to_str().unwrap()],
    )
    .fails(2, &["accuracy"]);
    assert!(!out.exists());
}

#[test]
fn writing_into_a_missing_directory_is_exit_1_naming_the_file() {
    let (d, repo, _) = sample_repo();
    let out = d.path().join("no/such/dir/loss.svg");
    th(
        Some(&repo),
        &["plot", "--metric", "loss", "-o", out.to_str().unwrap()],
    )
    .fails(1, &["loss.svg"]);
    let out = d.path().join("no/such/dir/m.safetensors");
    th(
        Some(&repo),
        &["export", "main", "-o", out.to_str().unwrap()],
    )
    .fails(1, &["m.safetensors"]);
}
