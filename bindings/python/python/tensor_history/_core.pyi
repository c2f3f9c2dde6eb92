"""Type stubs of the compiled core (`tensor_history._core`)."""

from __future__ import annotations

import os
from typing import Callable, Iterator, Literal, Mapping, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

Ref = Union["Version", str]
ArrayIn = npt.ArrayLike
MetaValue = Union[bool, int, float, str]
# `into=` targets and `sync` inputs: a mapping, or a sequence of (name, array) pairs
Targets = Union[Mapping[str, np.ndarray], Sequence[tuple[str, np.ndarray]]]
Inputs = Union[Mapping[str, ArrayIn], Sequence[tuple[str, ArrayIn]]]

DEFAULT_CHUNK_BYTES: int
"""The largest chunk in bytes of a store made without `chunk_bytes` (256 KiB)."""

class Version:
    """A version of the history (`v12`): hashable, ordered, usable wherever a ref is taken.

    Args:
        id: the numeric id (`Version(3)` is `v3`)
    """
    def __init__(self, id: int) -> None: ...
    @property
    def id(self) -> int:
        """The numeric id."""
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __lt__(self, other: Version) -> bool: ...
    def __le__(self, other: Version) -> bool: ...
    def __gt__(self, other: Version) -> bool: ...
    def __ge__(self, other: Version) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type[Version], tuple[int]]: ...

class WriteStats:
    """What a write (or a write-back into an array) changed."""
    @property
    def chunks_changed(self) -> int:
        """Chunks whose bytes changed and were copied."""
    @property
    def chunks_total(self) -> int:
        """Chunks in the tensor."""
    @property
    def bytes_copied(self) -> int:
        """Bytes copied."""

class Stats:
    """What a store holds against what deep copies would hold."""
    @property
    def versions(self) -> int:
        """Live versions."""
    @property
    def variables(self) -> int:
        """Variables in the working state."""
    @property
    def unique_chunks(self) -> int:
        """Distinct chunks held by the working state and every live version."""
    @property
    def unique_bytes(self) -> int:
        """Bytes of those chunks: the tensor data actually held (raw size)."""
    @property
    def logical_bytes(self) -> int:
        """What one deep copy of every live version would hold, plus one of the working state
        when it has uncommitted changes.
        """
    @property
    def sharing_ratio(self) -> float:
        """`logical_bytes / unique_bytes` (1.0 when nothing is held)."""
    @property
    def pooled_bytes(self) -> int:
        """Freed chunk buffers kept for reuse (not counted in `unique_bytes`)."""
    @property
    def held_bytes(self) -> int:
        """Memory the chunks' buffers hold: raw chunks on the heap, the encoded forms of
        chunks held encoded and what they keep alive. Chunks in a repository count
        nothing. This is what `memory_budget` bounds.
        """
    @property
    def encoded_bytes(self) -> int:
        """Of `unique_bytes`, the raw bytes of chunks held encoded in memory."""
    @property
    def encoded_held_bytes(self) -> int:
        """Memory the encoded chunks hold (part of `held_bytes`); `encoded_bytes /
        encoded_held_bytes` is what encoding saves.
        """
    @property
    def stored_bytes(self) -> int:
        """Of `unique_bytes`, the raw bytes of chunks that live in a repository (read from
        it on use, not on the heap).
        """
    @property
    def stored_pack_bytes(self) -> int:
        """Bytes the chunks of `stored_bytes` take in the repository's packs (byte planes,
        deltas); `stored_bytes / stored_pack_bytes` is what the repository's encoding saves.
        """

class PruneStats:
    """What `prune` dropped."""
    @property
    def dropped(self) -> list[Version]:
        """The versions dropped, oldest first."""
    @property
    def kept(self) -> int:
        """Live versions left."""
    @property
    def bytes_before(self) -> int:
        """Unique chunk bytes held before pruning (`Stats.unique_bytes`)."""
    @property
    def bytes_after(self) -> int:
        """Unique chunk bytes held after pruning."""

class LogEntry:
    """One entry of `Store.log()`."""
    @property
    def id(self) -> Version:
        """The version."""
    @property
    def message(self) -> str:
        """Its commit message."""
    @property
    def time(self) -> float:
        """Commit time, seconds since the Unix epoch."""
    @property
    def parents(self) -> list[Version]:
        """Its parents (two for a merge)."""
    @property
    def metadata(self) -> dict[str, MetaValue]:
        """Keyword arguments given to `commit`."""

