"""Ray Tune trials as branches of one shared history.

>>> import tensor_history as th
>>> from ray import tune
>>> def trainable(config):
...     model, optimizer = make_model(config)
...     tracker = th.torch.track(model, optimizer)
...     th.ray.restore(tracker)                    # tune.get_checkpoint(), if any, in place
...     for step in range(steps):
...         loss = train_step()
...         tune.report({"loss": loss}, checkpoint=th.ray.checkpoint(tracker, "/data/runs/exp1"))

Every trial saves into one repository (a local path for trials on one machine, an
``s3://`` URL for a cluster) on its own branch, ``trials/<trial id>``; the checkpoint Ray
keeps is a directory of one small file, :data:`POINTER`, that names the repository and the
version (its content address). So:

- A checkpoint writes only the chunks the repository lacks (a dense step: byte-plane
  coded deltas against the trial's previous version), never a second copy of a model.
- A PBT exploit hands trial B the checkpoint of trial A: :func:`restore` puts A's version
  into B's model in place and resets B's branch to it; no tensor byte is copied or
  written (the save that follows writes ref entries only).
- Trials in many processes save at once without conflicts (a branch each); a restarted
  trial (a killed actor) restores its last checkpoint the same way.
- Retention follows Ray's: once Ray deleted a checkpoint directory (``num_to_keep``),
  :func:`gc` lets go of its version unless a live checkpoint or a branch tip needs it.

``ray`` and ``torch`` are imported on first use; ``import tensor_history.ray`` needs
neither.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._core import GcStats, Store, Version
from ._errors import InvalidArgument, OpenFallbackWarning

__all__ = ["POINTER", "KEEP_TAG_PREFIX", "RESET_TAG_PREFIX", "GcResult", "Pointer", "checkpoint", "gc",
           "gc_callback", "live_pointers", "read_pointer", "restore", "trial_branch"]

#: The file a checkpoint directory holds: JSON naming the repository and the version.
POINTER = "tensor_history.json"
#: Tags :func:`gc` writes to keep the versions live checkpoints point to (``ray-keep/<hash>``).
KEEP_TAG_PREFIX = "ray-keep/"
#: Tags :func:`restore` writes on the tip a branch leaves (``ray-reset/<hash>``), until
#: :func:`gc` finds no live checkpoint on that line.
RESET_TAG_PREFIX = "ray-reset/"
_FORMAT = "tensor-history-ray"
_FORMAT_VERSION = 1


def _ray() -> Any:
    try:
        import ray
        import ray.tune  # noqa: F401 - ray[tune], not only ray
    except ImportError as e:
        # A ModuleNotFoundError naming `ray`, as `import ray` itself would raise.
        raise ModuleNotFoundError(
            f"tensor_history.ray needs Ray Tune: pip install 'ray[tune]' ({e})",
            name="ray") from e
    return ray


@dataclass(frozen=True)
class Pointer:
    """What a checkpoint directory holds: the repository (``location``), the version's
    content address (``version``, 64 hex digits), the ``branch`` and the trial
    (``trial_id``, ``None`` outside Tune) that saved it."""

    location: str
    version: str
    branch: str
    trial_id: Optional[str]

    def to_json(self) -> str:
        """The pointer file's text (JSON, with its format and format version)."""
        return json.dumps({"format": _FORMAT, "format_version": _FORMAT_VERSION,
                           "location": self.location, "version": self.version,
                           "branch": self.branch, "trial_id": self.trial_id}, indent=1)

    @staticmethod
    def from_json(text: str, where: str) -> "Pointer":
        """The pointer a pointer file's `text` holds; `where` names the file in errors.
        Raises ``InvalidArgument`` for text that is not a pointer of this format."""
        try:
            d = json.loads(text)
        except ValueError as e:
            raise InvalidArgument(f"`{where}` is not a tensor_history checkpoint pointer: {e}",
                                  reason="not a pointer") from None
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise InvalidArgument(f"`{where}` is not a tensor_history checkpoint pointer",
                                  reason="not a pointer")
        if d.get("format_version") != _FORMAT_VERSION:
            raise InvalidArgument(
                f"`{where}` is a pointer of format version {d.get('format_version')!r}; this "
                f"tensor_history reads version {_FORMAT_VERSION}", reason="pointer version")
        loc, ver, br = d.get("location"), d.get("version"), d.get("branch")
        if not (isinstance(loc, str) and isinstance(ver, str) and isinstance(br, str)
                and len(ver) == 64):
            raise InvalidArgument(f"`{where}` is a damaged checkpoint pointer",
                                  reason="not a pointer")
        tid = d.get("trial_id")
        return Pointer(loc, ver, br, tid if isinstance(tid, str) else None)


