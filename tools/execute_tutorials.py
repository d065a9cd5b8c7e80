"""Execute the tutorial notebooks in place, with full outputs, and stamp the API they ran at.

Every notebook runs top to bottom in a fresh kernel, in full mode (``SMOKE_TEST`` off: the
variable ``CI`` is removed from the kernel's environment) with matplotlib's inline backend, so
figures are saved in the notebook. Its metadata then records, under ``"pyro_autospec"``, the
package version and a fingerprint of the public API (every public name and signature, from
``tools/public_api.py``). ``tests/test_tutorials.py`` fails when a committed notebook has no
outputs, has errors, was not executed in order, or ran at another API.

Usage (from the repository root)::

    python tools/execute_tutorials.py                       # every tutorials/*.ipynb
    python tools/execute_tutorials.py tutorials/02_diffusion.ipynb
    python tools/execute_tutorials.py --check               # report problems, run nothing

A notebook whose execution fails is left untouched on disk and the command exits with 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
# This checkout's package, not whatever pyro_autospec is installed (an editable install may
# point at another checkout): the stamp's fingerprint and the kernel both use this one.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

import public_api  # noqa: E402

#: Key of the notebooks' metadata written by this tool.
METADATA_KEY = "pyro_autospec"
#: Code that draws a figure; a notebook with such code must have an image among its outputs.
PLOTS = re.compile(r"\bplt\.|\.plot\(|plot_[a-z_]+\(")
IMAGES = ("image/png", "image/svg+xml", "image/jpeg")
RERUN = "re-run tools/execute_tutorials.py"


def current_stamp(smoke_test: bool = False) -> dict:
    """What :func:`execute` writes into a notebook's metadata."""
    import pyro_autospec

    return {
        "api_fingerprint": public_api.fingerprint(),
        "version": pyro_autospec.__version__,
        "smoke_test": bool(smoke_test),
    }


@contextlib.contextmanager
def _kernel_environment(smoke_test: bool) -> Iterator[None]:
    """The kernel inherits this process's environment: set SMOKE_TEST's switch, the backend, and
    this checkout first on the kernel's ``sys.path``."""
    saved = {key: os.environ.get(key) for key in ("CI", "MPLBACKEND", "PYTHONPATH")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    if smoke_test:
        os.environ["CI"] = "true"
    else:
        os.environ.pop("CI", None)
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def execute(path: Path, *, timeout: int | None = None, smoke_test: bool = False) -> float:
    """Run one notebook in place with full outputs and stamp its metadata; return the seconds.

    ``smoke_test=True`` runs it in CI's smoke mode instead, and says so in the stamp (the
    checks then reject it as a committed notebook); it exists to test this tool quickly.
    Raises :class:`nbclient.exceptions.CellExecutionError` (and leaves the file as it was) if
    a cell fails.
    """
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    with _kernel_environment(smoke_test):
        client.execute()
    seconds = time.perf_counter() - start
    notebook.metadata[METADATA_KEY] = current_stamp(smoke_test)
    nbformat.validate(notebook)
    nbformat.write(notebook, path)
    return seconds


def check(path: Path, fingerprint: str | None = None) -> list[str]:
    """What is wrong with a committed notebook: an empty list if it is executed and current.

    Checks that it has outputs, that every code cell ran, in order from 1 and in a single
    session, that no output is an error, that code drawing figures left an image, that it
    did not run in smoke mode, and that its API fingerprint is the current one.
    """
    fingerprint = public_api.fingerprint() if fingerprint is None else fingerprint
    notebook = nbformat.read(Path(path), as_version=4)
    cells = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]
    problems = []
    outputs = [o for c in cells for o in c.get("outputs", [])]
    if not outputs:
        problems.append(f"no outputs: the notebook was committed unexecuted; {RERUN}")
    counts = [c.get("execution_count") for c in cells]
    not_run = [i for i, count in enumerate(counts) if count is None]
    if not_run:
        problems.append(f"code cells {not_run} (0-based, non-empty) were not executed; {RERUN}")
    elif counts != list(range(1, len(cells) + 1)):
        problems.append(f"not executed in order in one session: execution counts {counts}; {RERUN}")
    for index, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(
                    f"code cell {index} has an error output: {output.get('ename')}: "
                    f"{output.get('evalue')}"
                )
    draws = any(PLOTS.search(cell.source) for cell in cells)
    images = any(key in o.get("data", {}) for o in outputs for key in IMAGES)
    if draws and outputs and not images:
        problems.append(
            "its code draws figures but no image was saved (run with the inline backend); " + RERUN
        )
    stamp = notebook.metadata.get(METADATA_KEY)
    if not stamp or "api_fingerprint" not in stamp:
        problems.append(f"no API fingerprint in its metadata: stale: {RERUN}")
    else:
        if stamp.get("smoke_test"):
            problems.append(f"executed in smoke mode (CI=true), not in full; {RERUN}")
        if stamp["api_fingerprint"] != fingerprint:
            problems.append(
                f"stale: executed at API fingerprint {stamp['api_fingerprint']} (version "
                f"{stamp.get('version')}), the current API is {fingerprint}; {RERUN}"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: tutorials/*.ipynb")
    parser.add_argument("--check", action="store_true", help="report problems, run nothing")
    parser.add_argument("--timeout", type=int, default=None, help="seconds per cell (no limit)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "tutorials").glob("*.ipynb"))
    if args.check:
        fingerprint = public_api.fingerprint()
        failed = 0
        for path in notebooks:
            problems = check(path, fingerprint)
            failed += bool(problems)
            print(f"{path}: " + ("ok" if not problems else "\n  ".join(["", *problems])))
        return int(failed > 0)
    status = 0
    for path in notebooks:
        print(f"executing {path} ...", flush=True)
        try:
            seconds = execute(path, timeout=args.timeout)
        except CellExecutionError as error:
            print(f"FAILED {path} (left unchanged):\n{error}", file=sys.stderr)
            status = 1
            continue
        print(f"  done in {seconds:.0f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
