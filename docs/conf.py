"""Sphinx configuration of the pyro-autospec documentation.

Build (warnings as errors, as ``tests/test_docs.py`` does)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

The tutorials are rendered from their committed outputs (never executed here): they are
copied from ``tutorials/`` into ``docs/tutorials/`` (ignored by git) at every build, with the
cell that sets ``SMOKE_TEST`` hidden and the title cell first.

Math renders offline: MathJax 3 (one self-contained file, SVG output) comes from the
``sphinx-mathjax-offline`` package and is copied into ``_static/mathjax/`` of the built site.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(DOCS / "_ext")]

import pyro_autospec  # noqa: E402

project = "pyro-autospec"
author = "the pyro-autospec developers"
copyright = "2026, the pyro-autospec developers"
release = pyro_autospec.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_nb",
    "autospec_api",
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
nitpicky = False

# autodoc and numpydoc: signatures as written, members in source order, no autosummary tables
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"exclude-members": "__init__"}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# MyST (markdown pages) and myst-nb (notebooks, rendered from their saved outputs)
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"
nb_merge_streams = True

html_theme = "furo"
html_title = f"pyro-autospec {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]

#: MathJax 3 from the ``sphinx-mathjax-offline`` package: TeX input, SVG output, every TeX
#: extension in the one file, so no font or component is fetched at run time.
MATHJAX_FILE = "tex-svg-full.js"
mathjax_path = f"mathjax/{MATHJAX_FILE}"


def _mathjax_source() -> Path:
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    source = None
    if spec is not None and spec.submodule_search_locations:
        source = Path(next(iter(spec.submodule_search_locations))) / "static/mathjax"
        source = source / MATHJAX_FILE
    if source is None or not source.exists():
        raise RuntimeError(
            "the documentation bundles MathJax from the sphinx-mathjax-offline package, which "
            'is not installed: pip install -c requirements-dev.txt -e ".[docs]"'
        )
    return source


def _copy_mathjax(app, exception) -> None:
    """Put the bundled MathJax where ``mathjax_path`` points, in the built site."""
    if exception is None and app.builder.format == "html":
        target = Path(app.outdir) / "_static" / "mathjax"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_mathjax_source(), target / MATHJAX_FILE)


def setup(app):
    _mathjax_source()  # fail early, with the way out, when the package is missing
    app.connect("build-finished", _copy_mathjax)


def _for_the_page(notebook: dict) -> dict:
    """A tutorial as a page shows it: the title cell first, the ``SMOKE_TEST`` cell hidden.

    The cell that switches CI's smoke mode on is for running the notebook, not for reading it:
    it gets myst-nb's ``remove-cell`` tag, and a markdown cell that opens with a title moves
    above it.
    """
    cells = notebook["cells"]
    for cell in cells:
        if cell["cell_type"] == "code" and "SMOKE_TEST =" in "".join(cell["source"]):
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if "remove-cell" not in tags:
                tags.append("remove-cell")
            break
    titles = [
        i
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).lstrip().startswith("# ")
    ]
    if titles and titles[0] > 0:
        cells.insert(0, cells.pop(titles[0]))
    return notebook


def _copy_tutorials() -> None:
    """Mirror ``tutorials/*.ipynb`` into ``docs/tutorials/`` (Sphinx reads only its own tree)."""
    target = DOCS / "tutorials"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    for notebook in sorted((ROOT / "tutorials").glob("*.ipynb")):
        page = _for_the_page(json.loads(notebook.read_text(encoding="utf-8")))
        (target / notebook.name).write_text(json.dumps(page, indent=1), encoding="utf-8")


_copy_tutorials()