# ---- where we are ------------------------------------------------------------------------


def _trial_id() -> Optional[str]:
    """The Tune trial id of the calling process (``None`` outside a Tune trial)."""
    ray = _ray()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Ray warns outside a session
            tid = ray.tune.get_context().get_trial_id()
    except Exception:  # noqa: BLE001 - not inside a Tune session
        tid = None
    return str(tid) if tid else None


def trial_branch() -> str:
    """The branch the calling trial saves on: ``trials/<trial id>`` in a Tune trial, else
    (a Ray Train worker) ``runs/<experiment name>``. Raises ``InvalidArgument`` outside
    both (pass ``branch=`` to :func:`checkpoint` and :func:`restore` there)."""
    tid = _trial_id()
    if tid:
        return f"trials/{tid}"
    ray = _ray()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            name = ray.train.get_context().get_experiment_name()
    except Exception:  # noqa: BLE001 - not inside a Train session
        name = None
    if name:
        return f"runs/{name}"
    raise InvalidArgument("not inside a Ray Tune trial or Ray Train worker: pass branch=",
                          reason="no trial")


def _canonical(location: Union[str, "os.PathLike[str]"]) -> str:
    text = os.fspath(location)
    if "://" in text:
        return text.rstrip("/")
    return os.path.abspath(text)


def _same_location(a: str, b: str) -> bool:
    return _canonical(a) == _canonical(b)


def _store_of(tracker_or_store: Any) -> Store:
    if isinstance(tracker_or_store, Store):
        return tracker_or_store
    store = getattr(tracker_or_store, "store", None)
    if isinstance(store, Store):
        return store
    raise TypeError("expected a tensor_history Store or a tracker (th.torch.track(...)), "
                    f"got {type(tracker_or_store).__name__}")


def _is_tracker(obj: Any) -> bool:
    from ._tracker import Tracker

    return isinstance(obj, Tracker)


# ---- branches ----------------------------------------------------------------------------


def _branches(store: Store) -> List[str]:
    return [name for name, kind, _ in store.refs() if kind == "branch"]


def _point_branch(store: Store, branch: str, at: Version) -> None:
    """Make `branch` point at `at` in memory (created, or moved wherever it was); HEAD must
    not be attached to it. O(1)."""
    if branch in _branches(store):
        if store.resolve(branch) == at:
            return
        store.delete_branch(branch)
    store.branch(branch, at)


# ---- checkpoint --------------------------------------------------------------------------

