"""`_core.pyi` against the compiled extension: the same classes, methods, properties and
module constants, and every method's parameters (names, kinds, which have defaults) as
the extension reports them (``__text_signature__``)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import tensor_history
from tensor_history import _core

STUB = Path(tensor_history.__file__).with_name("_core.pyi")
# dunders the stub may declare that come from Python's own type slots (pyo3's `eq`,
# `ord`, `hash` options) rather than from a `#[pymethods]` entry with a signature
SLOT_DUNDERS = {"__eq__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__iter__",
                "__contains__", "__len__", "__getitem__", "__int__", "__index__"}

# how the extension's read-only attributes look from Python (`#[getter]`, `get_all`)
DESCRIPTORS = {"getset_descriptor", "member_descriptor"}


def _stub() -> ast.Module:
    return ast.parse(STUB.read_text())


def _stub_classes() -> dict:
    return {n.name: n for n in _stub().body if isinstance(n, ast.ClassDef)}


def _real_classes() -> dict:
    return {n: c for n, c in vars(_core).items() if isinstance(c, type)}


def _members(cls: ast.ClassDef) -> dict:
    out = {}
    for n in cls.body:
        if isinstance(n, ast.FunctionDef):
            deco = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in n.decorator_list}
            if "setter" in deco:
                continue  # a settable property: its getter was listed
            out[n.name] = ("property" if "property" in deco else
                           "staticmethod" if "staticmethod" in deco else "method", n)
    return out


def _stub_params(fn: ast.FunctionDef, drop_self: bool) -> list:
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(pos, defaults):
        out.append((arg.arg, "positional", d is not None))
    if a.vararg:
        out.append((a.vararg.arg, "var_positional", False))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "keyword_only", d is not None))
    if a.kwarg:
        out.append((a.kwarg.arg, "var_keyword", False))
    if drop_self and out and out[0][0] == "self":
        out = out[1:]
    return out


def _real_params(obj) -> list:
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional",
             inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.VAR_POSITIONAL: "var_positional",
             inspect.Parameter.KEYWORD_ONLY: "keyword_only",
             inspect.Parameter.VAR_KEYWORD: "var_keyword"}
    out = []
    for p in inspect.signature(obj).parameters.values():
        out.append((p.name, kinds[p.kind], p.default is not inspect.Parameter.empty))
    if out and out[0][0] in ("self", "cls", "$self"):
        out = out[1:]
    return out


def test_stub_declares_exactly_the_extensions_classes_and_constants():
    stub = _stub()
    stub_classes = set(_stub_classes())
    consts = {t.id for n in stub.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    real = set(_real_classes())
    assert stub_classes == real
    real_consts = {n for n, v in vars(_core).items()
                   if not n.startswith("_") and not isinstance(v, type)
                   and not inspect.ismodule(v)}
    assert real_consts <= consts, real_consts - consts


@pytest.mark.parametrize("name", sorted(_real_classes()))
def test_stub_class_matches_the_extension(name):
    real = _real_classes()[name]
    stub = _members(_stub_classes()[name])
    public = {k for k in vars(real) if not k.startswith("_")}
    assert public == {k for k in stub if not k.startswith("_")}, name
    for member, (kind, fn) in stub.items():
        if member == "__init__":
            assert _stub_params(fn, True) == _real_params(real), f"{name}()"
            continue
        assert hasattr(real, member), f"{name}.{member} is not in the extension"
        raw = inspect.getattr_static(real, member)
        if kind == "property":
            assert type(raw).__name__ in DESCRIPTORS, f"{name}.{member}"
            continue
        assert type(raw).__name__ not in DESCRIPTORS, f"{name}.{member} is a property"
        assert (kind == "staticmethod") == isinstance(raw, staticmethod), f"{name}.{member}"
        if member in SLOT_DUNDERS:
            continue
        target = getattr(real, member)
        if getattr(target, "__text_signature__", None) is None:
            continue
        assert _stub_params(fn, kind == "method") == _real_params(target), f"{name}.{member}"


def test_every_method_with_a_signature_is_checked():
    # The check above compares parameters through __text_signature__: every public
    # method of the extension has one, so none escapes it.
    for name, cls in _real_classes().items():
        for member, raw in vars(cls).items():
            if member.startswith("_") or type(raw).__name__ in DESCRIPTORS:
                continue
            assert getattr(getattr(cls, member), "__text_signature__", None), f"{name}.{member}"
