//! The repository on object storage: the backend conformance suite (the local backend
//! always; S3, Azure and Google Cloud Storage against servers named by the environment,
//! see `tests/s3_common`), the object-store backend and the repository over it.

#[path = "../s3_common/mod.rs"]
mod s3_common;

mod backend_conformance;
mod s3_backend;
mod s3_repo;
