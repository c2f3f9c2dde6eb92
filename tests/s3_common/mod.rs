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

/// An object-store provider the network tests run on: a bucket (or container) named by
/// an environment variable, which the emulator tiers of `.ci/run` set.
#[derive(Debug)]
pub struct Tier {
    /// The provider's name, as tests report it.
    pub name: &'static str,
    scheme: &'static str,
    bucket_var: &'static str,
    required_var: &'static str,
    /// The variable holding the server's URL (what a proxy stands in for).
    pub endpoint_var: &'static str,
}

/// S3 (`TH_S3_BUCKET`, `AWS_*`; `TH_S3_REQUIRED=1` makes its cases fail rather than
/// skip without a server).
pub const S3: Tier = Tier {
    name: "s3",
    scheme: "s3",
    bucket_var: "TH_S3_BUCKET",
    required_var: "TH_S3_REQUIRED",
    endpoint_var: "AWS_ENDPOINT_URL",
};

/// Azure Blob Storage (`TH_AZURE_CONTAINER`, `AZURE_*`; `TH_AZURE_REQUIRED=1`).
pub const AZURE: Tier = Tier {
    name: "azure",
    scheme: "az",
    bucket_var: "TH_AZURE_CONTAINER",
    required_var: "TH_AZURE_REQUIRED",
    endpoint_var: "AZURE_STORAGE_ENDPOINT",
};

/// Google Cloud Storage (`TH_GCS_BUCKET`, `GOOGLE_*`; `TH_GCS_REQUIRED=1`).
pub const GCS: Tier = Tier {
    name: "gcs",
    scheme: "gs",
    bucket_var: "TH_GCS_BUCKET",
    required_var: "TH_GCS_REQUIRED",
    endpoint_var: "GOOGLE_BASE_URL",
};

impl Tier {
    /// Whether this tier's cases must run (`TH_<PROVIDER>_REQUIRED=1`, set by `.ci/run`).
    pub fn required(&self) -> bool {
        std::env::var(self.required_var).is_ok_and(|v| v == "1")
    }

    /// `<scheme>://<bucket>/<fresh prefix>` when a server is configured. Panics when none
    /// is configured but the tier is required, so a tier cannot pass by not running.
    pub fn location(&self, what: &str) -> Option<String> {
        match std::env::var(self.bucket_var) {
            Ok(bucket) if !bucket.is_empty() => Some(format!(
                "{}://{bucket}/{}",
                self.scheme,
                unique_prefix(what)
            )),
            _ => {
                assert!(
                    !self.required(),
                    "{}=1 but no {} server is configured ({}, {})",
                    self.required_var,
                    self.name,
                    self.bucket_var,
                    self.endpoint_var
                );
                eprintln!(
                    "no {} server configured ({}): {} cases skipped",
                    self.name, self.bucket_var, self.name
                );
                None
            }
        }
    }

    /// The server's URL from `endpoint_var`.
    pub fn endpoint(&self) -> String {
        std::env::var(self.endpoint_var)
            .unwrap_or_else(|_| panic!("{} names the {} server", self.endpoint_var, self.name))
    }
}

/// The object-store providers of this build (each runs where its server is configured:
/// `.ci/run` starts emulators for S3 and Azure; Google Cloud Storage runs on a real
/// bucket named by `TH_GCS_BUCKET`).
pub fn tiers() -> Vec<&'static Tier> {
    [
        (&S3, cfg!(feature = "s3")),
        (&GCS, cfg!(feature = "gcs")),
        (&AZURE, cfg!(feature = "azure")),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(t, _)| t)
    .collect()
}

/// A fresh location on each configured provider of this build.
pub fn locations(what: &str) -> Vec<(&'static Tier, String)> {
    tiers()
        .into_iter()
        .filter_map(|t| Some((t, t.location(what)?)))
        .collect()
}

/// Whether the S3 cases must run (`TH_S3_REQUIRED=1`, set by `.ci/run`).
pub fn s3_required() -> bool {
    S3.required()
}

/// `s3://<TH_S3_BUCKET>/<fresh prefix>` when a server is configured (see
/// [`Tier::location`]).
pub fn s3_location(what: &str) -> Option<String> {
    S3.location(what)
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
    #[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
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
        for (tier, url) in locations("conformance") {
            let b = ObjectStoreBackend::open(&url)
                .unwrap_or_else(|e| panic!("{} backend at {url}: {e}", tier.name));
            out.push((tier.name, Arc::new(b)));
        }
    }
    (out, dir)
}
