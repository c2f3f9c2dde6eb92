//! Google Cloud Storage (feature `gcs`): the client built from the environment, and the
//! multipart limit of its XML API (the API `object_store` speaks).
//!
//! Configuration is `object_store`'s `GoogleCloudStorageBuilder::from_env`:
//! `GOOGLE_SERVICE_ACCOUNT` (or `GOOGLE_APPLICATION_CREDENTIALS`: the path of a service
//! account key file), `GOOGLE_SERVICE_ACCOUNT_KEY` (the key itself, JSON),
//! `GOOGLE_BASE_URL` (another server, such as a local emulator), `GOOGLE_ALLOW_HTTP=true`
//! (plain HTTP) and the other `GOOGLE_*` variables `object_store` reads. Without any of
//! them the client asks the instance metadata service for credentials; an emulator
//! without OAuth takes the key `{"disable_oauth": true, "client_email": "",
//! "private_key": "", "private_key_id": ""}`. The bucket comes from the URL.
//!
//! `put_if_absent` is a PUT with `x-goog-if-generation-match: 0`; an existing object
//! answers `412 Precondition Failed`, which `object_store` reports as `AlreadyExists`.
//!
//! `GoogleCloudStorageBuilder::from_env`: object_store::gcp::GoogleCloudStorageBuilder::from_env

/// The smallest part the XML API accepts in a multipart upload (all parts but the last),
/// as on S3.
pub(super) const MIN_PART_SIZE: usize = 5 << 20;

#[cfg(feature = "gcs")]
pub(super) fn build(
    url: &str,
    options: &super::ObjectStoreOptions,
    connector: super::CountingConnector,
) -> object_store::Result<std::sync::Arc<dyn object_store::ObjectStore>> {
    use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
    use object_store::ClientConfigKey;

    let mut builder = GoogleCloudStorageBuilder::from_env()
        .with_url(url)
        .with_retry(options.retry_config())
        .with_http_connector(connector);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_base_url(endpoint);
        if endpoint.starts_with("http://") {
            builder =
                builder.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
        }
    }
    Ok(std::sync::Arc::new(builder.build()?))
}
