//! Version ids and ref kinds: leaves of the core that the error type and the history
//! both name.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The id of a version: dense, in commit order, never reused within a store.
/// Shown as `v12`; parsed from `v12` or `12`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VersionId(pub u64);

impl fmt::Display for VersionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl fmt::Debug for VersionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Text that is not a version id (`v12` or `12`). Converts into
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) with the same message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a version id like `v12`")]
pub struct ParseVersionIdError {
    /// The text that was given.
    pub text: String,
}

impl FromStr for VersionId {
    type Err = ParseVersionIdError;

    fn from_str(s: &str) -> Result<Self, ParseVersionIdError> {
        s.strip_prefix('v')
            .unwrap_or(s)
            .parse()
            .map(VersionId)
            .map_err(|_| ParseVersionIdError { text: s.to_owned() })
    }
}

/// The kind of a [`Ref`](crate::Ref): a branch or a tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RefKind {
    /// A [`Ref::Branch`](crate::Ref::Branch): moves with commits made while HEAD is attached to it.
    Branch,
    /// A [`Ref::Tag`](crate::Ref::Tag): never moves.
    Tag,
}

impl RefKind {
    /// `branch` or `tag`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            RefKind::Branch => "branch",
            RefKind::Tag => "tag",
        }
    }
}

impl fmt::Display for RefKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
