"""The type stubs of the native module name every public function, class, method and
property it has, and nothing it lacks."""

import ast
from pathlib import Path

import kvlayout
from kvlayout import _native

STUB = Path(kvlayout.__file__).with_name("_native.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = None
    return names


def test_every_native_name_has_a_stub_and_every_stub_a_name():
    stubs = stub_names()
    module = {n for n in dir(_native) if not n.startswith("__") or n == "__version__"}
    assert module - set(stubs) == set(), "native names without a stub"
    typing_helpers = {"Region", "__getattr__"}
    assert set(stubs) - module - typing_helpers == set(), "stubs of names the module lacks"
    for name, members in stubs.items():
        if members is None:
            continue
        cls = getattr(_native, name)
        public = {m for m in dir(cls) if not m.startswith("__") and m != "mro"}
        documented = {m for m in members if not m.startswith("__")}
        assert public - documented == set(), f"{name}: members without a stub"
        assert documented - public == set(), f"{name}: stubs of members it lacks"


def test_every_public_native_name_has_a_docstring():
    for name in dir(_native):
        if name.startswith("__"):
            continue
        obj = getattr(_native, name)
        if callable(obj):
            assert obj.__doc__, f"{name} has no docstring"
        if isinstance(obj, type):
            for m in dir(obj):
                if not m.startswith("__"):
                    assert getattr(obj, m).__doc__, f"{name}.{m} has no docstring"
