//! [`ObjectStoreBackend`]: a repository on object storage (features `s3`, `gcs`,
//! `azure`), generic over `object_store`'s [`ObjectStore`].
//!
//! The protocol needs of a store only what every provider offers: whole and ranged reads,
//! writes, a create-if-absent write ([`PutMode::Create`]), listing and deletion. What
//! differs between providers, how a client is configured and the multipart limits, lives
//! in one file each: `s3.rs` (Amazon S3 and S3-compatible servers), `gcs.rs` (Google
//! Cloud Storage), `azure.rs` (Azure Blob Storage). Each client is configured from the
//! environment as `object_store`'s `from_env` builders do:
//!
//! | provider | variables |
//! | --- | --- |
//! | S3 | `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` (default `us-east-1`), `AWS_ALLOW_HTTP`, other `AWS_*` |
//! | Google Cloud Storage | `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS`, `GOOGLE_SERVICE_ACCOUNT_KEY`, `GOOGLE_BASE_URL`, `GOOGLE_ALLOW_HTTP`, other `GOOGLE_*` |
//! | Azure | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_KEY`, `AZURE_STORAGE_ENDPOINT`, `AZURE_ALLOW_HTTP`, `AZURE_STORAGE_USE_EMULATOR`, other `AZURE_*` |
//!
//! The [`Backend`] trait is synchronous; `object_store` is async. The backend owns a
//! private tokio runtime and runs every request on it, so callers need no runtime of
//! their own, and a caller that *is* inside a tokio runtime (an async web handler, a
//! `#[tokio::main]` program) does not hit tokio's "cannot block inside a runtime" panic:
//! there the request is spawned on the private runtime and the calling thread waits for
//! its result.
//!
//! # Requests
//!
//! As sent to S3 (Google Cloud Storage's XML API sends the same; Azure lists with
//! `comp=list` and uploads a large object as blocks and a block list, all PUTs):
//!
//! | trait call | requests |
//! | --- | --- |
//! | `get` | one GET |
//! | `get_range` | one ranged GET (`Range: bytes=a-b`) |
//! | `put` up to `part_size` | one PUT |
//! | `put` above `part_size` | multipart: one POST, one PUT per part (up to `max_concurrent_parts` at once), one POST |
//! | `get_many` | one GET per object, up to [`REQUESTS_IN_FLIGHT`] at once (a part write's manifests) |
//! | `put_many` | one PUT per object, up to [`REQUESTS_IN_FLIGHT`] at once (a save's and a part write's manifests); objects above `part_size` as `put`, one after another |
//! | `put_if_absent` | one conditional PUT; if the object exists, one GET to tell a lost response of our own write from another writer's object |
//! | `list` | one GET per 1,000 keys |
//! | `delete` | one DELETE |
//! | `barrier` | none: an acknowledged PUT is already durable |
//!
//! Transient failures (connection errors, 5xx, 429, timeouts of idempotent requests) are
//! retried by `object_store` with exponential backoff, at most
//! [`ObjectStoreOptions::max_retries`] times and never past
//! [`ObjectStoreOptions::retry_timeout`]; then the call fails with [`Error::Io`].

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use object_store::client::{HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse};
use object_store::client::{HttpService, ReqwestConnector};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt,
    ObjectStoreScheme, PutMode, PutOptions, PutPayload, RetryConfig, WriteMultipart,
};

use super::{AlignedBuf, Backend, Bytes, ObjectInfo, PutOutcome};
use crate::error::{Error, Result};

mod azure;
mod gcs;
mod s3;

/// The smallest part S3 (and Google Cloud Storage) accept in a multipart upload (all
/// parts but the last); Azure has no minimum.
pub const MIN_PART_SIZE: usize = s3::MIN_PART_SIZE;

/// Requests of one [`Backend::put_many`] or [`Backend::get_many`] in flight at once: a
/// save writes one manifest per changed tensor, and a part write reads and writes one
/// per tensor; one after another they cost a round trip each.
pub const REQUESTS_IN_FLIGHT: usize = 16;

