"""The README's main job and the benchmarks' smoke modes run."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, timeout=600):
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_demo_small():
    out = run(
        "-m", "pyro_autospec", "demo", "--n", "128", "--num-samples", "4", "--exact-samples", "4000"
    )
    assert "rounds/sample" in out and "autospec" in out and "sequential" in out
    assert "chi-square p-value" in out


def test_help():
    assert "demo" in run("-m", "pyro_autospec", "--help")


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
def test_benchmark_smoke(script, tmp_path):
    args = [str(ROOT / "benchmarks" / script), "--smoke"]
    if script == "rounds.py":
        args += ["--out", str(tmp_path)]
    run(*args)
