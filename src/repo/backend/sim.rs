//! [`SimBackend`]: an in-memory disk that simulates power loss and I/O errors, for tests.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::memory::{not_found, slice_range};
use super::{AlignedBuf, Backend, Bytes, ObjectInfo, PutOutcome};
use crate::error::{Error, Result};

/// An in-memory "disk" that models what a power loss leaves behind, and injects errors.
///
/// - Objects written by `put` (and deletes) are volatile until the next `barrier`: a
///   simulated power loss ([`SimBackend::power_loss`]) keeps each of them whole, drops it,
///   truncates it or zeroes part of it (a seeded choice per object).
/// - `put_if_absent` is durable when it returns (like a linked file with a synced
///   directory); a barrier makes everything before it durable.
/// - [`crash_at`](SimBackend::crash_at) makes the mutating operation of index `n` (puts,
///   deletes and barriers, counted from 0) and every later call fail, as if the machine
///   stopped there; [`fail_at`](SimBackend::fail_at) makes only that operation fail with
///   a given error kind (disk full, permission denied), and later ones succeed.
///
/// Clones share the disk, so a test keeps one handle while a store uses another.
#[derive(Clone, Debug, Default)]
pub struct SimBackend {
    state: Arc<Mutex<SimState>>,
}

#[derive(Debug, Default)]
struct SimState {
    durable: BTreeMap<String, Stored>,
    /// Operations since the last barrier, oldest first: `Some(data)` a put, `None` a delete.
    pending: Vec<(String, Option<Stored>)>,
    ops: u64,
    crash_at: Option<u64>,
    crashed: bool,
    fail_at: Option<(u64, std::io::ErrorKind)>,
}

#[derive(Clone, Debug)]
struct Stored {
    bytes: Bytes,
    time: SystemTime,
}

impl SimState {
    fn view(&self, key: &str) -> Option<&Stored> {
        for (k, op) in self.pending.iter().rev() {
            if k == key {
                return op.as_ref();
            }
        }
        self.durable.get(key)
    }

    /// Count a mutating operation; fail it if a crash or an error is due.
    fn tick(&mut self, key: &str) -> Result<()> {
        self.alive(key)?;
        let n = self.ops;
        self.ops += 1;
        if self.crash_at == Some(n) {
            self.crashed = true;
            return self.alive(key);
        }
        if let Some((at, kind)) = self.fail_at {
            if at == n {
                self.fail_at = None;
                return Err(Error::Io {
                    path: key.to_owned(),
                    kind,
                    message: format!("simulated failure at operation {n}"),
                });
            }
        }
        Ok(())
    }

    fn alive(&self, key: &str) -> Result<()> {
        if self.crashed {
            return Err(Error::Io {
                path: key.to_owned(),
                kind: std::io::ErrorKind::Other,
                message: "simulated power loss: the machine is off".into(),
            });
        }
        Ok(())
    }
}

