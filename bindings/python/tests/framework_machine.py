"""A hypothesis state machine for the in-place trackers of the frameworks (TensorFlow,
Keras on each backend, Flax NNX), against an oracle of NumPy copies.

A framework test module subclasses :class:`TrackerMachine` with an adapter: ``make``
builds a small model whose variables have the given dtype, ``values`` copies every
variable into NumPy (by store name), ``assign`` sets one, ``track`` starts a tracker.
Rules: change a variable, commit, restore any version, trial with keep or revert, branch,
checkout, save and reopen (a new model with other values, resumed from the repository).
After every step the model holds exactly the oracle's working values.
"""

from __future__ import annotations

import shutil
import tempfile

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conftest import same

DTYPES = ["float32", "float16", "bfloat16"]
BRANCHES = ["x", "y"]


class TrackerMachine(RuleBasedStateMachine):
    # ---- the adapter -------------------------------------------------------------------

    def make(self, dtype: str, seed: int):
        raise NotImplementedError

    def values(self, model) -> dict:
        raise NotImplementedError

    def assign(self, model, name: str, value: np.ndarray) -> None:
        raise NotImplementedError

    def track(self, model, **kw):
        raise NotImplementedError

    # ---- the machine -------------------------------------------------------------------

    @initialize(dtype=st.sampled_from(DTYPES))
    def setup(self, dtype: str) -> None:
        self.dtype = dtype
        self.dir = tempfile.mkdtemp(prefix="th-fw-machine-")
        self.model = self.make(dtype, 0)
        self.tracker = self.track(self.model)
        self.working = self.values(self.model)
        head = self.tracker.store.head()
        self.versions = {head: self.copy(self.working)}
        self.branches = {"main": head}
        self.attached = "main"
        self.saved = False

    def teardown(self) -> None:
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    @staticmethod
    def copy(d: dict) -> dict:
        return {k: v.copy() for k, v in d.items()}

    def head(self):
        return self.tracker.store.head()

    def moved(self, v) -> None:
        if self.attached is not None:
            self.branches[self.attached] = v

    @rule(data=st.data(), scale=st.sampled_from([0.5, 2.0, -1.0]))
    def change(self, data, scale: float) -> None:
        name = data.draw(st.sampled_from(sorted(self.working)))
        new = (self.working[name].astype(np.float32) * scale + 1.0).astype(self.working[name].dtype)
        self.assign(self.model, name, new)
        self.working[name] = new

    @rule()
    def commit(self) -> None:
        v = self.tracker.commit("c")
        self.versions[v] = self.copy(self.working)
        self.moved(v)

    @rule(data=st.data())
    def restore(self, data) -> None:
        v = data.draw(st.sampled_from(sorted(self.versions)))
        self.tracker.restore(v)
        self.moved(v)  # the branch HEAD is on follows
        self.working = self.copy(self.versions[v])

    @rule(keep=st.booleans(), scale=st.sampled_from([0.5, 3.0]))
    def trial(self, keep: bool, scale: float) -> None:
        entry_dirty = any(not same(a, self.versions[self.head()][k])
                          for k, a in self.working.items())
        before = self.head()
        with self.tracker.trial() as t:
            # A changed state at entry is committed as the trial's base; so may be a
            # state changed back to HEAD's values (the tracker's identity checks see the
            # writes, not the values), which holds HEAD's values then.
            assert entry_dirty <= (t.base != before)
            if t.base != before:
                self.versions[t.base] = self.copy(self.working)
                self.moved(t.base)
            name = sorted(self.working)[0]
            new = (self.working[name].astype(np.float32) * scale).astype(self.working[name].dtype)
            self.assign(self.model, name, new)
            if keep:
                v = t.keep()
        if keep:
            self.working[name] = new
            self.versions[v] = self.copy(self.working)
            self.moved(v)

    @rule(name=st.sampled_from(BRANCHES))
    def branch(self, name: str) -> None:
        if name in self.branches:
            return
        self.tracker.branch(name)
        self.branches[name] = self.head()

    @precondition(lambda self: len(self.branches) > 1)
    @rule(data=st.data())
    def checkout(self, data) -> None:
        name = data.draw(st.sampled_from(sorted(self.branches)))
        v = self.tracker.checkout(name)
        assert v == self.branches[name]
        self.attached = name
        self.working = self.copy(self.versions[v])

    @rule()
    def save_and_reopen(self) -> None:
        """Save, then a new model with other values resumes from the repository."""
        self.tracker.commit("before save")
        v = self.head()
        self.versions[v] = self.copy(self.working)
        self.moved(v)
        if self.saved:
            self.tracker.save()
        else:
            self.tracker.save(self.dir)
        self.saved = True
        store = self.tracker.store
        hashes = {k: store.version_hash(k) for k in self.versions}
        self.model = self.make(self.dtype, 1)
        self.tracker = self.track(self.model, path=self.dir)
        r = self.tracker.store
        assert r.version_hash(r.head()) == hashes[v]
        # the versions a ref or HEAD reaches come back (under new ids)
        new = {}
        for k, h in hashes.items():
            try:
                new[k] = r.resolve(h)
            except KeyError:  # not reachable from a ref: not saved
                pass
        self.versions = {new[k]: d for k, d in self.versions.items() if k in new}
        self.branches = {b: new[x] for b, x in self.branches.items() if x in new}
        self.attached = r.current_branch()
        self.working = self.copy(self.versions[r.head()])

    @invariant()
    def model_holds_the_working_values(self) -> None:
        if not hasattr(self, "model"):
            return
        live = self.values(self.model)
        assert live.keys() == self.working.keys()
        for k in live:
            assert same(live[k], self.working[k]), k
