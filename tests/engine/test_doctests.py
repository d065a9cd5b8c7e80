"""The engine's docstring examples run as written (two had drifted from the code unnoticed)."""

import doctest
import importlib
import pkgutil

import pytest

import pyro_autospec.engine as engine

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(engine.__path__, prefix="pyro_autospec.engine.")
)


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} failing example(s) in {name}"
