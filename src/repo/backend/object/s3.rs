//! Amazon S3 and S3-compatible servers (feature `s3`): the client built from the
//! environment, and S3's multipart limit.
//!
//! Configuration is `object_store`'s `AmazonS3Builder::from_env`: `AWS_ENDPOINT_URL`
//! (for S3-compatible servers), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION` (or `AWS_DEFAULT_REGION`; `us-east-1` when neither
//! is set), `AWS_ALLOW_HTTP=true` (plain HTTP, for a local test server) and the other
//! `AWS_*` variables `object_store` reads. The bucket comes from the URL.
//!
//! `put_if_absent` is a PUT with `If-None-Match: *`; an existing object answers
//! `412 Precondition Failed`, which `object_store` reports as `Precondition`.

/// The smallest part S3 accepts in a multipart upload (all parts but the last).
pub(super) const MIN_PART_SIZE: usize = 5 << 20;

#[cfg(feature = "s3")]
pub(super) fn build(
    url: &str,
    options: &super::ObjectStoreOptions,
    connector: super::CountingConnector,
) -> object_store::Result<std::sync::Arc<dyn object_store::ObjectStore>> {
    use object_store::aws::AmazonS3Builder;

    let mut builder = AmazonS3Builder::from_env()
        .with_url(url)
        .with_retry(options.retry_config())
        .with_http_connector(connector);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_endpoint(endpoint);
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        builder = builder.with_region("us-east-1");
    }
    Ok(std::sync::Arc::new(builder.build()?))
}
