//! The repository protocol on a real object store, with many processes at once: branches
//! saved in parallel, races to advance one branch, a worker killed mid-upload, and the
//! server going away during a save. Worker processes are this test binary run again with
//! `TH_S3_CHILD` set (see `child_entry`). Each case runs on every provider of the build
//! whose server is configured (`TH_S3_BUCKET` and `AWS_*`, `TH_AZURE_CONTAINER` and
//! `AZURE_*`; see `tests/s3_common`).

#![cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]

use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ndarray::{Array, ArrayD, IxDyn};
use tensor_history::{
    Backend, Config, Error, GcOptions, ObjectStoreBackend, ObjectStoreOptions, Store,
};

use crate::s3_common;
use crate::s3_common::proxy::Proxy;
use crate::s3_common::Tier;

/// Exit codes of a worker.
const SAVED: i32 = 0;
const CONFLICT: i32 = 3;

const N: usize = 64 * 1024; // f32 elements of the shared tensor: 256 KiB.

fn values(seed: u64, n: usize) -> ArrayD<f32> {
    // Pseudo-random bits (splitmix64 of seed and index; no NaN, so arrays compare equal):
    // incompressible, so a pack stores them raw and an upload is as large as the data,
    // which the outage and kill tests need to cut it part-way.
    let bits = |i: u64| {
        let mut z = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let mut r = ((z ^ (z >> 31)) >> 32) as u32;
        if (r >> 23) & 0xff == 0xff {
            r ^= 1 << 23;
        }
        f32::from_bits(r)
    };
    Array::from_shape_vec(IxDyn(&[n]), (0..n as u64).map(bits).collect()).unwrap()
}

/// Read every tensor of every branch tip of a freshly opened store (each chunk is fetched
/// and checked against its hash), and `verify` it.
fn open_and_read_everything(url: &str) -> Store {
    let mut s = Store::open(url).unwrap();
    s.verify().unwrap();
    let branches: Vec<String> = s
        .refs()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| !n.starts_with("tags/"))
        .collect();
    for b in &branches {
        if s.checkout(b).is_err() {
            continue;
        }
        for name in s.names() {
            s.get::<f32>(&name).unwrap();
        }
    }
    s
}

/// The name libtest gives this module's test `f`: its module path without the crate's
/// name (this file is a module of a test binary with several), as `--exact` wants it.
fn test_name(f: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{f}"),
        None => f.to_owned(),
    }
}

fn spawn_child(role: &str, url: &str, arg: &str, extra_env: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        &test_name("child_entry"),
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
    .stdout(std::process::Stdio::null())
    .env("TH_S3_CHILD", role)
    .env("TH_S3_CHILD_URL", url)
    .env("TH_S3_CHILD_ARG", arg);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start a worker process")
}