class Change:
    """How one variable differs between two states."""
    @property
    def kind(self) -> str:
        """`"added"`, `"removed"`, `"changed"` or `"unchanged"`."""
    @property
    def chunks(self) -> list[int]:
        """Indices of the changed chunks."""
    @property
    def elements(self) -> list[tuple[int, int]]:
        """Flat element ranges of the changed chunks, as `(start, stop)`."""
    @property
    def bytes(self) -> int:
        """Bytes in the changed chunks."""
    @property
    def layout_changed(self) -> bool:
        """Whether dtype, shape or chunk size differ."""

class SaveStats:
    """What a `save` (or `save_as`) wrote."""
    @property
    def versions_written(self) -> int:
        """Versions new to the repository."""
    @property
    def chunks_written(self) -> int:
        """Chunks written into new packs."""
    @property
    def chunks_present(self) -> int:
        """Distinct chunks of the new versions that the repository already held."""
    @property
    def packs_written(self) -> int:
        """Packs written."""
    @property
    def manifests_written(self) -> int:
        """Manifests (per-tensor objects) written."""
    @property
    def refs_written(self) -> int:
        """Ref log entries written."""
    @property
    def bytes_written(self) -> int:
        """Bytes of every object written."""
    @property
    def chunk_bytes_raw(self) -> int:
        """Raw bytes of the chunks written into new packs."""
    @property
    def chunk_bytes_stored(self) -> int:
        """Bytes those chunks take in the packs (coded: byte planes or deltas)."""
    @property
    def chunks_written_as_held(self) -> int:
        """Of the chunks written, those written in the coded form the memory budget held
        them in (not decoded and coded again).
        """

class PartStats:
    """What `write_part` wrote: one writer's part of a version several writers make (its
    `items`, name and manifest id in hex, go to the coordinator's `commit_parts`).
    """
    @property
    def items(self) -> list[tuple[str, str]]:
        """The part: `(name, manifest id in hex)` per tensor, sorted by name."""
    @property
    def chunks_written(self) -> int:
        """Chunks written into new packs."""
    @property
    def chunks_present(self) -> int:
        """Distinct chunks the repository held already."""
    @property
    def packs_written(self) -> int:
        """Packs written."""
    @property
    def manifests_written(self) -> int:
        """Manifests written."""
    @property
    def bytes_written(self) -> int:
        """Bytes of every object written."""

class PendingSave:
    """A save running on a writer thread, returned by `Store.save(background=True)`."""
    def wait(self) -> SaveStats:
        """Block until the save ended (GIL released) and return its `SaveStats`, or raise its
        error (`StorageError`, `BranchMoved`, ...). Waiting again gives the same outcome.
        """
    def done(self) -> bool:
        """Whether the save ended (`wait()` then returns at once)."""

class RefreshStats:
    """What a `refresh` took in from the repository."""
    @property
    def versions_loaded(self) -> int:
        """Versions new to this store."""
    @property
    def refs_updated(self) -> list[str]:
        """Refs moved, created or deleted to match the repository."""
    @property
    def diverged(self) -> list[str]:
        """Branches moved both here and in the repository (this store keeps its own)."""
    @property
    def theirs(self) -> dict[str, Version | None]:
        """For each diverged branch, the repository's version (loaded here), or `None` if
        the repository deleted it.
        """

class OpenFallback:
    """Where `Store.open` started at an older version because HEAD's did not read (the
    store's `open_fallback`): HEAD is detached at `opened_at`; the branch still points at
    `wanted`, which raises `CorruptObject` when read.
    """
    @property
    def branch(self) -> str | None:
        """The branch HEAD was attached to in the repository (`None`: it was detached)."""
    @property
    def wanted(self) -> Version:
        """HEAD's version, which does not read."""
    @property
    def opened_at(self) -> Version:
        """The version the store started at."""
    @property
    def error(self) -> str:
        """The error reading `wanted` gave."""

