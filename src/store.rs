//! The store: the working state and the operations on it and on the history.

use std::ops::Range;
use std::sync::Arc;

use ndarray::{ArrayBase, ArrayD, Data, Dimension};

use crate::chunk::{Alloc, Pool};
use crate::config::Config;
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::history::{check_ref_name, check_ref_name_len, Head, History, Ref, Vars};
use crate::kernels::WriteMode;
use crate::meta::Meta;
use crate::snapshot::Snapshot;
use crate::tensor::{Tensor, WriteCtx, WriteStats, PAR_MIN_BYTES, PAR_MIN_BYTES_COLD};
use crate::version::{RefKind, VersionId};

/// Named tensors with their full version history, in memory.
///
/// The working state maps names to [`Tensor`]s; [`commit`](Store::commit) records it as
/// a [`VersionId`] in a tree of versions, sharing every chunk; [`restore`](Store::restore),
/// [`undo`](Store::undo) and [`checkout`](Store::checkout) repoint it to an earlier
/// version. Costs grow with what changed, not with the model.
///
/// Every method that returns an error has changed nothing.
#[derive(Debug)]
pub struct Store {
    pub(crate) config: Config,
    pub(crate) alloc: Alloc,
    pool: Option<Arc<Pool>>,
    pub(crate) working: Vars,
    pub(crate) hist: History,
    /// The repository this store saves to, if any. The one place the core names the
    /// repository layer: everything the store asks of it goes through this link.
    pub(crate) repo: Option<Box<crate::repo::RepoLink>>,
    /// A background save in flight, or one whose error nobody saw yet.
    pub(crate) bg: crate::repo::Background,
    /// The background encoding under [`Config::memory_budget`].
    pub(crate) budget: crate::encoded::Budget,
    /// The memory budget's record of the versions (what they hold, what is settled).
    pub(crate) record: crate::budget::Record,
    /// The saved versions that may still hold chunks on the heap.
    pub(crate) evictions: crate::repo::Evictions,
    /// Unit tests of the encoding: the budget encodes but lets no version go.
    #[cfg(test)]
    pub(crate) budget_keeps_versions: bool,
}

impl Default for Store {
    fn default() -> Self {
        Store::new()
    }
}

impl Store {
    /// An empty store with the default [`Config`]. O(1).
    #[must_use]
    pub fn new() -> Store {
        Store::with_config(Config::default()).expect("the default config is valid")
    }

    /// An empty store with `config`. O(1).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if [`Config::validate`] fails.
    pub fn with_config(config: Config) -> Result<Store> {
        config.validate()?;
        // No chunk is larger than an allocation can be, so a larger `chunk_bytes` needs no
        // pool of full-size buffers.
        let pool = (config.recycle_bytes >= config.chunk_bytes
            && isize::try_from(config.chunk_bytes).is_ok())
        .then(|| Pool::new(config.chunk_bytes, config.recycle_bytes));
        Ok(Store {
            alloc: Alloc::new(pool.clone()),
            pool,
            config,
            working: Vars::new(),
            hist: History::default(),
            repo: None,
            bg: crate::repo::Background::default(),
            budget: crate::encoded::Budget::default(),
            record: crate::budget::Record::default(),
            evictions: crate::repo::Evictions::default(),
            #[cfg(test)]
            budget_keeps_versions: false,
        })
    }