def _pointer_dir(p: Pointer) -> str:
    d = tempfile.mkdtemp(prefix="tensor_history_ray_")
    tmp = os.path.join(d, POINTER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(p.to_json())
    os.replace(tmp, os.path.join(d, POINTER))
    return d


def checkpoint(tracker_or_store: Any, location: Union[str, "os.PathLike[str]", None] = None,
               *, message: str = "", branch: Optional[str] = None, **metadata: Any) -> Any:
    """Commit the tracked state, save it to the shared repository on the trial's branch
    and return a ``ray.tune.Checkpoint`` holding only a pointer to that version, for
    ``tune.report(metrics, checkpoint=...)`` (or ``ray.train.report``).

    `tracker_or_store`: a tracker (``th.torch.track(model, optimizer)``, or any framework
    tracker) or a :class:`Store`; a store's working state is committed as it is.
    `location`: the repository (a path, or ``s3://bucket/prefix``), created if absent;
    needed the first time a store that is not bound to one is checkpointed, and must
    be the store's own afterwards. `branch`: default :func:`trial_branch`
    (``trials/<trial id>``). `message` and `metadata` go to the commit.

    What is saved: the trial's branch only. The first checkpoint of an in-memory store
    binds it to the repository and leaves its other branches (the tracker's ``main``)
    out of it (they are deleted from the store: every trial has one). HEAD is attached
    to the trial's branch, which moves to the new version.

    Cost: the commit (changed chunks only) and a save of the chunks the repository lacks,
    then one ref entry; the returned directory is one small JSON file. Raises
    ``BranchMoved`` when another process moved this trial's branch (two processes
    running one trial), ``OtherHistory`` when the repository already has this trial's
    branch and the store does not descend from it (restore before checkpointing a
    restarted trial), ``InvalidArgument`` without a location or with another one than
    the store's. Nothing is lost by a failing call: the commit stays in memory (HEAD on
    the trial's branch), and an in-memory store keeps its other branches.
    """
    ray = _ray()
    store = _store_of(tracker_or_store)
    bound = store.location
    if location is None and bound is None:
        raise InvalidArgument("the store has no repository yet: pass location= (a path or "
                              "s3:// URL shared by the trials)", reason="no location")
    if location is not None and bound is not None and not _same_location(
            os.fspath(location), bound):
        raise InvalidArgument(
            f"the store saves to `{bound}`, not `{os.fspath(location)}`", reason="location")
    branch = branch if branch is not None else trial_branch()
    if store.current_branch() != branch:
        store.detach()  # the commit must move no other branch
    if _is_tracker(tracker_or_store):
        v = tracker_or_store.commit(message, **metadata)
    else:
        v = store.commit(message, **metadata)
    if store.current_branch() != branch:
        _point_branch(store, branch, v)
        store.checkout(branch)  # HEAD is already at `v`: nothing is written
    if bound is None:
        others = [(n, store.resolve(n)) for n in _branches(store) if n != branch]
        for n, _ in others:
            store.delete_branch(n)
        try:
            store.save_as(os.fspath(location))  # type: ignore[arg-type]
        except BaseException:
            for n, at in others:  # the store keeps its branches when nothing was saved
                store.branch(n, at)
            raise
    else:
        store.save()
    where = store.location
    assert where is not None
    p = Pointer(where, store.version_hash(v), branch, _trial_id())
    d = _pointer_dir(p)
    ckpt = ray.tune.Checkpoint.from_directory(d)
    # Ray copies a reported checkpoint into its storage; the local directory goes with
    # the last reference to this object.
    weakref.finalize(ckpt, shutil.rmtree, d, True)
    return ckpt


# ---- restore -----------------------------------------------------------------------------


def read_pointer(ckpt: Any) -> Pointer:
    """The :class:`Pointer` the checkpoint `ckpt` (a ``ray.tune.Checkpoint``, or a local
    directory path) holds. Raises ``InvalidArgument`` when it holds none (a checkpoint Ray's
    default code wrote, say)."""
    fs, base = getattr(ckpt, "filesystem", None), getattr(ckpt, "path", None)
    if (fs is None or base is None) and isinstance(ckpt, (str, os.PathLike)):
        path = os.path.join(os.fspath(ckpt), POINTER)
        if not os.path.exists(path):
            raise InvalidArgument(f"`{os.fspath(ckpt)}` holds no {POINTER}: not a checkpoint "
                                  "of tensor_history.ray.checkpoint", reason="not a pointer")
        with open(path, encoding="utf-8") as f:
            return Pointer.from_json(f.read(), path)
    if fs is None or base is None:
        raise TypeError(f"expected a ray.tune.Checkpoint or a directory, got {type(ckpt).__name__}")
    path = base.rstrip("/") + "/" + POINTER
    try:
        with fs.open_input_stream(path) as f:
            text = f.read().decode("utf-8")
    except (FileNotFoundError, OSError) as e:
        raise InvalidArgument(f"checkpoint `{base}` holds no {POINTER} ({e}): not a checkpoint "
                              "of tensor_history.ray.checkpoint", reason="not a pointer") from None
    return Pointer.from_json(text, path)


def _open(location: str) -> Store:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OpenFallbackWarning)
        return Store.open(location, create=False)


def _rebind(tracker: Any, store: Store) -> None:
    """Make `tracker` use `store` (the repository's) instead of its in-memory store, whose
    history is dropped. The next sync compares every tensor."""
    from . import _tracker

    tracker._check_idle("restore")
    tracker._settle()
    tracker._checkpoint_outcome(wait=True)
    old = tracker.store
    if store.memory_budget is None:
        store.memory_budget = old.memory_budget
    if old in _tracker._AUTO_BUDGET:
        _tracker._AUTO_BUDGET.add(store)
    tracker.store = store
    tracker._synced = {}
    tracker._held = []
    tracker._synced_head = None
    tracker._extras = {}
    old.close()


