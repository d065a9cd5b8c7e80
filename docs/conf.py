"""Sphinx configuration of the pyro-autospec documentation.

Build (warnings as errors, as ``tests/test_docs.py`` does)::

    sphinx-build -W --keep-going -b html docs docs/_build/html

The tutorials are rendered from their committed outputs (never executed here): they are
copied from ``tutorials/`` into ``docs/tutorials/`` (ignored by git) at every build.
"""

from __future__ import annotations

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
html_static_path: list[str] = []


def _copy_tutorials() -> None:
    """Mirror ``tutorials/*.ipynb`` into ``docs/tutorials/`` (Sphinx reads only its own tree)."""
    target = DOCS / "tutorials"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir()
    for notebook in sorted((ROOT / "tutorials").glob("*.ipynb")):
        shutil.copy2(notebook, target / notebook.name)


_copy_tutorials()
