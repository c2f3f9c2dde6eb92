"""The DCP storage layer on S3: the tests of test_dcp.py that matter for an object store
(4 ranks save, loads into 2 and 1, a 1% second save, a failed save, two coordinators
racing) against an S3-compatible server, and that reading a prefix with no repository
(a load, ``whole_tensors``, ``validate_checkpoint_id``), or a save refused for its
branch, writes nothing to the bucket.

Runs when TH_S3_BUCKET names a bucket and the AWS_* variables the `s3` feature reads
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP
for a plain-HTTP test server) are set, as `.ci/s3-server.sh`'s `start_s3_server` does;
skipped with the reason otherwise, and failed instead of skipped when TH_REQUIRE_S3=1.
Every test writes under a prefix of its own (s3://<bucket>/dcp-<uuid>/...).
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from test_dcp import (  # noqa: F401  (_own_process: the autouse fixture applies here too)
    COLS,
    ROWS,
    _own_process,
    check_one_percent_save,
    failing_save,
    load_and_check,
    run,
    save_step,
)

from test_dcp_locations import (
    NO_REPOSITORY,
    load_expecting_failure,
    rank_texts,
    save_expecting_failure,
)

import tensor_history as th
from tensor_history.torch.dcp import StorageReader, whole_tensors

_REQUIRED = os.environ.get("TH_REQUIRE_S3") == "1"


def _s3_prefix() -> str:
    """s3://<bucket>/dcp-<uuid>, or skip (fail with TH_REQUIRE_S3=1) saying why not."""
    bucket = os.environ.get("TH_S3_BUCKET")
    missing = [v for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(v)]
    why = None
    if not bucket:
        why = "TH_S3_BUCKET is not set (no S3 test server; see .ci/s3-server.sh)"
    elif missing:
        why = f"TH_S3_BUCKET is set but {', '.join(missing)} not"
    if why is not None:
        if _REQUIRED:
            pytest.fail(f"{why}, and TH_REQUIRE_S3=1 requires the DCP S3 tier")
        pytest.skip(f"{why}: the DCP S3 tier did not run")
    return f"s3://{bucket}/dcp-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def s3_saved_by_4(tmp_path_factory):
    """A repository on S3 with one DCP save of 4 ranks (seed 1) on main."""
    repo = _s3_prefix() + "/saved-by-4"
    run(4, tmp_path_factory.mktemp("dcp-s3"), save_step, repo, 1, {"step": 1})
    return repo


def test_s3_a_save_by_4_ranks_is_one_version_that_loads_into_4_2_and_1_ranks(
        s3_saved_by_4, tmp_path):
    s = th.Store.open(s3_saved_by_4)
    assert s.location == s3_saved_by_4
    log = s.log("main")
    assert len(log) == 1 and log[0].message == "dcp save"
    assert s.metadata("main") == {"step": 1}
    for world in (4, 2, 1):
        run(world, tmp_path, load_and_check, s3_saved_by_4, 1, "main")


def test_s3_a_second_save_with_1_percent_changed_writes_about_1_percent_of_the_bytes(
        tmp_path):
    check_one_percent_save(_s3_prefix() + "/one-percent", tmp_path)


def test_s3_a_rank_failing_in_write_data_leaves_no_new_version_and_gc_cleans_up(
        s3_saved_by_4, tmp_path):
    before = th.Store.open(s3_saved_by_4).version_hash("main")
    run(4, tmp_path, failing_save, s3_saved_by_4)
    s = th.Store.open(s3_saved_by_4)
    assert s.version_hash("main") == before and [e.message for e in s.log("main")] == [
        "dcp save"]
    run(1, tmp_path, load_and_check, s3_saved_by_4, 1, "main")
    # the three ranks that wrote their parts (each a quarter of w) left garbage
    stats = s.gc(grace=0)
    assert stats.bytes_deleted >= ROWS * COLS * 4 // 2, stats.bytes_deleted
    s.verify()
    run(2, tmp_path, load_and_check, s3_saved_by_4, 1, "main")


def test_s3_two_coordinators_creating_one_branch_one_wins_and_the_other_raises(
        s3_saved_by_4):
    parts = []
    for seed in (1, 2):
        w = th.Store()
        w.insert("x", np.full(1000, seed, dtype=np.float32))
        parts.append(w.write_part(s3_saved_by_4).items)
    branch = f"race-{uuid.uuid4().hex[:8]}"
    a, b = th.Store.open(s3_saved_by_4), th.Store.open(s3_saved_by_4)
    a.commit_parts(branch, [parts[0]], "a")
    b.commit_parts(branch, [parts[1]], "b")
    a.save()
    with pytest.raises(th.BranchMoved) as e:
        b.save()
    assert e.value.theirs is not None
    r = th.Store.open(s3_saved_by_4)
    assert [x.message for x in r.log(branch)] == ["a"]
    assert np.array_equal(r.get("x", at=branch), np.full(1000, 1, dtype=np.float32))


def assert_no_repository(prefix):
    """Nothing was written under `prefix`: it still opens as no repository (a prefix
    holding any object without a config.json would be UnsupportedFormat instead)."""
    with pytest.raises(th.NoRepository):
        th.Store.open(prefix, create=False)


def test_s3_a_read_of_a_prefix_with_no_repository_says_so_and_writes_nothing(tmp_path):
    prefix = _s3_prefix() + "/typo"
    assert not StorageReader.validate_checkpoint_id(prefix)
    with pytest.raises(th.NoRepository) as e:
        whole_tensors(prefix)
    assert NO_REPOSITORY in str(e.value)
    assert_no_repository(prefix)
    out = str(tmp_path / "err")
    run(2, tmp_path, load_expecting_failure, prefix, "main", out)
    for text in rank_texts(out, 2):
        assert NO_REPOSITORY in text, text
    assert_no_repository(prefix)
    assert not StorageReader.validate_checkpoint_id(prefix)


def test_s3_validate_checkpoint_id_is_true_for_a_repository(s3_saved_by_4):
    assert StorageReader.validate_checkpoint_id(s3_saved_by_4)


def test_s3_a_save_refused_for_its_branch_writes_nothing(tmp_path):
    prefix = _s3_prefix() + "/bad-branch"
    out = str(tmp_path / "err")
    run(2, tmp_path, save_expecting_failure, prefix, "bad name", out)
    for text in rank_texts(out, 2):
        assert "InvalidRefName" in text, text
    assert_no_repository(prefix)
