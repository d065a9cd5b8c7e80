"""Warnings of a run name the user's line (``pyro_autospec._warnings``)."""

import doctest
import inspect
import warnings

import pyro_autospec._warnings as module
from pyro_autospec._warnings import user_stacklevel


def test_examples_run():
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def library_function():
    """Stands for a library function: its frames count as the user's here (tests/ is
    outside the package), so the warning names the line that called it."""
    warnings.warn("from a run", UserWarning, stacklevel=user_stacklevel())


def test_the_warning_names_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        library_function()
        line = inspect.currentframe().f_lineno - 1  # the call above
    assert caught[0].filename == __file__ and caught[0].lineno == line
