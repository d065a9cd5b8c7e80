"""The documentation site builds without a warning and documents every public name; nothing
that ships points readers to internal notes they cannot see."""

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import public_api  # noqa: E402

#: Pages other documents link to with :doc: (docstrings included): they must exist.
PAGES = ["index", "algorithm", "oracles", "choosing", "benchmarks", "pyro", "guides", "diffusion"]
PAGES += ["api", "tutorials", "contributing", "architecture"]

#: Internal notes of the developers, which users cannot read.
INTERNAL = re.compile(r"ALGORITHM\.md|PYRO_NOTES|RESEARCH\.md|STYLE\.md|/work/shared")
SHIPPED = ["pyro_autospec", "docs", "benchmarks", "tutorials", "README.md"]


@pytest.fixture
def built(docs_build):
    """The session's one build of the documentation (tests/conftest.py)."""
    return docs_build


def test_docs_build_without_warnings(built):
    warnings = [line for line in built.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert built.returncode == 0, (
        f"sphinx-build -W failed ({len(warnings)} warnings; reproduce with "
        "`sphinx-build -W --keep-going -b html docs docs/_build/html`):\n"
        + "\n".join(warnings or built.stderr.splitlines()[-40:])
    )
    print(f"docs built in {built.seconds:.1f} s")


def test_pages_exist(built):
    missing = [page for page in PAGES if not (built.html / f"{page}.html").exists()]
    assert not missing, f"pages missing from the build: {missing}"
    notebooks = sorted(p.stem for p in (ROOT / "tutorials").glob("*.ipynb"))
    rendered = sorted(p.stem for p in (built.html / "tutorials").glob("*.html"))
    assert notebooks and rendered == notebooks, f"tutorials {notebooks}, rendered {rendered}"


def api_page(module_name: str) -> str:
    return "pyro_autospec" if module_name == "pyro_autospec" else module_name.split(".", 1)[1]


def test_every_public_name_is_on_the_api_pages(built):
    homes = public_api.home_modules()
    missing = []
    for module_name, names in public_api.public_names().items():
        module = importlib.import_module(module_name)
        for name in names:
            home = homes[id(getattr(module, name))]
            page = built.html / "api" / f"{api_page(home)}.html"
            html = page.read_text(encoding="utf-8") if page.exists() else ""
            if f'id="{home}.{name}"' not in html:
                missing.append(f"{module_name}.{name} (expected on api/{api_page(home)})")
    assert not missing, "public names missing from the API pages:\n" + "\n".join(missing)


def test_no_internal_notes_referenced():
    hits = []
    for top in SHIPPED:
        path = ROOT / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            relative = file.relative_to(ROOT)
            if relative.parts[:2] in {("docs", "_build"), ("docs", "tutorials")}:
                continue  # build output and the build's copies of tutorials/
            if "__pycache__" in relative.parts or file.suffix in {".png", ".pt", ".pyc"}:
                continue
            text = file.read_text(encoding="utf-8", errors="ignore")
            for number, line in enumerate(text.splitlines(), 1):
                if INTERNAL.search(line):
                    hits.append(f"{relative}:{number}: {line.strip()[:120]}")
    assert not hits, (
        "these files send readers to internal notes they cannot read; point to the "
        "documentation pages instead (:doc:`/algorithm`, :doc:`/oracles`, :doc:`/pyro`, ...):\n"
        + "\n".join(hits)
    )


def test_tutorial_pages_open_with_their_title(built):
    """A tutorial page opens with its numbered title; the SMOKE_TEST cell is for CI, not readers."""
    problems = []
    for page in sorted((built.html / "tutorials").glob("*.html")):
        html = page.read_text(encoding="utf-8")
        body = html[html.index('role="main"') :]
        title, cell = body.find("<h1"), body.find('class="cell')
        if title < 0 or (0 <= cell < title):
            problems.append(f"{page.name}: a cell comes before the title")
        if "SMOKE_TEST =" in body:
            problems.append(f"{page.name}: shows the cell that sets SMOKE_TEST")
        heading = re.search(r"<h1>(.*?)<", body, re.S)
        if not heading or not re.match(rf"{page.name[:2]} · ", heading.group(1).strip()):
            problems.append(f"{page.name}: title {heading and heading.group(1)!r} not numbered")
    assert not problems, "\n".join(problems)
