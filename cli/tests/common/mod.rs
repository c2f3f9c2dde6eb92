//! Helpers for the command-line tests: repositories made with the library, and a runner
//! for the built binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use ndarray::{Array1, Array2};
use tempfile::TempDir;
use tensor_history::{Meta, Store, VersionId};

/// What a run of the binary gave.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Parse stdout as JSON (panics with the output if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }

    /// Assert exit code 0 and return self.
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    /// Assert a failure with `code`, one line on stderr holding every piece of `needles`,
    /// and no panic or backtrace.
    pub fn fails(self, code: i32, needles: &[&str]) -> Run {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        let err = self.stderr.trim_end();
        assert_eq!(err.lines().count(), 1, "one line expected: {err}");
        assert!(err.starts_with("tensor-history: error: "), "{err}");
        for n in needles {
            assert!(err.contains(n), "`{n}` missing from: {err}");
        }
        assert!(
            !err.contains("panicked") && !err.contains("backtrace"),
            "{err}"
        );
        self
    }
}

/// Run `tensor-history --repo REPO ARGS...` (no `--repo` when `repo` is `None`).
pub fn th(repo: Option<&Path>, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensor-history"));
    if let Some(r) = repo {
        cmd.arg("--repo").arg(r);
    }
    let out = cmd
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The versions of the sample history.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    pub init: VersionId,
    pub main: [VersionId; 3],
    pub alt: [VersionId; 2],
}

/// Chunks of 1 KiB: `w` (64 x 32 f32, 8 KiB) has 8 chunks, so a step that changes a few
/// rows changes a few chunks.
pub const CHUNK: usize = 1024;

pub fn weights() -> Array2<f32> {
    Array2::from_shape_fn((64, 32), |(i, j)| (i * 32 + j) as f32 / 100.0)
}

/// A history with metrics:
///
/// ```text
/// v0 init
/// v1 step 1 (step=1 loss=0.9)  <- fork of `alt`
/// v2 step 2 (step=2 loss=0.7)
/// v3 step 3 (step=3 loss=0.5)  main, tag `best`
///   v4 alt step 2 (step=2 loss=0.8)
///   v5 alt step 3 (step=3 loss=0.4)  alt
/// ```
///
/// Each main step adds 0.5 to rows 0..8 of `w` (chunk 0); each alt step sets rows 56..64
/// (chunk 7) to -1. `b` (16 f32) and `count` (4 i64) change only on main.
pub fn sample_store() -> (Store, Ids) {
    let mut s = Store::new();
    s.insert_chunked("w", &weights(), CHUNK).unwrap();
    s.insert_chunked("b", &Array1::<f32>::zeros(16), CHUNK)
        .unwrap();
    s.insert_chunked("count", &Array1::<i64>::zeros(4), CHUNK)
        .unwrap();
    let init = s.commit("init").unwrap();
    let mut main = Vec::new();
    for (step, loss) in [(1, 0.9), (2, 0.7), (3, 0.5)] {
        s.update_range::<f32>("w", 0..8 * 32, |_, xs| {
            xs.iter_mut().for_each(|x| *x += 0.5)
        })
        .unwrap();
        s.update::<f32>("b", |_, xs| xs[0] += 1.0).unwrap();
        s.update::<i64>("count", |_, xs| xs[0] += 1).unwrap();
        let meta = Meta::new().with("step", step).with("loss", loss);
        main.push(s.commit_with(&format!("step {step}"), meta).unwrap());
    }
    s.tag("best", main[2]).unwrap();
    s.branch("alt", main[0]).unwrap();
    s.checkout("alt").unwrap();
    let mut alt = Vec::new();
    for (step, loss) in [(2, 0.8), (3, 0.4)] {
        s.update_range::<f32>("w", 56 * 32..64 * 32, |_, xs| {
            xs.iter_mut().for_each(|x| *x -= 1.0)
        })
        .unwrap();
        let meta = Meta::new().with("step", step).with("loss", loss);
        alt.push(s.commit_with(&format!("alt step {step}"), meta).unwrap());
    }
    s.checkout("main").unwrap();
    let ids = Ids {
        init,
        main: [main[0], main[1], main[2]],
        alt: [alt[0], alt[1]],
    };
    (s, ids)
}

/// The sample history saved to a new repository in a temporary directory.
pub fn sample_repo() -> (TempDir, PathBuf, Ids) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("repo");
    let (mut s, ids) = sample_store();
    s.save_as(&path).unwrap();
    (dir, path, ids)
}

/// Bytes of every file under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = e.metadata().unwrap();
        total += if meta.is_dir() {
            dir_bytes(&e.path())
        } else {
            meta.len()
        };
    }
    total
}

/// Every file under `dir`, relative paths sorted.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