/// Tuning of an [`ObjectStoreBackend`]. `Default` suits every provider.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ObjectStoreOptions {
    /// Objects larger than this go up as a multipart upload of parts of this size.
    /// At least the provider's minimum ([`MIN_PART_SIZE`] on S3 and Google Cloud Storage,
    /// 1 byte on Azure). Default 8 MiB.
    pub part_size: usize,
    /// Parts of one multipart upload in flight at once. Default 4.
    pub max_concurrent_parts: usize,
    /// Retries of one request after a transient failure. Default 5.
    pub max_retries: usize,
    /// No retry starts this long after the first attempt. Default 60 s.
    pub retry_timeout: Duration,
    /// The first backoff; each next one doubles, up to `max_backoff`. Default 100 ms.
    pub initial_backoff: Duration,
    /// The longest backoff between two attempts. Default 5 s.
    pub max_backoff: Duration,
    /// The service's URL, instead of the environment's (`AWS_ENDPOINT_URL` on S3,
    /// `GOOGLE_BASE_URL` on Google Cloud Storage, `AZURE_STORAGE_ENDPOINT` on Azure, where
    /// it names the account: `http://127.0.0.1:10000/devstoreaccount1` for Azurite). An
    /// `http://` URL allows plain HTTP. Default `None`.
    pub endpoint: Option<String>,
}

impl Default for ObjectStoreOptions {
    fn default() -> ObjectStoreOptions {
        ObjectStoreOptions {
            part_size: 8 << 20,
            max_concurrent_parts: 4,
            max_retries: 5,
            retry_timeout: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            endpoint: None,
        }
    }
}

impl ObjectStoreOptions {
    /// Check the options against a provider whose multipart parts are at least
    /// `min_part_size` bytes.
    fn validate(&self, min_part_size: usize) -> Result<()> {
        if self.part_size < min_part_size {
            return Err(Error::InvalidArgument {
                reason: format!(
                    "part_size {} is below the {min_part_size}-byte minimum of this store's multipart uploads",
                    self.part_size
                ),
            });
        }
        if self.max_concurrent_parts == 0 {
            return Err(Error::InvalidArgument {
                reason: "max_concurrent_parts must be at least 1".into(),
            });
        }
        Ok(())
    }

    fn retry_config(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: self.initial_backoff,
                max_backoff: self.max_backoff,
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }
}

/// HTTP requests an [`ObjectStoreBackend`] has sent (retries included), counted on the
/// wire, and the bytes of request and response bodies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestStats {
    /// GET requests for object data (whole or ranged).
    pub gets: u64,
    /// List requests (GET with `list-type` on S3 and Google Cloud Storage, `comp=list` on
    /// Azure).
    pub lists: u64,
    /// PUT requests (single objects, multipart parts; Azure's blocks and block list).
    pub puts: u64,
    /// POST requests (S3 and Google Cloud Storage multipart create and complete).
    pub posts: u64,
    /// HEAD requests.
    pub heads: u64,
    /// DELETE requests.
    pub deletes: u64,
    /// Bytes of request bodies sent.
    pub bytes_sent: u64,
    /// Bytes of object data received by `get` and `get_range`.
    pub bytes_received: u64,
}

impl RequestStats {
    /// All requests together.
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.gets + self.lists + self.puts + self.posts + self.heads + self.deletes
    }

    /// The requests and bytes of `self` not yet counted in `earlier`.
    #[must_use]
    pub fn since(&self, earlier: &RequestStats) -> RequestStats {
        RequestStats {
            gets: self.gets - earlier.gets,
            lists: self.lists - earlier.lists,
            puts: self.puts - earlier.puts,
            posts: self.posts - earlier.posts,
            heads: self.heads - earlier.heads,
            deletes: self.deletes - earlier.deletes,
            bytes_sent: self.bytes_sent - earlier.bytes_sent,
            bytes_received: self.bytes_received - earlier.bytes_received,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    gets: AtomicU64,
    lists: AtomicU64,
    puts: AtomicU64,
    posts: AtomicU64,
    heads: AtomicU64,
    deletes: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> RequestStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RequestStats {
            gets: r(&self.gets),
            lists: r(&self.lists),
            puts: r(&self.puts),
            posts: r(&self.posts),
            heads: r(&self.heads),
            deletes: r(&self.deletes),
            bytes_sent: r(&self.bytes_sent),
            bytes_received: r(&self.bytes_received),
        }
    }
}

