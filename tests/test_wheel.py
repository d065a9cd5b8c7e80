"""The package builds as a wheel (``python -m build``, as the README says) that installs and
imports on its own, away from the source tree.

The wheel goes into a fresh virtual environment with ``--no-deps``; the environment sees the
test environment's packages (torch, Pyro, ...) so that nothing is downloaded, but
``pyro_autospec`` itself must come from the wheel. Outside CI the test is skipped, with the
reason, when ``build`` is not installed; under CI (``CI`` set) that is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["engine", "oracles", "model", "infer", "guides", "diagnostics", "distributions"]

IMPORT_CHECK = f"""
import importlib
import pyro_autospec
for name in {SUBPACKAGES!r}:
    importlib.import_module("pyro_autospec." + name)
from pyro_autospec import AutoSpec, sample_any_order
from pyro_autospec.oracles import MarkovChainOracle
import torch
chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.9, 0.1], [0.1, 0.9]]), 64)
result = sample_any_order(chain, 2, seed=0)
assert tuple(result.samples.shape) == (2, 64), result.samples.shape
print(pyro_autospec.__file__)
print(pyro_autospec.__version__)
"""


def run(command, **kwargs):
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert out.returncode == 0, f"{' '.join(map(str, command))} failed:\n" + (
        out.stdout[-3000:] + out.stderr[-3000:]
    )
    return out


def test_wheel_builds_installs_and_imports(tmp_path):
    if importlib.util.find_spec("build") is None:
        reason = "`build` is not installed (it is in the `[test]` extra)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must build the wheel, but {reason}")
        pytest.skip(reason)
    import pyro_autospec

    start = time.perf_counter()
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)])
    wheels = sorted(dist.glob("pyro_autospec-*.whl"))
    sdists = sorted(dist.glob("pyro_autospec-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    assert wheels[0].name == f"pyro_autospec-{pyro_autospec.__version__}-py3-none-any.whl"
    built = time.perf_counter() - start

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    run([*pip, "install", "--no-deps", "--no-index", "-q", str(wheels[0])])

    away = tmp_path / "elsewhere"  # not the source tree: the import must find the wheel
    away.mkdir()
    out = run([str(python), "-c", IMPORT_CHECK], cwd=away)
    location, version = out.stdout.split()[-2:]
    assert Path(location).resolve().is_relative_to(venv.resolve()), (
        f"pyro_autospec was imported from {location}, not from the wheel installed in {venv}"
    )
    assert version == pyro_autospec.__version__
    command = bindir / "pyro-autospec"
    help_text = run([str(command), "--help"], cwd=away).stdout
    assert "demo" in help_text, help_text
    total = time.perf_counter() - start
    print(f"wheel built in {built:.1f} s; built, installed and imported in {total:.1f} s")
