//! Process kill: a child process saves in a loop to a local repository (with `save`, or
//! with `save_in_background` while it commits the next step) and is killed with SIGKILL
//! at random points. Reopening always succeeds, verifies, and holds every
//! save the child reported as done, with the right data.
//!
//! The child is this test binary itself, run with `--ignored --exact` on
//! [`child_saves_in_a_loop`] and the repository in an environment variable.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ndarray::Array1;
use tensor_history::{Config, GcOptions, PendingSave, Retention, Store, VersionId};

const DIR_VAR: &str = "TENSOR_HISTORY_KILL_TEST_DIR";
/// Set (to anything) for a child that saves in the background.
const BACKGROUND_VAR: &str = "TENSOR_HISTORY_KILL_TEST_BACKGROUND";
/// Elements of the tensor `w`: 64 Ki f32 = 256 KiB in 16 chunks of 16 KiB.
const LEN: usize = 1 << 16;
const CHUNK_BYTES: usize = 16 << 10;
const CHUNKS: usize = LEN * 4 / CHUNK_BYTES;
/// Saves one child makes at most before it stops by itself.
const CHILD_STEPS: u64 = 2_000;

fn config() -> Config {
    Config {
        chunk_bytes: CHUNK_BYTES,
        ..Config::default()
    }
}

/// `w` after step `step`: chunk `c` holds the last step `j <= step` with `j % CHUNKS ==
/// c` (0 when there is none), in every element.
fn expected_w(step: u64) -> Array1<f32> {
    let per = LEN / CHUNKS;
    Array1::from_shape_fn(LEN, |i| {
        let c = (i / per) as u64;
        if step < c {
            0.0
        } else {
            (step - (step - c) % CHUNKS as u64) as f32
        }
    })
}

/// The step a version holds, and whether its data is what that step wrote.
fn check_version(store: &Store, refname: &str) -> u64 {
    let id = store
        .resolve(refname)
        .unwrap_or_else(|e| panic!("{refname}: {e}"));
    let snap = store.snapshot(id).unwrap();
    let step = snap
        .get::<u64>("step")
        .unwrap_or_else(|e| panic!("{refname}: {e}"));
    let step = step.iter().copied().next().unwrap();
    let w = snap
        .get::<f32>("w")
        .unwrap_or_else(|e| panic!("{refname}: {e}"));
    assert_eq!(
        w,
        expected_w(step).into_dyn(),
        "{refname}: data of step {step}"
    );
    assert_eq!(snap.message(), format!("step {step}"));
    step
}

/// Run by the parent as a child process: open the repository, continue from its HEAD,
/// and save a step at a time, reporting each save on stdout once `save` returned. Every
/// seventh step it also prunes to the last three versions and collects garbage. With
/// [`BACKGROUND_VAR`] set, each step's save runs in the background while the next step
/// is computed and committed, and is reported once `wait` returned.
#[test]
#[ignore = "the child process of `saves_reported_before_a_kill_survive_it`"]
fn child_saves_in_a_loop() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        panic!("{DIR_VAR} is not set: this test is run by the process-kill test");
    };
    let mut store = Store::open_with(&dir, config()).unwrap();
    let mut step = match store.head() {
        Some(_) => {
            let s = store.get::<u64>("step").unwrap();
            s.iter().copied().next().unwrap()
        }
        None => {
            store.insert("w", &Array1::<f32>::zeros(LEN)).unwrap();
            store.insert("step", &ndarray::arr0(0u64)).unwrap();
            store.commit("step 0").unwrap();
            store.save().unwrap();
            println!(
                "saved 0 {}",
                store.version_hash(store.head().unwrap()).unwrap()
            );
            0
        }
    };
    let background = std::env::var_os(BACKGROUND_VAR).is_some();
    let mut pending: Option<(u64, VersionId, PendingSave)> = None;
    for _ in 0..CHILD_STEPS {
        step += 1;
        let c = (step % CHUNKS as u64) as usize;
        let per = LEN / CHUNKS;
        store
            .update_range::<f32>("w", c * per..(c + 1) * per, |_, xs| xs.fill(step as f32))
            .unwrap();
        store.write("step", &ndarray::arr0(step)).unwrap();
        let id = store.commit(&format!("step {step}")).unwrap();
        if step % 7 == 0 {
            store.prune(&Retention::keep_last(3)).unwrap();
        }
        if background {
            if let Some((s, v, p)) = pending.take() {
                p.wait().unwrap();
                println!("saved {s} {}", store.version_hash(v).unwrap());
            }
            if step % 7 == 0 {
                store.gc_with(&GcOptions::immediate()).unwrap();
            }
            pending = Some((step, id, store.save_in_background().unwrap()));
            continue;
        }
        store.save().unwrap();
        if step % 7 == 0 {
            store.gc_with(&GcOptions::immediate()).unwrap();
        }
        println!("saved {step} {}", store.version_hash(id).unwrap());
    }
}