/// Counts each HTTP request as it goes on the wire, then sends it with reqwest.
#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> std::result::Result<HttpResponse, HttpError> {
        let c = &self.counters;
        let counter = match req.method().as_str() {
            // S3 and Google Cloud Storage list with `list-type=2`, Azure with `comp=list`.
            "GET"
                if req
                    .uri()
                    .query()
                    .is_some_and(|q| q.contains("list-type") || q.contains("comp=list")) =>
            {
                &c.lists
            }
            "GET" => &c.gets,
            "PUT" => &c.puts,
            "POST" => &c.posts,
            "HEAD" => &c.heads,
            "DELETE" => &c.deletes,
            _ => &c.gets,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        c.bytes_sent
            .fetch_add(req.body().content_length() as u64, Ordering::Relaxed);
        self.inner.execute(req).await
    }
}

#[derive(Debug)]
struct CountingConnector {
    counters: Arc<Counters>,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService {
            inner,
            counters: Arc::clone(&self.counters),
        }))
    }
}

/// A repository's objects in a bucket (or container) of object storage, under a key
/// prefix: any [`ObjectStore`], built from a URL by [`open`](ObjectStoreBackend::open) or
/// handed over by [`from_object_store`](ObjectStoreBackend::from_object_store).
///
/// Synchronous, with a private tokio runtime (see the module docs); safe to share between
/// threads and to call from inside another tokio runtime. Keys map to object names
/// `<prefix>/<key>`.
///
/// `put_if_absent` is the store's create-if-absent write ([`PutMode::Create`]: on S3 a
/// PUT with `If-None-Match: *`, on Google Cloud Storage `x-goog-if-generation-match: 0`,
/// on Azure `If-None-Match: *`): of concurrent writers of one key exactly one creates it. When the answer to our own successful PUT is lost and
/// the retry finds the object, the object is read back: if it holds exactly our bytes the
/// outcome is `Created` (the bytes a caller wanted are there, whoever wrote them).
pub struct ObjectStoreBackend {
    store: Arc<dyn ObjectStore>,
    /// `""` or a prefix ending in `/`.
    prefix: String,
    location: String,
    options: ObjectStoreOptions,
    counters: Arc<Counters>,
    /// `Some` until drop.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for ObjectStoreBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreBackend")
            .field("location", &self.location)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Drop for ObjectStoreBackend {
    fn drop(&mut self) {
        // Dropping a runtime blocks until its tasks end, which panics inside another
        // runtime; nothing of ours is in flight when the backend is dropped.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The object-storage providers this backend knows, each behind its cargo feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provider {
    /// Amazon S3 and S3-compatible servers (feature `s3`).
    S3,
    /// Google Cloud Storage (feature `gcs`).
    Gcs,
    /// Azure Blob Storage (feature `azure`).
    Azure,
}

impl Provider {
    /// The cargo feature that builds this provider's client.
    fn feature(self) -> &'static str {
        match self {
            Provider::S3 => "s3",
            Provider::Gcs => "gcs",
            Provider::Azure => "azure",
        }
    }

    /// The smallest part of a multipart upload (all parts but the last).
    fn min_part_size(self) -> usize {
        match self {
            Provider::S3 => s3::MIN_PART_SIZE,
            Provider::Gcs => gcs::MIN_PART_SIZE,
            Provider::Azure => azure::MIN_PART_SIZE,
        }
    }

    /// This provider's client for `url`, configured from the environment, then from
    /// `options` (retries, endpoint), sending its requests through `connector`.
    #[allow(unused_variables)]
    fn build(
        self,
        url: &str,
        options: &ObjectStoreOptions,
        connector: CountingConnector,
    ) -> Result<Arc<dyn ObjectStore>> {
        let built: std::result::Result<Arc<dyn ObjectStore>, object_store::Error> = match self {
            #[cfg(feature = "s3")]
            Provider::S3 => s3::build(url, options, connector),
            #[cfg(feature = "gcs")]
            Provider::Gcs => gcs::build(url, options, connector),
            #[cfg(feature = "azure")]
            Provider::Azure => azure::build(url, options, connector),
            #[allow(unreachable_patterns)]
            _ => {
                return Err(Error::InvalidArgument {
                    reason: format!(
                        "`{url}`: this build has no {self:?} client (it needs the `{}` feature)",
                        self.feature()
                    ),
                })
            }
        };
        built.map_err(|e| io_error(url, &e))
    }
}

/// The provider of an object-store URL (recognised by `object_store`'s
/// [`ObjectStoreScheme`]) and the key prefix it names: empty or ending in `/`.
fn parse_location(location: &str) -> Result<(Provider, String)> {
    let invalid = |why: &str| Error::InvalidArgument {
        reason: format!(
            "`{location}` is not an object-store location ({why}); expected \
             s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"
        ),
    };
    let (_, rest) = location
        .split_once("://")
        .ok_or_else(|| invalid("no scheme"))?;
    // The URL parser resolves `.` and `..` and keeps empty segments silently: check the
    // path as written first.
    let (authority, raw_path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(invalid("no bucket"));
    }
    if raw_path.contains(['?', '#']) {
        return Err(invalid("a query or fragment"));
    }
    let raw_path = raw_path.trim_matches('/');
    if raw_path.split('/').any(|s| s == "." || s == "..") || raw_path.contains("//") {
        return Err(invalid("`.`, `..` or an empty segment in the prefix"));
    }
    let url = url::Url::parse(location).map_err(|e| invalid(&e.to_string()))?;
    let (scheme, path) =
        ObjectStoreScheme::parse(&url).map_err(|_| invalid("not an object-store URL"))?;
    let provider = match scheme {
        ObjectStoreScheme::AmazonS3 => Provider::S3,
        ObjectStoreScheme::GoogleCloudStorage => Provider::Gcs,
        ObjectStoreScheme::MicrosoftAzure => Provider::Azure,
        other => return Err(invalid(&format!("{other:?} is not an object store"))),
    };
    let prefix = path.as_ref();
    let prefix = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    Ok((provider, prefix))
}

/// Install `ring` as the process's rustls provider unless one is installed already
/// (reqwest is built without a provider of its own).
fn install_tls_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // An Err means another provider is already the default: that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl ObjectStoreBackend {
    /// The repository at an object-store URL, its client configured from the
    /// environment as `object_store`'s `from_env` builders do (`AWS_*`, `GOOGLE_*` or
    /// `AZURE_*`; `docs/object-storage.md`, "Configuration", lists them). No request is
    /// sent. O(1).
    ///
    /// | URL | provider | feature |
    /// | --- | --- | --- |
    /// | `s3://bucket/prefix` (also `s3a://`, `https://s3.<region>.amazonaws.com/bucket/prefix`) | Amazon S3 or an S3-compatible server | `s3` |
    /// | `gs://bucket/prefix` | Google Cloud Storage | `gcs` |
    /// | `az://container/prefix`, `abfs[s]://container@account.dfs.core.windows.net/prefix`, `https://account.blob.core.windows.net/container/prefix` | Azure Blob Storage | `azure` |
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a malformed URL or one whose provider this build
    /// lacks; [`Error::Io`] if the client cannot be configured (a malformed variable,
    /// missing credentials or account).
    pub fn open(url: &str) -> Result<ObjectStoreBackend> {
        ObjectStoreBackend::open_with(url, ObjectStoreOptions::default())
    }