def restore(tracker_or_store: Any, checkpoint: Any = None, *,
            branch: Optional[str] = None) -> Optional[Version]:
    """Put the version a checkpoint points to into the model and optimizer that
    `tracker_or_store` tracks, in place (or into a :class:`Store`'s working state), and
    reset the trial's branch to it.

    `checkpoint`: default ``tune.get_checkpoint()`` (``ray.train.get_checkpoint()`` in a
    Train worker); ``None`` there (a fresh trial): nothing happens and ``None`` is
    returned. Else returns the restored version. The checkpoint may come from another
    trial (a PBT exploit): its version becomes this trial's branch tip, sharing every
    chunk; nothing is copied or written. The tip the branch leaves is tagged
    ``ray-reset/<hash>`` (saved with the next save) so that the repository still reaches
    that line while Ray keeps checkpoints of it; :func:`gc` drops the tag after. A
    tracker whose store is not bound to a repository yet is bound to the checkpoint's
    (its in-memory history is dropped); a :class:`Store` must be bound to it already
    (``Store.open(location)``).

    Cost: a refresh of the repository (new versions' metadata), then the chunks that
    differ from the model are read and written in place. Raises ``InvalidArgument`` for
    a checkpoint without a pointer or of another repository than the store's,
    ``UnknownRef`` when its version is not in the repository (collected by a gc); nothing
    changes then.
    """
    ray = _ray()
    if checkpoint is None:
        try:
            checkpoint = ray.tune.get_checkpoint()
        except Exception:  # noqa: BLE001 - not in a Tune session: a Train worker's
            checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
    p = read_pointer(checkpoint)
    store = _store_of(tracker_or_store)
    tracker = tracker_or_store if _is_tracker(tracker_or_store) else None
    branch = branch if branch is not None else trial_branch()
    opened: Optional[Store] = None
    if store.location is None:
        if tracker is None:
            raise InvalidArgument(
                "restore() into a store that is not bound to the checkpoint's repository: "
                f"open it with tensor_history.Store.open({p.location!r})", reason="location")
        opened = _open(p.location)
        store = opened
    elif not _same_location(store.location, p.location):
        raise InvalidArgument(f"the checkpoint is in `{p.location}`, the store saves to "
                              f"`{store.location}`", reason="location")
    else:
        store.refresh()
    try:
        v = store.resolve(p.version)
    except Exception:
        if opened is not None:
            opened.close()
        raise
    if opened is not None:
        assert tracker is not None
        _rebind(tracker, opened)
    store.detach()
    if branch in _branches(store):
        old = store.resolve(branch)
        if old != v:
            # The line the branch leaves (an exploit) may still have live checkpoint
            # directories; a repository reads only what its refs reach, so the old tip is
            # tagged until gc() finds no directory for it.
            tag = RESET_TAG_PREFIX + store.version_hash(old)
            if tag not in {n for n, _, _ in store.refs()}:
                store.tag(tag, old)
    _point_branch(store, branch, v)
    if tracker is not None:
        tracker.checkout(branch)
    else:
        store.checkout(branch)
    return v


# ---- retention ---------------------------------------------------------------------------


def _walk_pointers(storage_path: str) -> Iterator[Tuple[str, str]]:
    """(path, text) of every pointer file under `storage_path` (a directory or a URI
    pyarrow reads, such as ``s3://bucket/prefix``)."""
    if "://" not in storage_path:
        for root, _dirs, files in os.walk(storage_path):
            if POINTER in files:
                path = os.path.join(root, POINTER)
                try:
                    with open(path, encoding="utf-8") as f:
                        yield path, f.read()
                except FileNotFoundError:
                    continue  # deleted by Ray meanwhile
        return
    import pyarrow.fs as pafs  # type: ignore[import-untyped]

    fs, base = pafs.FileSystem.from_uri(storage_path)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    for info in infos:
        if info.type == pafs.FileType.File and info.base_name == POINTER:
            try:
                with fs.open_input_stream(info.path) as f:
                    yield info.path, f.read().decode("utf-8")
            except (FileNotFoundError, OSError):
                continue


def live_pointers(storage_path: Union[str, "os.PathLike[str]"],
                  location: Optional[Union[str, "os.PathLike[str]"]] = None) -> List[Pointer]:
    """The pointers of every checkpoint directory under Ray's `storage_path` (of the
    repository at `location` only, when given). Files that are not pointers are skipped."""
    out = []
    for path, text in _walk_pointers(os.fspath(storage_path)):
        try:
            p = Pointer.from_json(text, path)
        except InvalidArgument:
            continue
        if location is None or _same_location(p.location, os.fspath(location)):
            out.append(p)
    return out


@dataclass(frozen=True)
class GcResult:
    """What :func:`gc` did: versions kept for live checkpoints (``protected``), live
    pointers whose version the repository no longer has (``missing``), versions let go
    (``pruned``) and the repository gc's own stats (``gc``)."""

    protected: int
    missing: List[str]
    pruned: int
    gc: GcStats


