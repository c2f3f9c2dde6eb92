//! safetensors files in and out: export a version streamed chunk by chunk, import a
//! file into the working state.
//!
//! # Export
//!
//! The header is built with the safetensors crate's own [`Metadata`] (which checks the
//! offsets) and serialized as `safetensors::serialize` does: tensors ordered by dtype
//! alignment (descending), then by name; the JSON padded with spaces to a multiple of
//! 8 bytes. The file is then streamed: the 8-byte header length, the header, and every
//! tensor's chunks in order, through one 1 MiB write buffer, so no buffer grows with the
//! model. It is written to a temporary file next to the target, fsynced, renamed over
//! the target and the directory fsynced: a reader sees the old file or the whole new one,
//! and a failed export leaves no partial file behind.
//!
//! # Import
//!
//! The file is mapped (not read into one buffer), parsed and checked by
//! [`SafeTensors::deserialize`], and every tensor is copied into chunks of the store's
//! `chunk_bytes`. Every tensor is built before any is inserted, so an import that fails
//! (a bad file, a dtype this crate lacks, a name already taken) changes nothing.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use ::safetensors::tensor::{Dtype, Metadata, TensorInfo};
use ::safetensors::SafeTensors;

use crate::element::DType;
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;
use crate::store::Store;
use crate::tensor::{check_dims, Tensor};
use crate::version::VersionId;

/// The largest header safetensors readers accept (`MAX_HEADER_SIZE` in the crate).
const MAX_HEADER_BYTES: usize = 100_000_000;

/// Bytes gathered before each write call: large enough that small chunks do not cost a
/// system call each, small enough to stay in cache.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// The key safetensors reserves for free-form metadata; no tensor may have this name.
const METADATA_KEY: &str = "__metadata__";