    /// [`open`](ObjectStoreBackend::open) with explicit tuning. O(1).
    ///
    /// # Errors
    ///
    /// As `open`, and [`Error::InvalidArgument`] for options out of range.
    pub fn open_with(url: &str, options: ObjectStoreOptions) -> Result<ObjectStoreBackend> {
        let (provider, prefix) = parse_location(url)?;
        options.validate(provider.min_part_size())?;
        install_tls_provider();
        let counters = Arc::new(Counters::default());
        let connector = CountingConnector {
            counters: Arc::clone(&counters),
        };
        let store = provider.build(url, &options, connector)?;
        let location = url.trim_end_matches('/').to_owned();
        ObjectStoreBackend::with_parts(store, prefix, location, options, counters)
    }

    /// A backend over any `object_store` store (a local file system, memory, or a client
    /// built by hand), with keys under `prefix`. Requests are counted only for stores
    /// built by [`open`](ObjectStoreBackend::open). O(1).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for options out of range (`part_size` below
    /// [`MIN_PART_SIZE`], the strictest provider's minimum) or a prefix with `.`, `..` or
    /// empty segments; [`Error::Io`] if the runtime cannot start.
    pub fn from_object_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        location: &str,
        options: ObjectStoreOptions,
    ) -> Result<ObjectStoreBackend> {
        options.validate(MIN_PART_SIZE)?;
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|s| s == "." || s == "..") || prefix.contains("//") {
            return Err(Error::InvalidArgument {
                reason: format!("`{prefix}`: `.`, `..` or an empty segment in the prefix"),
            });
        }
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        ObjectStoreBackend::with_parts(
            store,
            prefix,
            location.to_owned(),
            options,
            Arc::new(Counters::default()),
        )
    }

    fn with_parts(
        store: Arc<dyn ObjectStore>,
        prefix: String,
        location: String,
        options: ObjectStoreOptions,
        counters: Arc<Counters>,
    ) -> Result<ObjectStoreBackend> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tensor-history-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::Io {
                path: location.clone(),
                kind: e.kind(),
                message: format!("cannot start the I/O runtime: {e}"),
            })?;
        Ok(ObjectStoreBackend {
            store,
            prefix,
            location,
            options,
            counters,
            runtime: Some(runtime),
        })
    }

    /// Requests sent and bytes moved so far (a snapshot of atomic counters). O(1).
    #[must_use]
    pub fn stats(&self) -> RequestStats {
        self.counters.snapshot()
    }

    /// The tuning in use. O(1).
    #[must_use]
    pub fn options(&self) -> &ObjectStoreOptions {
        &self.options
    }

    fn path(&self, key: &str) -> Result<Path> {
        let full = format!("{}{key}", self.prefix);
        Path::parse(&full)
            .map_err(|e| Error::Io {
                path: self.url(key),
                kind: std::io::ErrorKind::InvalidInput,
                message: format!("not a valid object key: {e}"),
            })
            .and_then(|p| {
                if key.is_empty() || key.ends_with('/') {
                    Err(Error::Io {
                        path: self.url(key),
                        kind: std::io::ErrorKind::InvalidInput,
                        message: "not a valid object key: empty or ending in `/`".into(),
                    })
                } else {
                    Ok(p)
                }
            })
    }

    fn url(&self, key: &str) -> String {
        format!("{}/{key}", self.location)
    }

    /// Run `fut` to completion on the private runtime, from any thread.
    fn run<T: Send + 'static>(
        &self,
        key: &str,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let rt = self.runtime.as_ref().expect("the runtime lives until drop");
        if tokio::runtime::Handle::try_current().is_err() {
            return rt.block_on(fut);
        }
        // Inside some runtime: `block_on` would panic. Run the future on ours and wait
        // for it on this thread (a plain channel, which does not need a runtime).
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().unwrap_or_else(|_| {
            Err(Error::Io {
                path: self.url(key),
                kind: std::io::ErrorKind::Other,
                message: "the request task ended without a result".into(),
            })
        })
    }

    fn received(&self, n: usize) {
        self.counters
            .bytes_received
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Put the concatenation of `parts`: one PUT, or a multipart upload above
    /// `part_size`.
    fn put_pieces(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.options.part_size {
            return self.put_multipart(key, parts);
        }
        let path = self.path(key)?;
        let url = self.url(key);
        let store = Arc::clone(&self.store);
        let payload: PutPayload = parts
            .iter()
            .map(|p| bytes::Bytes::copy_from_slice(p))
            .collect();
        self.run(key, async move {
            store
                .put(&path, payload)
                .await
                .map(|_| ())
                .map_err(|e| io_error(&url, &e))
        })
    }

    fn put_multipart(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = Arc::clone(&self.store);
        let part_size = self.options.part_size;
        let concurrency = self.options.max_concurrent_parts;
        // Copy into part-sized owned buffers (the upload tasks outlive this borrow).
        let mut owned: Vec<bytes::Bytes> = Vec::new();
        let mut cur = Vec::with_capacity(part_size);
        for part in parts {
            let mut p = *part;
            while !p.is_empty() {
                let n = (part_size - cur.len()).min(p.len());
                cur.extend_from_slice(&p[..n]);
                p = &p[n..];
                if cur.len() == part_size {
                    owned.push(std::mem::replace(&mut cur, Vec::with_capacity(part_size)).into());
                }
            }
        }
        if !cur.is_empty() {
            owned.push(cur.into());
        }
        self.run(key, async move {
            let upload = store
                .put_multipart(&path)
                .await
                .map_err(|e| io_error(&url, &e))?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, part_size);
            for part in owned {
                if let Err(e) = writer.wait_for_capacity(concurrency).await {
                    let _ = writer.abort().await;
                    return Err(io_error(&url, &e));
                }
                writer.put(part);
            }
            writer.finish().await.map_err(|e| io_error(&url, &e))?;
            Ok(())
        })
    }
}

