//! [`MemoryBackend`]: objects in a map in memory (tests, throwaway repositories).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::{AlignedBuf, Backend, Bytes, ObjectInfo, PutOutcome};
use crate::error::{Error, Result};

/// A repository held in memory: nothing survives the process. Every operation is atomic
/// and immediately "durable"; `barrier` does nothing. Clones share the objects.
#[derive(Clone, Debug, Default)]
pub struct MemoryBackend {
    objects: Arc<Mutex<BTreeMap<String, (Bytes, SystemTime)>>>,
}

impl MemoryBackend {
    /// An empty backend. O(1).
    #[must_use]
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Bytes, SystemTime)>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) fn not_found(key: &str) -> Error {
    Error::Io {
        path: key.to_owned(),
        kind: std::io::ErrorKind::NotFound,
        message: "no such object".into(),
    }
}

pub(crate) fn slice_range(key: &str, b: &Bytes, range: Range<u64>) -> Result<Bytes> {
    let len = b.len() as u64;
    if range.start > range.end || range.end > len {
        return Err(Error::Io {
            path: key.to_owned(),
            kind: std::io::ErrorKind::UnexpectedEof,
            message: format!("range {range:?} outside an object of {len} bytes"),
        });
    }
    b.slice(range.start as usize..range.end as usize)
        .ok_or_else(|| not_found(key))
}

impl Backend for MemoryBackend {
    fn get(&self, key: &str) -> Result<Bytes> {
        self.lock()
            .get(key)
            .map(|(b, _)| b.clone())
            .ok_or_else(|| not_found(key))
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let b = self.get(key)?;
        slice_range(key, &b, range)
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<()> {
        let b = AlignedBuf::bytes_of(data);
        self.lock().insert(key.to_owned(), (b, SystemTime::now()));
        Ok(())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<PutOutcome> {
        let mut objects = self.lock();
        if objects.contains_key(key) {
            return Ok(PutOutcome::AlreadyExists);
        }
        objects.insert(
            key.to_owned(),
            (AlignedBuf::bytes_of(data), SystemTime::now()),
        );
        Ok(PutOutcome::Created)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        Ok(self
            .lock()
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (b, t))| ObjectInfo {
                key: k.clone(),
                size: b.len() as u64,
                modified: Some(*t),
            })
            .collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.lock().remove(key);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }

    fn location(&self) -> String {
        format!("memory://{:p}", Arc::as_ptr(&self.objects))
    }
}
