"""The reference engine's round scheduler: many samplers, one batched oracle call per round.

Samplers are written as plain Python generators that ``yield`` commands:

* :class:`Call` -- "I need these oracle rows". The generator is resumed with the response
  after the next round. Every call pending at the start of a round goes into ONE batched
  oracle call (the problem's ``dispatch`` may cut it into memory-sized chunks; chunks of one
  round still count as one round).
* :class:`FirstAccepted` -- "run exact tries of a residual step as parallel threads and give
  me the accepted try with the smallest thread index". This is the index-ordered rule of
  :doc:`/algorithm`: a try is returned only once every try with a smaller index has
  finished and rejected; tries with larger indices are cancelled. Running time never decides
  the winner, so the schedule (batch growth ``rho``, the rows-per-round cap) moves rounds
  against rows and never changes the output law.

The scheduler knows nothing about what the rows mean: the reference recursion runs on it for
both settings (discrete coordinates and diffusion steps).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pyro_autospec.engine.stepping import run_rounds

__all__ = ["Call", "FirstAccepted", "Scheduler", "RunStats", "next_batch"]


@dataclass
class Call:
    """A request for oracle rows, answered after the next round.

    Parameters
    ----------
    payload : object
        Problem-specific description of the rows; handed to ``dispatch`` unchanged.
    rows : int
        Number of rows (conditionings) the request counts.
    sample : int
        Index of the sample this request serves (for per-sample latency in rounds).
    """

    payload: Any
    rows: int
    sample: int


@dataclass
class FirstAccepted:
    """Run tries ``make_thread(1), make_thread(2), ...`` and return the first accepted one.

    Each thread is a generator that finally returns ``(accepted: bool, result)``. Threads are
    launched in batches: batch ``r`` holds the indices ``i`` with
    ``ceil((1 + rho)^r) <= i < ceil((1 + rho)^(r + 1))`` (empty batches are skipped), and batch
    ``r + 1`` starts when every thread of batch ``r`` has rejected. The yielding generator is
    resumed with the ``result`` of the accepted thread with the smallest index.
    """

    make_thread: Callable[[int], Generator]
    rho: float


@dataclass
class RunStats:
    """Counters of one scheduler run."""

    rounds: int = 0
    oracle_rows: int = 0
    sample_rounds: list[int] = field(default_factory=list)


class _Task:
    __slots__ = ("gen", "race", "index", "sample", "waiting_on", "cancelled", "done")

    def __init__(self, gen: Generator, race: _Race | None, index: int, sample: int):
        self.gen = gen
        self.race = race  # the race this task is a thread of (None for a root)
        self.index = index  # thread index within its race, or root index
        self.sample = sample
        self.waiting_on: _Race | None = None  # a race this task waits for
        self.cancelled = False
        self.done = False


class _Race:
    __slots__ = ("owner", "spec", "live", "results", "next_index", "batch", "decided", "scan")

    def __init__(self, owner: _Task, spec: FirstAccepted):
        self.owner = owner
        self.spec = spec
        self.live: dict[int, _Task] = {}
        self.results: dict[int, tuple[bool, Any]] = {}
        self.next_index = 1  # smallest index not yet launched
        self.batch = 0
        self.decided = False
        self.scan = 1  # every index below it has finished and rejected


class Scheduler:
    """Advance many sampler generators together, one batched oracle call per round.

    Parameters
    ----------
    dispatch : callable
        ``dispatch(payloads: list) -> list`` answers every payload of one round, in order.
    max_rows_per_round : int, optional
        Cap on the rows sent in one round. Calls beyond it wait for the next round (first
        come, first served; at least one call always goes). Never changes the output law.
    max_concurrent : int, optional
        Roots in flight at once; the next root starts when one finishes.
    progress : bool
        Show a tqdm progress bar over finished samples, with rounds and rows.
    desc : str
        Label of the progress bar.

    Examples
    --------
    >>> def sampler(sample):
    ...     answer = yield Call(payload=sample, rows=1, sample=sample)
    ...     return answer * 10
    >>> scheduler = Scheduler(dispatch=lambda payloads: [p + 1 for p in payloads])
    >>> scheduler.run([sampler(0), sampler(1)])
    [10, 20]
    >>> scheduler.stats.rounds, scheduler.stats.oracle_rows
    (1, 2)
    """

    def __init__(
        self,
        dispatch: Callable[[list], Sequence],
        *,
        max_rows_per_round: int | None = None,
        max_concurrent: int | None = None,
        progress: bool = False,
        desc: str = "autospec",
    ):
        if max_rows_per_round is not None and max_rows_per_round < 1:
            raise ValueError(f"max_rows_per_round must be >= 1 or None, got {max_rows_per_round}")
        self.dispatch = dispatch
        self.max_rows_per_round = max_rows_per_round
        self.max_concurrent = max_concurrent
        self.progress = progress
        self.desc = desc
        self.stats = RunStats()
        self._pending: dict[_Task, Call] = {}
        self._results: list[Any] = []
        self._finished = 0

    # ------------------------------------------------------------------ driving
    def run(self, roots: Sequence[Generator], samples: Sequence[int] | None = None) -> list:
        """Run root generators to completion and return their results in order.

        ``samples[k]`` is the sample index that root ``k`` serves (default: ``k``).
        """
        samples = list(range(len(roots))) if samples is None else list(samples)
        self.stats = RunStats(sample_rounds=[0] * (max(samples, default=-1) + 1))
        self._results = [None] * len(roots)
        self._finished = 0
        self._roots = list(roots)
        self._samples = samples
        self._next_root = 0
        run_rounds(self, total=len(roots), progress=self.progress, desc=self.desc, unit="sample")
        return self._results

    # the round protocol of :func:`~pyro_autospec.engine.stepping.run_rounds`
    def start(self) -> None:
        """Start the first roots (all of them, or ``max_concurrent``)."""
        first = len(self._roots) if self.max_concurrent is None else self.max_concurrent
        for _ in range(min(first, len(self._roots))):
            self._start_root()

    def step(self) -> None:
        """One round (roots that finish start the next ones)."""
        self._round()

    @property
    def done(self) -> bool:
        return not self._pending

    @property
    def finished(self) -> int:
        return self._finished

    @property
    def rounds(self) -> int:
        return self.stats.rounds

    @property
    def oracle_rows(self) -> int:
        return self.stats.oracle_rows

    def _round(self) -> None:
        tasks, calls, rows = [], [], 0
        cap = self.max_rows_per_round
        for task, call in self._pending.items():
            if cap is not None and tasks and rows + call.rows > cap:
                break
            tasks.append(task)
            calls.append(call)
            rows += call.rows
        for task in tasks:
            del self._pending[task]
        responses = self.dispatch([c.payload for c in calls])
        if len(responses) != len(calls):
            raise RuntimeError("dispatch must answer every payload of the round")
        self.stats.rounds += 1
        self.stats.oracle_rows += rows
        for sample in {c.sample for c in calls}:
            self.stats.sample_rounds[sample] += 1
        for task, response in zip(tasks, responses):
            if not task.cancelled:
                self._advance(task, response)

    # ------------------------------------------------------------------ tasks
    def _start_root(self) -> None:
        k = self._next_root
        self._next_root += 1
        self._advance(_Task(self._roots[k], None, k, self._samples[k]), None)

    def _advance(self, task: _Task, value: Any) -> None:
        """Resume ``task`` with ``value`` until it waits for a call or a race, or ends."""
        try:
            command = task.gen.send(value)
        except StopIteration as stop:
            task.done = True
            self._finish(task, stop.value)
            return
        if isinstance(command, Call):
            self._pending[task] = command
        elif isinstance(command, FirstAccepted):
            race = _Race(task, command)
            task.waiting_on = race
            self._launch_batch(race)
        else:
            raise TypeError(
                f"sampler yielded {type(command).__name__}; expected Call or FirstAccepted"
            )

    def _finish(self, task: _Task, result: Any) -> None:
        race = task.race
        if race is None:
            self._results[task.index] = result
            self._finished += 1
            if self._next_root < len(self._roots):
                self._start_root()
            return
        del race.live[task.index]
        race.results[task.index] = result
        self._settle(race)

    def _launch_batch(self, race: _Race) -> None:
        """Launch the next non-empty batch of threads of ``race``."""
        stop, batch = next_batch(
            torch.tensor([race.next_index]),
            torch.tensor([race.batch]),
            torch.tensor([float(race.spec.rho)], dtype=torch.float64),
        )
        stop = int(stop)
        race.batch = int(batch)
        start, race.next_index = race.next_index, stop
        owner = race.owner
        for index in range(start, stop):
            child = _Task(race.spec.make_thread(index), race, index, owner.sample)
            race.live[index] = child
        for index in range(start, stop):
            child = race.live.get(index)
            if child is not None and not race.decided:
                self._advance(child, None)

    def _settle(self, race: _Race) -> None:
        """Decide ``race`` if the smallest unfinished-or-accepted index allows it."""
        if race.decided:
            return
        # Walk indices in order: all rejections are skipped, the first acceptance wins only
        # if every smaller index has finished. The walk resumes where the last one stopped
        # (finished rejections stay rejected), so a race of T threads costs O(T), not O(T^2).
        while race.scan < race.next_index:
            outcome = race.results.get(race.scan)
            if outcome is None:
                return  # a smaller thread is still running: wait for it
            accepted, result = outcome
            if accepted:
                self._decide(race, result)
                return
            race.scan += 1
        # Every launched thread rejected: launch the next batch.
        self._launch_batch(race)

    def _decide(self, race: _Race, result: Any) -> None:
        race.decided = True
        for child in list(race.live.values()):
            self._cancel(child)
        race.live.clear()
        owner = race.owner
        owner.waiting_on = None
        self._advance(owner, result)

    def _cancel(self, task: _Task) -> None:
        task.cancelled = True
        self._pending.pop(task, None)
        if task.waiting_on is not None:
            race = task.waiting_on
            race.decided = True
            for child in list(race.live.values()):
                self._cancel(child)
            race.live.clear()
        task.gen.close()


def next_batch(
    next_index: torch.Tensor, batch: torch.Tensor, rho: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Thread indices of the next batch of a race: ``[next_index, stop)`` and the new batch.

    Batch ``r`` holds the indices ``ceil((1+rho)^r) <= i < ceil((1+rho)^(r+1))``; empty batches
    are skipped.

    Parameters
    ----------
    next_index, batch : LongTensor[R]
        Smallest index not launched yet, and the number of batches considered so far.
    rho : DoubleTensor[R]
        Batch growth of each race.

    Returns
    -------
    stop, batch : LongTensor[R]

    Examples
    --------
    >>> rho = torch.tensor([3.0], dtype=torch.float64)
    >>> stop, batch = next_batch(torch.tensor([1]), torch.tensor([0]), rho)
    >>> int(stop), int(batch)  # tries 1, 2, 3 first: ceil(4^0) <= i < ceil(4^1)
    (4, 1)
    """
    growth = torch.log1p(rho)
    r = torch.maximum(batch, torch.floor(torch.log(next_index.double()) / growth).long())
    stop = torch.ceil(torch.exp(growth * (r + 1).double())).long()
    while True:  # rounding of the closed form (at most a step or two)
        low = stop <= next_index
        if not bool(low.any()):
            break
        r = torch.where(low, r + 1, r)
        stop = torch.where(low, torch.ceil(torch.exp(growth * (r + 1).double())).long(), stop)
    return stop, r + 1
