//! The version tree: ids, versions, refs and HEAD, and the walks over them.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::tensor::Tensor;
use crate::text::needs_escape;
use crate::version::{RefKind, VersionId};

/// The variables of a version or of the working state: a persistent map, O(1) to clone.
pub(crate) type Vars = imbl::OrdMap<String, Tensor>;

/// A named ref.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Ref {
    /// Moves to each new version committed while HEAD is attached to it (and with undo,
    /// redo and restore while attached).
    Branch(VersionId),
    /// Never moves.
    Tag(VersionId),
}

impl Ref {
    /// Whether the ref is a branch or a tag.
    #[must_use]
    pub fn kind(self) -> RefKind {
        match self {
            Ref::Branch(_) => RefKind::Branch,
            Ref::Tag(_) => RefKind::Tag,
        }
    }

    /// The version the ref points at.
    #[must_use]
    pub fn target(self) -> VersionId {
        match self {
            Ref::Branch(v) | Ref::Tag(v) => v,
        }
    }
}

/// Where HEAD is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// Attached to a branch (which does not exist yet before the first commit).
    Branch(String),
    /// At a version, on no branch.
    Detached(VersionId),
}

/// One node of the tree.
// Invariant: every parent id is live and smaller than the node's own id; `children` lists
// exactly the live nodes that have this one as a parent.
#[derive(Clone, Debug)]
pub(crate) struct Version {
    pub(crate) parents: Vec<VersionId>,
    pub(crate) children: Vec<VersionId>,
    pub(crate) message: Arc<str>,
    pub(crate) meta: Arc<Meta>,
    pub(crate) time: SystemTime,
    pub(crate) vars: VersionVars,
}

/// A new [`VersionVars`] stamp: unique in the process.
fn next_stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Reads a version's variables from where they are kept (a repository's manifests).
pub(crate) trait VarsSource: Send + Sync {
    fn load(&self) -> Result<Vars>;
}

/// A version's variables: in memory, or read from a repository on first use and kept
/// from then on. A store opened from a repository reads only the versions it uses, so
/// opening costs O(versions) small reads however many tensors each version has.
#[derive(Clone)]
pub(crate) struct VersionVars {
    vars: OnceLock<Vars>,
    /// Unique to these variables as they are held (new when they are replaced): how the
    /// memory budget's record tells a version it counted from one changed since.
    stamp: u64,
    source: Option<Arc<dyn VarsSource>>,
}

impl VersionVars {
    /// Variables held in memory.
    pub(crate) fn held(vars: Vars) -> VersionVars {
        VersionVars {
            vars: OnceLock::from(vars),
            stamp: next_stamp(),
            source: None,
        }
    }

    /// Variables read from `source` when first asked for.
    pub(crate) fn lazy(source: Arc<dyn VarsSource>) -> VersionVars {
        VersionVars {
            vars: OnceLock::new(),
            stamp: next_stamp(),
            source: Some(source),
        }
    }

    /// The variables, read from the repository the first time.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] or [`Error::CorruptObject`] when they cannot be read; nothing is
    /// kept then, and the next call tries again.
    pub(crate) fn get(&self) -> Result<&Vars> {
        if let Some(v) = self.vars.get() {
            return Ok(v);
        }
        let loaded = match &self.source {
            Some(s) => s.load()?,
            None => Vars::new(),
        };
        Ok(self.vars.get_or_init(|| loaded))
    }

    /// The variables if they are in memory already.
    pub(crate) fn loaded(&self) -> Option<&Vars> {
        self.vars.get()
    }

    /// Replace the variables (with the same values, differently held).
    pub(crate) fn set(&mut self, vars: Vars) {
        self.vars = OnceLock::from(vars);
        self.stamp = next_stamp();
    }

    /// The stamp of the variables as held now: it changes whenever they are replaced.
    pub(crate) fn stamp(&self) -> u64 {
        self.stamp
    }
}

impl fmt::Debug for VersionVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.vars.get() {
            Some(v) => f.debug_map().entries(v.iter()).finish(),
            None => f.write_str("<not read yet>"),
        }
    }
}

/// The arena of versions, the refs and HEAD.
// Invariant: `nodes[i]` is version `VersionId(i)`, `None` once pruned; refs, HEAD and
// the redo stack point at live versions; HEAD is attached to a branch that does not exist
// only before the first commit (a checked-out branch cannot be deleted).
#[derive(Clone, Debug)]
pub(crate) struct History {
    pub(crate) nodes: Vec<Option<Version>>,
    pub(crate) refs: BTreeMap<String, Ref>,
    pub(crate) head: Head,
    /// Versions undo came from, the next redo target last.
    pub(crate) redo: Vec<VersionId>,
    /// Versions HEAD left while no ref pointed at them any more, with the branch HEAD was
    /// attached to (or `HEAD` when detached), oldest first; each version at most once.
    pub(crate) reflog: VecDeque<(String, VersionId)>,
}

