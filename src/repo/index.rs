//! Index files (`index/<id>.thidx`): the one reader of the repository's index files,
//! used by the chunk source (which chunk lives where) and by gc (which packs are live).
//! What an index holds is encoded in `format/bodies.rs`; index files are written by
//! save and by gc's repack.

use std::collections::HashSet;

use super::backend::{is_not_found, Backend};
use super::format::{id_of_key, parse_index, IndexBody};
use crate::error::{Error, Result};
use crate::hash::ContentHash;

/// One index file read and parsed.
pub(crate) struct IndexFile {
    pub(crate) key: String,
    pub(crate) id: ContentHash,
    pub(crate) body: IndexBody,
}

/// What reading a set of index files found.
#[derive(Default)]
pub(crate) struct IndexFiles {
    /// The files that parsed, in listing order.
    pub(crate) read: Vec<IndexFile>,
    /// Keys of files that did not parse: left by an interrupted save (never referenced)
    /// or damaged. Chunks only they list are reported as missing when needed.
    pub(crate) damaged: Vec<String>,
    /// The ids of index files that the files read replace (written by gc's repack).
    pub(crate) superseded: HashSet<ContentHash>,
}

impl IndexFiles {
    /// The files read that no file read replaces.
    pub(crate) fn current(self) -> impl Iterator<Item = IndexFile> {
        let superseded = self.superseded;
        self.read
            .into_iter()
            .filter(move |f| !superseded.contains(&f.id))
    }
}

/// Read the index files among `keys` (a listing; other keys are skipped) whose ids are
/// not in `skip`. A file deleted since the listing is skipped; one that does not parse
/// is reported in [`IndexFiles::damaged`].
///
/// # Errors
///
/// A backend error other than "not found".
pub(crate) fn read_index_files<'k>(
    backend: &dyn Backend,
    keys: impl IntoIterator<Item = &'k str>,
    skip: &HashSet<ContentHash>,
) -> Result<IndexFiles> {
    let mut out = IndexFiles::default();
    for key in keys {
        let Some(id) = id_of_key(key, "thidx") else {
            continue;
        };
        if skip.contains(&id) {
            continue;
        }
        let bytes = match backend.get(key) {
            Ok(b) => b,
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        match parse_index(key, &bytes, Some(&id)) {
            Ok(body) => {
                out.superseded
                    .extend(body.supersedes.iter().map(|h| ContentHash(*h)));
                out.read.push(IndexFile {
                    key: key.to_owned(),
                    id,
                    body,
                });
            }
            Err(Error::CorruptObject { path, .. }) => out.damaged.push(path),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}
