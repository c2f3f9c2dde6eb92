//! The durable repository: where a [`Store`](crate::Store)'s history is saved, and the
//! storage backends under it.

pub(crate) mod backend;
mod safetensors;
