"""Accept/reject training of a small Keras model on TensorFlow: NumPy copies vs
tensor-history, side by side.

First the question this project answers, as it was asked about TensorFlow: put W and b
back to the values they had, without saving to disk. Then an MLP trained on two spirals
with Adam; each trial step (a few minibatch updates in a tf.function) is kept only if
the held-out loss did not get worse, else taken back. The same training runs twice from
the same weights: with NumPy copies of every model and optimizer variable
(``[v.numpy() for v in variables]``, ``assign`` back on rejection, the answer the
question got) and with ``tensor_history.tf`` (a trial, ``keep()`` on accept). The
program exits non-zero unless both end bit-identical.

    python examples/python/tf_accept_reject.py [--hidden 256] [--steps 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

for k, v in {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_NUM_INTEROP_THREADS": "1",
             "TF_NUM_INTRAOP_THREADS": "1"}.items():
    os.environ.setdefault(k, v)

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import tensorflow as tf  # noqa: E402

import tensor_history as th  # noqa: E402
import tensor_history.tf  # noqa: E402,F401

keras = tf.keras


def seed_question() -> None:
    W = tf.Variable(tf.zeros((5, 5)))
    b = tf.Variable(tf.zeros(5))
    x = tf.ones((1, 5))
    print("the question: put W and b back without saving to disk")
    print("  y = x @ W + b with W, b zeros:", (x @ W + b).numpy()[0])
    tracker = th.tf.track([W, b])                      # remember the values
    W.assign(tf.ones((5, 5)))
    b.assign(tf.ones(5))
    print("  after assigning ones:         ", (x @ W + b).numpy()[0])
    tracker.restore(tracker.store.head())              # back, in place
    print("  after tracker.restore(...):   ", (x @ W + b).numpy()[0],
          "(repository on disk:", tracker.store.location, ")")
    print()


def spirals(n: int, rng: np.random.Generator) -> tuple[npt.NDArray[np.float32],
                                                       npt.NDArray[np.int32]]:
    t = rng.uniform(0.25, 3.0, n) * np.pi
    k = rng.integers(0, 2, n)
    r = t / (3 * np.pi)
    x = np.stack([r * np.cos(t + k * np.pi), r * np.sin(t + k * np.pi)], 1)
    x += rng.normal(0, 0.02, x.shape)
    return x.astype(np.float32), k.astype(np.int32)


def build(hidden: int, seed: int) -> tuple[Any, Any]:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(hidden, activation="tanh"),
                              keras.layers.Dense(hidden, activation="tanh"),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.Adam(1e-2)
    opt.build(model.trainable_variables)
    return model, opt


def run(kind: str, hidden: int, steps: int, seed: int, data: dict[str, Any]) -> dict[str, Any]:
    model, opt = build(hidden, seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_steps(x: Any, y: Any) -> None:
        for i in range(4):
            with tf.GradientTape() as tape:
                loss = loss_fn(y[i], model(x[i], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)

    def held_out_loss() -> Any:
        return loss_fn(data["yv"], model(data["xv"]))

    # tf.function as a call, not a decorator: TensorFlow has no type information, and
    # mypy --strict refuses untyped decorators.
    train = tf.function(train_steps)
    held_out = tf.function(held_out_loss)

    variables = list(model.variables) + list(opt.variables)
    tracker = th.tf.track(model, opt) if kind == "store" else None
    best = float(held_out())
    t_snap = t_restore = t_train = 0.0
    accepted = 0
    rng = np.random.default_rng(seed + 1)
    for step in range(steps):
        idx = rng.integers(0, len(data["x"]), (4, 32))
        x, y = tf.constant(data["x"][idx]), tf.constant(data["y"][idx])
        if kind == "copies":
            t0 = time.perf_counter()
            saved = [v.numpy() for v in variables]
            t_snap += time.perf_counter() - t0
            t0 = time.perf_counter()
            train(x, y)
            loss = float(held_out())
            t_train += time.perf_counter() - t0
            if loss <= best:
                best, accepted = loss, accepted + 1
            else:
                t0 = time.perf_counter()
                for v, a in zip(variables, saved):
                    v.assign(a)
                t_restore += time.perf_counter() - t0
        else:
            assert tracker is not None
            t0 = time.perf_counter()
            with tracker.trial("step") as t:
                t1 = time.perf_counter()
                train(x, y)
                loss = float(held_out())
                t2 = time.perf_counter()
                if loss <= best:
                    best, accepted = loss, accepted + 1
                    t.keep(loss=loss)
                t3 = time.perf_counter()
            t_train += t2 - t1
            t_snap += (t1 - t0) + (t3 - t2)
            t_restore += time.perf_counter() - t3
    logits = model(data["xt"]).numpy()
    out: dict[str, Any] = {"loss": best, "acc": float((logits.argmax(1) == data["yt"]).mean()),
           "accepted": accepted, "snap": t_snap, "restore": t_restore, "train": t_train,
           "weights": [v.numpy() for v in variables]}
    if tracker is not None:
        st = tracker.stats()
        out["held"] = st.unique_bytes
        out["versions"] = st.versions
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    seed_question()
    rng = np.random.default_rng(a.seed)
    x, y = spirals(2048, rng)
    xv, yv = spirals(256, rng)
    xt, yt = spirals(1024, rng)
    data = {"x": x, "y": y, "xv": tf.constant(xv), "yv": tf.constant(yv), "xt": xt, "yt": yt}
    c = run("copies", a.hidden, a.steps, a.seed, data)
    s = run("store", a.hidden, a.steps, a.seed, data)
    n = sum(w.size for w in c["weights"])
    print(f"MLP 2-{a.hidden}-{a.hidden}-2 on two spirals, Adam, {a.steps} trial steps of 4 "
          f"minibatch updates; keep a step if the held-out loss did not get worse\n")
    print(f"{'':32}{'NumPy copies':>16}{'tensor-history':>18}")
    print(f"{'held-out loss':32}{c['loss']:>16.6f}{s['loss']:>18.6f}")
    print(f"{'test accuracy':32}{c['acc']:>15.1%} {s['acc']:>17.1%}")
    print(f"{'steps accepted / rejected':32}{c['accepted']:>9} / {a.steps - c['accepted']:<4}"
          f"{s['accepted']:>11} / {a.steps - s['accepted']:<4}")
    print(f"{'time remembering (ms)':32}{c['snap'] * 1e3:>16.1f}{s['snap'] * 1e3:>18.1f}")
    print(f"{'time taking back (ms)':32}{c['restore'] * 1e3:>16.1f}{s['restore'] * 1e3:>18.1f}")
    print(f"{'time training (ms)':32}{c['train'] * 1e3:>16.1f}{s['train'] * 1e3:>18.1f}")
    print(f"{'variables (model + optimizer)':32}{n:>16}{n:>18}")
    print(f"{'versions kept':32}{'1 (the copy)':>16}{s['versions']:>18}")
    print("\nremembering: the copies, for NumPy copies; entering the trial and keep(), for the "
          "store\ntaking back: assign of every copy; the end of the trial (assigns the "
          "variables that changed,\n             on a rejection)")
    same = all(p.tobytes() == q.tobytes() for p, q in zip(c["weights"], s["weights"]))
    print(f"\nbit-identical results: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
