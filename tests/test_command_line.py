"""The README's main job and the benchmarks' smoke modes run."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pyro_autospec.engine.methods import KEYWORD_KNOBS_DEPRECATED

ROOT = Path(__file__).resolve().parents[1]
#: The library's own deprecations fail a command that still uses them.
OWN_DEPRECATIONS = ["-W", f"error:{KEYWORD_KNOBS_DEPRECATED}:FutureWarning"]


def run(*args, timeout=600):
    out = subprocess.run(
        [sys.executable, *OWN_DEPRECATIONS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_demo_smoke():
    out = run("-m", "pyro_autospec", "demo", "--smoke")
    # 1. a Pyro model through AutoSpec, its summary (measured seconds) and MAP path
    assert "AutoSpec(method='autospec', num_samples=40, num_chains=1, sites=['x_0..x_11'])" in out
    assert "Wall time (measured)" in out and "Self-check passed" in out
    assert ">>> fit.map(rolls)" in out
    # 2. ArviZ beside Pyro, with what the wall column covers
    assert "az.summary of 40 draws" in out and "Pyro's infer_discrete, vectorised" in out
    assert 'AutoSpec(casino, sampler="engine")' in out  # autospeculation itself, beside the default
    assert "Wall time of 40 draws" in out and "Fastest here:" in out
    # 3. exactness, 4. the engine race
    assert "largest |z|" in out and "chi-square p-value" in out
    assert "4. The engine race" in out and "rounds per draw" in out
    assert "Warning" not in out and "Shape validation failed" not in out


def test_demo_numbers():
    from pyro_autospec.demo import run_demo

    torch.set_num_threads(1)
    out = run_demo(
        num_rolls=10, num_samples=200, n=64, race_samples=4, exact_samples=1000, repeats=1
    )
    assert out["self_check"] and out["max_z"] < 4.5 and out["p_value"] > 1e-5
    assert out["rounds_per_draw"]["sequential"] == 64 and out["rounds_per_draw"]["autospec"] < 64
    assert set(out["wall"]) >= {"autospec", "sequential", "infer_discrete"}


def test_demo_reference_is_exact():
    """The demo's forward-backward against brute force over every path of a short casino."""
    import itertools
    import math

    from pyro_autospec.demo import EMIT, TRANS, casino_rolls, exact_loaded_probability

    rolls = casino_rolls(6, seed=3)
    weights = {}
    for path in itertools.product(range(2), repeat=6):
        w = 0.5 * EMIT[path[0]][int(rolls[0])]
        for t in range(1, 6):
            w *= TRANS[path[t - 1]][path[t]] * EMIT[path[t]][int(rolls[t])]
        weights[path] = w
    total = math.fsum(weights.values())
    for t, p in enumerate(exact_loaded_probability(rolls)):
        brute = math.fsum(w for path, w in weights.items() if path[t] == 1) / total
        assert abs(p - brute) < 1e-12


def test_help():
    assert "demo" in run("-m", "pyro_autospec", "--help")


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
def test_benchmark_smoke(script, tmp_path):
    args = [str(ROOT / "benchmarks" / script), "--smoke"]
    if script == "rounds.py":
        args += ["--out", str(tmp_path)]
    if script == "control_plane.py":  # every part, the lock step too
        args += ["--parts", "rounds", "kernel", "lockstep"]
    if script == "engine.py":  # every part, the opt-in profile too
        args += ["--parts", "overhead", "race", "ops", "draws", "batching", "profile"]
    run(*args)


def test_pyro_suite_comparison_smoke():
    """``pyro_vs_infer_discrete.py --suite``: AutoSpec against infer_discrete on Pyro's own
    test-suite models (four of them in the smoke run), with the median ratios."""
    out = run(str(ROOT / "benchmarks" / "pyro_vs_infer_discrete.py"), "--suite", "--smoke")
    assert "AutoSpec / vectorised infer_discrete over 4 models: median" in out
    assert "AutoSpec / infer_discrete one call per draw over 4 models: median" in out
