"""Docstring audit of the public Python API.

Every public class, function, method and property of the package has a docstring, and
every parameter (other than ``self``, ``cls``, ``*args`` and ``**kwargs``) is named in
it. Public means: listed in the module's ``__all__`` (every public module has one), and
the public methods and properties of those classes, including what they inherit from
the package's own base classes.

Two sources are audited:

- the modules as Python sees them (``tensor_history`` with the errors,
  ``tensor_history.torch``, ``.torch.dcp``, ``.tf``, ``.keras``, ``.jax``). The
  framework modules import without their framework (they import it on first use), so
  they are audited here whether or not it is installed; ``tensor_history.torch.dcp``
  subclasses torch's storage classes and needs torch, so without torch its source is
  audited instead (parsed with ``ast``).
- ``_core.pyi``, the stubs of the classes implemented in Rust: type checkers, editors
  and the API reference (pdoc) read their docstrings there. The compiled classes'
  runtime docstrings (``help()``, from the Rust doc comments) must exist too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

import tensor_history

PACKAGE = Path(tensor_history.__file__).parent
STUB = PACKAGE / "_core.pyi"
MODULES = ["tensor_history", "tensor_history.torch", "tensor_history.torch.dcp",
           "tensor_history.tf", "tensor_history.keras", "tensor_history.jax",
           "tensor_history.lightning", "tensor_history.ray"]
# Modules whose import needs their framework: audited from source when it is absent.
NEEDS = {"tensor_history.torch.dcp": "torch",
         # CheckpointIO subclasses Lightning's: made when first asked for.
         "tensor_history.lightning": "lightning.pytorch"}
SKIP_PARAMS = {"self", "cls"}


def _mentions(doc: str, name: str) -> bool:
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", doc) is not None


def _param_problems(where: str, doc: str, params: List[Tuple[str, str]]) -> List[str]:
    out = []
    for name, kind in params:
        if name in SKIP_PARAMS or kind in ("var_positional", "var_keyword"):
            continue
        if not _mentions(doc, name):
            out.append(f"{where}: parameter {name!r} is not mentioned in the docstring")
    return out


# --------------------------------------------------------------------------- runtime

_KINDS = {inspect.Parameter.VAR_POSITIONAL: "var_positional",
          inspect.Parameter.VAR_KEYWORD: "var_keyword"}


def _signature_params(obj) -> Optional[List[Tuple[str, str]]]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [(p.name.lstrip("$"), _KINDS.get(p.kind, "named")) for p in sig.parameters.values()]


def _own(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("tensor_history")


def audit_function(where: str, fn, check_params: bool = True) -> List[str]:
    doc = fn.__doc__ or ""
    if not doc.strip():
        return [f"{where}: no docstring"]
    if not check_params:
        return []
    params = _signature_params(fn)
    return _param_problems(where, doc, params or [])


def _class_members(cls: type) -> Iterator[Tuple[str, object]]:
    """(name, raw attribute) of the public members the class defines or inherits from the
    package's own classes (nearest definition first)."""
    seen = set()
    for klass in cls.__mro__:
        if not _own(klass):
            continue
        for name, raw in vars(klass).items():
            if name in seen or (name.startswith("_") and name != "__init__"):
                continue
            seen.add(name)
            yield name, raw


def audit_class(where: str, cls: type, compiled: bool = False) -> List[str]:
    """Problems of class `cls`. For a class compiled from Rust (`compiled`), only that its
    members have runtime docstrings: their parameters are checked in the stubs."""
    problems = []
    cdoc = cls.__dict__.get("__doc__") or ""
    if not cdoc.strip():
        problems.append(f"{where}: no class docstring")
    for name, raw in _class_members(cls):
        at = f"{where}.{name}"
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property) or type(raw).__name__ in ("getset_descriptor",
                                                                 "member_descriptor"):
            if not (raw.__doc__ or "").strip():
                problems.append(f"{at}: no docstring")
            continue
        if not callable(raw):
            continue  # a class attribute (constant)
        if name == "__init__":
            if compiled or not hasattr(raw, "__code__"):
                continue  # a builtin's constructor (exceptions): documented by the class
            params = _signature_params(raw) or []
            problems += _param_problems(f"{where}()", cdoc + "\n" + (raw.__doc__ or ""), params)
            continue
        problems += audit_function(at, raw, check_params=not compiled)
    return problems


