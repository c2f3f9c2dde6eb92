"""Exceptions raised by tensor_history: one class per kind of error of the Rust core.

Every class derives from :class:`TensorHistoryError` and from the built-in exception that
fits (``KeyError`` for unknown names, ``TypeError`` for dtypes, ``ValueError`` for shapes
and arguments, ``OSError`` for storage). The error's fields are attributes. A call that
raises has changed nothing.
"""

from __future__ import annotations

from typing import Any


class TensorHistoryError(Exception):
    """Base class of every error raised by tensor_history."""

    def __init__(self, message: str = "", /, **attrs: Any) -> None:
        """Make the error (the package raises them; user code rarely needs to).

        Args:
            message: what ``str(error)`` returns.
            **attrs: the error's fields, set as attributes (``name``, ``expected``, ...).
        """
        super().__init__(message)
        for key, value in attrs.items():
            setattr(self, key, value)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):
        # Pickled with the message and the fields, so an error raised in a
        # multiprocessing worker reaches the parent whole.
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


def _rebuild(cls: type, message: str, attrs: dict) -> "TensorHistoryError":
    return cls(message, **attrs)


class UnknownVariable(TensorHistoryError, KeyError):
    """No variable of that name (attribute ``name``)."""


class VariableExists(TensorHistoryError, ValueError):
    """A variable of that name already exists (``name``)."""


class DTypeMismatch(TensorHistoryError, TypeError):
    """The array's dtype is not the variable's (``name``, ``expected``, ``found``)."""


class ShapeMismatch(TensorHistoryError, ValueError):
    """The array's shape is not the variable's (``name``, ``expected``, ``found``)."""


class RangeOutOfBounds(TensorHistoryError, IndexError):
    """An element range outside the variable (``name``, ``start``, ``stop``, ``len``)."""


class NotRowAligned(TensorHistoryError, ValueError):
    """The tensor's chunks do not hold whole rows (``row_bytes``)."""


class InvalidConfig(TensorHistoryError, ValueError):
    """A store setting that cannot be used (``reason``)."""


class InvalidHash(TensorHistoryError, ValueError):
    """Text that is not a 64-digit hex content hash (``text``)."""


class UnknownVersion(TensorHistoryError, KeyError):
    """No version with this id was ever created (``id``)."""


class PrunedVersion(TensorHistoryError, KeyError):
    """The version was dropped by pruning (``id``)."""


class UnknownRef(TensorHistoryError, KeyError):
    """No branch or tag of that name (``name``)."""


class RefExists(TensorHistoryError, ValueError):
    """A branch or tag of that name already exists (``name``)."""


class InvalidRefName(TensorHistoryError, ValueError):
    """A ref name that is empty, has white space or is ``HEAD`` (``name``), or is too
    long for a repository key (``name``, ``bytes``, ``max``: see ``MAX_REF_NAME_BYTES``
    in the Rust crate)."""


class WrongRefKind(TensorHistoryError, TypeError):
    """A tag where a branch is needed, or the reverse (``name``, ``expected``)."""


class BranchCheckedOut(TensorHistoryError, ValueError):
    """The branch HEAD is attached to cannot be deleted (``name``)."""


class NoCommits(TensorHistoryError, ValueError):
    """The call needs at least one commit."""


class UncommittedChanges(TensorHistoryError, ValueError):
    """Commit or discard the working state's changes first."""


class NothingToUndo(TensorHistoryError, ValueError):
    """HEAD has no parent."""


class NothingToRedo(TensorHistoryError, ValueError):
    """No undo since the last commit, restore or checkout."""


class MergeConflict(TensorHistoryError, ValueError):
    """Chunks changed on both sides (``conflicts``: list of ``(variable, chunks | None)``)."""


class UnsupportedDType(TensorHistoryError, TypeError):
    """A dtype the operation does not support (``name``, ``dtype``, ``operation``)."""


class InvalidArgument(TensorHistoryError, ValueError):
    """An argument that is not valid for the call (``reason``)."""


class StorageError(TensorHistoryError, OSError):
    """A storage backend failed (``path``, ``kind``, ``message``)."""


class UnsupportedFormat(TensorHistoryError, ValueError):
    """A repository format this version cannot read (``path``, ``found``)."""


class InvalidSafeTensors(TensorHistoryError, ValueError):
    """A file that is not valid safetensors (``path``, ``reason``)."""


class BranchMoved(TensorHistoryError):
    """A save found that a branch moved in the repository since this store last saw it
    (``branch``); nothing was written for that branch, every other ref was saved (and
    HEAD, unless attached to that branch). ``theirs`` is the content address (hex) of the
    repository's version of the branch, or ``None`` if the repository deleted it.
    ``refresh()`` (which loads it: ``RefreshStats.theirs``), merge, and save again; a
    branch the repository deleted is written again by the save after a refresh."""


class OtherHistory(BranchMoved):
    """``save_as`` (or a tracker's ``save(path)``) onto a location that holds another
    history: its ref ``branch`` is at version ``theirs`` (hex), which this store's ref
    of that name does not descend from (``location``). Nothing there was overwritten,
    and the store stays bound where it was. To continue that history, open it
    (``Store.open(path)``, or ``track(..., path=path)``); to keep this one, save it
    elsewhere or under another branch name. A subclass of :class:`BranchMoved`."""


class Corrupt(TensorHistoryError):
    """``verify()`` found damaged data or a broken invariant (``reason``)."""


class CorruptObject(Corrupt):
    """A repository object failed its checksum or hash, is missing, or does not parse
    (``path``: the object at fault, ``reason``)."""


class AmbiguousRef(TensorHistoryError, KeyError):
    """A hex prefix matches several saved versions (``prefix``, ``matches``)."""


class TooLarge(TensorHistoryError, ValueError):
    """A tensor larger than memory can address (``shape``, ``dtype``)."""


class OpenFallbackWarning(RuntimeWarning):
    """``Store.open`` started at an older version because HEAD's did not read (see
    ``Store.open_fallback``)."""


class NoRepository(TensorHistoryError, FileNotFoundError):
    """No repository at the location a reading call was given (``location``); nothing
    was created there."""


class RepositoryReplaced(TensorHistoryError, OSError):
    """The repository a store saves to was deleted or replaced since it connected
    (``location``, ``reason``); nothing was written."""


class TooManyDims(TensorHistoryError, ValueError):
    """A tensor with more axes than a repository holds (``name``, ``dims``, ``max``)."""


class StoreClosed(TensorHistoryError, ValueError):
    """A call on a store after ``close()`` (or the end of its ``with`` block)."""


class TrialError(TensorHistoryError, RuntimeError):
    """A PyTorch tracker call made at the wrong time (``reason``)."""


class InternalError(TensorHistoryError, RuntimeError):
    """A check that cannot fail did (``reason``): a bug in tensor_history, please report
    it. Nothing was changed."""


_DEPRECATED = {"Conflict": BranchMoved}


def __getattr__(name: str):
    # ``Conflict`` was the name of ``BranchMoved`` (too close to ``MergeConflict``).
    if name in _DEPRECATED:
        import warnings

        new = _DEPRECATED[name]
        warnings.warn(
            f"tensor_history.{name} is deprecated; use tensor_history.{new.__name__}",
            DeprecationWarning,
            stacklevel=2,
        )
        return new
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
