"""Model-based test: random sequences of store calls against an oracle of NumPy copies.

The oracle keeps the working state, every committed version, HEAD, the branches and the
redo path as plain dicts of array copies. After every step the store must match it, and
every call the oracle says must fail raises the right exception and changes nothing.
A persistence rule saves the store to a directory and, half of the time, replaces it by
a store opened from there (the versions a ref or HEAD reaches come back; uncommitted
changes and the redo path do not).
"""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import tensor_history as th
from conftest import DTYPES, LAYOUTS, OUT_LAYOUTS, random_array, same, with_layout

NAMES = ["a", "b", "c"]
SHAPES = [(), (0,), (5,), (7, 3), (3, 0, 2), (9, 4)]
BRANCHES = ["main", "x", "y"]


class StoreMachine(RuleBasedStateMachine):
    @initialize(chunk=st.sampled_from([8, 24, 64]))
    def setup(self, chunk: int) -> None:
        self.chunk = chunk
        self.dir = tempfile.mkdtemp(prefix="th-machine-")
        self.saved_once = False
        self.store = th.Store(chunk_bytes=chunk)
        self.working: dict[str, np.ndarray] = {}
        self.versions: dict[th.Version, dict[str, np.ndarray]] = {}
        self.parent: dict[th.Version, th.Version | None] = {}
        self.head: th.Version | None = None
        self.attached: str | None = "main"  # HEAD starts on the unborn branch main
        self.branches: dict[str, th.Version] = {}
        self.redo_path: list[th.Version] = []

    # ---- oracle helpers ----------------------------------------------------------------

    def dirty(self) -> bool:
        if self.head is None:
            return bool(self.working)
        ref = self.versions[self.head]
        return ref.keys() != self.working.keys() or any(
            not same(ref[k], self.working[k]) for k in ref
        )

    def move_head(self, v: th.Version) -> None:
        self.head = v
        if self.attached is not None:
            self.branches[self.attached] = v

    def load(self, v: th.Version) -> None:
        self.working = {k: a.copy() for k, a in self.versions[v].items()}

    def targets(self, v: th.Version, seed: int, layout: str, names: list[str]) -> dict:
        """Caller-owned arrays for `into=`: the working values where they fit, else noise."""
        rng = np.random.default_rng(seed)
        out = {}
        for n in names:
            want = self.versions[v][n]
            cur = self.working.get(n)
            base = cur if cur is not None and cur.dtype == want.dtype and cur.shape == want.shape else random_array(rng, want.dtype, want.shape)
            out[n] = with_layout(base, layout)
        return out

    def check_targets(self, v: th.Version, into: dict) -> None:
        for n, arr in into.items():
            assert same(arr, self.versions[v][n]), n

    def expect_unchanged(self, exc: type, call) -> None:
        before = {k: self.store.get(k) for k in self.store.names()}
        head, branch = self.store.head(), self.store.current_branch()
        with pytest.raises(exc):
            call()
        assert self.store.head() == head and self.store.current_branch() == branch
        assert self.store.names() == sorted(before)
        for k, a in before.items():
            assert same(self.store.get(k), a)

    # ---- rules -------------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES), dtype=st.sampled_from(DTYPES), shape=st.sampled_from(SHAPES),
          layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1))
    def insert(self, name, dtype, shape, layout, seed):
        a = random_array(np.random.default_rng(seed), dtype, shape)
        if name in self.working:
            self.expect_unchanged(th.VariableExists, lambda: self.store.insert(name, with_layout(a, layout)))
            return
        self.store.insert(name, with_layout(a, layout))
        self.working[name] = a.copy()

    @rule(name=st.sampled_from(NAMES), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1),
          frac=st.sampled_from([0.0, 0.1, 1.0]), wrong=st.sampled_from([None, "shape", "dtype"]))
    def write(self, name, layout, seed, frac, wrong):
        rng = np.random.default_rng(seed)
        if name not in self.working:
            self.expect_unchanged(th.UnknownVariable, lambda: self.store.write(name, np.zeros(3)))
            return
        cur = self.working[name]
        if wrong == "shape":
            bad = np.zeros(cur.shape + (2,), dtype=cur.dtype)
            self.expect_unchanged(th.ShapeMismatch, lambda: self.store.write(name, bad))
            return
        if wrong == "dtype":
            other = DTYPES[(DTYPES.index(cur.dtype) + 1) % len(DTYPES)]
            self.expect_unchanged(th.DTypeMismatch, lambda: self.store.write(name, np.zeros(cur.shape, other)))
            return
        new = cur.copy()
        flat = new.reshape(-1)
        noise = random_array(rng, cur.dtype, cur.shape).reshape(-1)
        mask = rng.random(flat.shape[0]) < frac
        flat[mask] = noise[mask]
        stats = self.store.write(name, with_layout(new, layout))
        assert stats.chunks_changed <= stats.chunks_total
        if same(new, cur):
            assert stats.chunks_changed == 0
        self.working[name] = new

    @rule(name=st.sampled_from(NAMES))
    def remove(self, name):
        if name not in self.working:
            self.expect_unchanged(th.UnknownVariable, lambda: self.store.remove(name))
            return
        self.store.remove(name)
        del self.working[name]

    @rule(step=st.integers(0, 100))
    def commit(self, step):
        v = self.store.commit(f"c{step}", step=step)
        assert v not in self.versions
        self.versions[v] = {k: a.copy() for k, a in self.working.items()}
        self.parent[v] = self.head
        self.move_head(v)
        self.redo_path.clear()
        assert self.store.metadata(v) == {"step": step}

    @precondition(lambda self: self.versions)
    @rule(data=st.data(), use_into=st.booleans(), use_known=st.booleans(),
          layout=st.sampled_from(OUT_LAYOUTS), seed=st.integers(0, 2**32 - 1))
    def restore(self, data, use_into, use_known, layout, seed):
        v = data.draw(st.sampled_from(sorted(self.versions)))
        into = None
        known = None
        if use_into:
            names = sorted(self.versions[v])
            if use_known and self.head is not None and not self.dirty():
                # the arrays hold HEAD's values (where HEAD has the variable with this layout)
                into = {}
                for n in names:
                    h = self.versions[self.head].get(n)
                    w = self.versions[v][n]
                    if h is not None and h.dtype == w.dtype and h.shape == w.shape:
                        into[n] = with_layout(h, layout)
                known = self.head
            else:
                into = self.targets(v, seed, layout, names)
        assert self.store.restore(v, into=into, known=known) == v
        self.load(v)
        self.move_head(v)
        self.redo_path.clear()
        if into:
            self.check_targets(v, into)

    @rule(use_into=st.booleans(), layout=st.sampled_from(OUT_LAYOUTS), seed=st.integers(0, 2**32 - 1))
    def undo(self, use_into, layout, seed):
        if self.dirty():
            self.expect_unchanged(th.UncommittedChanges, self.store.undo)
            return
        if self.head is None or self.parent[self.head] is None:
            self.expect_unchanged(th.NothingToUndo, self.store.undo)
            return
        p = self.parent[self.head]
        into = self.targets(p, seed, layout, sorted(self.versions[p])) if use_into else None
        assert self.store.undo(into=into) == p
        self.redo_path.append(self.head)
        self.move_head(p)
        self.load(p)
        if into:
            self.check_targets(p, into)

    @rule(use_into=st.booleans(), layout=st.sampled_from(OUT_LAYOUTS), seed=st.integers(0, 2**32 - 1))
    def redo(self, use_into, layout, seed):
        if self.dirty():
            self.expect_unchanged(th.UncommittedChanges, self.store.redo)
            return
        if not self.redo_path:
            self.expect_unchanged(th.NothingToRedo, self.store.redo)
            return
        n = self.redo_path[-1]
        into = self.targets(n, seed, layout, sorted(self.versions[n])) if use_into else None
        assert self.store.redo(into=into) == n
        self.redo_path.pop()
        self.move_head(n)
        self.load(n)
        if into:
            self.check_targets(n, into)

    @rule(name=st.sampled_from(BRANCHES))
    def branch(self, name):
        if self.head is None:
            self.expect_unchanged(th.NoCommits, lambda: self.store.branch(name))
            return
        if name in self.branches or name == self.attached:
            self.expect_unchanged(th.RefExists, lambda: self.store.branch(name))
            return
        self.store.branch(name)
        self.branches[name] = self.head

    @rule(name=st.sampled_from(BRANCHES), use_into=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def checkout(self, name, use_into, seed):
        if name not in self.branches:
            self.expect_unchanged(th.UnknownRef, lambda: self.store.checkout(name))
            return
        v = self.branches[name]
        into = self.targets(v, seed, "C", sorted(self.versions[v])) if use_into else None
        assert self.store.checkout(name, into=into) == v
        self.attached = name
        self.head = v
        self.load(v)
        self.redo_path.clear()
        if into:
            self.check_targets(v, into)

    @precondition(lambda self: self.head is not None and not self.dirty())
    @rule(keep=st.booleans(), seed=st.integers(0, 2**32 - 1), frac=st.sampled_from([0.05, 1.0]))
    def trial(self, keep, seed, frac):
        """The trial pattern on caller-owned buffers: change, sync, keep or revert in place."""
        rng = np.random.default_rng(seed)
        bufs = {k: a.copy() for k, a in self.working.items()}
        for b in bufs.values():
            flat = b.reshape(-1)
            noise = random_array(rng, b.dtype, b.shape).reshape(-1)
            mask = rng.random(flat.shape[0]) < frac
            flat[mask] = noise[mask]
        self.store.sync(bufs)
        if keep:
            v = self.store.commit("kept")
            self.versions[v] = {k: a.copy() for k, a in bufs.items()}
            self.parent[v] = self.head
            self.move_head(v)
            self.redo_path.clear()
            self.working = {k: a.copy() for k, a in bufs.items()}
        else:
            self.store.restore(self.head, into=bufs, known=None)
            self.redo_path.clear()
            self.check_targets(self.head, bufs)

    @precondition(lambda self: self.head is not None)
    @rule()
    def save(self):
        self.save_then(reopen=False)

    @precondition(lambda self: self.head is not None)
    @rule()
    def save_and_reopen(self):
        self.save_then(reopen=True)

    def save_then(self, reopen: bool) -> None:
        s = self.store
        stats = s.save() if self.saved_once else s.save_as(self.dir)
        self.saved_once = True
        assert s.location is not None
        again = s.save()
        assert again.versions_written == 0 and again.chunks_written == 0
        if not reopen:
            return
        # What a reopened store holds: versions reachable from the branches and HEAD.
        roots = list(self.branches.values()) + ([self.head] if self.head is not None else [])
        reach, stack = set(), roots
        while stack:
            v = stack.pop()
            if v is None or v in reach:
                continue
            reach.add(v)
            stack.append(self.parent[v])
        hashes = {v: s.version_hash(v) for v in reach}
        assert stats.versions_written <= len(reach)
        self.store = r = th.Store.open(self.dir, chunk_bytes=self.chunk)
        new = {v: r.resolve(h) for v, h in hashes.items()}
        assert sorted(r.versions()) == sorted(new.values())
        self.versions = {new[v]: self.versions[v] for v in reach}
        self.parent = {new[v]: (new[self.parent[v]] if self.parent[v] is not None else None)
                       for v in reach}
        self.branches = {b: new[v] for b, v in self.branches.items()}
        self.head = new[self.head] if self.head is not None else None
        self.working = {} if self.head is None else {
            k: a.copy() for k, a in self.versions[self.head].items()}
        self.redo_path = []

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- invariants --------------------------------------------------------------------

    @invariant()
    def matches_oracle(self):
        if not hasattr(self, "store"):
            return
        s = self.store
        assert s.names() == sorted(self.working)
        for k, a in self.working.items():
            assert same(s.get(k), a), k
        assert s.head() == self.head
        assert s.current_branch() == self.attached
        assert s.is_dirty() == self.dirty()
        for name, v in self.branches.items():
            assert s.resolve(name) == v
        s.verify()

    @invariant()
    def versions_are_immutable(self):
        if not hasattr(self, "store"):
            return
        for v, snap in list(self.versions.items())[-3:]:
            got = self.store.snapshot(v)
            assert sorted(got.keys()) == sorted(snap)
            for k, a in snap.items():
                assert same(got[k], a)


StoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestStoreMachine = StoreMachine.TestCase