def audit_module(mod: types.ModuleType) -> List[str]:
    problems = []
    if not (mod.__doc__ or "").strip():
        problems.append(f"{mod.__name__}: no module docstring")
    names = getattr(mod, "__all__", None)
    if names is None:
        return problems + [f"{mod.__name__}: no __all__"]
    core = getattr(tensor_history, "_core", None)
    for name in names:
        obj = getattr(mod, name)
        where = f"{mod.__name__}.{name}"
        if isinstance(obj, type):
            compiled = core is not None and getattr(core, name, None) is obj
            problems += audit_class(where, obj, compiled=compiled)
        elif callable(obj):
            problems += audit_function(where, obj)
        # constants (ints, strings) carry no docstring of their own
    return problems


# --------------------------------------------------------------------------- source

def _ast_params(fn: ast.FunctionDef) -> List[Tuple[str, str]]:
    a = fn.args
    out = [(x.arg, "named") for x in a.posonlyargs + a.args + a.kwonlyargs]
    if a.vararg:
        out.append((a.vararg.arg, "var_positional"))
    if a.kwarg:
        out.append((a.kwarg.arg, "var_keyword"))
    return out


def _decorators(fn: ast.FunctionDef) -> set:
    return {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in fn.decorator_list}


def _audit_ast_class(where: str, cls: ast.ClassDef) -> List[str]:
    problems = []
    cdoc = ast.get_docstring(cls) or ""
    if not cdoc.strip():
        problems.append(f"{where}: no class docstring")
    defs = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in defs:
        deco = _decorators(node)
        if "setter" in deco:
            continue  # the getter carries the docstring
        if "overload" in deco:
            same = [n for n in defs if n.name == node.name]
            if any("overload" not in _decorators(n) for n in same):
                continue  # the implementation carries the docstring
            if node is not same[-1]:
                continue
            # A stub's overloads without an implementation: one of them carries the
            # docstring, which names the parameters of all of them.
            doc = "\n".join(ast.get_docstring(n) or "" for n in same)
            if not doc.strip():
                problems.append(f"{where}.{node.name}: no docstring")
                continue
            params = [p for n in same for p in _ast_params(n)]
            problems += _param_problems(f"{where}.{node.name}", doc, list(dict.fromkeys(params)))
            continue
        at = f"{where}.{node.name}"
        if node.name == "__init__":
            doc = cdoc + "\n" + (ast.get_docstring(node) or "")
            problems += _param_problems(f"{where}()", doc, _ast_params(node))
            continue
        if node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node) or ""
        if not doc.strip():
            problems.append(f"{at}: no docstring")
            continue
        if "property" not in deco:
            problems += _param_problems(at, doc, _ast_params(node))
    return problems


def audit_source(source: str, name: str, only: Optional[List[str]] = None) -> List[str]:
    """Problems of the classes and functions of a module's source (or a stub's): those in
    `only` (the module's ``__all__``), else every name without a leading underscore."""
    tree = ast.parse(source)
    problems = []
    for node in tree.body:
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if (only is not None and node.name not in only) or (
                only is None and node.name.startswith("_")):
            continue
        where = f"{name}.{node.name}"
        if isinstance(node, ast.ClassDef):
            problems += _audit_ast_class(where, node)
        else:
            doc = ast.get_docstring(node) or ""
            problems += ([f"{where}: no docstring"] if not doc.strip()
                         else _param_problems(where, doc, _ast_params(node)))
    return problems