/// A small deterministic generator (splitmix64) for the power-loss choices.
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SimBackend {
    /// An empty disk. O(1).
    #[must_use]
    pub fn new() -> SimBackend {
        SimBackend::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mutating operations (puts, deletes, barriers) performed so far.
    #[must_use]
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Stop the machine at mutating operation `n` (counted from 0 since the disk was
    /// made): that operation and every later call fail.
    pub fn crash_at(&self, n: u64) {
        self.lock().crash_at = Some(n);
    }

    /// Make mutating operation `n` fail with an I/O error of `kind`; later ones succeed.
    pub fn fail_at(&self, n: u64, kind: std::io::ErrorKind) {
        self.lock().fail_at = Some((n, kind));
    }

    /// Whether a crash happened.
    #[must_use]
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The disk as a power loss now would leave it, as a new backend: everything up to
    /// the last barrier and every `put_if_absent`, plus each later put or delete kept,
    /// dropped, truncated or partly zeroed as chosen by `seed`. O(objects).
    #[must_use]
    pub fn power_loss(&self, seed: u64) -> SimBackend {
        let st = self.lock();
        let mut durable = st.durable.clone();
        let mut seed = seed ^ 0x5eed;
        for (key, op) in &st.pending {
            match op {
                None => {
                    if next(&mut seed).is_multiple_of(2) {
                        durable.remove(key);
                    }
                }
                Some(s) => {
                    let len = s.bytes.len();
                    match next(&mut seed) % 5 {
                        0 => {}
                        1 => {
                            durable.insert(key.clone(), s.clone());
                        }
                        2 => {
                            let cut = if len == 0 {
                                0
                            } else {
                                (next(&mut seed) as usize) % len
                            };
                            let b = AlignedBuf::bytes_of(&s.bytes[..cut]);
                            durable.insert(
                                key.clone(),
                                Stored {
                                    bytes: b,
                                    time: s.time,
                                },
                            );
                        }
                        3 => {
                            let mut v = s.bytes.to_vec();
                            if len > 0 {
                                let from = (next(&mut seed) as usize) % len;
                                v[from..].iter_mut().for_each(|b| *b = 0);
                            }
                            let b = AlignedBuf::bytes_of(&v);
                            durable.insert(
                                key.clone(),
                                Stored {
                                    bytes: b,
                                    time: s.time,
                                },
                            );
                        }
                        _ => {
                            let b = AlignedBuf::bytes_of(&vec![0u8; len]);
                            durable.insert(
                                key.clone(),
                                Stored {
                                    bytes: b,
                                    time: s.time,
                                },
                            );
                        }
                    }
                }
            }
        }
        SimBackend {
            state: Arc::new(Mutex::new(SimState {
                durable,
                ..SimState::default()
            })),
        }
    }

    /// Every object's key, in order (for tests that inspect or damage the disk).
    #[must_use]
    pub fn keys(&self) -> Vec<String> {
        let st = self.lock();
        let mut keys: Vec<String> = st.durable.keys().cloned().collect();
        for (k, op) in &st.pending {
            match op {
                Some(_) => keys.push(k.clone()),
                None => keys.retain(|x| x != k),
            }
        }
        keys.sort();
        keys.dedup();
        keys.retain(|k| st.view(k).is_some());
        keys
    }

    /// Replace an object's bytes durably, bypassing crash and error injection (tests that
    /// damage a repository).
    pub fn overwrite(&self, key: &str, data: &[u8]) {
        let mut st = self.lock();
        st.pending.retain(|(k, _)| k != key);
        st.durable.insert(
            key.to_owned(),
            Stored {
                bytes: AlignedBuf::bytes_of(data),
                time: SystemTime::now(),
            },
        );
    }
}

impl Backend for SimBackend {
    fn get(&self, key: &str) -> Result<Bytes> {
        let st = self.lock();
        st.alive(key)?;
        st.view(key)
            .map(|s| s.bytes.clone())
            .ok_or_else(|| not_found(key))
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let b = self.get(key)?;
        slice_range(key, &b, range)
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<()> {
        let mut st = self.lock();
        st.tick(key)?;
        let s = Stored {
            bytes: AlignedBuf::bytes_of(data),
            time: SystemTime::now(),
        };
        st.pending.push((key.to_owned(), Some(s)));
        Ok(())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<PutOutcome> {
        let mut st = self.lock();
        st.tick(key)?;
        if st.view(key).is_some() {
            return Ok(PutOutcome::AlreadyExists);
        }
        let s = Stored {
            bytes: AlignedBuf::bytes_of(data),
            time: SystemTime::now(),
        };
        st.durable.insert(key.to_owned(), s);
        Ok(PutOutcome::Created)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let st = self.lock();
        st.alive(prefix)?;
        drop(st);
        let st = self.lock();
        let mut keys: Vec<String> = st
            .durable
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        keys.extend(
            st.pending
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, _)| k.clone()),
        );
        keys.sort();
        keys.dedup();
        Ok(keys
            .into_iter()
            .filter_map(|k| {
                st.view(&k).map(|s| ObjectInfo {
                    size: s.bytes.len() as u64,
                    modified: Some(s.time),
                    key: k,
                })
            })
            .collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut st = self.lock();
        st.tick(key)?;
        st.pending.push((key.to_owned(), None));
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        let mut st = self.lock();
        st.tick("barrier")?;
        let pending = std::mem::take(&mut st.pending);
        for (k, op) in pending {
            match op {
                Some(s) => {
                    st.durable.insert(k, s);
                }
                None => {
                    st.durable.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn location(&self) -> String {
        format!("sim://{:p}", Arc::as_ptr(&self.state))
    }
}
