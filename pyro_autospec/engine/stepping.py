"""A sampler as rounds: the one loop every sampler of the engine runs, with its progress bar.

A sampler is a :class:`RoundStepper`: :meth:`~RoundStepper.start` puts the first draws in
flight, :meth:`~RoundStepper.step` runs one round (one batched oracle call, or a few within
the memory budget) and starts the draws that fit after it (continuous batching),
``finished`` counts the units done (draws, or steps of a lockstep loop), ``done`` says
whether the run is over, and ``rounds`` and ``oracle_rows`` are the counts a round adds to
(the names of :class:`~pyro_autospec.engine.result.SampleResult`'s counts). The
samplers of :mod:`~pyro_autospec.engine.host_plane` (the host control plane),
:mod:`~pyro_autospec.engine.euler_tokens` and :mod:`~pyro_autospec.engine.euler_baselines`,
and the reference engine's scheduler, all run through :func:`run_rounds`, so the loop, the
progress bar and its counts are written once.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

from tqdm.auto import tqdm

__all__ = ["RoundStepper", "progress_bar", "run_rounds"]


class RoundStepper(Protocol):
    """What :func:`run_rounds` drives."""

    #: Units done so far (draws, or steps), and the run's rounds and rows (oracle rows, or
    #: drift evaluations) so far.
    finished: int
    rounds: int
    oracle_rows: int

    def start(self) -> None:
        """Put the first draws in flight."""

    def step(self) -> None:
        """Run one round, then start the draws that fit."""

    @property
    def done(self) -> bool:
        """Whether every draw has finished."""


def progress_bar(progress: bool, total: int, desc: str, unit: str = "draw") -> Any:
    """A tqdm bar over ``total`` units (``None`` when ``progress`` is False)."""
    if not progress:
        return None
    return tqdm(total=total, desc=desc, unit=unit)


def run_rounds(
    stepper: RoundStepper, *, total: int, progress: bool, desc: str, unit: str = "draw"
) -> None:
    """Run ``stepper`` until it is done: ``start()``, then ``step()`` round after round.

    With ``progress``, a tqdm bar over ``total`` units shows ``stepper.finished``, with the
    rounds and rows so far beside it.

    Examples
    --------
    >>> class Countdown:
    ...     def __init__(self, n):
    ...         self.n, self.finished, self.rounds, self.oracle_rows = n, 0, 0, 0
    ...     def start(self):
    ...         pass
    ...     def step(self):
    ...         self.rounds += 1
    ...         self.oracle_rows += 2
    ...         self.finished += 1
    ...     @property
    ...     def done(self):
    ...         return self.finished == self.n
    >>> countdown = Countdown(3)
    >>> run_rounds(countdown, total=3, progress=False, desc="countdown")
    >>> countdown.rounds, countdown.oracle_rows
    (3, 6)
    """
    bar = progress_bar(progress, total, desc, unit)
    shown = -math.inf
    try:
        stepper.start()
        while not stepper.done:
            stepper.step()
            # at most one refresh per tqdm mininterval (0.1 s): a round can take microseconds
            if bar is not None and time.monotonic() - shown >= bar.mininterval:
                _show(bar, stepper)
                bar.refresh()
                shown = time.monotonic()
    finally:
        if bar is not None:
            _show(bar, stepper)
            bar.close()


def _show(bar: Any, stepper: RoundStepper) -> None:
    bar.n = stepper.finished
    bar.set_postfix(rounds=stepper.rounds, rows=stepper.oracle_rows, refresh=False)
