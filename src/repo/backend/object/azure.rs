//! Azure Blob Storage (feature `azure`): the client built from the environment.
//!
//! Configuration is `object_store`'s `MicrosoftAzureBuilder::from_env`:
//! `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` (or `AZURE_STORAGE_SAS_KEY`,
//! `AZURE_STORAGE_TOKEN`, `AZURE_CLIENT_ID` / `AZURE_CLIENT_SECRET` / `AZURE_TENANT_ID`),
//! `AZURE_STORAGE_ENDPOINT` (the account's URL on another server, such as
//! `http://127.0.0.1:10000/devstoreaccount1` for Azurite), `AZURE_ALLOW_HTTP=true` (plain
//! HTTP), `AZURE_STORAGE_USE_EMULATOR=true` (Azurite's well-known account, at
//! `AZURITE_BLOB_STORAGE_URL` or `http://127.0.0.1:10000`) and the other `AZURE_*`
//! variables `object_store` reads. The container (and, in `abfs://` and `https://` URLs,
//! the account) comes from the URL.
//!
//! `put_if_absent` is a PUT with `If-None-Match: *`; an existing blob answers
//! `409 Conflict` (`BlobAlreadyExists`) or `412`, which `object_store` reports as
//! `AlreadyExists`. Multipart uploads are block blobs: a PUT per block, then a PUT of the
//! block list.
//!
//! `MicrosoftAzureBuilder::from_env`: object_store::azure::MicrosoftAzureBuilder::from_env

/// Azure blocks have no minimum size.
pub(super) const MIN_PART_SIZE: usize = 1;

#[cfg(feature = "azure")]
pub(super) fn build(
    url: &str,
    options: &super::ObjectStoreOptions,
    connector: super::CountingConnector,
) -> object_store::Result<std::sync::Arc<dyn object_store::ObjectStore>> {
    use object_store::azure::MicrosoftAzureBuilder;

    let mut builder = MicrosoftAzureBuilder::from_env()
        .with_url(url)
        .with_retry(options.retry_config())
        .with_http_connector(connector);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
        if endpoint.starts_with("http://") {
            builder = builder.with_allow_http(true);
        }
    }
    Ok(std::sync::Arc::new(builder.build()?))
}
