"""The entropy floors of benches/_floor.py (trainers_report.py --floor), checked on
tensors whose entropy is known."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benches"))

import _floor  # noqa: E402


def test_a_constant_tensor_and_a_repeated_checkpoint_cost_nothing():
    a = np.full(10_000, 1.5, np.float32)
    f = _floor.floor_of([{"w": a}, {"w": a.copy()}], _floor.earlier)
    assert f["raw"] == 2 * a.nbytes
    assert f["h0"] == 0 and f["h1"] == 0


def test_random_bytes_cost_their_size_and_a_constant_step_costs_nothing_as_a_difference():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, 200_000, dtype=np.uint32)
    whole = _floor.floor_of([{"w": a}], _floor.earlier)
    # 8 bits of entropy per byte, within the estimate's bias for 200,000 samples
    assert 0.99 * a.nbytes < whole["h0"] <= a.nbytes
    # the context model's plug-in estimate runs low on few samples per context (65,536
    # joint counts from 200,000 bytes per plane): a floor errs that way
    assert 0.95 * a.nbytes < whole["h1"] <= whole["h0"] + 1e-6
    # the next checkpoint adds 3 to every element: its difference is one value
    f = _floor.floor_of([{"w": a}, {"w": a + np.uint32(3)}], _floor.earlier)
    assert abs(f["h0"] - whole["h0"]) < 1e-6
    # without a base, the second checkpoint costs as much as the first
    alone = _floor.floor_of([{"w": a}, {"w": a + np.uint32(3)}], lambda i: [])
    assert alone["h0"] > 1.99 * whole["h0"]


def test_h1_sees_a_byte_that_follows_the_byte_above_it():
    # the low byte equals the high byte of each 16-bit element: order-0 sees two random
    # planes, the context model one
    rng = np.random.default_rng(1)
    hi = rng.integers(0, 256, 100_000, dtype=np.uint16)
    a = (hi << 8) | hi
    f = _floor.floor_of([{"w": a}], _floor.earlier)
    assert f["h0"] > 1.95 * a.size
    assert f["h1"] < 1.02 * a.size


def test_flat_tensors_finds_arrays_in_nested_containers():
    a, b = np.zeros(3, np.float32), np.ones((2, 2), np.float64)
    got = _floor.flat_tensors({"x": [a, {"y": b}], "n": 3, "s": "text"})
    assert sorted(got) == ["/x/0", "/x/1/y"]
    assert got["/x/1/y"].shape == (4,)