def gc(location: Union[str, "os.PathLike[str]"], storage_path: Union[str, "os.PathLike[str]"],
       *, grace: Optional[float] = None, dry_run: bool = False) -> GcResult:
    """Collect the repository's versions that no live Ray checkpoint and no branch needs.

    A version is kept when a checkpoint directory under Ray's `storage_path` points to it
    (Ray deletes the directories ``CheckpointConfig(num_to_keep=...)`` lets go) or when it
    is a branch tip (each trial's latest state); every other version (older steps of a
    trial, the line a PBT exploit reset a branch away from) is pruned, and the repository's
    gc deletes what only those held. Kept versions are marked by ``ray-keep/<hash>`` tags
    in the repository, deleted again once their directory is gone; the
    ``ray-reset/<hash>`` tags :func:`restore` puts on the tip a branch left (so that the
    repository still reaches that line) are replaced by them.

    Safe while trials run: the refs are read before the directories, a checkpoint's
    version is a branch tip until the trial's next checkpoint (by when Ray holds its
    directory), and the repository gc's two phases keep what a save in flight may use
    (`grace` seconds, default one hour; it must exceed the longest save, see
    ``Store.gc``). Deletion therefore happens one run after `grace` has passed: call it
    periodically (between PBT rounds, or from a ``tune.Callback``). ``dry_run``: prune
    and delete nothing, report what would go.

    Cost: O(versions + pointers), then ``Store.gc``. Raises ``NoRepository`` when there is
    none at `location`.
    """
    loc = os.fspath(location)
    store = _open(loc)  # refs first: see above
    try:
        live = live_pointers(storage_path, loc)
        want: Dict[str, Version] = {}
        missing: List[str] = []
        for p in live:
            if p.version in want:
                continue
            try:
                want[p.version] = store.resolve(p.version)
            except KeyError:
                missing.append(p.version)
        tags = {name: v for name, kind, v in store.refs()
                if kind == "tag" and name.startswith((KEEP_TAG_PREFIX, RESET_TAG_PREFIX))}
        if not dry_run:
            for h, v in want.items():
                name = KEEP_TAG_PREFIX + h
                if name not in tags:
                    store.tag(name, v)
            for name in tags:
                if name.startswith(RESET_TAG_PREFIX) or name[len(KEEP_TAG_PREFIX):] not in want:
                    store.delete_tag(name)  # what is live has its keep tag now
            pruned = len(store.prune(keep_last=1, drop_unreachable=True).dropped)
            store.save()
        else:
            keep = set(want.values()) | {v for _, _, v in store.refs()}
            pruned = len([v for v in store.versions() if v not in keep])
        stats = store.gc(grace=grace, dry_run=dry_run)
        return GcResult(protected=len(want), missing=missing, pruned=pruned, gc=stats)
    finally:
        store.close()


def gc_callback(location: Union[str, "os.PathLike[str]"],
                storage_path: Union[str, "os.PathLike[str]"], *, every: int = 32,
                grace: Optional[float] = None) -> Any:
    """A ``tune.Callback`` that runs :func:`gc` (of the repository at `location`, keeping
    what the checkpoint directories under `storage_path` point to) in the driver after
    every `every`-th
    checkpoint Ray registers (on a thread, one run at a time, so Tune's loop is not held
    up), and once when the experiment ends, so that the repository stays bounded as
    Ray's ``num_to_keep`` deletes directories. `grace`: see :func:`gc` (it must exceed
    the longest save of any trial). The last run's :class:`GcResult` is the callback's
    ``last`` attribute; ``runs`` counts them; an error of a run is raised at the end of
    the experiment.

    Pass it to ``tune.RunConfig(callbacks=[...])``. Cost per run: that of :func:`gc`."""
    ray = _ray()
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise InvalidArgument(f"every must be a whole number >= 1, got {every!r}",
                              reason="every")

    base: Any = ray.tune.Callback

    class GcCallback(base):  # type: ignore[misc]
        def __init__(self) -> None:
            self.last: Optional[GcResult] = None
            self.runs = 0
            self.error: Optional[BaseException] = None
            self._seen = 0
            self._thread: Optional[threading.Thread] = None

        def _run(self) -> None:
            try:
                self.last = gc(location, storage_path, grace=grace)
                self.runs += 1
            except BaseException as e:  # noqa: BLE001 - raised at the experiment's end
                self.error = e

        def on_checkpoint(self, iteration: int, trials: Any, trial: Any, checkpoint: Any,
                          **info: Any) -> None:
            self._seen += 1
            busy = self._thread is not None and self._thread.is_alive()
            if self._seen % every == 0 and not busy:
                # On a thread: Tune's loop goes on (the store releases the GIL).
                self._thread = threading.Thread(target=self._run, name="th-ray-gc",
                                                daemon=True)
                self._thread.start()

        def on_experiment_end(self, trials: Any, **info: Any) -> None:
            if self._thread is not None:
                self._thread.join()
            self._run()
            if self.error is not None:
                raise self.error

    return GcCallback()