    /// The configuration. O(1).
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Bytes of freed chunk buffers currently kept for reuse. O(1).
    #[must_use]
    pub fn pooled_bytes(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.pooled_bytes())
    }

    /// The buffer pool, if this store recycles buffers.
    pub(crate) fn pool(&self) -> Option<&Pool> {
        self.pool.as_deref()
    }

    /// Return the pooled buffers' memory to the allocator (for example after pruning a
    /// large history). Later copy-on-write writes refill the pool. O(pooled buffers).
    pub fn release_pooled(&mut self) {
        if let Some(p) = &self.pool {
            p.clear();
        }
    }

    // ---- working state -------------------------------------------------------------

    /// Add a variable holding a copy of `array` (any memory layout) to the working state.
    /// O(size).
    ///
    /// # Errors
    ///
    /// [`Error::VariableExists`]; [`Error::InvalidConfig`] if `chunk_bytes` is smaller
    /// than one element of `T`; [`Error::TooLarge`] if the array's logical size exceeds
    /// `isize::MAX` bytes (a broadcast view of a huge shape); [`Error::TooManyDims`] for
    /// more than [`MAX_DIMS`](crate::MAX_DIMS) axes.
    pub fn insert<T, S, D>(&mut self, name: &str, array: &ArrayBase<S, D>) -> Result<()>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        self.insert_chunked(name, array, self.config.chunk_bytes)
    }

    /// Like [`insert`](Store::insert), with a chunk size for this variable instead of the
    /// store's [`Config::chunk_bytes`]: smaller chunks suit tensors updated a few rows at a
    /// time (an embedding table), since every write copies whole chunks. O(size).
    ///
    /// # Errors
    ///
    /// [`Error::VariableExists`]; [`Error::InvalidConfig`] if `chunk_bytes` is smaller
    /// than one element of `T`; [`Error::TooLarge`] if the array's logical size exceeds
    /// `isize::MAX` bytes (a broadcast view of a huge shape); [`Error::TooManyDims`] for
    /// more than [`MAX_DIMS`](crate::MAX_DIMS) axes.
    pub fn insert_chunked<T, S, D>(
        &mut self,
        name: &str,
        array: &ArrayBase<S, D>,
        chunk_bytes: usize,
    ) -> Result<()>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        self.check_free(name)?;
        let t = Tensor::from_array_in(array, chunk_bytes, &self.alloc).map_err(|e| match e {
            Error::TooManyDims { dims, max, .. } => Error::TooManyDims {
                name: name.to_owned(),
                dims,
                max,
            },
            e => e,
        })?;
        self.working.insert(name.to_owned(), t);
        Ok(())
    }

    /// Add an existing tensor (for example one taken from a [`Snapshot`]) under `name`.
    /// O(log variables): shares every chunk.
    ///
    /// # Errors
    ///
    /// [`Error::VariableExists`].
    pub fn insert_tensor(&mut self, name: &str, tensor: Tensor) -> Result<()> {
        self.check_free(name)?;
        self.working.insert(name.to_owned(), tensor);
        Ok(())
    }

    fn check_free(&self, name: &str) -> Result<()> {
        if self.working.contains_key(name) {
            Err(Error::VariableExists {
                name: name.to_owned(),
            })
        } else {
            Ok(())
        }
    }

    /// Drop a variable from the working state and return its tensor. O(log variables).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`].
    pub fn remove(&mut self, name: &str) -> Result<Tensor> {
        self.working.remove(name).ok_or_else(|| unknown(name))
    }

    /// Whether the working state has a variable `name`. O(log variables).
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.working.contains_key(name)
    }

    /// Names of the working variables, sorted. O(variables).
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.working.keys().cloned().collect()
    }

    /// A materialized copy of a working variable. O(size).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`].
    pub fn get<T: Element>(&self, name: &str) -> Result<ArrayD<T>> {
        let t = self.tensor(name)?;
        t.check_dtype::<T>(name)?;
        t.to_array()
    }

    /// The dtype and shape of a working variable, without reading its data (a variable
    /// of a version read from a repository stays unread). O(log variables).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`].
    pub fn layout(&self, name: &str) -> Result<(DType, &[usize])> {
        let t = self.working.get(name).ok_or_else(|| unknown(name))?;
        Ok((t.dtype(), t.shape()))
    }

    /// The persistent tensor of a working variable, for zero-copy reads. O(log variables).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`].
    pub fn tensor(&self, name: &str) -> Result<&Tensor> {
        let t = self.working.get(name).ok_or_else(|| unknown(name))?;
        t.load()?;
        Ok(t)
    }

    /// How fused updates and writes run. When the working state is larger than the
    /// last-level cache (`Config::stream_threshold_bytes`), the data is memory-bound:
    /// streaming stores pay, and so does splitting even a few MiB over both cores.
    fn write_ctx(&self) -> WriteCtx {
        let bytes = self
            .working
            .values()
            .fold(0usize, |a, t| a.saturating_add(t.nbytes()));
        let cold = bytes >= self.config.stream_threshold_bytes;
        WriteCtx {
            alloc: self.alloc.clone(),
            mode: if cold {
                WriteMode::Streaming
            } else {
                WriteMode::Normal
            },
            par_min_bytes: if cold {
                PAR_MIN_BYTES_COLD
            } else {
                PAR_MIN_BYTES
            },
        }
    }

    fn typed_mut<T: Element>(&mut self, name: &str) -> Result<&mut Tensor> {
        let t = self.working.get_mut(name).ok_or_else(|| unknown(name))?;
        t.check_dtype::<T>(name)?;
        t.load()?;
        Ok(t)
    }

    /// Write a variable in place, chunk by chunk: `f(offset, elems)` gets each chunk's
    /// elements and the flat offset of the first. A uniquely owned chunk is written in
    /// place; a chunk shared with a version is written through a copy, and if `f` left it
    /// byte-identical the original stays shared. Memory grows only by chunks that really
    /// changed.
    ///
    /// O(size) time, memory O(changed chunks). The stats count chunks written (in place
    /// or replaced by a changed copy) and bytes copied.
    ///
    /// ```
    /// # use tensor_history::Store;
    /// # use ndarray::array;
    /// let mut store = Store::new();
    /// store.insert("w", &array![1.0f32, 2.0, 3.0])?;
    /// store.update::<f32>("w", |_offset, xs| xs.iter_mut().for_each(|x| *x *= 2.0))?;
    /// assert_eq!(store.get::<f32>("w")?.as_slice().unwrap(), &[2.0, 4.0, 6.0]);
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`].
    pub fn update<T: Element>(
        &mut self,
        name: &str,
        f: impl FnMut(usize, &mut [T]),
    ) -> Result<WriteStats> {
        let len = self.tensor(name)?.len();
        self.update_range(name, 0..len, f)
    }

    /// Like [`update`](Store::update), visiting only the part of each chunk that lies in
    /// the flat element range `elems` (for example some rows of an embedding table:
    /// `row * cols .. (row + n) * cols`). Chunks outside it are not touched.
    ///
    /// O(range + touched chunks).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`], [`Error::RangeOutOfBounds`].
    pub fn update_range<T: Element>(
        &mut self,
        name: &str,
        elems: Range<usize>,
        f: impl FnMut(usize, &mut [T]),
    ) -> Result<WriteStats> {
        let alloc = self.alloc.clone();
        let t = self.typed_mut::<T>(name)?;
        if elems.start > elems.end || elems.end > t.len() {
            return Err(Error::RangeOutOfBounds {
                name: name.to_owned(),
                range: elems,
                len: t.len(),
            });
        }
        let written = t.update_range(elems, &alloc, f);
        Ok(stats_for(t, written))
    }

    /// `x = f(x)` for every element: the store computes each chunk's new values from the
    /// old ones straight into the new buffer (copy-on-write and update in one pass, in
    /// parallel over chunks); chunks that come out equal stay shared.
    ///
    /// O(size), one pass over memory.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`].
    pub fn update_map<T: Element>(
        &mut self,
        name: &str,
        f: impl Fn(T) -> T + Sync + Send,
    ) -> Result<WriteStats> {
        let ctx = self.write_ctx();
        let t = self.typed_mut::<T>(name)?;
        let written = t.map(&ctx, f);
        Ok(stats_for(t, written))
    }

    /// `x = f(x, y)` for every element, with `y` the matching element of `other` (same
    /// shape, any layout; for example `w -= lr * g` as `|w, g| w - lr * g`). Fused like
    /// [`update_map`](Store::update_map).
    ///
    /// O(size), one pass over memory.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`], [`Error::ShapeMismatch`].
    pub fn zip_update<T, S, D>(
        &mut self,
        name: &str,
        other: &ArrayBase<S, D>,
        f: impl Fn(T, T) -> T + Sync + Send,
    ) -> Result<WriteStats>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let ctx = self.write_ctx();
        let t = self.typed_mut::<T>(name)?;
        t.check_shape(name, other.shape())?;
        let std = other.as_standard_layout();
        let flat = std.as_slice().ok_or_else(|| Error::Internal {
            reason: "standard-layout array without a contiguous slice".into(),
        })?;
        let written = t.zip(flat, &ctx, f);
        Ok(stats_for(t, written))
    }

    /// Overwrite a variable from an array of the same dtype and shape (any memory layout),
    /// keeping every chunk whose bytes did not change (shared, not copied).
    ///
    /// O(size) compare (parallel over chunks), copies O(changed).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVariable`], [`Error::DTypeMismatch`], [`Error::ShapeMismatch`].
    pub fn write<T, S, D>(&mut self, name: &str, array: &ArrayBase<S, D>) -> Result<WriteStats>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let ctx = self.write_ctx();
        let t = self.typed_mut::<T>(name)?;
        t.check_shape(name, array.shape())?;
        let std = array.as_standard_layout();
        let flat = std.as_slice().ok_or_else(|| Error::Internal {
            reason: "standard-layout array without a contiguous slice".into(),
        })?;
        Ok(t.write_from(flat, &ctx))
    }

    // ---- commits and HEAD ----------------------------------------------------------

    /// Record the working state as a new version, child of HEAD, and return its id. An
    /// attached branch advances (the first commit creates `main`). A commit with no change
    /// still records a version, sharing everything. Clears the redo path. With
    /// [`Config::max_versions`] set, old versions are then pruned.
    ///
    /// O(1) plus O(versions) for auto-retention: no tensor byte is copied or hashed.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for fallible retention.
    pub fn commit(&mut self, message: &str) -> Result<VersionId> {
        self.commit_with(message, Meta::new())
    }

    /// Like [`commit`](Store::commit), recording `meta` (a step, a loss, a learning
    /// rate) with the version; read it back with [`metadata`](Store::metadata) or
    /// [`Snapshot::metadata`]. [`log_graph`](Store::log_graph) shows it after the message
    /// and [`Retention::keep_best`](crate::Retention::keep_best) ranks versions by it.
    ///
    /// O(keys) plus what [`commit`](Store::commit) costs.
    ///
    /// ```
    /// # use tensor_history::{Meta, Store, Value};
    /// # use ndarray::array;
    /// let mut store = Store::new();
    /// store.insert("w", &array![1.0f32])?;
    /// let v0 = store.commit_with("step", Meta::new().with("step", 3).with("loss", 0.12))?;
    /// assert_eq!(store.metadata(v0)?.get("step"), Some(&Value::Int(3)));
    /// assert_eq!(store.log_graph(), "* v0 (HEAD -> main) step [loss=0.12 step=3]\n");
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a key that is empty or holds white space, control
    /// characters, `=` or `"` (see [`Meta`]); nothing is recorded then.
    pub fn commit_with(&mut self, message: &str, meta: Meta) -> Result<VersionId> {
        meta.validate()?;
        let parents = self.hist.head_id().into_iter().collect();
        self.commit_vars(parents, message, meta, self.working.clone())
    }

    /// The current version, `None` before the first commit. O(1).
    #[must_use]
    pub fn head(&self) -> Option<VersionId> {
        self.hist.head_id()
    }

    /// The id the next version recorded in this store gets (by [`commit`](Store::commit),
    /// a merge, ...): one past the newest id ever used, pruned ones included. O(1).
    ///
    /// ```
    /// # use tensor_history::Store;
    /// # use ndarray::array;
    /// let mut store = Store::new();
    /// store.insert("w", &array![1.0f32])?;
    /// let next = store.next_version_id();
    /// assert_eq!(store.commit("init")?, next);
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    #[must_use]
    pub fn next_version_id(&self) -> VersionId {
        self.hist.next_id()
    }

    /// The branch HEAD is attached to (`None` when detached). O(1).
    #[must_use]
    pub fn current_branch(&self) -> Option<&str> {
        self.hist.head_branch()
    }

    /// Whether the working state differs from HEAD (before the first commit: whether it
    /// has any variable). A variable re-inserted with the same values but another chunk
    /// size counts as a change (its content hash differs).
    ///
    /// O(variables) when nothing was written since HEAD; else pointer compares of the
    /// written tensors' chunks, and a content compare (cached hashes or bytes) only of
    /// chunks that are not shared.
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        match self.hist.head_id().and_then(|h| self.hist.node(h).ok()) {
            None => !self.working.is_empty(),
            // HEAD's variables are in memory: every move of HEAD reads them into the
            // working state. Unreadable ones would count as a change.
            Some(node) => node
                .vars
                .get()
                .map_or(true, |v| !vars_equal(&self.working, v)),
        }
    }

    /// Drop uncommitted changes: the working state becomes HEAD's (empty before the first
    /// commit). O(1).
    ///
    /// # Errors
    ///
    /// None today.
    pub fn discard(&mut self) -> Result<()> {
        self.working = match self.hist.head_id() {
            Some(h) => self.hist.node(h)?.vars.get()?.clone(),
            None => Vars::new(),
        };
        Ok(())
    }

    /// Make the working state equal version `id` (uncommitted changes are dropped) and
    /// move HEAD there. **When HEAD is attached to a branch, the branch moves to `id`
    /// too** (like `git reset --hard`), and HEAD stays attached; to look at a version
    /// without moving any branch, use [`checkout_detached`](Store::checkout_detached).
    /// Later versions stay in the tree; the version the branch (or a detached HEAD) left
    /// goes to the [`reflog`](Store::reflog) if no ref points at it any more, so
    /// retention does not drop it right away. Clears the redo path. O(1).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn restore(&mut self, id: VersionId) -> Result<()> {
        let vars = self.hist.node(id)?.vars.get()?.clone();
        self.working = vars;
        self.hist.move_head_logged(id, self.config.reflog_entries);
        self.hist.redo.clear();
        Ok(())
    }

    /// Detach HEAD at version `id` and make the working state equal it (uncommitted
    /// changes are dropped): no branch moves, and commits made from there move no branch
    /// either (start one with [`branch`](Store::branch) and [`checkout`](Store::checkout)
    /// to keep them). The way to go to a tag or any old version and look around, like
    /// `git checkout --detach`. Clears the redo path. O(1).
    ///
    /// ```
    /// # use tensor_history::Store;
    /// # use ndarray::array;
    /// let mut store = Store::new();
    /// store.insert("w", &array![0.0f32])?;
    /// let v0 = store.commit("v0")?;
    /// store.tag("ckpt", v0)?;
    /// store.write("w", &array![1.0f32])?;
    /// let v1 = store.commit("main tip")?;
    /// store.checkout_detached(store.resolve("ckpt")?)?;
    /// assert_eq!((store.head(), store.current_branch()), (Some(v0), None));
    /// assert_eq!(store.resolve("main")?, v1); // the branch did not move
    /// # Ok::<(), tensor_history::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn checkout_detached(&mut self, id: VersionId) -> Result<()> {
        let vars = self.hist.node(id)?.vars.get()?.clone();
        let from = self.hist.head_id();
        let name = self.hist.head_branch().unwrap_or("HEAD").to_owned();
        self.working = vars;
        self.hist.head = Head::Detached(id);
        self.hist.log_left(from, name, self.config.reflog_entries);
        self.hist.redo.clear();
        Ok(())
    }

    /// The reflog, newest first: versions that HEAD (and the branch it was attached to)
    /// left through [`restore`](Store::restore), [`undo`](Store::undo),
    /// [`redo`](Store::redo), [`checkout`](Store::checkout) or
    /// [`checkout_detached`](Store::checkout_detached) while no branch or tag pointed at
    /// them any more, each with the branch HEAD was attached to (`HEAD` when detached).
    /// At most [`Config::reflog_entries`] entries, each version once; pruning keeps
    /// these versions. O(entries).
    #[must_use]
    pub fn reflog(&self) -> Vec<(String, VersionId)> {
        self.hist.reflog.iter().rev().cloned().collect()
    }

    /// Empty the reflog, so that the next [`prune`](Store::prune) (or auto-retention)
    /// may drop the versions it held. O(entries).
    pub fn clear_reflog(&mut self) {
        self.hist.reflog.clear();
    }

    /// Move HEAD (and an attached branch) to its first parent and restore it, remembering
    /// where it came from for [`redo`](Store::redo) (and in the [`reflog`](Store::reflog),
    /// so that a commit after the undo, which clears the redo path, does not let
    /// retention drop it right away). Undo-tree semantics: a commit after
    /// an undo starts a new branch of the tree; the old future stays reachable by id,
    /// [`children`](Store::children) and [`tips`](Store::tips). O(1) plus the dirty check.
    ///
    /// # Errors
    ///
    /// [`Error::UncommittedChanges`] if the working state is dirty (commit or discard
    /// first); [`Error::NothingToUndo`] at the root or before the first commit.
    pub fn undo(&mut self) -> Result<VersionId> {
        if self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        let head = self.hist.head_id().ok_or(Error::NothingToUndo)?;
        let parent = *self
            .hist
            .node(head)?
            .parents
            .first()
            .ok_or(Error::NothingToUndo)?;
        self.working = self.hist.node(parent)?.vars.get()?.clone();
        self.hist
            .move_head_logged(parent, self.config.reflog_entries);
        self.hist.redo.push(head);
        Ok(parent)
    }

    /// Go back to the child the last [`undo`](Store::undo) came from. O(1) plus the dirty
    /// check.
    ///
    /// # Errors
    ///
    /// [`Error::UncommittedChanges`] if the working state is dirty; [`Error::NothingToRedo`]
    /// if no undo happened since the last commit, restore, checkout or merge.
    pub fn redo(&mut self) -> Result<VersionId> {
        if self.is_dirty() {
            return Err(Error::UncommittedChanges);
        }
        let next = *self.hist.redo.last().ok_or(Error::NothingToRedo)?;
        self.working = self.hist.node(next)?.vars.get()?.clone();
        self.hist.redo.pop();
        self.hist.move_head_logged(next, self.config.reflog_entries);
        Ok(next)
    }

    // ---- refs ----------------------------------------------------------------------

    /// Create branch `name` at version `at`. O(log refs).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRefName`], [`Error::RefNameTooLong`] for a name past
    /// [`MAX_REF_NAME_BYTES`](crate::MAX_REF_NAME_BYTES) in a repository key,
    /// [`Error::RefExists`], [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn branch(&mut self, name: &str, at: VersionId) -> Result<()> {
        self.new_ref(name, Ref::Branch(at))
    }

    /// Create tag `name` at version `at`; tags never move and protect their version from
    /// pruning. O(log refs).
    ///
    /// # Errors
    ///
    /// As for [`branch`](Store::branch).
    pub fn tag(&mut self, name: &str, at: VersionId) -> Result<()> {
        self.new_ref(name, Ref::Tag(at))
    }

    fn new_ref(&mut self, name: &str, r: Ref) -> Result<()> {
        check_ref_name(name)?;
        check_ref_name_len(name)?;
        if self.hist.refs.contains_key(name) {
            return Err(Error::RefExists {
                name: name.to_owned(),
            });
        }
        if let Head::Branch(b) = &self.hist.head {
            if b == name {
                return Err(Error::RefExists {
                    name: name.to_owned(),
                });
            }
        }
        self.hist.node(r.target())?;
        self.hist.refs.insert(name.to_owned(), r);
        Ok(())
    }

    /// Attach HEAD to branch `name` and make the working state its tip (uncommitted
    /// changes are dropped). No branch moves. A detached HEAD's version that no ref holds
    /// goes to the [`reflog`](Store::reflog). Clears the redo path. O(log refs).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownRef`]; [`Error::WrongRefKind`] for a tag (use
    /// `checkout_detached(store.resolve(tag)?)` to go there detached; `restore` would
    /// move the current branch to the tag).
    pub fn checkout(&mut self, name: &str) -> Result<()> {
        let tip = match self.hist.refs.get(name) {
            Some(Ref::Branch(v)) => *v,
            Some(Ref::Tag(_)) => {
                return Err(Error::WrongRefKind {
                    name: name.to_owned(),
                    expected: RefKind::Branch,
                })
            }
            None => {
                return Err(Error::UnknownRef {
                    name: name.to_owned(),
                })
            }
        };
        self.working = self.hist.node(tip)?.vars.get()?.clone();
        let from = self.hist.head_id();
        let left = self.hist.head_branch().unwrap_or("HEAD").to_owned();
        self.hist.head = Head::Branch(name.to_owned());
        self.hist.log_left(from, left, self.config.reflog_entries);
        self.hist.redo.clear();
        Ok(())
    }

    /// Detach HEAD at its current version (commits then move no branch). O(1).
    pub fn detach(&mut self) {
        if let Some(h) = self.hist.head_id() {
            self.hist.head = Head::Detached(h);
        }
    }

    /// Delete branch `name`; its versions stay until pruned. O(log refs).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownRef`], [`Error::WrongRefKind`] for a tag,
    /// [`Error::BranchCheckedOut`] for the branch HEAD is attached to.
    pub fn delete_branch(&mut self, name: &str) -> Result<()> {
        self.delete_ref(name, RefKind::Branch)
    }

    /// Delete tag `name`. O(log refs).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownRef`], [`Error::WrongRefKind`] for a branch.
    pub fn delete_tag(&mut self, name: &str) -> Result<()> {
        self.delete_ref(name, RefKind::Tag)
    }

    fn delete_ref(&mut self, name: &str, kind: RefKind) -> Result<()> {
        let found = match self.hist.refs.get(name) {
            Some(r) => r.kind(),
            None => {
                return Err(Error::UnknownRef {
                    name: name.to_owned(),
                })
            }
        };
        if found != kind {
            return Err(Error::WrongRefKind {
                name: name.to_owned(),
                expected: kind,
            });
        }
        if self.hist.head_branch() == Some(name) {
            return Err(Error::BranchCheckedOut {
                name: name.to_owned(),
            });
        }
        self.hist.refs.remove(name);
        Ok(())
    }

    /// The version a name stands for, tried in this order: `HEAD` is the current
    /// version; `v12` (or `12`) is version 12; any other name is a branch or tag. Ref
    /// names can never read as a version id or `HEAD` (branch and tag creation refuse
    /// them), so no ref hides a version. O(log refs).
    ///
    /// # Errors
    ///
    /// [`Error::NoCommits`] for `HEAD` before the first commit;
    /// [`Error::UnknownVersion`] or [`Error::PrunedVersion`] for a version id that is
    /// not live; [`Error::UnknownRef`] for any other name that is not a branch or tag.
    /// 4 to 64 hex digits that name no ref resolve to the saved (or loaded) version whose
    /// [content address](Store::version_hash) starts with them (O(saved versions));
    /// [`Error::AmbiguousRef`] if several do.
    pub fn resolve(&self, refname: &str) -> Result<VersionId> {
        if refname == "HEAD" {
            return self.hist.head_id().ok_or(Error::NoCommits);
        }
        if let Ok(id) = refname.parse::<VersionId>() {
            return match self.hist.node(id) {
                Ok(_) => Ok(id),
                Err(e) => match self.saved_with_prefix(refname)? {
                    Some(v) if !refname.starts_with('v') => Ok(v),
                    _ => Err(e),
                },
            };
        }
        match self.hist.refs.get(refname) {
            Some(r) => Ok(r.target()),
            None => match self.saved_with_prefix(refname)? {
                Some(v) => Ok(v),
                None => Err(Error::UnknownRef {
                    name: refname.to_owned(),
                }),
            },
        }
    }

    /// Become the store of an opened repository: take the history read from it
    /// (versions, refs, HEAD) and the link to it; the working state is HEAD's variables.
    /// O(1) when HEAD's variables are read already.
    ///
    /// # Errors
    ///
    /// When HEAD's variables cannot be read; the store is unchanged then.
    pub(crate) fn bind_opened(
        &mut self,
        hist: History,
        link: Box<crate::repo::RepoLink>,
    ) -> Result<()> {
        self.working = match hist.head_id() {
            Some(h) => hist.node(h)?.vars.get()?.clone(),
            None => Vars::new(),
        };
        self.hist = hist;
        self.repo = Some(link);
        Ok(())
    }

    /// The checked-out branch moved to a version whose variables are `vars` (another
    /// process saved it): the working state follows (it stays as it is when equal, so
    /// that its chunks stay shared) and the redo path is cleared. O(variables).
    pub(crate) fn follow_branch(&mut self, vars: Vars) {
        if !vars_equal(&vars, &self.working) {
            self.working = vars;
        }
        self.hist.redo.clear();
    }

    /// The saved version whose content address starts with the hex digits `text`, if
    /// this store has a repository (see [`resolve`](Store::resolve)).
    fn saved_with_prefix(&self, text: &str) -> Result<Option<VersionId>> {
        match (&self.repo, &self.bg.inflight) {
            (Some(b), _) => b.resolve_prefix(&self.hist, text),
            (None, Some(f)) => crate::repo::resolve_prefix(&f.saved, &self.hist, text),
            (None, None) => Ok(None),
        }
    }

    /// Every branch and tag, sorted by name. O(refs).
    #[must_use]
    pub fn refs(&self) -> Vec<(String, Ref)> {
        self.hist
            .refs
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    // ---- reading versions ----------------------------------------------------------

    /// A read-only handle to version `id`. O(1): shares everything; stays valid after the
    /// store moves on, prunes `id`, or is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn snapshot(&self, id: VersionId) -> Result<Snapshot> {
        let node = self.hist.node(id)?;
        Ok(Snapshot::new(
            Some(id),
            node.message.clone(),
            node.meta.clone(),
            Some(node.time),
            node.vars.get()?.clone(),
        ))
    }

    /// A read-only handle to the working state as it is now (no id). O(1).
    #[must_use]
    pub fn working_snapshot(&self) -> Snapshot {
        Snapshot::new(None, "".into(), Arc::default(), None, self.working.clone())
    }

    /// The first parent of `id` (`None` for a root). Pruned ancestors are skipped: a
    /// version whose parent was pruned has that parent's parent. O(1).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn parent(&self, id: VersionId) -> Result<Option<VersionId>> {
        Ok(self.hist.node(id)?.parents.first().copied())
    }

    /// All parents of `id` (two for a merge). O(parents).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn parents(&self, id: VersionId) -> Result<Vec<VersionId>> {
        Ok(self.hist.node(id)?.parents.clone())
    }

    /// The live children of `id`, oldest first. O(children).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn children(&self, id: VersionId) -> Result<Vec<VersionId>> {
        Ok(self.hist.node(id)?.children.clone())
    }

    /// `id` and all its live ancestors, newest first. O(ancestors · log).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn log(&self, id: VersionId) -> Result<Vec<VersionId>> {
        self.hist.ancestors(id)
    }

    /// The newest common ancestor of `a` and `b` (`None` if they share no root).
    /// O(ancestors).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn merge_base(&self, a: VersionId, b: VersionId) -> Result<Option<VersionId>> {
        self.hist.merge_base(a, b)
    }

    /// Every live version, oldest first. O(versions).
    #[must_use]
    pub fn versions(&self) -> Vec<VersionId> {
        self.hist.live().map(|(id, _)| id).collect()
    }

    /// Live versions with no children (every branch of the tree ends in one). O(versions).
    #[must_use]
    pub fn tips(&self) -> Vec<VersionId> {
        self.hist
            .live()
            .filter(|(_, n)| n.children.is_empty())
            .map(|(id, _)| id)
            .collect()
    }

    /// The commit message of version `id`. O(1).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn message(&self, id: VersionId) -> Result<&str> {
        Ok(&self.hist.node(id)?.message)
    }

    /// The metadata recorded with version `id` (empty for a plain
    /// [`commit`](Store::commit)). O(1).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownVersion`], [`Error::PrunedVersion`].
    pub fn metadata(&self, id: VersionId) -> Result<&Meta> {
        Ok(&self.hist.node(id)?.meta)
    }

    /// Record `vars` as a new version with these parents, make it the working state and
    /// move HEAD (and an attached branch) there; clears the redo path and applies
    /// auto-retention.
    pub(crate) fn commit_vars(
        &mut self,
        parents: Vec<VersionId>,
        message: &str,
        meta: Meta,
        vars: Vars,
    ) -> Result<VersionId> {
        self.working = vars;
        let id = self.hist.add(parents, message, meta, self.working.clone());
        self.hist.move_head(id);
        self.hist.redo.clear();
        self.auto_retain();
        // A background save that ended gives its link back (and its memory) now, before
        // the budget counts what is held.
        self.settle_save(false);
        self.budget_after_commit();
        Ok(id)
    }
}

fn unknown(name: &str) -> Error {
    Error::UnknownVariable {
        name: name.to_owned(),
    }
}

fn stats_for(t: &Tensor, (written, copied): (usize, usize)) -> WriteStats {
    WriteStats {
        chunks_changed: written,
        chunks_total: t.num_chunks(),
        bytes_copied: copied,
    }
}

/// Load every stored chunk of `vars` (see [`Tensor::load`]).
pub(crate) fn load_vars(vars: &Vars) -> Result<()> {
    vars.values().try_for_each(Tensor::load)
}

/// Whether two variable maps hold the same names, contents and chunk layouts (pointer
/// fast paths first): a variable cut into chunks of another size has another content
/// hash, so it is a change to commit even with the same values.
pub(crate) fn vars_equal(a: &Vars, b: &Vars) -> bool {
    if a.ptr_eq(b) {
        return true;
    }
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|((ka, ta), (kb, tb))| {
            // With the same layout `content_eq` reads no stored chunk: it cannot fail.
            ka == kb && ta.same_layout(tb) && ta.content_eq(tb).unwrap_or(false)
        })
}
