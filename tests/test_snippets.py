"""Every Python block of README.md and docs/*.md runs as written, so that a snippet cannot rot.

The blocks of one file run in order in one namespace (a block may use what an earlier block of
the same page defined), in a fresh namespace per file. A block that cannot run on its own (a
method body, a script for ``torchrun``, a sketch that needs the reader's model) is marked as a
fragment by the HTML comment ``<!-- fragment -->`` on the last non-blank line before its fence;
it is skipped here. The convention is documented in ``docs/contributing.md``. A block that warns
(other than a deprecation) fails too: a snippet shows the way that works without a warning.
"""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyro_autospec.engine.methods import KEYWORD_KNOBS_DEPRECATED

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: The marker that exempts the next Python block.
FRAGMENT = "<!-- fragment"
#: Warnings that come and go with the versions of other libraries; any other warning fails.
VERSION_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
#: The library's own deprecations (FutureWarning too): a snippet must not show a deprecated way.
OWN_DEPRECATIONS = (KEYWORD_KNOBS_DEPRECATED,)


def _ours_deprecated(message: Warning | str) -> bool:
    return any(text in str(message) for text in OWN_DEPRECATIONS)


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    source: str
    fragment: bool

    @property
    def label(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, dedented (list items indent theirs)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    previous = ""  # the last non-blank line outside a block
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        fence, info = match["fence"], match["info"].strip()
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence)}[ \t]*$", lines[i]):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        language = info.split()[0] if info else ""
        source = textwrap.dedent("\n".join(body)) + "\n"
        blocks.append(Block(path, start + 1, language, source, previous.startswith(FRAGMENT)))
        previous = ""
    return blocks


def python_blocks(path: Path) -> list[Block]:
    return [block for block in code_blocks(path) if block.language in {"python", "py"}]


def test_blocks_are_found():
    """The parser sees the blocks it must run (README's quickstarts), so this test can fail."""
    labels = [block.label for block in python_blocks(ROOT / "README.md") if not block.fragment]
    assert len(labels) >= 3, labels
    blocks = code_blocks(ROOT / "README.md")
    assert any(b.language == "bash" for b in blocks)


def test_fragment_marker_is_recognised(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- fragment: a method body -->\n\n```python\nself.x\n```\n\n"
        "- item:\n\n  ```python\n  x = 1\n  ```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(page)
    assert [b.fragment for b in blocks] == [True, False]
    assert blocks[1].source == "x = 1\n"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_verbatim(path, tmp_path, monkeypatch):
    blocks = [block for block in python_blocks(path) if not block.fragment]
    if not blocks:
        pytest.skip(f"{path.name} has no Python block to run")
    import pyro

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    monkeypatch.chdir(tmp_path)  # a snippet that writes files writes them here
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        start = time.perf_counter()
        code = compile(block.source, block.label, "exec")
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                exec(code, namespace)
        except Exception as error:  # noqa: BLE001 - reported with the block's place
            trace = "".join(traceback.format_exception(error)[-6:])
            pytest.fail(
                f"the Python block at {block.label} fails as written: "
                f"{type(error).__name__}: {error}\n{trace}\n(mark a block that is not meant to "
                "run on its own with `<!-- fragment -->` on the line before its fence; see "
                "docs/contributing.md)"
            )
        ours = [
            w
            for w in caught
            if not issubclass(w.category, VERSION_WARNINGS) or _ours_deprecated(w.message)
        ]
        assert not ours, (
            f"the Python block at {block.label} warns; a snippet shows the way that works "
            "without a warning:\n"
            + "\n".join(f"{w.category.__name__}: {str(w.message)[:300]}" for w in ours)
        )
        print(f"{block.label}: {time.perf_counter() - start:.1f} s")
