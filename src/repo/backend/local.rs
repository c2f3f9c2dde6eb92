//! [`LocalDir`]: a repository in a directory of the local file system.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{Read, Write};
#[cfg(not(unix))]
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{Backend, Bytes, ObjectInfo, PutOutcome};
use crate::error::{Error, Result};

/// Objects at least this large are mapped by [`Backend::get`] instead of read.
const MAP_MIN_BYTES: u64 = 64 * 1024;

/// Temporary files live here (relative to the root) until they are renamed or linked into
/// place; [`Backend::list`] never shows them.
const TMP_DIR: &str = "tmp";

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A repository in a local directory: one file per object, keys as relative paths.
///
/// `put` writes a temporary file and renames it into place (readers never see a torn
/// file); [`barrier`](Backend::barrier) fsyncs every file written since the last barrier
/// and every directory whose entries changed. `put_if_absent` writes and fsyncs a
/// temporary file, hard-links it to the key (the link fails if the key exists, so of
/// several writers exactly one wins) and fsyncs the directory.
///
/// # Reads: mapped or copied
///
/// By default ([`ReadMode::Map`]) `get` and `get_range` map objects of 64 KiB and more
/// (packs) instead of reading them, and chunks read from a pack are used in place:
/// objects are never rewritten in place, only created and unlinked, so a mapping stays
/// valid. Every read checks the mapped file's length again (one `fstat`): a pack that is
/// shorter than when it was mapped, or shorter than the chunk asked for, is an
/// [`Error::Io`] of kind `UnexpectedEof` naming the file, which the repository reports
/// as [`Error::CorruptObject`] naming the pack. What no check can prevent is a pack
/// truncated by another program *while* bytes of it are in use: the pages past the new
/// end are gone, and touching them raises `SIGBUS`, which ends the process (as for
/// every program that maps files). Truncating or rewriting a repository's files in
/// place is outside the format's contract. Where that cannot be ruled out (a repository
/// on a file system that other programs clean up), [`ReadMode::Copy`]
/// ([`LocalDir::with_read_mode`]) reads with `pread` into the heap instead: a truncated
/// pack then only ever gives that typed error, at the cost of a copy per chunk read.
#[derive(Debug)]
pub struct LocalDir {
    root: PathBuf,
    reads: ReadMode,
    dirty: Mutex<Dirty>,
    /// Mappings of large objects read by `get_range`, kept for the next read, with the
    /// open file (its length is checked before each read of the mapping).
    maps: Mutex<HashMap<PathBuf, Mapped>>,
}

/// How a [`LocalDir`] reads objects of 64 KiB and more (packs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadMode {
    /// Map them, and use chunks in place (no copy). A pack truncated by another program
    /// while one of its chunks is in use raises `SIGBUS` (see [`LocalDir`]).
    #[default]
    Map,
    /// Read them with `pread` into the heap: one copy per chunk read, and a truncated
    /// pack is only ever a typed error.
    Copy,
}

/// A mapped object and its open file.
#[derive(Debug, Clone)]
struct Mapped {
    file: Arc<File>,
    map: Bytes,
}

/// What the next barrier must make durable.
#[derive(Debug, Default)]
struct Dirty {
    files: Vec<File>,
    dirs: BTreeSet<PathBuf>,
}

/// An I/O error on `path` as this crate's error.
pub(crate) fn io_error(path: &Path, e: &std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        kind: e.kind(),
        message: e.to_string(),
    }
}

impl LocalDir {
    /// A backend rooted at `root`, creating the directory (and its parents) if absent.
    /// O(1) plus the directories created.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the directory cannot be created or is not a directory.
    pub fn new(root: impl AsRef<Path>) -> Result<LocalDir> {
        LocalDir::with_read_mode(root, ReadMode::Map)
    }

    /// [`LocalDir::new`] reading large objects as `reads` says.
    ///
    /// # Errors
    ///
    /// As for [`LocalDir::new`].
    pub fn with_read_mode(root: impl AsRef<Path>, reads: ReadMode) -> Result<LocalDir> {
        let root = root.as_ref().to_path_buf();
        let dir = LocalDir {
            root,
            reads,
            dirty: Mutex::new(Dirty::default()),
            maps: Mutex::new(HashMap::new()),
        };
        // `tmp/` is made by the first write, so opening a directory that is not a
        // repository (and is refused) leaves it exactly as it was.
        dir.ensure_dir(&dir.root.clone())?;
        dir.sync_dirs()?;
        Ok(dir)
    }

