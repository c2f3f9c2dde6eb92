//! Shared fixtures of the backend and S3 tests: the backends of this build, and an S3
//! location under a fresh prefix when a server is configured.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tensor_history::Backend;

pub mod proxy;

/// A prefix no other test run or test uses: `<what>-<pid>-<nanos>-<n>`.
pub fn unique_prefix(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{what}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether the S3 cases must run (`TH_S3_REQUIRED=1`, set by `.ci/run`).
pub fn s3_required() -> bool {
    std::env::var("TH_S3_REQUIRED").is_ok_and(|v| v == "1")
}

/// `s3://<TH_S3_BUCKET>/<fresh prefix>` when a server is configured. Panics when none is
/// configured but `TH_S3_REQUIRED=1`, so the S3 tier cannot pass by not running.
pub fn s3_location(what: &str) -> Option<String> {
    match std::env::var("TH_S3_BUCKET") {
        Ok(bucket) if !bucket.is_empty() => Some(format!("s3://{bucket}/{}", unique_prefix(what))),
        _ => {
            assert!(
                !s3_required(),
                "TH_S3_REQUIRED=1 but no S3 server is configured (TH_S3_BUCKET, AWS_ENDPOINT_URL)"
            );
            eprintln!("no S3 server configured (TH_S3_BUCKET): S3 cases skipped");
            None
        }
    }
}

/// Backends by name.
pub type Named = Vec<(&'static str, Arc<dyn Backend>)>;

/// Every backend of this build, each empty, named; and the temporary directory to keep
/// while they are used.
pub fn backends() -> (Named, tempfile::TempDir) {
    let mut out: Named = Vec::new();
    out.push(("memory", Arc::new(tensor_history::MemoryBackend::new())));
    let dir = tempfile::tempdir().expect("a temporary directory");
    out.push((
        "local directory",
        Arc::new(tensor_history::LocalDir::new(dir.path().join("repo")).expect("LocalDir")),
    ));
    out.push((
        "power-loss simulator",
        Arc::new(tensor_history::SimBackend::new()),
    ));
    #[cfg(feature = "s3")]
    {
        use tensor_history::{ObjectStoreBackend, ObjectStoreOptions};
        let mem = ObjectStoreBackend::from_object_store(
            Arc::new(object_store::memory::InMemory::new()),
            "repo",
            "memory://object_store",
            ObjectStoreOptions::default(),
        )
        .expect("object_store InMemory backend");
        out.push(("object_store InMemory", Arc::new(mem)));
        if let Some(url) = s3_location("conformance") {
            out.push((
                "s3",
                Arc::new(ObjectStoreBackend::open(&url).expect("S3 backend")),
            ));
        }
    }
    (out, dir)
}
