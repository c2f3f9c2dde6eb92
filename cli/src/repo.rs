//! Opening the repository a command works on, with clear errors for locations that hold
//! none.

use std::path::Path;

use tensor_history::{Ref, Store, VersionId};

use crate::error::{CliError, CliResult, Context};

/// The file every repository has at its root.
const CONFIG_FILE: &str = "config.json";

/// An opened repository.
#[derive(Debug)]
pub(crate) struct Repo {
    pub(crate) store: Store,
    pub(crate) location: String,
}

impl Repo {
    /// Open an existing repository. A directory that does not exist, is not a directory,
    /// or has no repository config is bad input (nothing is created).
    pub(crate) fn open(location: &str) -> CliResult<Repo> {
        if !is_url(location) {
            let path = Path::new(location);
            if !path.exists() {
                return Err(CliError::usage(format!(
                    "no repository at `{location}`: the directory does not exist"
                )));
            }
            if !path.is_dir() {
                return Err(CliError::usage(format!(
                    "`{location}` is not a repository: it is a file, not a directory"
                )));
            }
            if !path.join(CONFIG_FILE).exists() {
                return Err(CliError::usage(format!(
                    "`{location}` is not a tensor-history repository (no {CONFIG_FILE})"
                )));
            }
        }
        Repo::connect(location)
    }

    /// Open a repository, creating it if the location does not exist or is an empty
    /// directory.
    pub(crate) fn open_or_create(location: &str) -> CliResult<Repo> {
        if !is_url(location) {
            let path = Path::new(location);
            let empty_dir = path.is_dir()
                && std::fs::read_dir(path)
                    .map_err(|e| CliError::failed(format!("`{location}`: {e}")))?
                    .next()
                    .is_none();
            if path.exists() && !empty_dir {
                return Repo::open(location);
            }
        }
        Repo::connect(location)
    }

    fn connect(location: &str) -> CliResult<Repo> {
        let store = Store::open(location).context(&format!("repository `{location}`"))?;
        Ok(Repo {
            store,
            location: location.to_owned(),
        })
    }

    /// The version a ref names: a branch, a tag, `HEAD`, or an id like `v12`.
    pub(crate) fn resolve(&self, refname: &str) -> CliResult<VersionId> {
        self.store
            .resolve(refname)
            .context(&format!("repository `{}`", self.location))
    }

    /// The version a ref names, HEAD when none is given.
    pub(crate) fn resolve_or_head(&self, refname: Option<&str>) -> CliResult<VersionId> {
        self.resolve(refname.unwrap_or("HEAD"))
    }

    /// Write what changed to the repository.
    pub(crate) fn save(&mut self) -> CliResult<()> {
        self.store
            .save()
            .map(|_| ())
            .context(&format!("saving to `{}`", self.location))
    }

    /// Bytes the repository's files take (every object the backend lists).
    pub(crate) fn disk_bytes(&self) -> CliResult<u64> {
        let Some(backend) = self.store.backend() else {
            return Ok(0);
        };
        let objects = backend
            .list("")
            .context(&format!("listing `{}`", self.location))?;
        Ok(objects.iter().map(|o| o.size).sum())
    }

    /// The names of the refs at each version, as `log` shows them (`HEAD -> main`,
    /// `tag: best`).
    pub(crate) fn labels(&self, id: VersionId) -> Vec<String> {
        let head_branch = self.store.current_branch();
        let mut out = Vec::new();
        if head_branch.is_none() && self.store.head() == Some(id) {
            out.push("HEAD".to_owned());
        }
        for (name, r) in self.store.refs() {
            if r.target() != id {
                continue;
            }
            match r {
                Ref::Branch(_) if head_branch == Some(name.as_str()) => {
                    out.insert(0, format!("HEAD -> {name}"));
                }
                Ref::Branch(_) => out.push(name),
                Ref::Tag(_) => out.push(format!("tag: {name}")),
            }
        }
        out
    }
}

/// Whether a location is a URL (`s3://bucket/prefix`) rather than a path.
fn is_url(location: &str) -> bool {
    location
        .split_once("://")
        .is_some_and(|(scheme, _)| !scheme.is_empty() && scheme.chars().all(char::is_alphanumeric))
}
