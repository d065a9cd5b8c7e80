"""The top-level package: subpackages reachable as attributes, loaded lazily (in subprocesses,
so that what is imported is observed from a fresh interpreter)."""

import subprocess
import sys
import textwrap

import pytest

SUBPACKAGES = ["engine", "oracles", "model", "infer", "guides", "diagnostics", "distributions"]


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_engine_and_oracles_attributes_do_not_import_pyro():
    out = run_python(
        """
        import sys
        import pyro_autospec as pa
        engine, oracles = pa.engine, pa.oracles
        assert engine.sample_any_order is pa.sample_any_order
        assert oracles.MarkovChainOracle.__name__ == "MarkovChainOracle"
        for name in ("infer", "guides", "diagnostics", "distributions"):
            assert f"pyro_autospec.{name}" not in sys.modules, f"{name} was imported eagerly"
        loaded = [m for m in sys.modules if m == "pyro" or m.startswith("pyro.")]
        assert not loaded, loaded
        print("ok")
        """
    )
    assert out.strip() == "ok"


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_subpackage_is_an_attribute(name):
    out = run_python(
        f"""
        import importlib
        import pyro_autospec as pa
        assert "{name}" in dir(pa)
        module = getattr(pa, "{name}")
        assert module is importlib.import_module("pyro_autospec.{name}")
        assert module.__all__, "empty __all__"
        for public in module.__all__:
            getattr(module, public)
        print(len(module.__all__))
        """
    )
    assert int(out.strip()) > 0


def test_issue_example_and_unknown_attribute():
    out = run_python(
        """
        import pyro_autospec as pa
        from pyro_autospec.guides import AnyOrderGuide
        assert pa.guides.AnyOrderGuide is AnyOrderGuide
        try:
            pa.not_a_subpackage
        except AttributeError as error:
            assert "not_a_subpackage" in str(error)
        else:
            raise AssertionError("no AttributeError")
        assert not hasattr(pa, "tests")
        print("ok")
        """
    )
    assert out.strip() == "ok"


#: What the repository root holds, tracked: anything else there is a stray file (a shell
#: pipeline once wrote 86 files named after Pyro's test models there).
ROOT_ENTRIES = {
    ".ci",
    ".gitignore",
    "README.md",
    "benchmarks",
    "docs",
    "pyproject.toml",
    "pyro_autospec",
    "requirements-dev.txt",
    "tests",
    "tools",
    "tutorials",
}


def test_the_repository_root_tracks_only_the_project():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout (an unpacked source archive)")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        pytest.skip(f"git ls-files failed: {out.stderr.strip()[:200]}")
    tops = {path.split("/", 1)[0] for path in out.stdout.split("\0") if path}
    assert tops <= ROOT_ENTRIES, sorted(tops - ROOT_ENTRIES)