class GcStats:
    """What a `gc` found and did (or, with `dry_run`, would do)."""
    @property
    def versions_live(self) -> int:
        """Versions reachable from the saved refs and HEAD."""
    @property
    def chunks_live(self) -> int:
        """Chunks those versions hold."""
    @property
    def candidates_recorded(self) -> int:
        """Objects recorded as unreferenced by this run (deleted by a run `grace` later)."""
    @property
    def objects_deleted(self) -> int:
        """Objects deleted."""
    @property
    def bytes_deleted(self) -> int:
        """Bytes of the objects deleted."""
    @property
    def packs_rewritten(self) -> int:
        """Packs rewritten: mostly-dead ones with only their live chunks, and (with
        `rebase`) those whose chunks were re-based.
        """
    @property
    def chunks_rebased(self) -> int:
        """Chunks stored whole that were written again as deltas (`rebase`)."""
    @property
    def chunks_unchained(self) -> int:
        """Chunks of live versions coded again because their delta chains needed chunks
        that only pruned versions hold (`unchain`)."""
    @property
    def rewritten_bytes_before(self) -> int:
        """Bytes of the packs rewritten, before and after."""
    @property
    def rewritten_bytes_after(self) -> int:
        """Bytes of the packs written for them."""
    @property
    def indexes_merged(self) -> int:
        """Index files replaced by one listing what they listed (more than 8 were found;
        counted in `objects_deleted` too).
        """

class Snapshot:
    """A read-only handle to one version (or to the working state as it was). It stays valid
    after the store moves on, prunes the version, or is dropped. Indexing returns a copy.
    """
    @property
    def id(self) -> Version | None:
        """The version, or `None` for a snapshot of the working state."""
    @property
    def message(self) -> str:
        """The commit message (empty for the working state)."""
    @property
    def time(self) -> float | None:
        """Commit time in seconds since the Unix epoch (`None` for the working state)."""
    @property
    def nbytes(self) -> int:
        """Bytes of tensor data this snapshot shows (as a deep copy would hold them)."""
    def keys(self) -> list[str]:
        """Variable names, sorted."""
    def info(self, name: str) -> tuple[str, list[int]]:
        """`(dtype, shape)` of variable `name`, dtype as `"f32"`, `"bf16"`, ...; reads no
        tensor data (a version of a repository keeps its chunks unread).

        Args:
            name: the variable
        """
    def get(self, name: str, default: object = None) -> np.ndarray | object:
        """A copy of variable `name`, or `default` if there is none.

        Args:
            name: the variable
            default: what to return when there is no such variable
        """
    def content_hash(self) -> str:
        """The content hash (BLAKE3 Merkle root over every tensor), 64 hex digits. Hashes
        chunks not hashed yet, in parallel, without the GIL.
        """
    def __getitem__(self, name: str) -> np.ndarray: ...
    def __contains__(self, name: object) -> bool: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[str]: ...