/// A small xorshift generator: the kill times need no more.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One child run, killed after `after`; returns the (step, version hash) it reported.
fn run_child(dir: &Path, after: Duration, background: bool) -> Vec<(u64, String)> {
    let mut command = Command::new(std::env::current_exe().unwrap());
    if background {
        command.env(BACKGROUND_VAR, "1");
    }
    let mut child = command
        .args([
            "child_saves_in_a_loop",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_VAR, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let mut parts = line.split_whitespace();
            if let (Some("saved"), Some(step), Some(hash), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            {
                if let (Ok(step), 64) = (step.parse::<u64>(), hash.len()) {
                    let _ = tx.send((step, hash.to_owned()));
                }
            }
        }
    });
    std::thread::sleep(after);
    // SIGKILL: no destructor, no flush, no unwinding.
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap();
    rx.try_iter().collect()
}

#[test]
fn saves_reported_before_a_kill_survive_it() {
    kill_children(false);
}

#[test]
fn background_saves_reported_before_a_kill_survive_it() {
    kill_children(true);
}

/// Kill children at random points (saving in the background or not) and check what
/// each left. One test's children at a time: their time budget is not shared.
fn kill_children(background: bool) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    let start = Instant::now();
    let mut last_reported: Option<(u64, String)> = None;
    let mut kills = 0;
    let mut total_reported = 0;
    // Bounded: at most 10 kills and about 8 s of children, or until the children have
    // reported at least 3 saves, within 60 s: a child needs some milliseconds to start
    // before it saves, and on a loaded machine a kill can come before its first save.
    let enough = |kills: usize, reported: usize, elapsed: Duration| {
        (kills >= 10 || elapsed >= Duration::from_secs(8))
            && (reported >= 3 || elapsed >= Duration::from_secs(60))
    };
    while !enough(kills, total_reported, start.elapsed()) {
        let after = Duration::from_millis(100 + rng.below(500));
        let reported = run_child(dir.path(), after, background);
        kills += 1;
        total_reported += reported.len();
        let store = Store::open_with(dir.path(), config())
            .unwrap_or_else(|e| panic!("reopen after kill {kills} (seed {seed}): {e}"));
        store.verify().unwrap();
        if let Some(last) = reported.last() {
            last_reported = Some(last.clone());
        }
        let Some((step, hash)) = &last_reported else {
            continue;
        };
        // The last reported save is there with its data, and HEAD is at it or later.
        assert_eq!(check_version(&store, hash), *step, "seed {seed}");
        let head = check_version(&store, "main");
        assert!(
            head >= *step,
            "HEAD at step {head}, {step} was reported (seed {seed})"
        );
        // Every reported version that no prune may have dropped: the child keeps the
        // last three versions when it prunes, and a prune issued just before the kill
        // may be on disk already (the retention asked for it), so the last two.
        for (s, h) in &reported {
            if s + 2 > *step {
                assert_eq!(check_version(&store, h), *s, "seed {seed}");
            }
        }
    }
    assert!(kills >= 3, "only {kills} kills ran");
    assert!(
        total_reported >= 3,
        "the children reported {total_reported} saves in {kills} runs: too few to test"
    );
    eprintln!("{kills} kills, {total_reported} saves reported (seed {seed})");
}