impl Store {
    /// Write version `id` to a `.safetensors` file at `path` (replaced if it exists),
    /// streamed chunk by chunk, atomically. Tensor order and header bytes are those of
    /// `safetensors::serialize`, so the file is byte-identical to what the reference
    /// implementation writes for the same tensors.
    ///
    /// O(size) time; memory O(1) beyond one 1 MiB write buffer and the header. Reads
    /// chunks that are only in the repository from it.
    ///
    /// ```
    /// # use tensor_history::Store;
    /// let mut store = Store::new();
    /// store.insert("w", &ndarray::array![[1.0f32, 2.0], [3.0, 4.0]])?;
    /// let v0 = store.commit("init")?;
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("model.safetensors");
    /// store.export_safetensors(v0, &path)?;
    ///
    /// let mut other = Store::new();
    /// assert_eq!(other.import_safetensors(&path)?, vec!["w".to_string()]);
    /// assert_eq!(other.get::<f32>("w")?, store.get::<f32>("w")?);
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`]; [`Error::InvalidArgument`]
    /// for a variable named `__metadata__` (reserved by the format) or a header over
    /// 100 MB; [`Error::Io`] if the file cannot be written; [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk that lives in the repository cannot be read. On error no file is left at
    /// `path` (an existing one is unchanged) and no temporary file remains.
    pub fn export_safetensors(&self, id: VersionId, path: impl AsRef<Path>) -> Result<()> {
        self.snapshot(id)?.write_safetensors(path)
    }

    /// Add every tensor of the `.safetensors` file at `path` to the working state, cut
    /// into chunks of [`Config::chunk_bytes`](crate::Config::chunk_bytes), and return
    /// their names, sorted. The file is mapped, not read into memory first.
    ///
    /// O(file size).
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the file cannot be opened or mapped;
    /// [`Error::InvalidSafeTensors`] if it is not a valid safetensors file;
    /// [`Error::UnsupportedSafeTensorsDType`] naming the first tensor (in name order)
    /// whose dtype no [`DType`] holds; [`Error::VariableExists`] if a name is taken;
    /// [`Error::TooManyDims`] for a tensor of more than [`MAX_DIMS`](crate::MAX_DIMS)
    /// axes.
    /// On error nothing was imported.
    pub fn import_safetensors(&mut self, path: impl AsRef<Path>) -> Result<Vec<String>> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|e| io_error(&shown, &e))?;
        let map = map_file(&file).map_err(|e| io_error(&shown, &e))?;
        let file = SafeTensors::deserialize(&map).map_err(|e| Error::InvalidSafeTensors {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let mut views = file.tensors();
        views.sort_by(|a, b| a.0.cmp(&b.0));
        // Check every name and dtype before copying any data.
        for (name, view) in &views {
            if from_safetensors_dtype(view.dtype()).is_none() {
                return Err(Error::UnsupportedSafeTensorsDType {
                    path: shown,
                    name: name.clone(),
                    dtype: view.dtype().to_string(),
                });
            }
            if self.working.contains_key(name) {
                return Err(Error::VariableExists { name: name.clone() });
            }
            check_dims(name, view.shape())?;
        }
        let mut built = Vec::with_capacity(views.len());
        for (name, view) in views {
            let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
                Error::UnsupportedSafeTensorsDType {
                    path: shown.clone(),
                    name: name.clone(),
                    dtype: view.dtype().to_string(),
                }
            })?;
            let tensor = Tensor::from_le_bytes_in(
                &name,
                dtype,
                view.shape(),
                view.data(),
                self.config.chunk_bytes,
                &self.alloc,
            )?;
            built.push((name, tensor));
        }
        let names = built.iter().map(|(n, _)| n.clone()).collect();
        for (name, tensor) in built {
            self.working.insert(name, tensor);
        }
        Ok(names)
    }
}

impl Snapshot {
    /// Write this snapshot's variables to a `.safetensors` file at `path` (replaced if
    /// it exists), streamed chunk by chunk, atomically. See
    /// [`Store::export_safetensors`].
    ///
    /// O(size) time; memory O(1) beyond one 1 MiB write buffer and the header.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a variable named `__metadata__` or a header over
    /// 100 MB; [`Error::Io`] if the file cannot be written; [`Error::Io`] or
    /// [`Error::CorruptObject`] if a chunk that lives in a repository cannot be read.
    /// On error no file is left at
    /// `path` (an existing one is unchanged) and no temporary file remains.
    pub fn write_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        write_tensors(self.tensors(), path.as_ref())
    }
}

/// Write `tensors` (name, tensor) to a `.safetensors` file at `path` (replaced if it
/// exists), streamed chunk by chunk, atomically, as [`Snapshot::write_safetensors`]
/// writes a snapshot's variables: for tensors that are not one snapshot's, such as
/// [`Snapshot::whole_tensors`].
///
/// # Errors
///
/// Those of [`Snapshot::write_safetensors`]; a name given twice is
/// [`Error::InvalidArgument`].
pub fn write_safetensors<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    path: impl AsRef<Path>,
) -> Result<()> {
    write_tensors(tensors.into_iter(), path.as_ref())
}

pub(crate) fn write_tensors<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a Tensor)>,
    path: &Path,
) -> Result<()> {
    let (header, order) = header(tensors)?;
    write_atomically(path, |w, io| {
        w.write_all(&header).map_err(io)?;
        for (_, tensor) in &order {
            for chunk in tensor.chunks() {
                // A chunk that lives in a repository is read (and checked) here, so a
                // damaged repository gives an error, not a panic in `bytes`.
                chunk.load()?;
                w.write_all(chunk.data()).map_err(io)?;
            }
        }
        Ok(())
    })
}

/// The safetensors dtype of a [`DType`].
fn to_safetensors_dtype(d: DType) -> Dtype {
    match d {
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
    }
}

/// The [`DType`] of a safetensors dtype, if this crate has one.
fn from_safetensors_dtype(d: Dtype) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|&ours| to_safetensors_dtype(ours) == d)
}

/// Named tensors in the order their data is written.
type FileOrder<'a> = Vec<(&'a str, &'a Tensor)>;

/// The file's first bytes (the `u64` LE header length and the padded JSON header) and
/// the tensors in file order. O(variables), no tensor data read.
fn header<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a Tensor)>,
) -> Result<(Vec<u8>, FileOrder<'a>)> {
    let mut order: FileOrder<'a> = tensors.collect();
    let mut names = std::collections::HashSet::with_capacity(order.len());
    if let Some((dup, _)) = order.iter().find(|(n, _)| !names.insert(*n)) {
        return Err(Error::InvalidArgument {
            reason: format!("the tensor `{dup}` is given twice"),
        });
    }
    // The order of `safetensors::serialize`: dtype alignment descending, then name.
    order.sort_by(|(ln, lt), (rn, rt)| {
        to_safetensors_dtype(rt.dtype())
            .cmp(&to_safetensors_dtype(lt.dtype()))
            .then(ln.cmp(rn))
    });
    let mut infos = Vec::with_capacity(order.len());
    let mut offset = 0usize;
    for (name, tensor) in &order {
        if *name == METADATA_KEY {
            return Err(Error::InvalidArgument {
                reason: format!("a safetensors tensor cannot be named `{METADATA_KEY}`"),
            });
        }
        let end = offset + tensor.nbytes();
        infos.push((
            (*name).to_owned(),
            TensorInfo {
                dtype: to_safetensors_dtype(tensor.dtype()),
                shape: tensor.shape().to_vec(),
                data_offsets: (offset, end),
            },
        ));
        offset = end;
    }
    // `Metadata::new` checks that the offsets are contiguous and match shape and dtype.
    let metadata = Metadata::new(None, infos).map_err(|e| Error::Internal {
        reason: format!("safetensors rejected the header built for this snapshot: {e}"),
    })?;
    let mut json = serde_json::to_vec(&metadata).map_err(|e| Error::Internal {
        reason: format!("safetensors header does not serialize: {e}"),
    })?;
    json.resize(json.len().next_multiple_of(8), b' ');
    if json.len() > MAX_HEADER_BYTES {
        return Err(Error::InvalidArgument {
            reason: format!(
                "the safetensors header would be {} bytes; readers accept at most {MAX_HEADER_BYTES}",
                json.len()
            ),
        });
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok((out, order))
}

/// Write a file at `path` through `fill`: into a temporary file in the same directory,
/// fsynced, renamed over `path`, then the directory fsynced. On error the temporary file
/// is removed and `path` is untouched.
fn write_atomically(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<&File>, &dyn Fn(std::io::Error) -> Error) -> Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let shown = path.display().to_string();
    let err = |e: std::io::Error| io_error(&shown, &e);
    let mut builder = tempfile::Builder::new();
    builder.prefix(".tensor-history-export-").suffix(".tmp");
    // Created as any new file is (0666 less the umask), not 0600 as a temporary file:
    // the export is the user's file once renamed.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let tmp = builder.tempfile_in(dir).map_err(err)?;
    {
        let mut w = BufWriter::with_capacity(WRITE_BUFFER_BYTES, tmp.as_file());
        fill(&mut w, &err)?;
        w.flush().map_err(err)?;
    }
    tmp.as_file().sync_all().map_err(err)?;
    tmp.persist(path).map_err(|e| err(e.error))?;
    sync_dir(dir).map_err(err)
}

/// Make a rename or create in `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn io_error(path: &str, e: &std::io::Error) -> Error {
    Error::Io {
        path: path.to_owned(),
        kind: e.kind(),
        message: e.to_string(),
    }
}

/// Map a file read-only.
#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: `Mmap::map` is unsafe because another process may truncate or modify the
    // file while it is mapped. The map lives only for one import call, during which the
    // bytes are parsed and copied into chunks; nothing keeps a reference into it. A file
    // that is changed concurrently can give wrong values (as any read would) or a SIGBUS
    // on truncation, the same contract as every safetensors loader that maps files.
    unsafe { memmap2::Mmap::map(file) }
}