class Store:
    """Named arrays with their full version history, in memory.

    Thread-safe: every call takes an internal lock with the GIL released, so several
    Python threads may share one store. Arrays must not be mutated by another thread while
    a call that reads or writes them runs.

    Args:
        chunk_bytes: largest chunk in bytes (default `DEFAULT_CHUNK_BYTES`)
        max_versions: keep at most this many versions, pruning the oldest after each
            commit (`None`: keep every version)
        recycle_bytes: bytes of freed chunk buffers to keep for reuse (`None`: the
            default)
        memory_budget: bytes of history to hold in memory; older versions are
            encoded to stay within it (`None`: no budget)
    """
    def __init__(
        self,
        *,
        chunk_bytes: int | None = None,
        max_versions: int | None = None,
        recycle_bytes: int | None = None,
        memory_budget: int | None = None,
    ) -> None: ...
    @staticmethod
    def open(
        path: str | os.PathLike[str],
        *,
        chunk_bytes: int | None = None,
        max_versions: int | None = None,
        recycle_bytes: int | None = None,
        memory_budget: int | None = None,
        create: bool = True,
    ) -> Store:
        """Open the repository at `path` (a directory, created if absent, or a URL): refs,
        HEAD and every version come back as saved, the working state is HEAD. Chunk data
        is not read here: it is mapped and checked against its hash on first use. Keyword
        arguments as for `Store()`. O(versions + tensors) objects read, GIL released.

        `create=False`: the repository must exist; where there is none, `NoRepository`
        is raised and nothing is created at `path` (for code that only reads).

        If HEAD's version does not read (a damaged pack, index or manifest), the store
        starts detached at the nearest older version that does, warns
        (`OpenFallbackWarning`) and says so in `open_fallback`.

        Raises `StorageError`, `UnsupportedFormat` (another format, or a non-empty
        directory that is not a repository), `CorruptObject`, `NoRepository`.

        Args:
            path: a directory (created if absent, unless `create` is false) or a URL
                (`s3://bucket/prefix`, ...)
            chunk_bytes: largest chunk in bytes (default `DEFAULT_CHUNK_BYTES`)
            max_versions: keep at most this many versions, pruning the oldest after
                each commit (`None`: keep every version)
            recycle_bytes: bytes of freed chunk buffers to keep for reuse (`None`:
                the default)
            memory_budget: bytes of history to hold in memory; older versions are
                encoded to stay within it (`None`: no budget)
            create: create the repository where there is none (default); `False`
                raises `NoRepository` instead
        """
    @property
    def open_fallback(self) -> OpenFallback | None:
        """`None` when `open` started at HEAD as saved; else an `OpenFallback`: HEAD's
        version did not read (a damaged or missing pack, index or manifest), and the
        store started detached at an older version that does (the branch still points at
        the damaged one, which raises `CorruptObject` when read). `open` also warned
        (`OpenFallbackWarning`). Check it before resuming work from an opened store. O(1).
        """
    @property
    def chunk_bytes(self) -> int:
        """Largest chunk in bytes."""
    @property
    def max_versions(self) -> int | None:
        """Auto-retention limit (`None`: keep every version)."""
    @property
    def memory_budget(self) -> int | None:
        """Bytes of history the store may hold in memory, raw and encoded (`None`: no
        budget): past it old versions are kept encoded, and when even encoded the
        history passes it, the oldest go (spilled to the repository, or let go where no
        ref, HEAD or the reflog holds them). Settable: the next commit holds the history
        to the new value.
        """
    @memory_budget.setter
    def memory_budget(self, budget: int | None) -> None: ...
    def enforce_memory_budget(self) -> int:
        """Encode old versions now (what commits start in the background) until the held
        bytes are within `memory_budget`; returns the bytes held. GIL released.
        """
    @property
    def location(self) -> str | None:
        """Where this store saves (`None` before `open` or `save_as`)."""
    # persistence
    @overload
    def save(self, *, background: Literal[False] = False) -> SaveStats: ...
    @overload
    def save(self, *, background: Literal[True]) -> PendingSave: ...
    @overload
    def save(self, *, background: bool = False) -> SaveStats | PendingSave:
        """Write every version a branch, tag or HEAD reaches that the repository lacks (only
        the chunks it lacks), then move the refs; crash-safe. Uncommitted changes are not
        saved. Afterwards chunks only saved versions hold leave memory (read back from
        disk on use). O(new chunks) written, GIL released.

        Raises `InvalidArgument` without a repository (use `save_as`), `StorageError`
        (nothing in memory is lost), `BranchMoved` if a branch moved in the repository
        since this store saw it (every other ref is saved; `BranchMoved.theirs` names the
        repository's version; `refresh`, merge, save again).

        `background=True`: return a `PendingSave` at once and save on a writer thread
        (what the save writes is captured first: no tensor data is copied). The store
        stays usable meanwhile; a later save, `refresh`, `gc` or `close` first waits for
        it. `PendingSave.wait()` returns the `SaveStats` or raises the save's error; if
        nobody waited, the next `save`, `save_as`, `refresh` or `close` raises it.

        Args:
            background: return a `PendingSave` at once and write on a writer thread
        """
    def save_as(self, path: str | os.PathLike[str]) -> SaveStats:
        """Bind the store to the repository at `path` (created if absent) and `save` there.
        On error the store keeps its previous repository. O(all chunks) the first time.

        Onto a repository with a history of its own, nothing of that history is lost: its
        refs that this store does not have stay as they are, and a ref this store has too
        must be a fast-forward of the repository's (unless this store saw exactly that
        state of it), else `BranchMoved` (naming the ref and `BranchMoved.theirs`) is raised
        before any ref is written and the store stays bound where it was. To keep both,
        save under another branch name.

        Args:
            path: the repository's directory or URL (created if absent)
        """
    def write_part(self, location: str, compress: bool = True) -> PartStats:
        """Write every variable of the working state into the repository at `location` as
        one writer's part of a version several writers make (the ranks of a distributed
        checkpoint): the chunks the repository lacks into packs of this writer, then the
        manifests, durably. Writes no version or ref; this store stays unbound (it may be
        a throwaway in-memory store). Give `PartStats.items` to the coordinator's
        `commit_parts`. What is never committed is garbage that `gc` deletes after its
        grace period. O(new chunks) written, GIL released.

        With `compress` false the new chunks are stored as they are (no encoding on
        write, no decoding on read); by default they are byte-plane coded where that
        saves at least 4%.

        Raises `StorageError`, `UnsupportedFormat`.

        Args:
            location: the repository's directory or URL
            compress: byte-plane code the new chunks where that saves at least 4%
                (default); `False` stores them as they are
        """
    def commit_parts(self, branch: str, parts: Sequence[Sequence[tuple[str, str]]],
                     message: str = "", **metadata: bool | int | float | str) -> Version:
        """Commit one version onto `branch` whose variables are every tensor of `parts`
        (each a list of `(name, manifest id)`, `PartStats.items` of `write_part` into this
        store's repository), parent the branch's tip, then publish it with `save()`. No
        tensor data is read. HEAD stays where it is unless it is attached to `branch` or
        the store has no version yet. Keyword arguments are the version's metadata.
        O(tensors) manifests read, GIL released.

        Raises `InvalidArgument` (no repository, a name two parts give different
        manifests, a malformed id), `InvalidRefName`, `WrongRefKind` (a tag),
        `UncommittedChanges`, `CorruptObject` (a part that is not in the repository).
        Nothing changes on error.

        Args:
            branch: the branch the version is committed onto (created if absent)
            parts: every writer's `PartStats.items`: lists of `(name, manifest id)`
            message: the commit message
        """
    def refresh(self) -> RefreshStats:
        """Take in the refs and versions other processes saved since this store opened or
        last refreshed. A ref this store did not move follows the repository, and so does
        one it moved when nothing is lost (it deleted it, or another ref reaches its
        version); a branch moved on both sides keeps this store's target (reported in
        `diverged`, the repository's version in `theirs`); a branch the repository
        deleted while this store moved it is kept and written again by the next save.
        Uncommitted changes are kept. Raises `InvalidArgument` without a repository.
        """
    def gc(self, *, grace: float | None = None, repack_below: float | None = None,
           dry_run: bool = False, delete_within: float | None = None,
           rebase: bool = False, unchain: bool = True) -> GcStats:
        """Delete repository objects no saved ref or HEAD reaches, in two phases: a run
        records candidates, a run `grace` seconds later (default 3600) deletes them, so a
        concurrent save never loses data (`grace=0` only with a single writer). Packs with
        less than `repack_below` (default 0.5) live bytes are rewritten. `dry_run`: write
        and delete nothing, report what would be done. `delete_within` (seconds, default
        30): how long the run may go on deleting once it announced its deletions; a save
        that writes again what the run may delete waits until the run is done or past
        this deadline. `rebase`: also store chunks that were saved whole (DCP saves,
        parts) as deltas against their parent version's chunks where that is smaller,
        rewriting their packs (not tried by a dry run). `unchain` (default true): code
        again the chunks of live versions whose delta chains need chunks that only
        pruned versions hold, so that those go (a later run, this one with `grace=0`).
        GIL released.

        Args:
            grace: seconds between the run that records candidates and the run that
                deletes them (default 3600)
            repack_below: rewrite packs with less than this fraction of live bytes
                (default 0.5)
            dry_run: write and delete nothing; report what would be done
            delete_within: seconds the run may go on deleting once it announced its
                deletions (default 30)
            rebase: also store chunks saved whole as deltas against their parent
                version's chunks where that is smaller
            unchain: code again the chunks of live versions whose delta chains need
                chunks of pruned versions (default true)
        """
    def version_hash(self, ref: Ref) -> str:
        """The content address of version `ref` (64 hex digits): the same in every process
        and repository; `resolve` takes any unique prefix of 4 or more digits once the
        version is saved or loaded. O(1) when saved, else hashes its unsaved chunks.

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
        """
    def close(self) -> None:
        """Release the store: wait for a background save, its versions and chunks leave
        memory, the repository files it mapped are unmapped, and every later call raises
        `StoreClosed`. Nothing new is saved: call `save()` first to keep new versions.
        Raises the error of a background save that nobody waited for (the store is closed
        all the same). Closing twice is allowed. A store used as a context manager
        (`with Store.open(path) as s:`) is closed when the block ends, also on an
        exception. GIL released.
        """
    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
    def __enter__(self) -> Store: ...
    def __exit__(self, *_args: object) -> bool:
        """Closes the store (see ``close``; raises a background save's error)."""
    # working state
    def insert(self, name: str, array: ArrayIn, *, chunk_bytes: int | None = None,
               dtype: str | None = None) -> None:
        """Add variable `name` holding a copy of `array` (any layout). O(size).

        Args:
            name: the new variable's name
            array: the values (any NumPy array or array-like, any layout); copied
            chunk_bytes: this variable's largest chunk in bytes (default: the
                store's `chunk_bytes`)
            dtype: `"bfloat16"` to store a `uint16` array as bf16 bit patterns;
                `None`: the array's dtype

        Raises:
            VariableExists: `name` is taken
            UnsupportedDType: a dtype the store has no type for
        """
    def write(self, name: str, array: ArrayIn, *, dtype: str | None = None) -> WriteStats:
        """Overwrite variable `name` from `array` (same dtype and shape, any layout), copying
        only the chunks whose bytes changed. O(size) compare.

        Args:
            name: the variable to overwrite
            array: the new values: the variable's dtype and shape, any layout
            dtype: `"bfloat16"` when `array` holds bf16 bit patterns as `uint16`

        Raises:
            UnknownVariable: no variable `name`
            ShapeMismatch, DTypeMismatch: `array` does not fit it
        """
    def sync(self, arrays: Inputs) -> dict[str, WriteStats]:
        """Write every array of `arrays` into its variable (inserting new names), copying only
        changed chunks. All or nothing. Returns `{name: WriteStats}`.

        Args:
            arrays: `{name: array}` or `(name, array)` pairs
        """
    def get(self, name: str, *, at: Ref | None = None) -> np.ndarray:
        """A copy of variable `name`, from the working state or from version `at`. O(size).

        Args:
            name: the variable
            at: the version to read (a ref: a `Version`, `"HEAD"`, a branch or tag
                name, `"v3"`, or a unique prefix of a version hash); `None`: the
                working state
        """
    def __getitem__(self, name: str) -> np.ndarray: ...
    def __contains__(self, name: object) -> bool: ...
    def __len__(self) -> int: ...
    def names(self) -> list[str]:
        """Names of the working variables, sorted."""
    def info(self, name: str) -> tuple[str, list[int]]:
        """`(dtype, shape)` of a working variable, dtype as `"f32"`, `"bf16"`, ...; reads
        no tensor data.

        Args:
            name: the working variable
        """
    def remove(self, name: str) -> None:
        """Drop variable `name` from the working state.

        Args:
            name: the working variable to drop
        """
    # commits and HEAD
    def commit(self, message: str = "", **metadata: MetaValue) -> Version:
        """Record the working state as a new version (O(1), no data copied). Keyword
        arguments (bool, int, float, str) are kept as the version's metadata.

        Args:
            message: the commit message

        Raises:
            InvalidArgument: a metadata value that is not bool, int, float or str
        """
    def commit_later(self, arrays: Inputs, check: Callable[[bool], object], message: str = "",
                     ready: Callable[[], object] | None = None, /,
                     **metadata: MetaValue) -> Version:
        """Commit `arrays` (`{name: array}`, C-contiguous) with `message` and the keyword
        arguments as metadata, as `sync(arrays)` then `commit(...)` would, but copy them
        on another thread: returns at once the `Version` the commit will get. The next
        call on this store (any method, or `settle()`) waits for the copy, then calls
        `check(copied)` (`copied`: whether the copy succeeded): if it returns, the commit
        is made; if it raises, the variables the copy wrote are put back as they were, no
        version is made, and that call raises the check's exception. A failed copy
        (a shape that does not fit a variable, ...) changes nothing, and that call raises
        its error after the check returns. `check` must not call this store.

        The arrays are read while the caller goes on: nothing may write them, resize
        them or free their memory until the store is settled (`check` is where a caller
        that cannot prevent a write detects one). The arrays are kept alive until then,
        and a store dropped meanwhile waits for the copy. A process forked while the copy
        runs gets `InvalidArgument` from its next call on this store.

        `ready`, when given, is called (with no arguments) on the copy thread before it
        reads the arrays, and returns once their bytes are in place (an accelerator's
        copy into a host staging area, say). If it raises, the copy is not made,
        `check(False)` is called, and the next call raises `ready`'s exception. The
        four parameters are positional, so that any keyword is metadata.

        Args:
            arrays: `{name: array}` of C-contiguous arrays to copy and commit
            check: called as `check(copied)` before the commit is made; raising
                cancels it
            message: the commit message
            ready: called on the copy thread before the arrays are read (default: none)
        """
    def settle(self) -> None:
        """Finish a `commit_later` in flight (see there); nothing to do without one."""
    def commit_pending(self) -> bool:
        """Whether a `commit_later` is in flight."""
    def head(self) -> Version | None:
        """The current version (`None` before the first commit)."""
    def current_branch(self) -> str | None:
        """The branch HEAD is attached to (`None` when detached)."""
    def is_dirty(self) -> bool:
        """Whether the working state differs from HEAD."""
    def discard(self) -> None:
        """Drop uncommitted changes of the working state."""
    def restore(self, ref: Ref, *, into: Targets | None = None,
                known: Ref | None = None) -> Version:
        """Make the working state version `ref` and move HEAD there (O(1)). With `into`
        (`{name: array}`), also write that version into the arrays in place, only the
        chunks that differ: compared chunk by chunk, or, with `known` (a version the arrays
        are known to hold), skipped without reading where the versions share chunks.

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
            into: `{name: array}` (or `(name, array)` pairs) of writable NumPy
                arrays to write the version into, in place, only where chunks
                differ; `None`: move HEAD only
            known: a version the arrays of `into` are known to hold: chunks it
                shares with the target are skipped without being read

        Raises:
            UnknownRef, UnknownVersion, PrunedVersion: `ref` names nothing live
            UncommittedChanges: the working state differs from HEAD
            ShapeMismatch, DTypeMismatch: an array of `into` does not fit its
                variable (nothing is written)
        """
    def undo(self, *, into: Targets | None = None,
             known: Ref | None = None) -> Version:
        """Move HEAD to its parent and restore it (`into`/`known` as for `restore`).

        Args:
            into: `{name: array}` (or `(name, array)` pairs) of writable NumPy
                arrays to write the version into, in place, only where chunks
                differ; `None`: move HEAD only
            known: a version the arrays of `into` are known to hold: chunks it
                shares with the target are skipped without being read

        Raises:
            NothingToUndo: HEAD has no parent
            UncommittedChanges: the working state differs from HEAD
        """
    def redo(self, *, into: Targets | None = None,
             known: Ref | None = None) -> Version:
        """Go back to the version the last undo came from (`into`/`known` as for `restore`).

        Args:
            into: `{name: array}` (or `(name, array)` pairs) of writable NumPy
                arrays to write the version into, in place, only where chunks
                differ; `None`: move HEAD only
            known: a version the arrays of `into` are known to hold: chunks it
                shares with the target are skipped without being read

        Raises:
            NothingToRedo: no undo to go back from
            UncommittedChanges: the working state differs from HEAD
        """
    def write_into(self, into: Targets, *, at: Ref | None = None,
                   known: Ref | None = None) -> dict[str, WriteStats]:
        """Write version `at` (default HEAD) into the arrays of `into` without moving HEAD,
        only the chunks that differ (see `restore`). Returns `{name: WriteStats}`.

        Args:
            into: `{name: array}` (or `(name, array)` pairs) of writable NumPy
                arrays
            at: the version to write (default HEAD)
            known: a version the arrays of `into` are known to hold: chunks it
                shares with the target are skipped without being read
        """
    # refs
    def branch(self, name: str, at: Ref | None = None) -> None:
        """Create branch `name` at `at` (default HEAD).

        Args:
            name: the new branch's name
            at: where it starts (default HEAD)

        Raises:
            RefExists: `name` is taken
            InvalidRefName: `name` breaks the ref-name rules
        """
    def tag(self, name: str, at: Ref | None = None) -> None:
        """Create tag `name` at `at` (default HEAD); tags never move.

        Args:
            name: the new tag's name
            at: the version it names (default HEAD)

        Raises:
            RefExists: `name` is taken
            InvalidRefName: `name` breaks the ref-name rules
        """
    def checkout(self, name: str, *, into: Targets | None = None,
                 known: Ref | None = None) -> Version:
        """Attach HEAD to branch `name` and restore its tip (`into`/`known` as for `restore`).

        Args:
            name: the branch
            into: `{name: array}` (or `(name, array)` pairs) of writable NumPy
                arrays to write the version into, in place, only where chunks
                differ; `None`: move HEAD only
            known: a version the arrays of `into` are known to hold: chunks it
                shares with the target are skipped without being read
        """
    def detach(self) -> None:
        """Detach HEAD at its current version."""
    def delete_branch(self, name: str) -> None:
        """Delete branch `name` (its versions stay until pruned).

        Args:
            name: the branch
        """
    def delete_tag(self, name: str) -> None:
        """Delete tag `name`.

        Args:
            name: the tag
        """
    def resolve(self, ref: Ref) -> Version:
        """The version a ref names (`"main"`, `"HEAD"`, `"v3"`, a tag, or a `Version`).

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
        """
    def refs(self) -> list[tuple[str, str, Version]]:
        """`[(name, "branch" | "tag", Version)]` for every ref, sorted by name."""
    # the tree
    def snapshot(self, ref: Ref | None = None) -> Snapshot:
        """A read-only snapshot of version `ref` (default: the working state as it is now).

        Args:
            ref: the version (`None`: the working state)
        """
    def parent(self, ref: Ref) -> Version | None:
        """The first parent of `ref` (`None` for a root).

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
        """
    def parents(self, ref: Ref) -> list[Version]:
        """All parents of `ref` (two for a merge).

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
        """
    def children(self, ref: Ref) -> list[Version]:
        """The live children of `ref`, oldest first.

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
        """
    def merge_base(self, a: Ref, b: Ref) -> Version | None:
        """The newest common ancestor of `a` and `b`, or `None`.

        Args:
            a: one version (a ref)
            b: the other version (a ref)
        """
    def versions(self) -> list[Version]:
        """Every live version, oldest first."""
    def tips(self) -> list[Version]:
        """Live versions without children."""
    def metadata(self, ref: Ref) -> dict[str, MetaValue]:
        """The metadata given to `commit` for version `ref`.

        Args:
            ref: a ref: a `Version`, `"HEAD"`, a branch or tag name, `"v3"`, or a
                unique prefix of a version hash
        """
    def log(self, ref: Ref | None = None) -> list[LogEntry]:
        """`ref` (default HEAD) and its ancestors, newest first, as `LogEntry`s with id,
        message, time, parents and metadata.

        Args:
            ref: where the log starts (default HEAD)
        """
    def diff(self, a: Ref | None = None, b: Ref | None = None) -> dict[str, Change]:
        """`{name: Change}` between versions `a` and `b`. `b` defaults to the working
        state; with no argument at all, the uncommitted changes (HEAD against working).

        Args:
            a: the old version (default HEAD)
            b: the new version (default: the working state)
        """
    def merge(self, other: Ref, *, strategy: str = "fail") -> Version:
        """Three-way merge of `other` into HEAD at chunk level. `strategy`: `"fail"` (a chunk
        changed on both sides raises `MergeConflict`), `"ours"`, `"theirs"` or `"mean"`.

        Args:
            other: the version or branch to merge into HEAD
            strategy: `"fail"`, `"ours"`, `"theirs"` or `"mean"`: what a chunk
                changed on both sides becomes

        Raises:
            MergeConflict: with `strategy="fail"`, a chunk changed on both sides
        """
    def average(self, refs: Sequence[Ref], weights: Sequence[float] | None = None) -> Version:
        """Commit the weighted elementwise mean of versions (a model soup).

        Args:
            refs: the versions to average (same variables, dtypes and shapes)
            weights: one weight per version (default: equal weights)
        """
    def prune(self, *, keep_last: int | None = None, keep_every: int | None = None,
              drop_unreachable: bool = False) -> PruneStats:
        """Drop versions: keep the last `keep_last` per branch (and HEAD), every
        `keep_every`-th version, tags and branch tips; `drop_unreachable` also drops
        versions no ref reaches.

        Args:
            keep_last: versions to keep per branch (and HEAD), newest first
            keep_every: also keep every `keep_every`-th version
            drop_unreachable: also drop versions no ref reaches
        """
    def stats(self) -> Stats:
        """Versions, variables, unique chunks and bytes held, logical bytes (deep copies),
        sharing ratio.
        """
    def verify(self) -> None:
        """Recompute every hash and check the tree; raises `Corrupt` on a mismatch.

        Raises:
            Corrupt: a hash or the tree does not check
        """
    def graph(self) -> str:
        """The history as text, like `git log --graph --oneline`."""
    def to_dot(self) -> str:
        """The history as Graphviz DOT."""
    def export_safetensors(self, path: str | os.PathLike[str], ref: Ref | None = None) -> None:
        """Write version `ref` (default HEAD) as a `.safetensors` file, chunk by chunk and
        atomically (no file is left at `path` on error).

        Args:
            path: the file to write
            ref: the version (default HEAD)
        """
    def import_safetensors(self, path: str | os.PathLike[str]) -> list[str]:
        """Add every tensor of a `.safetensors` file to the working state; returns the names,
        sorted. All or nothing.

        Args:
            path: the `.safetensors` file to read
        """
    def pooled_bytes(self) -> int:
        """Bytes of freed chunk buffers kept for reuse."""
    def release_pooled(self) -> None:
        """Return pooled buffers to the allocator."""
