"""tensor_history.torch.dcp at locations that do not hold what a call expects.

Reading never creates: a load, ``whole_tensors``, ``export_safetensors`` or
``validate_checkpoint_id`` of a path with no repository (absent, an empty directory, a
file, a directory of other files, a relative path) says so and leaves the path exactly
as it was (compared file by file, sizes and modification times, before and after; a path
that did not exist still does not). A ref missing from a repository is named along with
the refs there are; a version that is not a DCP save says so. A writer refuses a
``branch`` that cannot be one (the core's ref-name rules, or a tag of the repository)
on every rank before any rank writes.

The ranks are the gloo ranks of test_dcp.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from test_dcp import (  # noqa: F401  (_own_process: the autouse fixture applies here too)
    _own_process,
    copy_repo,
    empty_like_sharded,
    full_state,
    run,
    save_step,
    sharded,
)

import torch  # noqa: E402  (test_dcp skips the module when torch is missing)
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import tensor_history as th  # noqa: E402
from tensor_history.torch.dcp import (  # noqa: E402
    NotADcpSave,
    StorageReader,
    StorageWriter,
    export_safetensors,
    whole_tensors,
)

NO_REPOSITORY = "there is no tensor-history repository at"


def tree(path):
    """Every file and directory under `path` (and `path` itself) with its kind, size and
    modification time; ``None`` if `path` does not exist."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        return None
    st = os.lstat(path)
    out = {".": (st.st_mode, st.st_size, st.st_mtime_ns)}
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                p = os.path.join(root, n)
                st = os.lstat(p)
                out[os.path.relpath(p, path)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def make_location(kind: str, tmp_path) -> str:
    """A path with no repository, as `kind` says."""
    base = tmp_path / "locations"
    base.mkdir(exist_ok=True)
    if kind == "absent":
        return str(base / "typo")
    if kind == "absent, relative":
        return "typo"  # the test runs in `base`
    if kind == "absent, under an absent parent":
        return str(base / "no" / "such" / "dir")
    if kind == "an empty directory":
        (base / "empty").mkdir()
        return str(base / "empty")
    if kind == "a file":
        (base / "file").write_bytes(b"not a repository")
        return str(base / "file")
    if kind == "a directory of other files":
        (base / "other").mkdir()
        (base / "other" / "notes.txt").write_text("hello")
        return str(base / "other")
    raise AssertionError(kind)


LOCATIONS = ["absent", "absent, relative", "absent, under an absent parent",
             "an empty directory", "a file", "a directory of other files"]


@pytest.fixture
def in_locations(tmp_path, monkeypatch):
    """Run in tmp_path/locations (a relative location resolves there, in the ranks too)."""
    (tmp_path / "locations").mkdir()
    monkeypatch.chdir(tmp_path / "locations")
    return tmp_path


@pytest.fixture(scope="module")
def saved_by_2(tmp_path_factory):
    """A repository with one DCP save of 2 ranks (seed 1) on main."""
    base = tmp_path_factory.mktemp("dcp-locations")
    repo = str(base / "repo")
    run(2, base, save_step, repo, 1, {"step": 1})
    return repo


def plain_repository(path) -> str:
    """A repository whose main is a version of plain tensors (no DCP metadata)."""
    s = th.Store()
    s.insert("w", np.ones(3, dtype=np.float32))
    s.commit("plain")
    s.save_as(path)
    return os.fspath(path)


# ---- what the ranks do ----------------------------------------------------------------

def load_expecting_failure(rank, world, mesh, repo, ref, out):
    sd = empty_like_sharded(world, rank, mesh)
    with pytest.raises(CheckpointException) as e:
        dcp.load(sd, storage_reader=StorageReader(repo, ref=ref))
    with open(f"{out}.{rank}", "w") as f:
        f.write(str(e.value))


def save_expecting_failure(rank, world, mesh, repo, branch, out):
    w = StorageWriter(repo)
    w.branch = branch  # set after construction: the save still checks it
    with pytest.raises((CheckpointException, th.TensorHistoryError)) as e:
        dcp.save(sharded(full_state(2), world, rank, mesh), storage_writer=w)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{type(e.value).__name__}: {e.value}")


def save_to_branch_expecting_failure(rank, world, mesh, repo, branch, out):
    with pytest.raises(CheckpointException) as e:
        dcp.save(sharded(full_state(2), world, rank, mesh),
                 storage_writer=StorageWriter(repo, branch=branch))
    with open(f"{out}.{rank}", "w") as f:
        f.write(str(e.value))


def rank_texts(out, world) -> list[str]:
    return [open(f"{out}.{r}").read() for r in range(world)]


# ---- readers never create --------------------------------------------------------------

@pytest.mark.parametrize("kind", LOCATIONS)
def test_a_load_where_there_is_no_repository_says_so_on_every_rank_and_creates_nothing(
        in_locations, kind):
    tmp_path = in_locations
    location = make_location(kind, tmp_path)
    before = tree(location)
    out = str(tmp_path / "err")
    run(2, tmp_path, load_expecting_failure, location, "main", out)
    for text in rank_texts(out, 2):
        if kind == "a directory of other files":
            assert "UnsupportedFormat" in text or "config.json" in text, text
        else:
            assert NO_REPOSITORY in text and location in text, text
        assert "unknown ref" not in text, text
    assert tree(location) == before
    assert not StorageReader.validate_checkpoint_id(location)
    assert not StorageWriter.validate_checkpoint_id(location)


@pytest.mark.parametrize("kind", LOCATIONS)
def test_whole_tensors_and_export_where_there_is_no_repository_raise_and_create_nothing(
        in_locations, kind):
    tmp_path = in_locations
    location = make_location(kind, tmp_path)
    before = tree(location)
    target = tmp_path / "model.safetensors"
    expected = th.UnsupportedFormat if kind == "a directory of other files" else th.NoRepository
    with pytest.raises(expected) as e:
        whole_tensors(location)
    if expected is th.NoRepository:
        assert isinstance(e.value, FileNotFoundError) and e.value.location == location
        assert NO_REPOSITORY in str(e.value)
    with pytest.raises(expected):
        export_safetensors(location, target)
    with pytest.raises(expected):
        StorageReader(location).read_metadata()
    assert tree(location) == before
    assert not target.exists()
    assert not StorageReader.validate_checkpoint_id(location)


def test_validate_checkpoint_id_is_true_for_a_repository_and_opens_nothing_else(
        saved_by_2, tmp_path):
    assert StorageReader.validate_checkpoint_id(saved_by_2)
    assert StorageWriter.validate_checkpoint_id(saved_by_2)
    typo = str(tmp_path / "typo")
    assert not StorageReader.validate_checkpoint_id(typo)
    assert not os.path.lexists(typo)


# ---- a missing ref, a version that is not a DCP save -------------------------------------

def test_a_load_of_a_missing_ref_names_it_and_the_refs_there(saved_by_2, tmp_path):
    repo = copy_repo(saved_by_2, tmp_path)
    s = th.Store.open(repo)
    s.tag("best", at="main")
    s.branch("exp-2", at="main")
    s.save()
    before = tree(repo)
    out = str(tmp_path / "err")
    run(2, tmp_path, load_expecting_failure, repo, "mian", out)
    for text in rank_texts(out, 2):
        assert "'mian'" in text and "best" in text and "exp-2" in text and "main" in text, text
    with pytest.raises(th.UnknownRef) as e:
        whole_tensors(repo, "mian")
    assert e.value.name == "mian"
    msg = str(e.value)
    assert "'mian'" in msg and repo in msg
    assert "branches: exp-2, main" in msg and "tags: best" in msg, msg
    assert tree(repo) == before


def test_a_read_of_a_repository_with_no_ref_says_nothing_was_saved_there(tmp_path):
    repo = str(tmp_path / "repo")
    th.Store.open(repo).close()  # a repository: config.json, no version
    before = tree(repo)
    with pytest.raises(th.UnknownRef) as e:
        whole_tensors(repo)
    assert "no branch or tag" in str(e.value) and "'main'" in str(e.value), str(e.value)
    out = str(tmp_path / "err")
    run(2, tmp_path, load_expecting_failure, repo, "main", out)
    for text in rank_texts(out, 2):
        assert "no branch or tag" in text, text
    assert tree(repo) == before


def test_a_load_of_a_version_that_is_not_a_dcp_save_says_so(tmp_path):
    repo = plain_repository(tmp_path / "plain")
    before = tree(repo)
    out = str(tmp_path / "err")
    run(2, tmp_path, load_expecting_failure, repo, "main", out)
    for text in rank_texts(out, 2):
        assert "not a DCP save" in text and "'main'" in text, text
        assert "unknown variable" not in text, text
    version = th.Store.open(repo).version_hash("main")
    for ref in ("main", version):
        with pytest.raises(NotADcpSave) as e:
            StorageReader(repo, ref=ref).read_metadata()
        assert isinstance(e.value, KeyError) and e.value.version == version
        with pytest.raises(NotADcpSave, match="not a DCP save"):
            whole_tensors(repo, ref)
    assert tree(repo) == before


# ---- a branch that cannot be one ---------------------------------------------------------

BAD_BRANCHES = ["", "has space", "HEAD", "v12", "12", "tab\there", "new\nline", "zero\u200bwidth",
                "x" * 300]


@pytest.mark.parametrize("branch", BAD_BRANCHES)
def test_a_writer_refuses_a_branch_name_the_core_refuses_when_it_is_made(tmp_path, branch):
    # the same rule as Store.branch's
    s = th.Store()
    s.insert("w", np.ones(1, dtype=np.float32))
    s.commit("c")
    with pytest.raises(th.InvalidRefName):
        s.branch(branch)
    location = str(tmp_path / "repo")
    with pytest.raises(th.InvalidRefName) as e:
        StorageWriter(location, branch=branch)
    assert e.value.name == branch
    assert not os.path.lexists(location)


@pytest.mark.parametrize("branch", [3, None, b"main"])
def test_a_writer_refuses_a_branch_that_is_not_a_string(tmp_path, branch):
    with pytest.raises(TypeError):
        StorageWriter(str(tmp_path / "repo"), branch=branch)


@pytest.mark.parametrize("branch", ["main", "exp/2", "run-2024.01", "ünïcode"])
def test_a_writer_takes_a_branch_name_the_core_takes(tmp_path, branch):
    assert StorageWriter(str(tmp_path / "repo"), branch=branch).branch == branch


@pytest.mark.parametrize("fresh", [True, False], ids=["new location", "a repository"])
def test_a_branch_name_made_invalid_after_construction_fails_every_rank_before_any_write(
        saved_by_2, tmp_path, fresh):
    repo = str(tmp_path / "new") if fresh else copy_repo(saved_by_2, tmp_path)
    before = tree(repo)
    out = str(tmp_path / "err")
    run(2, tmp_path, save_expecting_failure, repo, "bad name", out)
    for text in rank_texts(out, 2):
        assert "InvalidRefName" in text and "bad name" in text, text
    assert tree(repo) == before


def test_a_save_to_a_branch_that_is_a_tag_fails_every_rank_before_any_write(saved_by_2,
                                                                           tmp_path):
    repo = copy_repo(saved_by_2, tmp_path)
    s = th.Store.open(repo)
    s.tag("release", at="main")
    s.save()
    before = tree(repo)
    out = str(tmp_path / "err")
    run(2, tmp_path, save_to_branch_expecting_failure, repo, "release", out)
    for text in rank_texts(out, 2):
        assert "WrongRefKind" in text and "release" in text, text
    assert tree(repo) == before
    # the repository is as it was: main loads
    got = whole_tensors(repo)
    assert torch.equal(got["w"], full_state(1)["w"])