impl Default for History {
    fn default() -> Self {
        History {
            nodes: Vec::new(),
            refs: BTreeMap::new(),
            head: Head::Branch("main".to_owned()),
            redo: Vec::new(),
            reflog: VecDeque::new(),
        }
    }
}

impl History {
    pub(crate) fn node(&self, id: VersionId) -> Result<&Version> {
        match self.nodes.get(id.0 as usize) {
            Some(Some(v)) => Ok(v),
            Some(None) => Err(Error::PrunedVersion { id }),
            None => Err(Error::UnknownVersion { id }),
        }
    }

    pub(crate) fn node_mut(&mut self, id: VersionId) -> Result<&mut Version> {
        match self.nodes.get_mut(id.0 as usize) {
            Some(Some(v)) => Ok(v),
            Some(None) => Err(Error::PrunedVersion { id }),
            None => Err(Error::UnknownVersion { id }),
        }
    }

    pub(crate) fn head_id(&self) -> Option<VersionId> {
        match &self.head {
            Head::Branch(b) => self.refs.get(b).map(|r| r.target()),
            Head::Detached(v) => Some(*v),
        }
    }

    pub(crate) fn head_branch(&self) -> Option<&str> {
        match &self.head {
            Head::Branch(b) => Some(b),
            Head::Detached(_) => None,
        }
    }

    /// Move HEAD, and the branch it is attached to, to `id`.
    pub(crate) fn move_head(&mut self, id: VersionId) {
        match &self.head {
            Head::Branch(b) => {
                self.refs.insert(b.clone(), Ref::Branch(id));
            }
            Head::Detached(_) => self.head = Head::Detached(id),
        }
    }

    /// Move HEAD (and the branch it is attached to) to `id` as [`History::move_head`], and
    /// record in the reflog (at most `cap` entries) the version HEAD leaves if no ref
    /// points at it afterwards.
    pub(crate) fn move_head_logged(&mut self, id: VersionId, cap: usize) {
        let from = self.head_id();
        let name = self.head_branch().unwrap_or("HEAD").to_owned();
        self.move_head(id);
        self.log_left(from, name, cap);
    }

    /// Record that HEAD (attached to branch `name`, or `HEAD`) left `from`, unless HEAD
    /// is still there or a ref points at it; keeps at most `cap` entries.
    pub(crate) fn log_left(&mut self, from: Option<VersionId>, name: String, cap: usize) {
        let Some(from) = from else { return };
        let held = self.head_id() == Some(from) || self.refs.values().any(|r| r.target() == from);
        if held || cap == 0 {
            return;
        }
        self.reflog.retain(|(_, v)| *v != from);
        self.reflog.push_back((name, from));
        while self.reflog.len() > cap {
            self.reflog.pop_front();
        }
    }

    /// Add a node as a child of `parents`; returns its id.
    pub(crate) fn add(
        &mut self,
        parents: Vec<VersionId>,
        message: &str,
        meta: Meta,
        vars: Vars,
    ) -> VersionId {
        let id = self.next_id();
        self.insert(
            id,
            parents,
            message.into(),
            Arc::new(meta),
            SystemTime::now(),
            VersionVars::held(vars),
        );
        id
    }

    /// The id the next added version gets: one past the newest id ever used. O(1).
    pub(crate) fn next_id(&self) -> VersionId {
        VersionId(self.nodes.len() as u64)
    }

    /// Add a node under `id` (at least [`next_id`](History::next_id); the ids between are
    /// left unused, as pruned ones) as a child of `parents`, keeping the children lists
    /// in step. This and [`remove`](History::remove) are the only places that link
    /// nodes: [`add`](History::add) for commits, and the repository for the versions it
    /// loads (under the ids they were saved with, where free). O(id gap + parents).
    pub(crate) fn insert(
        &mut self,
        id: VersionId,
        parents: Vec<VersionId>,
        message: Arc<str>,
        meta: Arc<Meta>,
        time: SystemTime,
        vars: VersionVars,
    ) {
        debug_assert!(id >= self.next_id(), "version id {id} is already taken");
        debug_assert!(
            parents.iter().all(|p| *p < id),
            "a parent of {id} is not older than it"
        );
        while self.next_id() < id {
            self.nodes.push(None);
        }
        for p in &parents {
            if let Ok(node) = self.node_mut(*p) {
                node.children.push(id);
            }
        }
        self.nodes.push(Some(Version {
            parents,
            children: Vec::new(),
            message,
            meta,
            time,
            vars,
        }));
    }

    /// Point `name` at `r`, creating it or moving it. The caller has checked the name and
    /// that `r`'s version is live. O(log refs).
    pub(crate) fn set_ref(&mut self, name: String, r: Ref) {
        debug_assert!(
            self.node(r.target()).is_ok(),
            "ref {name} to a dead version"
        );
        self.refs.insert(name, r);
    }