    /// The root directory.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How large objects are read.
    #[must_use]
    pub fn read_mode(&self) -> ReadMode {
        self.reads
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        let ok = !key.is_empty()
            && !key.starts_with('/')
            && !key.contains('\\')
            && key
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
            && key.split('/').next() != Some(TMP_DIR);
        if !ok {
            return Err(Error::InvalidArgument {
                reason: format!("`{key}` is not a valid object key"),
            });
        }
        Ok(self.root.join(key))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Dirty> {
        self.dirty.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Create `dir` and its missing parents, remembering each parent whose entries changed.
    fn ensure_dir(&self, dir: &Path) -> Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        if let Some(parent) = dir.parent() {
            if !parent.as_os_str().is_empty() {
                self.ensure_dir(parent)?;
            }
        }
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(io_error(dir, &e)),
        }
        if let Some(parent) = dir.parent() {
            // A relative path's last parent is "": the current directory.
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            self.lock().dirs.insert(parent.to_path_buf());
        }
        Ok(())
    }

    /// Call `f` with the key and directory entry of every file whose key starts with
    /// `prefix`, walking the deepest directory that the prefix names entirely. A
    /// directory is told from a file by its entry's type (no metadata read where the
    /// file system gives it); the temporary directory is skipped.
    fn walk(
        &self,
        prefix: &str,
        mut f: impl FnMut(String, &fs::DirEntry) -> Result<()>,
    ) -> Result<()> {
        let dir_part = prefix.rfind('/').map_or("", |i| &prefix[..i]);
        let start = if dir_part.is_empty() {
            self.root.clone()
        } else {
            self.path(dir_part)?
        };
        let mut stack = vec![(start, dir_part.to_owned())];
        while let Some((dir, key_prefix)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
                Err(e) => return Err(io_error(&dir, &e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error(&dir, &e))?;
                let Ok(name) = entry.file_name().into_string() else {
                    continue;
                };
                let key = if key_prefix.is_empty() {
                    name
                } else {
                    format!("{key_prefix}/{name}")
                };
                if key == TMP_DIR {
                    continue;
                }
                let kind = entry.file_type().map_err(|e| io_error(&entry.path(), &e))?;
                if kind.is_dir() {
                    if prefix.starts_with(&format!("{key}/")) || key.starts_with(prefix) {
                        stack.push((entry.path(), key));
                    }
                } else if key.starts_with(prefix) {
                    f(key, &entry)?;
                }
            }
        }
        Ok(())
    }

    fn sync_dirs(&self) -> Result<()> {
        let dirs: Vec<PathBuf> = std::mem::take(&mut self.lock().dirs).into_iter().collect();
        let errors = par_each(&dirs, |d| sync_dir(d));
        if let Some((i, e)) = errors
            .into_iter()
            .find_map(|(i, r)| r.err().map(|e| (i, e)))
        {
            // Keep them all for the next barrier.
            self.lock().dirs.extend(dirs.iter().cloned());
            return Err(io_error(dirs.get(i).unwrap_or(&self.root), &e));
        }
        Ok(())
    }

    /// Write `parts` to a new temporary file; returns its path and the open file.
    fn write_tmp(&self, parts: &[&[u8]]) -> Result<(PathBuf, File)> {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp_dir = self.root.join(TMP_DIR);
        self.ensure_dir(&tmp_dir)?;
        let tmp = tmp_dir.join(format!("{}-{n}-{nanos}", std::process::id()));
        let mut f = File::create(&tmp).map_err(|e| io_error(&tmp, &e))?;
        for p in parts {
            if let Err(e) = f.write_all(p) {
                let _ = fs::remove_file(&tmp);
                return Err(io_error(&tmp, &e));
            }
        }
        Ok((tmp, f))
    }
}

