//! The crate's error type.

use std::ops::Range;

use crate::element::DType;
use crate::hash::{ContentHash, ParseHashError};
use crate::text::escape;
use crate::version::{ParseVersionIdError, RefKind, VersionId};

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a call. A call that returns an error has changed
/// nothing: the working state, the history and the refs are as before.
///
/// The messages show names and other caller-given text with control characters, line
/// separators and invisible reordering characters escaped (`\n`, `\u{202e}`), so one
/// message is always one line; the fields hold the text as given.
///
/// # Families
///
/// | family | variants |
/// | --- | --- |
/// | variables and tensors | [`UnknownVariable`](Error::UnknownVariable), [`VariableExists`](Error::VariableExists), [`DTypeMismatch`](Error::DTypeMismatch), [`ShapeMismatch`](Error::ShapeMismatch), [`RangeOutOfBounds`](Error::RangeOutOfBounds), [`NotRowAligned`](Error::NotRowAligned), [`TooLarge`](Error::TooLarge), [`TooManyDims`](Error::TooManyDims), [`UnsupportedDType`](Error::UnsupportedDType) |
/// | versions and history | [`UnknownVersion`](Error::UnknownVersion), [`PrunedVersion`](Error::PrunedVersion), [`NoCommits`](Error::NoCommits), [`UncommittedChanges`](Error::UncommittedChanges), [`NothingToUndo`](Error::NothingToUndo), [`NothingToRedo`](Error::NothingToRedo), [`MergeConflict`](Error::MergeConflict) (chunks changed on both sides of a merge; one [`Conflict`] per variable) |
/// | refs | [`UnknownRef`](Error::UnknownRef), [`RefExists`](Error::RefExists), [`InvalidRefName`](Error::InvalidRefName), [`RefNameTooLong`](Error::RefNameTooLong), [`WrongRefKind`](Error::WrongRefKind), [`BranchCheckedOut`](Error::BranchCheckedOut), [`AmbiguousRef`](Error::AmbiguousRef) |
/// | arguments and settings | [`InvalidArgument`](Error::InvalidArgument), [`InvalidConfig`](Error::InvalidConfig), [`InvalidHash`](Error::InvalidHash) |
/// | repository | [`Io`](Error::Io), [`UnsupportedFormat`](Error::UnsupportedFormat), [`CorruptObject`](Error::CorruptObject), [`BranchMoved`](Error::BranchMoved) (a save found a branch moved by another process), [`RepositoryReplaced`](Error::RepositoryReplaced) |
/// | safetensors files | [`InvalidSafeTensors`](Error::InvalidSafeTensors), [`UnsupportedSafeTensorsDType`](Error::UnsupportedSafeTensorsDType) |
/// | integrity | [`Corrupt`](Error::Corrupt) (damaged data in memory, as [`verify`](crate::Store::verify) finds it), [`Internal`](Error::Internal) (a bug) |
///
/// [`BranchMoved`](Error::BranchMoved) was called `Conflict` before; an enum variant has
/// no alias, so code matching `Error::Conflict` must be renamed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- Variables and tensors -----------------------------------------------
    /// No variable of that name in the working state (or in the snapshot asked).
    #[error("unknown variable `{}`", escape(.name))]
    UnknownVariable {
        /// The name asked for.
        name: String,
    },
    /// A variable of that name already exists.
    #[error("variable `{}` already exists", escape(.name))]
    VariableExists {
        /// The name that is taken.
        name: String,
    },
    /// The element type asked for is not the tensor's.
    #[error(
        "dtype mismatch for `{}`: the tensor holds {expected}, the call used {found}",
        escape(.name)
    )]
    DTypeMismatch {
        /// The variable (empty for a tensor outside a store).
        name: String,
        /// The tensor's dtype.
        expected: DType,
        /// The dtype of the call or array.
        found: DType,
    },
    /// An array's shape is not the tensor's.
    #[error(
        "shape mismatch for `{}`: expected {expected:?}, found {found:?}",
        escape(.name)
    )]
    ShapeMismatch {
        /// The variable (empty for a tensor outside a store).
        name: String,
        /// The tensor's shape.
        expected: Vec<usize>,
        /// The shape given.
        found: Vec<usize>,
    },
    /// A flat element range outside the tensor.
    #[error(
        "element range {range:?} out of bounds for `{}` of {len} elements",
        escape(.name)
    )]
    RangeOutOfBounds {
        /// The variable.
        name: String,
        /// The range asked.
        range: Range<usize>,
        /// The number of elements in the tensor.
        len: usize,
    },
    /// The tensor's chunks do not hold whole rows (a row is larger than a chunk, the rows
    /// have zero elements, or the tensor is a scalar), so it has no row blocks.
    #[error("chunks of this tensor do not hold whole rows (rows of {row_bytes} bytes)")]
    NotRowAligned {
        /// Bytes in one row of the outermost axis.
        row_bytes: usize,
    },
    /// A tensor larger than memory can address: its size in bytes overflows or exceeds
    /// `isize::MAX` (for example a broadcast view of a huge shape).
    #[error("a {dtype} tensor of shape {shape:?} is larger than memory can address")]
    TooLarge {
        /// The shape given.
        shape: Vec<usize>,
        /// The element type.
        dtype: DType,
    },
    /// A tensor with more axes than a tensor can have ([`MAX_DIMS`](crate::MAX_DIMS), the
    /// most a repository's manifest holds). Nothing was added or written.
    #[error(
        "`{}` has {dims} dimensions; a tensor has at most {max}",
        escape(.name)
    )]
    TooManyDims {
        /// The variable (empty for a tensor outside a store).
        name: String,
        /// The number of dimensions given.
        dims: usize,
        /// The most a tensor may have ([`MAX_DIMS`](crate::MAX_DIMS)).
        max: usize,
    },
    /// The operation is not defined for this dtype (`Mean` merge or `average` of integers).
    #[error(
        "{operation} is not defined for dtype {dtype} (variable `{}`)",
        escape(.name)
    )]
    UnsupportedDType {
        /// The variable.
        name: String,
        /// Its dtype.
        dtype: DType,
        /// The operation asked.
        operation: &'static str,
    },

    // ---- Versions and history ------------------------------------------------
    /// No version with this id was ever created in this store.
    #[error("unknown version {id}")]
    UnknownVersion {
        /// The id asked for.
        id: VersionId,
    },
    /// The version existed but was dropped by `prune` or auto-retention.
    #[error("version {id} was pruned")]
    PrunedVersion {
        /// The id asked for.
        id: VersionId,
    },
    /// The call needs at least one commit (a HEAD).
    #[error("no commit yet")]
    NoCommits,
    /// Undo, redo, merge and average need a clean working state; commit or discard first.
    #[error("the working state has uncommitted changes")]
    UncommittedChanges,
    /// HEAD has no parent (or no commit exists).
    #[error("nothing to undo")]
    NothingToUndo,
    /// No version to go forward to: no undo since the last commit, restore or checkout.
    #[error("nothing to redo")]
    NothingToRedo,
    /// A three-way merge found chunks changed on both sides, and the strategy does not
    /// resolve them.
    #[error("merge conflict in {}", conflict_names(.conflicts))]
    MergeConflict {
        /// One entry per variable in conflict.
        conflicts: Vec<Conflict>,
    },

    // ---- Refs ----------------------------------------------------------------
    /// No branch or tag of that name.
    #[error("unknown ref `{}`", escape(.name))]
    UnknownRef {
        /// The name asked for.
        name: String,
    },
    /// A branch or tag of that name already exists (branches and tags share one namespace).
    #[error("ref `{}` already exists", escape(.name))]
    RefExists {
        /// The name that is taken.
        name: String,
    },
    /// A ref name that is empty, is `HEAD`, has white space, control or invisible
    /// characters, or reads as a version id (`v12`, `12`).
    #[error("invalid ref name `{}`", escape(.name))]
    InvalidRefName {
        /// The name given.
        name: String,
    },
    /// A ref name longer than a repository can store: a ref name is one component of an
    /// object key (a directory name on a local disk, limited to 255 bytes), in which ASCII
    /// letters, digits, `-` and `_` take one byte and every other byte of the name three
    /// (`%XX`). The limit, [`MAX_REF_NAME_BYTES`](crate::MAX_REF_NAME_BYTES) of that
    /// encoding, is the same on every backend and for a store without a repository.
    #[error(
        "ref name `{}` takes {bytes} bytes in a repository key; the limit is {max}",
        escape(.name)
    )]
    RefNameTooLong {
        /// The name given.
        name: String,
        /// Bytes of the name in a key (see above).
        bytes: usize,
        /// The limit ([`MAX_REF_NAME_BYTES`](crate::MAX_REF_NAME_BYTES)).
        max: usize,
    },
    /// The ref is a tag where a branch is needed (checkout, delete_branch) or the reverse.
    #[error("`{}` is not a {expected}", escape(.name))]
    WrongRefKind {
        /// The name given.
        name: String,
        /// The kind the call needs.
        expected: RefKind,
    },
    /// The branch HEAD is attached to cannot be deleted.
    #[error("branch `{}` is checked out", escape(.name))]
    BranchCheckedOut {
        /// The branch.
        name: String,
    },
    /// A hex prefix given to `resolve` matches more than one saved version.
    #[error("`{prefix}` matches {matches} versions; give more hex digits")]
    AmbiguousRef {
        /// The prefix given.
        prefix: String,
        /// How many versions it matches.
        matches: usize,
    },

    // ---- Arguments and settings ----------------------------------------------
    /// An argument that is not valid for the call (empty version list, weights that do not
    /// match, a merge of a version into itself).
    #[error("invalid argument: {}", escape(.reason))]
    InvalidArgument {
        /// What is wrong.
        reason: String,
    },
    /// A [`Config`](crate::Config) value is not usable.
    #[error("invalid config: {}", escape(.reason))]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// Text that is not 64 hex digits was parsed as a [`ContentHash`](crate::ContentHash).
    #[error("not a 64-digit hex content hash: `{}`", escape(.text))]
    InvalidHash {
        /// The text given.
        text: String,
    },

    // ---- Repository ----------------------------------------------------------
    /// A storage backend failed (disk full, permission denied, network error, a missing
    /// object). Nothing in memory or in the repository was lost.
    #[error("I/O error on `{}`: {}", escape(.path), escape(.message))]
    Io {
        /// The file, object key or URL at fault.
        path: String,
        /// The kind of failure (`NotFound` for a missing object).
        kind: std::io::ErrorKind,
        /// The backend's description.
        message: String,
    },
    /// The repository was written in a format (or format version) this build cannot read.
    #[error(
        "unsupported repository format in `{}`: {}",
        escape(.path),
        escape(.found)
    )]
    UnsupportedFormat {
        /// The file at fault.
        path: String,
        /// What was found (the format name and version).
        found: String,
    },
    /// A repository object failed its checksum or its hash, or does not parse.
    #[error("corrupt repository object `{path}`: {reason}")]
    CorruptObject {
        /// The object (file path or key) at fault.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A save found that a branch (or tag) moved in the repository since this store last
    /// saw it, and this store's version does not descend from the repository's: nothing
    /// was written for that ref. Every other ref was saved, and HEAD unless it is attached
    /// to that branch. The way out: [`refresh`](crate::Store::refresh) (which loads
    /// `theirs`), merge it into this store's branch and save again; a ref the repository
    /// deleted is written again by the save after a refresh.
    #[error(
        "branch `{}` moved in the repository since it was last seen ({}): refresh, merge it \
         and save again",
        escape(.branch),
        match .theirs { Some(h) => format!("it is at version {h} there"), None => "it was deleted there".into() }
    )]
    BranchMoved {
        /// The branch.
        branch: String,
        /// The content address of the repository's version of the branch (accepted by
        /// [`resolve`](crate::Store::resolve) once a refresh loaded it); `None` if the
        /// repository deleted the branch.
        theirs: Option<ContentHash>,
    },
    /// A call that only reads a repository (an open that must not create one) found none
    /// at the location: nothing was created there.
    #[error("there is no tensor-history repository at `{}`", escape(.location))]
    NoRepository {
        /// The location as given.
        location: String,
    },
    /// [`save_as`](crate::Store::save_as) onto a location that holds another history:
    /// the repository has ref `branch` at a version (`theirs`) that this store's ref of
    /// that name does not descend from, and this store never saw it there. Nothing was
    /// written to the repository's refs; the store stays bound where it was. The ways
    /// on: open that repository to continue its history (or merge into it), or save
    /// this one elsewhere or under another branch name.
    #[error(
        "`{}` holds another history: its ref `{}` is at version {}, which this store's `{}` \
         does not descend from; nothing was overwritten. To continue that history, open it \
         (Store::open, or track(..., path=...) in Python); to keep this one, save it \
         elsewhere or under another branch name",
        escape(.location),
        escape(.branch),
        match .theirs { Some(h) => h.to_string(), None => "(deleted)".into() },
        escape(.branch)
    )]
    OtherHistory {
        /// The repository's location.
        location: String,
        /// The ref both histories have.
        branch: String,
        /// The repository's version of it.
        theirs: Option<ContentHash>,
    },
    /// The repository this store saves to was deleted, or replaced by another one, since
    /// the store connected to it: nothing was written. Open the location again (or
    /// `save_as` it) to start over there.
    #[error("the repository at `{}` {}", escape(.location), escape(.reason))]
    RepositoryReplaced {
        /// Where the store saves.
        location: String,
        /// What was found (`is gone (no config.json)`, `was replaced by another one`).
        reason: String,
    },

    // ---- safetensors files ---------------------------------------------------
    /// A file given to `import_safetensors` is not a valid safetensors file (a header
    /// that is too small, too large, not JSON, or offsets that do not cover the data).
    /// Nothing was imported.
    #[error("`{path}` is not a valid safetensors file: {reason}")]
    InvalidSafeTensors {
        /// The file.
        path: String,
        /// What the safetensors parser found wrong.
        reason: String,
    },
    /// A tensor of a safetensors file has an element type no [`DType`] holds (`BOOL`,
    /// the 8-, 6- and 4-bit floats, `C64`). Nothing was imported.
    #[error("tensor `{name}` in `{path}` has dtype {dtype}, which tensor-history cannot hold")]
    UnsupportedSafeTensorsDType {
        /// The file.
        path: String,
        /// The tensor.
        name: String,
        /// The safetensors dtype, as written in the file (`BOOL`, `F8_E4M3`, ...).
        dtype: String,
    },

    // ---- Integrity -----------------------------------------------------------
    /// Damaged data in memory: [`verify`](crate::Store::verify) found a broken invariant
    /// or a cached hash that does not match the bytes, or a chunk held encoded (under a
    /// memory budget) does not decode to its id. Failures that are not damage are
    /// [`Internal`](Error::Internal).
    #[error("integrity check failed: {}", escape(.reason))]
    Corrupt {
        /// What is broken.
        reason: String,
    },
    /// A check that cannot fail did: a bug in tensor-history (please report it with the
    /// message). Nothing was changed.
    #[error("internal error (a bug in tensor-history): {}", escape(.reason))]
    Internal {
        /// What the check found.
        reason: String,
    },
}

fn conflict_names(conflicts: &[Conflict]) -> String {
    let names: Vec<String> = conflicts
        .iter()
        .map(|c| match &c.chunks {
            Some(chunks) => format!("`{}` (chunks {:?})", escape(&c.variable), chunks),
            None => format!("`{}` (whole variable)", escape(&c.variable)),
        })
        .collect();
    names.join(", ")
}

/// One variable in a merge conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The variable.
    pub variable: String,
    /// The chunk indices changed on both sides, or `None` when the variable as a whole
    /// conflicts (added on both sides with different content, removed on one side and
    /// changed on the other, or given a new dtype or shape).
    pub chunks: Option<Vec<usize>>,
}

impl From<ParseVersionIdError> for Error {
    fn from(e: ParseVersionIdError) -> Error {
        Error::InvalidArgument {
            reason: e.to_string(),
        }
    }
}

impl From<ParseHashError> for Error {
    fn from(e: ParseHashError) -> Error {
        Error::InvalidHash { text: e.text }
    }
}