    /// Put HEAD at `head` (a branch, or a live version). O(1).
    pub(crate) fn set_head(&mut self, head: Head) {
        if let Head::Detached(v) = head {
            debug_assert!(self.node(v).is_ok(), "HEAD detached at a dead version {v}");
        }
        self.head = head;
    }

    /// Delete ref `name` if it exists. O(log refs).
    pub(crate) fn remove_ref(&mut self, name: &str) {
        self.refs.remove(name);
    }

    pub(crate) fn live(&self) -> impl DoubleEndedIterator<Item = (VersionId, &Version)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (VersionId(i as u64), n)))
    }

    /// `id` and all its ancestors (every parent), newest first.
    pub(crate) fn ancestors(&self, id: VersionId) -> Result<Vec<VersionId>> {
        self.node(id)?;
        let mut seen = BTreeSet::new();
        let mut stack = vec![id];
        while let Some(v) = stack.pop() {
            if seen.insert(v) {
                stack.extend(self.node(v)?.parents.iter().copied());
            }
        }
        Ok(seen.into_iter().rev().collect())
    }

    pub(crate) fn merge_base(&self, a: VersionId, b: VersionId) -> Result<Option<VersionId>> {
        let from_a: HashSet<VersionId> = self.ancestors(a)?.into_iter().collect();
        Ok(self.ancestors(b)?.into_iter().find(|v| from_a.contains(v)))
    }

    /// Remove a node, reconnecting its children to its parents.
    pub(crate) fn remove(&mut self, id: VersionId) -> Option<Version> {
        let node = self.nodes.get_mut(id.0 as usize)?.take()?;
        for p in &node.parents {
            if let Ok(pn) = self.node_mut(*p) {
                pn.children.retain(|c| *c != id);
                for c in &node.children {
                    if !pn.children.contains(c) {
                        pn.children.push(*c);
                    }
                }
            }
        }
        for c in &node.children {
            if let Ok(cn) = self.node_mut(*c) {
                let mut parents = Vec::with_capacity(cn.parents.len() + node.parents.len());
                for p in &cn.parents {
                    if *p == id {
                        for q in &node.parents {
                            if !parents.contains(q) {
                                parents.push(*q);
                            }
                        }
                    } else if !parents.contains(p) {
                        parents.push(*p);
                    }
                }
                cn.parents = parents;
            }
        }
        for p in &node.parents {
            if let Ok(pn) = self.node_mut(*p) {
                pn.children.sort_unstable();
            }
        }
        self.redo.retain(|r| *r != id);
        Some(node)
    }
}

/// The most bytes a ref name may take in a repository key (see
/// [`Error::RefNameTooLong`]): ASCII letters, digits, `-` and `_` count one byte, every
/// other byte of the UTF-8 name three. 255 is the longest file name of common local file
/// systems, where the name is one directory; so at most 85 bytes of any text, and up to
/// 255 ASCII letters and digits.
pub const MAX_REF_NAME_BYTES: usize = 255;

/// Bytes of `name` as a repository key component (`%XX` for every byte other than ASCII
/// letters, digits, `-` and `_`; the repository's encoder agrees, see its tests).
pub(crate) fn ref_name_key_len(name: &str) -> usize {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                1
            } else {
                3
            }
        })
        .sum()
}

/// [`Error::RefNameTooLong`] if `name` takes more than [`MAX_REF_NAME_BYTES`] in a key.
/// Checked where a ref is created (not where one is read: a repository that holds a
/// longer name, written by an older build on an object store, still opens).
pub(crate) fn check_ref_name_len(name: &str) -> Result<()> {
    let bytes = ref_name_key_len(name);
    if bytes > MAX_REF_NAME_BYTES {
        return Err(Error::RefNameTooLong {
            name: name.to_owned(),
            bytes,
            max: MAX_REF_NAME_BYTES,
        });
    }
    Ok(())
}

/// Whether `name` can be a branch or tag name. This is the one place that decides (see
/// [`Error::InvalidRefName`]): not empty, not `HEAD`, no white space, no control or
/// invisible characters (see `text::needs_escape`), and not a version id such as `v12`
/// or `12` (`v` or nothing followed by ASCII digits), so that
/// [`Store::resolve`](crate::Store::resolve) never has to choose between a ref and a
/// version.
pub(crate) fn check_ref_name(name: &str) -> Result<()> {
    let digits = name.strip_prefix('v').unwrap_or(name);
    let reads_as_version = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let ok = !name.is_empty()
        && name != "HEAD"
        && !reads_as_version
        && !name.chars().any(|c| c.is_whitespace() || needs_escape(c));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRefName {
            name: name.to_owned(),
        })
    }
}
