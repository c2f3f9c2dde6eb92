"""The Store API as a typed program uses it: `mypy --strict` checks this file against the
installed package's stubs (`_core.pyi`, `py.typed`) in CI, and running it checks that
what the annotations claim is what the calls return.

    python tests/typed_usage.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import numpy.typing as npt

import tensor_history as th


def main() -> int:
    store = th.Store(chunk_bytes=1024, max_versions=None)
    w: npt.NDArray[np.float32] = np.zeros((16, 64), np.float32)  # 4 chunks of 1 KiB
    store.insert("w", w)
    v0: th.Version = store.commit("init", lr=0.1, step=0)

    w[0, 0] = 1.0
    ws: th.WriteStats = store.write("w", w)
    assert (ws.chunks_changed, ws.chunks_total) == (1, 4), ws
    v1 = store.commit("step", loss=0.5, step=1)
    assert v0 < v1 and store.parent(v1) == v0 and store.children(v0) == [v1]

    restored: th.Version = store.restore(v0, into={"w": w}, known=v1)
    assert restored == v0 and w[0, 0] == 0.0
    out: dict[str, th.WriteStats] = store.write_into({"w": w}, at=v1)
    assert out["w"].chunks_changed == 1 and w[0, 0] == 1.0

    store.branch("trial", at=v1)
    store.tag("baseline", at=v0)
    refs: list[tuple[str, str, th.Version]] = store.refs()
    assert ("baseline", "tag", v0) in refs
    store.checkout("trial")
    assert store.current_branch() == "trial" and store.resolve("baseline") == v0

    changes: dict[str, th.Change] = store.diff(v0, v1)
    assert changes["w"].kind == "changed" and changes["w"].chunks == [0], changes
    log: list[th.LogEntry] = store.log()
    assert [e.message for e in log] == ["step", "init"] and log[0].metadata["step"] == 1

    snap: th.Snapshot = store.snapshot(v0)
    a: np.ndarray = snap["w"]
    assert snap.id == v0 and a[0, 0] == 0.0 and snap.keys() == ["w"]
    assert len(store.version_hash(v1)) == 64

    stats: th.Stats = store.stats()
    assert stats.versions == 2 and stats.sharing_ratio > 1.0, stats
    pruned: th.PruneStats = store.prune(keep_last=1)
    assert isinstance(pruned.kept, int)

    try:
        store.get("missing")
    except th.UnknownVariable as e:  # a KeyError too
        assert isinstance(e, KeyError)
    else:
        raise AssertionError("get of a missing variable returned")

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "repo")
        saved: th.SaveStats = store.save_as(path)
        assert saved.versions_written >= 1
        with th.Store.open(path, create=False) as again:
            assert again.location is not None and again.open_fallback is None
            assert np.array_equal(again.get("w", at="trial"), store.get("w", at="trial"))
    print("typed usage: every call returned what its annotation says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