impl LocalDir {
    fn lock_maps(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Mapped>> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `range` of the mapping `m` of `path`, after checking that the file still has
    /// every byte the mapping had: touching a mapped page past a file's end raises
    /// `SIGBUS`, so a file that shrank since it was mapped is an error (and the mapping
    /// is dropped from the cache) instead.
    fn read_mapped(&self, path: &Path, m: &Mapped, range: Range<u64>) -> Result<Bytes> {
        let now = m.file.metadata().map_err(|e| io_error(path, &e))?.len();
        let mapped = m.map.len() as u64;
        if now < mapped {
            self.lock_maps().remove(path);
            return Err(Error::Io {
                path: path.display().to_string(),
                kind: std::io::ErrorKind::UnexpectedEof,
                message: format!(
                    "the file shrank from {mapped} to {now} bytes since it was mapped \
                     (truncated by another program)"
                ),
            });
        }
        slice_of(path, &m.map, range)
    }
}

fn out_of_range(path: &Path, range: &Range<u64>, len: u64) -> Error {
    Error::Io {
        path: path.display().to_string(),
        kind: std::io::ErrorKind::UnexpectedEof,
        message: format!("range {range:?} outside an object of {len} bytes"),
    }
}

fn slice_of(path: &Path, b: &Bytes, range: Range<u64>) -> Result<Bytes> {
    let len = b.len() as u64;
    if range.start > range.end || range.end > len {
        return Err(out_of_range(path, &range, len));
    }
    b.slice(range.start as usize..range.end as usize)
        .ok_or_else(|| out_of_range(path, &range, len))
}

/// `range` of `f`, read with `pread` into the heap.
fn read_range(path: &Path, f: &File, range: Range<u64>) -> Result<Bytes> {
    let len = f.metadata().map_err(|e| io_error(path, &e))?.len();
    if range.start > range.end || range.end > len {
        return Err(out_of_range(path, &range, len));
    }
    let mut buf = vec![0u8; (range.end - range.start) as usize];
    read_exact_at(f, &mut buf, range.start).map_err(|e| io_error(path, &e))?;
    Ok(Bytes::from(buf))
}

#[cfg(unix)]
fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    let mut f = f;
    f.seek(SeekFrom::Start(offset))?;
    f.read_exact(buf)
}

/// Items up to which [`par_each`] runs on the calling thread. A save's usual barrier
/// syncs a pack or an index and a version, and their directories. After the first
/// fsync commits the journal, the others find little left to do, while a thread
/// started for each waits for a core: beside one busy process (a second trial on a
/// 2-core machine) a dense step's save took 8.6-9.0 ms with threads against 5.5-6.2
/// ms inline, and the same alone (4.5-5.3 ms). A save of 100 versions took 14-16 ms
/// on threads against 29-30 ms inline.
const INLINE_SYNCS: usize = 4;