/// `object_store`'s error as [`Error::Io`] with the matching kind.
fn io_error(url: &str, e: &object_store::Error) -> Error {
    use std::io::ErrorKind;
    let kind =
        match e {
            object_store::Error::NotFound { .. } => ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => ErrorKind::AlreadyExists,
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => ErrorKind::PermissionDenied,
            object_store::Error::NotSupported { .. }
            | object_store::Error::NotImplemented { .. } => ErrorKind::Unsupported,
            object_store::Error::InvalidPath { .. }
            | object_store::Error::UnknownConfigurationKey { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::Other,
        };
    Error::Io {
        path: url.to_owned(),
        kind,
        message: e.to_string(),
    }
}

fn eof(url: &str, range: &Range<u64>, size: u64) -> Error {
    Error::Io {
        path: url.to_owned(),
        kind: std::io::ErrorKind::UnexpectedEof,
        message: format!("range {range:?} outside an object of {size} bytes"),
    }
}

/// `b` as [`Bytes`], without a copy when it is 8-byte aligned (so chunk data can be
/// viewed as typed slices), else copied into an aligned buffer.
fn to_bytes(b: bytes::Bytes) -> Bytes {
    if (b.as_ptr() as usize).is_multiple_of(8) {
        Bytes::new(Arc::new(b))
    } else {
        AlignedBuf::bytes_of(&b)
    }
}

impl Backend for ObjectStoreBackend {
    fn get(&self, key: &str) -> Result<Bytes> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = Arc::clone(&self.store);
        let b = self.run(key, async move {
            let r = store.get(&path).await.map_err(|e| io_error(&url, &e))?;
            r.bytes().await.map_err(|e| io_error(&url, &e))
        })?;
        self.received(b.len());
        Ok(to_bytes(b))
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let path = self.path(key)?;
        let url = self.url(key);
        if range.start > range.end {
            return Err(eof(&url, &range, 0));
        }
        let store = Arc::clone(&self.store);
        let want = range.clone();
        let b = self.run(key, async move {
            if want.is_empty() {
                // S3 cannot serve an empty range; check the object and its size instead.
                let meta = store.head(&path).await.map_err(|e| io_error(&url, &e))?;
                if want.end > meta.size {
                    return Err(eof(&url, &want, meta.size));
                }
                return Ok(bytes::Bytes::new());
            }
            let opts = GetOptions::new().with_range(Some(GetRange::Bounded(want.clone())));
            let got = match store.get_opts(&path, opts).await {
                Ok(r) => r.bytes().await,
                Err(e) => Err(e),
            };
            match got {
                Ok(b) if b.len() as u64 == want.end - want.start => Ok(b),
                Ok(b) => Err(eof(&url, &want, want.start + b.len() as u64)),
                Err(e @ object_store::Error::NotFound { .. }) => Err(io_error(&url, &e)),
                Err(e) => {
                    // A range past the end fails in server-specific ways (416, a short
                    // body); the object's size tells an out-of-range read apart.
                    match store.head(&path).await {
                        Ok(meta) if want.end > meta.size => Err(eof(&url, &want, meta.size)),
                        _ => Err(io_error(&url, &e)),
                    }
                }
            }
        })?;
        self.received(b.len());
        Ok(to_bytes(b))
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<()> {
        self.put_pieces(key, &[data])
    }

    fn put_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        self.put_pieces(key, parts)
    }

    fn get_many(&self, keys: &[String]) -> Vec<Result<Bytes>> {
        let Some(first) = keys.first() else {
            return Vec::new();
        };
        let requests: Vec<_> = keys
            .iter()
            .map(|k| {
                let (path, url, store) = (self.path(k), self.url(k), Arc::clone(&self.store));
                async move {
                    let r = store.get(&path?).await.map_err(|e| io_error(&url, &e))?;
                    r.bytes().await.map_err(|e| io_error(&url, &e))
                }
            })
            .collect();
        let got = self.run(first, async move {
            Ok(futures_util::stream::iter(requests)
                .buffered(REQUESTS_IN_FLIGHT)
                .collect::<Vec<Result<bytes::Bytes>>>()
                .await)
        });
        match got {
            Ok(all) => all
                .into_iter()
                .map(|r| {
                    let b = r?;
                    self.received(b.len());
                    Ok(to_bytes(b))
                })
                .collect(),
            // The task ended without a result: every read failed with its error.
            Err(e) => keys.iter().map(|_| Err(e.clone())).collect(),
        }
    }

    fn put_many(&self, objects: &[(String, Vec<u8>)]) -> Result<()> {
        let (large, small): (Vec<_>, Vec<_>) = objects
            .iter()
            .partition(|(_, d)| d.len() > self.options.part_size);
        let mut requests = Vec::with_capacity(small.len());
        for (key, data) in small {
            let payload = PutPayload::from(bytes::Bytes::copy_from_slice(data));
            requests.push((self.path(key)?, self.url(key), payload));
        }
        if let Some((first, _)) = objects.first() {
            let store = Arc::clone(&self.store);
            self.run(first, async move {
                futures_util::stream::iter(requests.into_iter().map(|(path, url, payload)| {
                    let store = Arc::clone(&store);
                    async move {
                        store
                            .put(&path, payload)
                            .await
                            .map(|_| ())
                            .map_err(|e| io_error(&url, &e))
                    }
                }))
                .buffer_unordered(REQUESTS_IN_FLIGHT)
                .try_collect::<Vec<()>>()
                .await
                .map(|_| ())
            })?;
        }
        for (key, data) in large {
            self.put(key, data)?;
        }
        Ok(())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<PutOutcome> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = Arc::clone(&self.store);
        let mine = bytes::Bytes::copy_from_slice(data);
        self.run(key, async move {
            let opts = PutOptions::from(PutMode::Create);
            match store.put_opts(&path, mine.clone().into(), opts).await {
                Ok(_) => Ok(PutOutcome::Created),
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => {
                    // Either another writer's object, or ours whose answer was lost and
                    // whose retry then found it. The bytes tell.
                    let r = store.get(&path).await.map_err(|e| io_error(&url, &e))?;
                    let theirs = r.bytes().await.map_err(|e| io_error(&url, &e))?;
                    Ok(if theirs == mine {
                        PutOutcome::Created
                    } else {
                        PutOutcome::AlreadyExists
                    })
                }
                Err(e) => Err(io_error(&url, &e)),
            }
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let url = self.url(prefix);
        let full = format!("{}{prefix}", self.prefix);
        // object_store lists by directory; list the deepest directory of the prefix and
        // keep the keys that start with the whole prefix.
        let dir = match full.rfind('/') {
            Some(i) => &full[..i],
            None => "",
        };
        let dir = if dir.is_empty() {
            None
        } else {
            Some(Path::parse(dir).map_err(|e| Error::Io {
                path: url.clone(),
                kind: std::io::ErrorKind::InvalidInput,
                message: format!("not a valid key prefix: {e}"),
            })?)
        };
        let store = Arc::clone(&self.store);
        let metas = self.run(prefix, async move {
            store
                .list(dir.as_ref())
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| io_error(&url, &e))
        })?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let name = m.location.as_ref();
                let key = name.strip_prefix(self.prefix.as_str())?;
                key.starts_with(prefix).then(|| ObjectInfo {
                    key: key.to_owned(),
                    size: m.size,
                    modified: Some(m.last_modified.into()),
                })
            })
            .collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        let url = self.url(key);
        let store = Arc::clone(&self.store);
        self.run(key, async move {
            match store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(io_error(&url, &e)),
            }
        })
    }

    fn barrier(&self) -> Result<()> {
        // An acknowledged PUT (or completed multipart upload) is durable on S3, Google
        // Cloud Storage and Azure.
        Ok(())
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_store_urls_split_into_provider_and_prefix() {
        let p = |u: &str| parse_location(u).map_err(|e| e.to_string());
        assert_eq!(p("s3://b").unwrap(), (Provider::S3, String::new()));
        assert_eq!(p("s3://b/").unwrap(), (Provider::S3, String::new()));
        assert_eq!(p("s3://b/x/y/").unwrap(), (Provider::S3, "x/y/".into()));
        assert_eq!(p("s3://b/x").unwrap(), (Provider::S3, "x/".into()));
        assert_eq!(p("s3a://b/x").unwrap(), (Provider::S3, "x/".into()));
        assert_eq!(p("gs://b/x/y").unwrap(), (Provider::Gcs, "x/y/".into()));
        assert_eq!(p("az://c/x").unwrap(), (Provider::Azure, "x/".into()));
        assert_eq!(
            p("abfs://c@acct.dfs.core.windows.net/x").unwrap(),
            (Provider::Azure, "x/".into())
        );
        assert_eq!(
            p("https://acct.blob.core.windows.net/c/x").unwrap(),
            (Provider::Azure, "x/".into())
        );
        for bad in [
            "s3://",
            "s3:///x",
            "http://b/x",
            "file:///tmp/x",
            "memory:///x",
            "s3://b/x//y",
            "s3://b/../x",
            "gs://b/./x",
            "az://c/x?y=1",
            "ftp://b/x",
            "s3//b/x",
        ] {
            assert!(
                matches!(parse_location(bad), Err(Error::InvalidArgument { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn part_size_below_the_s3_minimum_is_refused() {
        let opts = ObjectStoreOptions {
            part_size: MIN_PART_SIZE - 1,
            ..ObjectStoreOptions::default()
        };
        assert!(matches!(
            ObjectStoreBackend::open_with("s3://b/x", opts),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
