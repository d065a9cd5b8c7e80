"""Warnings that point at the user's line.

A warning raised deep inside a run (``AutoSpec.run``, wrapped by Pyro's handlers and torch's
decorators) should name the line of the user's code that started it, whatever the depth of
the library's own calls. :func:`user_stacklevel` counts the frames of this library, Pyro and
torch between the caller and the first frame outside them, so that no ``stacklevel`` is
counted by hand (Python 3.12's ``skip_file_prefixes`` does this; 3.11 lacks it).
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["user_stacklevel"]


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(path) + os.sep if path else None


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the function that calls this one,
    such that the warning names the first frame outside this library, Pyro, torch and
    ``contextlib`` (the user's line).

    Returns
    -------
    int
        At least 2 (the caller of the warning function).

    Examples
    --------
    >>> import warnings
    >>> def inside():
    ...     warnings.warn("look here", UserWarning, stacklevel=user_stacklevel())
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     inside()
    >>> caught[0].filename != __file__  # the line that called inside(), not this module
    True
    """
    internal = tuple(
        path
        for path in (
            os.path.dirname(__file__) + os.sep,
            _package_dir("pyro"),
            _package_dir("torch"),
            contextlib.__file__,
        )
        if path
    )
    frame, level = sys._getframe(2), 2  # the caller of the function that warns
    while frame.f_back is not None and frame.f_code.co_filename.startswith(internal):
        frame, level = frame.f_back, level + 1
    return level
