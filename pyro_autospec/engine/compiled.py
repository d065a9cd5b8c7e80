"""Compiled host code for sequential sampling's lock step, when numba is installed.

Sequential sampling's lock step (:class:`~pyro_autospec.engine.host_plane.TokenSampler` with
windows of one coordinate, every draw in flight) asks each step for every draw's row at one
position, checks and normalises the rows, draws each coordinate by Gumbel-max with its keyed
draft noise and writes it into the partial samples. In NumPy that is about 25 calls on arrays
of a few dozen entries, each paying Python's and NumPy's dispatch. :class:`LockStep` does it in
two compiled calls and three NumPy calls.

**The same bits as NumPy.** The exponentials, their sums and the logarithms stay NumPy's, on
arrays of the shapes and layout :func:`~pyro_autospec.engine.rows.normalise_rows` uses
(float64, C-contiguous, whatever the oracle's output looked like): numba's ``exp``
and ``log`` round differently from NumPy's in about one case in 20 on a CPU with AVX-512, and
NumPy sums a row pairwise. The compiled parts only take maxima, subtract, add, compare and
write, which round the same everywhere. So the draws and their log probabilities are bit for
bit those of the NumPy step, and of the general loop with any batch composition.

numba is optional (``pip install "pyro-autospec[compiled]"``). The compiled step about halves
the engine's time per step outside the oracle, but numba's start (its import, which imports
SciPy's linear algebra, then loading the compiled code from its cache on disk, or compiling it
after an install) costs more than a short run saves: the measurements are in the project's
``benchmarks/README.md`` ("The compiled lock step", "A process's first run"). So by default
(``PYRO_AUTOSPEC_NUMBA`` unset, or ``auto``)
a process runs its lock steps in NumPy until their steps, counting the run about to start,
reach :data:`START_AFTER_STEPS`, and compiled from then on: the rule of renting skis until
the rent reaches the price, which never spends more than about twice the better choice made
in hindsight. With
``PYRO_AUTOSPEC_NUMBA=1`` (``true``, ``yes``, ``on``) every lock step runs compiled, from the
first; with ``0`` (``false``, ``no``, ``off``), none does. Without numba the lock step runs
in NumPy. Which one runs changes neither the draws nor any bit of their log probabilities.

Where numba cannot write its cache it compiles in each process; where its cache is damaged it
warns once and compiles without it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pickle
import warnings
from collections.abc import Callable

import numpy as np

__all__ = [
    "AUTO",
    "OFF",
    "START_AFTER_STEPS",
    "LockStep",
    "compiled_lock_step",
    "draw_rows",
    "setting",
    "shift_rows",
    "wanted",
]


def shift_rows(out: np.ndarray, top: np.ndarray, shifted: np.ndarray) -> int:
    """Each row's largest entry, and the row minus it, in float64 (compiled by numba).

    Parameters
    ----------
    out : float32 or float64 ndarray [D, 1, q]
        The oracle's rows.
    top : float64 ndarray [D]
        Receives each row's largest entry.
    shifted : float64 ndarray [D, 1, q]
        Receives ``out - top``.

    Returns
    -------
    int
        ``-1``; or the first row whose largest entry is not finite (a NaN first, ``+inf``, or
        no mass), with ``top`` and ``shifted`` written only before it.
    """
    num, q = out.shape[0], out.shape[2]
    for d in range(num):
        best = out[d, 0, 0]
        for v in range(1, q):
            if out[d, 0, v] > best:
                best = out[d, 0, v]
        if not np.isfinite(best):
            return d
        top[d] = best
        for v in range(q):
            shifted[d, 0, v] = np.float64(out[d, 0, v]) - np.float64(best)
    return -1


def draw_rows(
    out: np.ndarray,
    top: np.ndarray,
    log_sum: np.ndarray,
    noise: np.ndarray,
    column: int,
    values: np.ndarray,
    mask: np.ndarray,
    coords: np.ndarray,
    log_mu: np.ndarray,
    tol: float,
) -> int:
    """Check each row, draw its coordinate and write it (compiled by numba).

    The log normaliser of row ``d`` is ``log_sum[d, 0] + top[d]``; the row is a distribution
    if it lies within ``tol`` of 0 (:func:`~pyro_autospec.engine.rows._tolerance`; a NaN
    fails). The value drawn is the first maximum of the normalised row plus the noise, as
    :class:`~pyro_autospec.engine.host_plane.TokenSampler` draws.

    Parameters
    ----------
    out : float32 or float64 ndarray [D, 1, q]
        The oracle's rows.
    top, log_sum : float64 ndarray [D], [D, 1]
        Each row's largest entry, and the log of the sum of ``exp(out - top)``.
    noise : float64 ndarray [D, W, q]
        The draft noise (Gumbels) of ``W`` steps; this step's is column ``column``.
    values : integer ndarray [D, n]
        The partial samples; ``values[d, coords[d]]`` receives the value drawn.
    mask : bool ndarray [D, n]
        Where the partial samples are pinned; ``mask[d, coords[d]]`` is set.
    coords : integer ndarray [D]
        The coordinate each draw draws at this step.
    log_mu : float64 ndarray [D]
        The draws' log probabilities; each gains the normalised row's entry drawn.
    tol : float
        How far a row's log normaliser may stray from 0.

    Returns
    -------
    int
        ``-1``; or the first row that is not a distribution, with the draws before it
        written.
    """
    num, q = out.shape[0], out.shape[2]
    for d in range(num):
        log_mass = log_sum[d, 0] + top[d]
        if not abs(log_mass) <= tol:
            return d
        best, drawn = -np.inf, 0
        for v in range(q):
            score = (np.float64(out[d, 0, v]) - log_mass) + noise[d, column, v]
            if score > best:
                best, drawn = score, v
        values[d, coords[d]] = drawn
        mask[d, coords[d]] = True
        log_mu[d] += np.float64(out[d, 0, drawn]) - log_mass
    return -1


class LockStep:
    """One step of the lock step for the rows of one call: :func:`shift_rows`, NumPy's
    ``exp``, sum and ``log``, then :func:`draw_rows`.

    Parameters
    ----------
    shift, draw : callable
        :func:`shift_rows` and :func:`draw_rows`, compiled (:func:`compiled_lock_step`) or,
        in the tests, as written.
    """

    def __init__(self, shift: Callable, draw: Callable):
        self.shift, self.draw = shift, draw
        self.buffers: dict[tuple, tuple[np.ndarray, ...]] = {}

    def _without_cache(self, error: Exception) -> None:
        """numba's cache on disk is damaged (it raised ``error`` loading a compiled
        function): compile without it from now on in this process. Nothing was run."""
        global _uncached
        if _uncached is None:
            warnings.warn(
                f"numba's cache of the compiled lock step is damaged ({type(error).__name__}: "
                f"{error}); compiling without it in this process. Delete the cache (the "
                "*.nbi and *.nbc files of pyro_autospec/engine/__pycache__, or of "
                "NUMBA_CACHE_DIR) to cache again.",
                RuntimeWarning,
                stacklevel=4,
            )
            import numba

            _uncached = _jitted(numba, cache=False)
        self.shift, self.draw = _uncached

    def __call__(
        self,
        out: np.ndarray,
        noise: np.ndarray,
        column: int,
        values: np.ndarray,
        mask: np.ndarray,
        coords: np.ndarray,
        log_mu: np.ndarray,
        tol: float,
    ) -> int:
        """Check the rows ``out`` [D, 1, q], draw from them and write the draws.

        The arguments are :func:`draw_rows`'s. Returns ``-1``, or the first row that is not a
        distribution (the caller raises; draws before it may be written).
        """
        shape = out.shape
        if shape not in self.buffers:
            self.buffers[shape] = (np.empty(shape[0]), np.empty(shape), np.empty(shape[:2]))
        top, shifted, log_sum = self.buffers[shape]
        try:
            bad = self.shift(out, top, shifted)
            if bad >= 0:
                return bad
            # NumPy's exp, pairwise sum and log, as normalise_rows computes them
            np.add.reduce(np.exp(shifted, out=shifted), axis=-1, out=log_sum)
            np.log(log_sum, out=log_sum)
            return self.draw(out, top, log_sum, noise, column, values, mask, coords, log_mu, tol)
        except _DAMAGED as error:
            # loading a cached function failed before it ran: only the buffers were written,
            # so the step runs again, whole, on functions compiled without the cache
            self._without_cache(error)
            return self(out, noise, column, values, mask, coords, log_mu, tol)


#: Values of ``PYRO_AUTOSPEC_NUMBA`` that turn the compiled step off (any case).
OFF = ("0", "false", "no", "off")
#: Values of ``PYRO_AUTOSPEC_NUMBA`` that leave the choice to :data:`START_AFTER_STEPS` (any
#: case); any value neither this nor :data:`OFF` runs every lock step compiled.
AUTO = ("", "auto")

#: By default, the lock-step steps a process runs in NumPy before it starts numba: its start
#: over what a compiled step saves, as measured in ``benchmarks/README.md`` ("A process's
#: first run").
START_AFTER_STEPS = 12_000

#: The lock-step steps this process has run, or is running, in NumPy under the default setting.
_steps_in_numpy = 0
#: Whether this process has handed out a compiled step (numba started, or is starting).
_started = False


def setting() -> str:
    """``"off"``, ``"auto"`` or ``"on"``: what ``PYRO_AUTOSPEC_NUMBA`` asks for (unset is
    ``"auto"``)."""
    value = os.environ.get("PYRO_AUTOSPEC_NUMBA", "auto").strip().lower()
    if value in OFF:
        return "off"
    return "auto" if value in AUTO else "on"


def wanted() -> bool:
    """Whether the lock step may run compiled: numba is installed and
    ``PYRO_AUTOSPEC_NUMBA`` is not one of :data:`OFF`."""
    if setting() == "off":
        return False
    return importlib.util.find_spec("numba") is not None


def _unavailable(why: str) -> None:
    warnings.warn(
        f"{why}; sequential sampling's lock step runs in NumPy (the same draws, slower). Set "
        "PYRO_AUTOSPEC_NUMBA=0 to say so and silence this warning.",
        RuntimeWarning,
        stacklevel=4,  # the sampler's caller
    )


@functools.cache
def _compiled() -> tuple | None:
    try:  # optional, and 0.3 s to import: only when a lock step first runs
        import numba
    except Exception as error:  # installed but broken, e.g. built for another NumPy
        _unavailable(f"numba is installed but does not import ({type(error).__name__}: {error})")
        return None
    if numba.config.DISABLE_JIT:  # NUMBA_DISABLE_JIT=1: the loops would run as Python
        return None
    try:
        return _jitted(numba, cache=True)
    except RuntimeError:  # no writable place for numba's cache: compile in every process
        return _jitted(numba, cache=False)


def _jitted(numba, cache: bool) -> tuple:
    """:func:`shift_rows` and :func:`draw_rows` as numba dispatchers (compiled on first
    call), cached on disk or not."""
    jit = numba.njit(cache=cache, nogil=True)
    return jit(shift_rows), jit(draw_rows)


#: What numba's cache loader raises on a damaged file (a truncated or overwritten one).
_DAMAGED = (pickle.UnpicklingError, EOFError)

#: The compiled functions without numba's cache, once a damaged cache was met.
_uncached: tuple | None = None


def compiled_lock_step(steps: int | None = None) -> LockStep | None:
    """A :class:`LockStep` of the compiled functions (numba caches them on disk where it can
    write, else compiles them in each process), or ``None`` where the lock step should run in
    NumPy.

    ``None`` where :func:`wanted` says no, where numba does not import (with a warning, once),
    where ``NUMBA_DISABLE_JIT`` is set, and, under the default setting (:func:`setting` is
    ``"auto"``), where numba has not started in this process and the lock steps' steps, the
    ``steps`` about to run included, stay under :data:`START_AFTER_STEPS`.

    Parameters
    ----------
    steps : int, optional
        The steps of the lock step about to run (its ``n``); counted towards
        :data:`START_AFTER_STEPS` when it runs in NumPy. ``None`` asks for the compiled step
        now, whatever the count.

    Examples
    --------
    >>> from pyro_autospec.engine import compiled
    >>> compiled.START_AFTER_STEPS  # by default, steps in NumPy before numba starts
    12000
    """
    global _steps_in_numpy, _started
    if not wanted():
        return None
    if steps is not None and not _started and setting() == "auto":
        if _steps_in_numpy + steps < START_AFTER_STEPS:
            _steps_in_numpy += steps
            return None
    functions = _uncached or _compiled()
    if functions is None:
        return None
    _started = True
    return LockStep(*functions)