fn wait_bounded(mut c: Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = c.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = c.kill();
            panic!("a worker ran longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait (bounded) until the file `go` exists, so racing workers start together.
fn wait_for_go(go: &str) {
    let start = Instant::now();
    while !std::path::Path::new(go).exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "no go signal");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A worker process. Does nothing in a normal test run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("TH_S3_CHILD") else {
        return;
    };
    let url = std::env::var("TH_S3_CHILD_URL").unwrap();
    let arg = std::env::var("TH_S3_CHILD_ARG").unwrap();
    let code = match role.as_str() {
        // Save a new branch `arg` off main with its own values.
        "branch" => {
            let mut s = Store::open(&url).unwrap();
            let seed: u64 = arg.trim_start_matches('b').parse().unwrap();
            let main = s.resolve("main").unwrap();
            s.branch(&arg, main).unwrap();
            s.checkout(&arg).unwrap();
            s.write("w", &values(1000 + seed, N)).unwrap();
            s.commit(&format!("worker {arg}")).unwrap();
            s.save().map(|_| SAVED).unwrap()
        }
        // Advance main with values `arg` = "<round>:<worker>:<go file>".
        "race" => {
            let mut parts = arg.splitn(3, ':');
            let round: u64 = parts.next().unwrap().parse().unwrap();
            let worker: u64 = parts.next().unwrap().parse().unwrap();
            let go = parts.next().unwrap();
            let mut s = Store::open(&url).unwrap();
            s.write("w", &values(round * 100 + worker, N)).unwrap();
            s.commit(&format!("round {round} worker {worker}")).unwrap();
            wait_for_go(go);
            match s.save() {
                Ok(_) => SAVED,
                Err(Error::BranchMoved { .. }) => CONFLICT,
                Err(e) => panic!("race save: {e}"),
            }
        }
        // Save a large new branch (killed by the parent part-way).
        "big" => {
            let mut s = Store::open(&url).unwrap();
            let n: usize = arg.parse().unwrap();
            let main = s.resolve("main").unwrap();
            s.branch("big", main).unwrap();
            s.checkout("big").unwrap();
            s.insert("big", &values(7, n)).unwrap();
            s.commit("big").unwrap();
            s.save().map(|_| SAVED).unwrap()
        }
        other => panic!("unknown worker role {other}"),
    };
    std::process::exit(code);
}

/// On each configured provider, a repository with one commit on main holding `w`.
fn seeded(what: &str) -> Vec<(&'static Tier, String)> {
    let out = s3_common::locations(what);
    for (tier, url) in &out {
        eprintln!("{what} on {}", tier.name);
        let mut s = Store::new();
        s.insert("w", &values(0, N)).unwrap();
        s.commit("base").unwrap();
        s.save_as(url).unwrap();
    }
    out
}

#[test]
fn sixteen_processes_save_sixteen_branches_at_once() {
    for (_, url) in seeded("sixteen") {
        sixteen_processes_save_sixteen_branches_at_once_on(&url);
    }
}

fn sixteen_processes_save_sixteen_branches_at_once_on(url: &str) {
    let url = url.to_owned();
    let children: Vec<Child> = (0..16)
        .map(|i| spawn_child("branch", &url, &format!("b{i}"), &[]))
        .collect();
    for (i, c) in children.into_iter().enumerate() {
        let status = wait_bounded(c, Duration::from_secs(300));
        assert_eq!(status.code(), Some(SAVED), "worker b{i}");
    }
    let mut s = open_and_read_everything(&url);
    for i in 0..16u64 {
        let name = format!("b{i}");
        s.checkout(&name).unwrap();
        assert_eq!(s.get::<f32>("w").unwrap(), values(1000 + i, N), "{name}");
        let tip = s.resolve(&name).unwrap();
        assert_eq!(s.parent(tip).unwrap(), Some(s.resolve("main").unwrap()));
    }
}

#[test]
fn eight_processes_racing_on_one_branch_have_one_winner_per_round() {
    for (_, url) in seeded("race") {
        eight_processes_racing_on_one_branch_have_one_winner_per_round_on(&url);
    }
}

fn eight_processes_racing_on_one_branch_have_one_winner_per_round_on(url: &str) {
    let url = url.to_owned();
    let dir = tempfile::tempdir().unwrap();
    let mut prev_tip = Store::open(&url).unwrap().resolve("main").unwrap();
    for round in 1..=3u64 {
        let go = dir.path().join(format!("go{round}"));
        let go = go.to_str().unwrap().to_owned();
        let children: Vec<Child> = (0..8)
            .map(|w| spawn_child("race", &url, &format!("{round}:{w}:{go}"), &[]))
            .collect();
        // Let every worker open and commit, then start the saves together.
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::write(&go, b"go").unwrap();
        let codes: Vec<Option<i32>> = children
            .into_iter()
            .map(|c| wait_bounded(c, Duration::from_secs(300)).code())
            .collect();
        let winners: Vec<usize> = (0..8).filter(|w| codes[*w] == Some(SAVED)).collect();
        let conflicts = codes.iter().filter(|c| **c == Some(CONFLICT)).count();
        eprintln!("round {round}: winner {winners:?}, {conflicts} conflicts");
        assert_eq!(winners.len(), 1, "round {round}: exit codes {codes:?}");
        assert_eq!(conflicts, 7, "round {round}: exit codes {codes:?}");
        let s = open_and_read_everything(&url);
        let tip = s.resolve("main").unwrap();
        assert_eq!(s.parent(tip).unwrap(), Some(prev_tip), "round {round}");
        assert_eq!(
            s.get::<f32>("w").unwrap(),
            values(round * 100 + winners[0] as u64, N),
            "round {round}: main holds the winner's data"
        );
        prev_tip = tip;
    }
}

#[test]
fn a_worker_killed_mid_upload_leaves_a_repository_that_opens_and_is_collected() {
    for (tier, url) in seeded("killed") {
        a_worker_killed_mid_upload_leaves_a_repository_that_opens_and_is_collected_on(tier, &url);
    }
}

fn a_worker_killed_mid_upload_leaves_a_repository_that_opens_and_is_collected_on(
    tier: &Tier,
    url: &str,
) {
    let url = url.to_owned();
    let endpoint = tier.endpoint();
    let proxy = Proxy::for_endpoint(&endpoint);
    // 64 MiB of new data: two 32 MiB packs, each a multipart upload. The kill comes once
    // the first pack is complete and the second is part-way.
    let child = spawn_child(
        "big",
        &url,
        &(16 << 20).to_string(),
        &[(tier.endpoint_var, proxy.endpoint_like(&endpoint))],
    );
    let start = Instant::now();
    while proxy.bytes_up() < 44 << 20 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "upload never started"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut child = child;
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert_ne!(
        status.code(),
        Some(SAVED),
        "the worker finished before the kill"
    );

    let backend = ObjectStoreBackend::open(&url).unwrap();
    let leftovers: u64 = backend.list("packs/").unwrap().iter().map(|o| o.size).sum();
    let mut s = open_and_read_everything(&url);
    assert!(s.resolve("big").is_err(), "the killed save's ref is absent");
    assert_eq!(s.get::<f32>("w").unwrap(), values(0, N));

    let stats = s.gc_with(&GcOptions::immediate()).unwrap();
    let after: u64 = backend.list("packs/").unwrap().iter().map(|o| o.size).sum();
    eprintln!("killed upload: {leftovers} pack bytes before gc, {after} after, {stats:?}");
    assert!(
        after < leftovers,
        "gc collected the orphaned packs ({leftovers} -> {after} bytes)"
    );
    assert!(after < 1 << 20, "only main's 256 KiB pack is left: {after}");
    open_and_read_everything(&url);
}

#[test]
fn a_server_stopped_during_a_save_loses_nothing_and_the_save_succeeds_after_restart() {
    for (tier, url) in seeded("stopped-save") {
        a_server_stopped_during_a_save_loses_nothing_and_the_save_succeeds_after_restart_on(
            tier, &url,
        );
    }
}

fn a_server_stopped_during_a_save_loses_nothing_and_the_save_succeeds_after_restart_on(
    tier: &Tier,
    url: &str,
) {
    let url = url.to_owned();
    let endpoint = tier.endpoint();
    let mut proxy = Proxy::for_endpoint(&endpoint);
    let mut opts = ObjectStoreOptions::default();
    opts.max_retries = 2;
    opts.initial_backoff = Duration::from_millis(50);
    opts.max_backoff = Duration::from_millis(200);
    opts.retry_timeout = Duration::from_secs(5);
    opts.endpoint = Some(proxy.endpoint_like(&endpoint));
    let backend: Arc<dyn Backend> = Arc::new(ObjectStoreBackend::open_with(&url, opts).unwrap());
    let mut s = Store::open_backend(backend, Config::default()).unwrap();
    let base = s.resolve("main").unwrap();
    s.insert("big", &values(3, 4 << 20)).unwrap(); // 16 MiB: a multipart pack
    let v = s.commit("during the outage").unwrap();

    proxy.cut_after(4 << 20);
    let e = s.save().unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    proxy.restart();

    // Nothing lost in memory; the repository still shows the old state.
    assert_eq!(s.head(), Some(v));
    assert_eq!(s.get::<f32>("big").unwrap(), values(3, 4 << 20));
    let other = open_and_read_everything(&url);
    assert_eq!(other.resolve("main").unwrap(), base);

    s.save().unwrap();
    let other = open_and_read_everything(&url);
    let tip = other.resolve("main").unwrap();
    assert_eq!(other.parent(tip).unwrap(), Some(base));
    assert_eq!(other.get::<f32>("big").unwrap(), values(3, 4 << 20));
}

#[test]
fn gc_on_an_object_store_records_first_and_deletes_only_after_the_grace_period() {
    for (_, url) in seeded("gc-grace") {
        gc_on_an_object_store_records_first_and_deletes_only_after_the_grace_period_on(&url);
    }
}

fn gc_on_an_object_store_records_first_and_deletes_only_after_the_grace_period_on(url: &str) {
    let url = url.to_owned();
    let mut s = Store::open(&url).unwrap();
    let main = s.resolve("main").unwrap();
    s.branch("tmp", main).unwrap();
    s.checkout("tmp").unwrap();
    s.write("w", &values(99, N)).unwrap();
    s.commit("throwaway").unwrap();
    s.save().unwrap();
    s.checkout("main").unwrap();
    s.delete_branch("tmp").unwrap();
    s.save().unwrap();
    // S3 modification times have one-second resolution; objects of the gc record's own
    // second count as possibly written after it and wait for a later record.
    std::thread::sleep(Duration::from_millis(1100));

    let mut opts = GcOptions::default();
    opts.grace = Duration::from_secs(3);
    let first = s.gc_with(&opts).unwrap();
    assert!(first.candidates_recorded > 0, "{first:?}");
    assert_eq!(
        first.objects_deleted, 0,
        "phase 1 deletes nothing: {first:?}"
    );
    let again = s.gc_with(&opts).unwrap();
    assert_eq!(
        again.objects_deleted, 0,
        "inside the grace period: {again:?}"
    );

    std::thread::sleep(Duration::from_millis(3500));
    let last = s.gc_with(&opts).unwrap();
    assert!(last.objects_deleted > 0, "after the grace period: {last:?}");
    let s = open_and_read_everything(&url);
    assert_eq!(s.get::<f32>("w").unwrap(), values(0, N));
    assert!(s.resolve("tmp").is_err());
}