/// Run `f` on every item: on the calling thread for a few, else on up to 8 threads:
/// fsyncs issued together are committed together by the file system's journal instead
/// of one after another (a save of many versions syncs tens of small files). Returns
/// each item's index and result.
fn par_each<T: Sync>(
    items: &[T],
    f: impl Fn(&T) -> std::io::Result<()> + Sync,
) -> Vec<(usize, std::io::Result<()>)> {
    const THREADS: usize = 8;
    if items.len() <= INLINE_SYNCS {
        return items.iter().map(&f).enumerate().collect();
    }
    let n = items.len().min(THREADS);
    let f = &f;
    let mut out: Vec<(usize, std::io::Result<()>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                scope.spawn(move || {
                    (t..items.len())
                        .step_by(n)
                        .map(|i| (i, f(&items[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join().unwrap_or_else(|_| {
                    vec![(
                        usize::MAX,
                        Err(std::io::Error::other("a sync thread panicked")),
                    )]
                })
            })
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out
}

fn sync_dir(d: &Path) -> std::io::Result<()> {
    File::open(d)?.sync_all()
}

/// Map a whole file read-only.
#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the repository never modifies a file in place: objects are written to a
    // temporary file and renamed or linked into place, and only ever unlinked afterwards.
    // An unlinked file stays mapped unchanged, so the mapped bytes never change while the
    // mapping lives. (Another program writing into the repository's files breaks this;
    // the format forbids it.)
    unsafe { memmap2::Mmap::map(file) }
}

impl Backend for LocalDir {
    fn get(&self, key: &str) -> Result<Bytes> {
        let path = self.path(key)?;
        let mut f = File::open(&path).map_err(|e| io_error(&path, &e))?;
        let len = f.metadata().map_err(|e| io_error(&path, &e))?.len();
        if len >= MAP_MIN_BYTES && self.reads == ReadMode::Map {
            let map = map_file(&f).map_err(|e| io_error(&path, &e))?;
            return Ok(Bytes::new(Arc::new(map)));
        }
        let mut buf = Vec::with_capacity(len as usize);
        f.read_to_end(&mut buf).map_err(|e| io_error(&path, &e))?;
        Ok(Bytes::from(buf))
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let path = self.path(key)?;
        let cached = self.lock_maps().get(&path).cloned();
        if let Some(m) = cached {
            return self.read_mapped(&path, &m, range);
        }
        let f = File::open(&path).map_err(|e| io_error(&path, &e))?;
        let len = f.metadata().map_err(|e| io_error(&path, &e))?.len();
        if len >= MAP_MIN_BYTES && self.reads == ReadMode::Map {
            let map = Bytes::new(Arc::new(map_file(&f).map_err(|e| io_error(&path, &e))?));
            let m = Mapped {
                file: Arc::new(f),
                map,
            };
            self.lock_maps().insert(path.clone(), m.clone());
            return self.read_mapped(&path, &m, range);
        }
        read_range(&path, &f, range)
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<()> {
        self.put_parts(key, &[data])
    }

    fn put_parts(&self, key: &str, parts: &[&[u8]]) -> Result<()> {
        let path = self.path(key)?;
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        self.ensure_dir(&parent)?;
        let (tmp, f) = self.write_tmp(parts)?;
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_error(&path, &e));
        }
        let mut dirty = self.lock();
        dirty.files.push(f);
        dirty.dirs.insert(parent);
        Ok(())
    }

    fn put_if_absent(&self, key: &str, data: &[u8]) -> Result<PutOutcome> {
        let path = self.path(key)?;
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        self.ensure_dir(&parent)?;
        let (tmp, f) = self.write_tmp(&[data])?;
        let synced = f.sync_all();
        drop(f);
        if let Err(e) = synced {
            let _ = fs::remove_file(&tmp);
            return Err(io_error(&tmp, &e));
        }
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Ok(PutOutcome::AlreadyExists)
            }
            Err(e) => return Err(io_error(&path, &e)),
        }
        self.lock().dirs.insert(parent);
        self.sync_dirs()?;
        Ok(PutOutcome::Created)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        self.walk(prefix, |key, entry| {
            let meta = entry.metadata().map_err(|e| io_error(&entry.path(), &e))?;
            out.push(ObjectInfo {
                key,
                size: meta.len(),
                modified: meta.modified().ok(),
            });
            Ok(())
        })?;
        Ok(out)
    }

    fn list_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let mut out = Vec::new();
        self.walk(prefix, |key, _| {
            out.push(key);
            Ok(())
        })?;
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        self.lock_maps().remove(&path);
        match fs::remove_file(&path) {
            Ok(()) => {
                if let Some(parent) = path.parent() {
                    self.lock().dirs.insert(parent.to_path_buf());
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path, &e)),
        }
    }

    fn barrier(&self) -> Result<()> {
        let files = std::mem::take(&mut self.lock().files);
        let results = par_each(&files, File::sync_all);
        let mut first = None;
        let mut failed = std::collections::HashSet::new();
        for (i, r) in results {
            if let Err(e) = r {
                first.get_or_insert(e);
                failed.insert(i);
            }
        }
        if let Some(e) = first {
            // Files not synced (all of them if a thread was lost) stay for the next barrier.
            let all = failed.contains(&usize::MAX);
            self.lock().files.extend(
                files
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| all || failed.contains(i))
                    .map(|(_, f)| f),
            );
            return Err(io_error(&self.root, &e));
        }
        self.sync_dirs()
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }
}
