"""The tests' own layout: no test module imports another test module.

What several test modules share lives in ``tests/catalogue/`` (or in an underscore support
module beside them), so a test module can be read, run and deleted on its own. Imports are
read with ``ast`` (nothing is imported), at any depth (inside functions too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TEST_MODULES = sorted(TESTS.rglob("test_*.py"))


def package_of(path: Path) -> tuple[str, ...]:
    """The dotted package of a file under tests/, e.g. ("tests", "engine")."""
    return path.relative_to(TESTS.parent).with_suffix("").parts[:-1]


def imported_modules(source: str, package: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, dotted name) of every module ``source`` imports (and of every name it imports
    from a module, which may be a module), relative imports resolved within ``package``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            # ``from tests.engine import test_any_order`` imports a module too
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts[1:])


def test_the_check_sees_test_module_imports():
    assert is_test_module("tests.engine.test_any_order")
    assert is_test_module("tests.engine.test_any_order.TARGETS")
    assert not is_test_module("tests.catalogue.targets")
    assert not is_test_module("tests.oracles._oracle_reference")
    assert not is_test_module("pytest")


@pytest.mark.parametrize("path", TEST_MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_module_imports_another(path):
    offending = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {name}"
        for line, name in imported_modules(path.read_text(), package_of(path))
        if is_test_module(name)
    ]
    assert not offending, (
        "a test module imports another test module; move what they share to tests/catalogue/:\n"
        + "\n".join(offending)
    )


def test_the_check_resolves_every_form_of_import():
    """Absolute, from-package and relative imports of a test module are all caught; imports
    from the catalogue and support modules are not."""
    source = (
        "import tests.engine.test_rows\n"
        "from tests.engine import test_keys\n"
        "from .test_any_order import TARGETS\n"
        "from . import test_modes\n"
        "from ..oracles.test_hmm import x\n"
        "def f():\n"
        "    from tests.infer.test_map import y\n"
        "from tests.catalogue.targets import TARGETS\n"
        "from ._user_oracles import z\n"
        "import torch\n"
    )
    flagged = [
        (line, name)
        for line, name in imported_modules(source, ("tests", "engine"))
        if is_test_module(name)
    ]
    lines = sorted({line for line, _ in flagged})
    assert lines == [1, 2, 3, 4, 5, 7]
    names = {name for _, name in flagged}
    assert {"tests.engine.test_any_order", "tests.engine.test_modes"} <= names
    assert "tests.oracles.test_hmm" in names
