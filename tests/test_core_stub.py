"""The type stub _core.pyi declares everything the compiled _core binds, and the package says
it is typed (py.typed): a binding added without its stub entry fails here."""

import ast
from pathlib import Path

import flux_dnn
from flux_dnn import _core

PACKAGE = Path(flux_dnn.__file__).parent


def stub_names() -> tuple:
    """(module-level names, {class name: member names}) declared in _core.pyi."""
    tree = ast.parse((PACKAGE / "_core.pyi").read_text(encoding="utf-8"))
    names, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                classes[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return names, classes


def public(obj) -> set:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_stub_declares_every_binding():
    names, _ = stub_names()
    missing = public(_core) - names
    assert not missing, f"_core binds names that _core.pyi does not declare: {sorted(missing)}"


def test_stub_declares_every_method_and_property():
    _, classes = stub_names()
    bound = [name for name in public(_core) if isinstance(getattr(_core, name), type)]
    for name in bound:
        if issubclass(getattr(_core, name), BaseException):
            continue
        missing = public(getattr(_core, name)) - classes[name]
        assert not missing, f"_core.{name} has members that _core.pyi does not declare: {sorted(missing)}"


def test_every_abi_number_is_an_int_named_after_the_header():
    for name, value in _core.ABI_CONSTANTS.items():
        assert name.startswith("FDNN_")
        if isinstance(value, int):
            assert getattr(_core, name[len("FDNN_") :]) == value, name


def test_package_is_typed():
    assert (PACKAGE / "py.typed").is_file()