def _literal_all(source: str) -> List[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("no literal __all__")


# --------------------------------------------------------------------------- tests

def _framework_present(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_of_the_module_is_documented(module):
    need = NEEDS.get(module)
    if need and not _framework_present(need):
        path = PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
        source = path.read_text()
        problems = audit_source(source, module, only=_literal_all(source))
    else:
        problems = audit_module(importlib.import_module(module))
    assert not problems, "\n".join(problems)


def test_the_framework_modules_import_without_their_framework():
    # What the audit above and the API reference rely on: these modules import their
    # framework on first use. Run in a process where the frameworks cannot be imported.
    import subprocess

    code = textwrap.dedent("""
        import sys
        for f in ("torch", "tensorflow", "keras", "jax", "jaxlib", "flax", "optax",
                  "lightning", "pytorch_lightning", "ray"):
            sys.modules[f] = None
        import tensor_history.torch, tensor_history.tf, tensor_history.keras
        import tensor_history.jax, tensor_history.lightning, tensor_history.ray
        try:
            import tensor_history.torch.dcp
        except ImportError as e:
            assert "needs torch" in str(e), e
        else:
            raise AssertionError("tensor_history.torch.dcp imported without torch")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_class_and_method_of_the_stubs_is_documented():
    problems = audit_source(STUB.read_text(), "_core.pyi")
    assert not problems, "\n".join(problems)


def test_the_compiled_classes_have_runtime_docstrings():
    from tensor_history import _core

    problems = []
    for name, obj in vars(_core).items():
        if isinstance(obj, type) and not name.startswith("_"):
            problems += audit_class(f"_core.{name}", obj, compiled=True)
    assert not problems, "\n".join(problems)


# The audit itself, on deliberately undocumented code: what it must report.

def test_the_audit_reports_what_a_module_lacks():
    mod = types.ModuleType("tensor_history_fake", "A module.")

    def documented(a, *args, b=1, **kwargs):
        """Uses `a` and b."""

    def bare(x):
        pass

    def unnamed(x, y):
        """Mentions x only (yy is another word)."""

    class Thing:
        """A thing."""

        def __init__(self, size, colour):
            """``size`` only."""

        @property
        def weight(self):
            return 1

        @staticmethod
        def make(n):
            return n

        def _private(self):
            pass

    for f in (documented, bare, unnamed, Thing):
        f.__module__ = "tensor_history_fake"
        setattr(mod, f.__name__, f)
    mod.__all__ = ["documented", "bare", "unnamed", "Thing"]
    assert sorted(audit_module(mod)) == sorted([
        "tensor_history_fake.bare: no docstring",
        "tensor_history_fake.unnamed: parameter 'y' is not mentioned in the docstring",
        "tensor_history_fake.Thing(): parameter 'colour' is not mentioned in the docstring",
        "tensor_history_fake.Thing.weight: no docstring",
        "tensor_history_fake.Thing.make: no docstring",
    ])
    del mod.__all__
    assert audit_module(mod)[-1] == "tensor_history_fake: no __all__"


def test_the_audit_reports_what_a_stub_lacks():
    stub = textwrap.dedent('''
        from typing import overload
        class Documented:
            """Fine."""
            def __init__(self, *, size: int) -> None: ...
            @property
            def p(self) -> int: ...
            @overload
            def f(self, a: int) -> int: ...
            def f(self, a: int, b: int = 0) -> int:
                """Takes a."""
            @overload
            def h(self, x: int) -> int: ...
            @overload
            def h(self, x: str, y: str) -> str:
                """Takes x."""
            @overload
            def k(self) -> int: ...
            @overload
            def k(self, z: str) -> str: ...
            def g(self, *args: int, **kw: int) -> None:
                """Takes anything."""
            def _hidden(self) -> None: ...
        class Bare:
            pass
        def top(q: int) -> None: ...
    ''')
    assert audit_source(stub, "s") == [
        "s.Documented(): parameter 'size' is not mentioned in the docstring",
        "s.Documented.p: no docstring",
        "s.Documented.f: parameter 'b' is not mentioned in the docstring",
        "s.Documented.h: parameter 'y' is not mentioned in the docstring",
        "s.Documented.k: no docstring",
        "s.Bare: no class docstring",
        "s.top: no docstring",
    ]
