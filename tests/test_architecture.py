"""The layout of the packages holds: no package imports one above it, and the modules of this
package import each other at module level only (docs/architecture.md draws the graph).

Every module's imports are read with ``ast`` (nothing is imported), so a violation is named
with its file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pyro_autospec"

#: The floors of the house, from the ground up: a part may import parts on lower floors only
#: (and itself). A part is a subpackage or a module directly under ``pyro_autospec/``.
FLOORS = [
    {"_shapes", "_warnings", "parallel"},  # nothing of this library
    {"engine"},  # the sampler and its protocols; Pyro-free
    {"oracles", "distributions"},  # exact Pyro-free oracles; Pyro distributions of the engine
    {"model"},  # reading a Pyro model, its enumeration oracle
    {"diagnostics"},
    {"guides"},
    {"infer"},  # the front end: AutoSpec, AutoSpecKernel
    {"demo"},
    {"__main__"},
]
FLOOR = {part: number for number, parts in enumerate(FLOORS) for part in parts}

#: Parts that never import Pyro, even lazily.
PYRO_FREE = {"_shapes", "_warnings", "parallel", "engine", "oracles"}

#: Function-level imports of this package still allowed: (module file, imported module).
FUNCTION_LEVEL_ALLOWED: set[tuple[str, str]] = set()


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def part_of(name: str) -> str | None:
    """The part of ``pyro_autospec.X...``: ``X``; ``None`` for the top-level package."""
    pieces = name.split(".")
    return pieces[1] if len(pieces) > 1 else None


def imports(path: Path, root: Path = ROOT):
    """``(line, imported module, inside a function)`` for every import of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nested = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            nested.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join(base + ([node.module] if node.module else []))]
            else:
                targets = [node.module]
        else:
            continue
        for target in targets:
            yield node.lineno, target, id(node) in nested


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_every_part_has_a_floor():
    parts = {part_of(module_name(p)) for p in modules()} - {None}
    assert parts <= set(FLOOR), f"parts without a floor in FLOORS: {sorted(parts - set(FLOOR))}"


def upward_imports(root: Path = ROOT) -> list[str]:
    """Every import of a part on the same floor or above (the top-level package included),
    in the package under ``root``."""
    upward = []
    for path in sorted((root / "pyro_autospec").rglob("*.py")):
        own = part_of(module_name(path, root))
        if own is None:  # the top-level package: the face, which may hand on any part
            continue
        here = path.relative_to(root)
        for line, target, _ in imports(path, root):
            if target == "pyro_autospec":  # the face, above every part
                upward.append(f"{here}:{line}: {own} imports the top-level package")
                continue
            other = part_of(target) if target.startswith("pyro_autospec.") else None
            if other is not None and other != own and FLOOR[other] >= FLOOR[own]:
                upward.append(f"{here}:{line}: {own} imports {target}")
    return upward


def test_no_part_imports_a_part_above_it():
    upward = upward_imports()
    assert not upward, "imports of a part on the same floor or above:\n" + "\n".join(upward)


def test_an_import_of_the_top_level_package_from_a_part_is_upward(tmp_path):
    """``from pyro_autospec import X`` inside a part reads the face, which imports every part:
    an upward import that ``part_of`` alone (``None`` for the top) would let through."""
    engine = tmp_path / "pyro_autospec" / "engine"
    engine.mkdir(parents=True)
    (engine / "sneaky.py").write_text("from pyro_autospec import AutoSpec\n", encoding="utf-8")
    (engine / "fine.py").write_text("from pyro_autospec.engine import keys\n", encoding="utf-8")
    (engine / "down.py").write_text("from ..parallel import groups\n", encoding="utf-8")
    (engine / "up.py").write_text("from ..model import enum\n", encoding="utf-8")
    assert upward_imports(tmp_path) == [
        "pyro_autospec/engine/sneaky.py:1: engine imports the top-level package",
        "pyro_autospec/engine/up.py:1: engine imports pyro_autospec.model",
    ]


def test_no_function_level_import_of_this_package():
    found = []
    for path in modules():
        rel = str(path.relative_to(ROOT))
        for line, target, in_function in imports(path):
            ours = target == "pyro_autospec" or target.startswith("pyro_autospec.")
            if in_function and ours and (rel, target) not in FUNCTION_LEVEL_ALLOWED:
                found.append(f"{where(path, line)}: {target}")
    assert not found, "function-level imports of this package (import at the top):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize("part", sorted(PYRO_FREE))
def test_pyro_free_parts_never_import_pyro(part):
    found = []
    for path in modules():
        if part_of(module_name(path)) != part:
            continue
        for line, target, _ in imports(path):
            if target == "pyro" or target.startswith("pyro."):
                found.append(f"{where(path, line)}: {target}")
    assert not found, f"{part} imports Pyro:\n" + "\n".join(found)


def test_the_reader_sees_relative_and_function_level_imports(tmp_path):
    """What the checks above rest on: relative imports resolved, nesting in functions seen."""
    engine = tmp_path / "pyro_autospec" / "engine"
    engine.mkdir(parents=True)
    bad = engine / "bad.py"
    bad.write_text(
        "from ..oracles import TabularOracle\n\n\ndef f():\n    from . import keys\n",
        encoding="utf-8",
    )
    assert list(imports(bad, tmp_path)) == [
        (1, "pyro_autospec.oracles", False),
        (5, "pyro_autospec.engine", True),
    ]


#: Third-party modules a function may import on first use (docs/architecture.md): ArviZ and
#: numba only in the one module that calls each, SciPy and Matplotlib anywhere; every other
#: module is imported at the top.
LAZY_THIRD_PARTY = {
    "arviz": {"pyro_autospec/diagnostics/arviz.py"},
    "numba": {"pyro_autospec/engine/compiled.py"},
    "scipy": None,
    "matplotlib": None,
}


def test_function_level_imports_of_other_packages_are_the_slow_or_optional_ones():
    found = []
    for path in modules():
        rel = str(path.relative_to(ROOT))
        for line, target, in_function in imports(path):
            top = target.partition(".")[0]
            if not in_function or top in ("pyro_autospec", "__future__"):
                continue
            if top not in LAZY_THIRD_PARTY or rel not in (LAZY_THIRD_PARTY[top] or {rel}):
                found.append(f"{where(path, line)}: {target}")
    assert not found, "function-level imports to move to the top:\n" + "\n".join(found)


def floors_in_the_docs() -> dict[str, int]:
    """``{part: floor}`` as the diagram of ``docs/architecture.md`` draws them."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## What each package may import", 1)[1]
    diagram = section.split("```text", 1)[1].split("```", 1)[0]
    floors, current = {}, None
    for line in diagram.strip("\n").splitlines():
        match = re.match(r"(?:floor (\d+))?\s+(\S+)", line)
        if match.group(1) is not None:
            current = int(match.group(1))
        floors[match.group(2)] = current
    return floors


def test_the_floors_the_docs_draw_are_the_tested_ones():
    assert floors_in_the_docs() == FLOOR
