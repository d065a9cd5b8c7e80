"""Random numbers that no visible site records: found when a model is run on given values.

Every sampler is exact for a model whose density is a function of its sites. A model that
draws random numbers no visible ``pyro.sample`` site records (a latent site inside
``poutine.block``, ``torch.randn`` noise, dropout of a network in training mode) has no such
density: each run of it scores the same values differently, and the draws follow whichever
numbers the runs happened to draw. The evaluation of draws gives every site its value, so
nothing needs a random number there: :class:`RandomUse` watches the global generators
(torch's on the CPU, and on the GPUs the values live on, NumPy's and Python's) during a
model's first runs, and when one moved it finds why, on runs whose generators it restores
afterwards:

* a latent site that no handler of the evaluation saw and that drew random numbers (hidden by
  ``poutine.block``) is refused by name;
* otherwise the model is run again with the generators seeded afresh, twice: where the log
  densities of its sites change, the numbers reach them, and the model is refused. Where they
  do not (``pyro.param(name, torch.rand(...))``, whose initial value is ignored once the
  parameter exists; noise in a ``pyro.deterministic`` site; numbers drawn after the last
  statement), the numbers are harmless and the runs go on.

Numbers of low entropy that reach a scored site through plain torch code (a
``torch.bernoulli(0.999)``) may give the same densities on the reruns and pass.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch
from pyro.distributions.util import is_identically_zero
from pyro.poutine import runtime
from pyro.poutine.subsample_messenger import _Subsample

from pyro_autospec.model.errors import AutoSpecModelError
from pyro_autospec.model.tracing import seed_generators, site_role

__all__ = ["HiddenRandomnessError", "RandomUse", "HIDDEN_RANDOMNESS"]

#: Why a model whose density is not a function of its sites is refused (the end of the
#: message; its start says how it was found).
HIDDEN_RANDOMNESS = (
    "the model draws random numbers that no visible pyro.sample site records (a latent site "
    "inside poutine.block, torch.randn or torch.rand, a distribution's .sample(), dropout of "
    "a network in training mode, NumPy's or Python's random), so its density is not a "
    "function of its sites and no sampler can be exact for it. Make each such number a "
    "visible sample site of the model (pyro.sample), or pass it in as data"
)


class HiddenRandomnessError(AutoSpecModelError):
    """The model's density depends on random numbers no visible site records (a model error
    of its own: no other way of evaluating it, one draw at a time included, can help)."""


class Generators:
    """The state of the global random generators a model can draw from: torch's on the CPU
    and on the GPUs ``cuda`` (indices), NumPy's and Python's."""

    def __init__(self, cuda: list[int]):
        self.cuda = cuda
        self.before = self.now()

    def now(self) -> tuple:
        numpy_state = np.random.get_state()
        return (
            [torch.get_rng_state()] + [torch.cuda.get_rng_state(i) for i in self.cuda],
            (numpy_state[1].tobytes(), numpy_state[2:]),
            random.getstate(),
        )

    def moved(self) -> bool:
        """Whether any of the generators moved since this object was made."""
        (torch_before, *others_before), (torch_now, *others_now) = self.before, self.now()
        changed = any(not torch.equal(a, b) for a, b in zip(torch_before, torch_now))
        return changed or others_before != others_now

    @contextlib.contextmanager
    def restored(self) -> Iterator[None]:
        """Run the body, then put every generator back as it was before it."""
        numpy_state, python_state = np.random.get_state(), random.getstate()
        with torch.random.fork_rng(devices=self.cuda):
            try:
                yield
            finally:
                np.random.set_state(numpy_state)
                random.setstate(python_state)

    @staticmethod
    def seed(seed: int) -> None:
        """Seed every global generator with ``seed``."""
        seed_generators(seed)
        np.random.seed(seed)
        random.seed(seed)


class _Statements:
    """Pyro's default behaviour for every statement of a run, watched. Every sample and param
    statement reaches it, also one that a handler of the model hides from the evaluation's
    own (``poutine.block``); it records

    * ``hidden``: the latent sample sites that reached it with no value (no handler of the
      evaluation saw them) and drew random numbers there;
    * ``unexcused``: the sample sites the generators moved just before. A move before a param
      statement (``pyro.param(name, torch.rand(...))``), a plate or a ``pyro.deterministic``
      site is excused: what it draws may reach no scored site, which the densities on
      reseeded runs decide.
    """

    def __init__(self, generators: Generators):
        self.cuda = generators.cuda
        self.state = Generators(self.cuda)
        self.hidden: list[str] = []
        self.unexcused: list[str] = []

    def process(self, original: Callable, msg) -> None:
        sample = msg["type"] == "sample"
        ours = msg["name"].startswith("_autospec")  # the plate over draws
        if self.state.moved() and sample and not ours:
            if not (isinstance(msg["fn"], _Subsample) or site_role(msg) == "deterministic"):
                self.unexcused.append(msg["name"])
        unvalued = not (msg["done"] or msg["is_observed"] or msg["value"] is not None)
        drawing = Generators(self.cuda)
        original(msg)
        if sample and unvalued and not isinstance(msg["fn"], _Subsample) and drawing.moved():
            self.hidden.append(msg["name"])
        self.state = Generators(self.cuda)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Watch the statements of the runs in the body."""
        original = runtime.default_process_message
        runtime.default_process_message = lambda msg: self.process(original, msg)
        try:  # apply_stack reads it from its module at every statement
            yield
        finally:
            runtime.default_process_message = original


def _densities(trace) -> list[tuple[str, torch.Tensor]]:
    """Every scored site's log density in a traced run (``compute_log_prob`` done)."""
    return [
        (name, site["log_prob"])
        for name, site in trace.nodes.items()
        if site["type"] == "sample"
        and "log_prob" in site
        and not is_identically_zero(site["log_prob"])
    ]


def _same(first: list, second: list) -> bool:
    return len(first) == len(second) and all(
        a == c and b.shape == d.shape and bool(torch.equal(b, d) | (b.isnan() & d.isnan()).all())
        for (a, b), (c, d) in zip(first, second)
    )


class RandomUse:
    """The watch of one evaluation's model runs (see the module's notes).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist, torch
    >>> def model():
    ...     z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     pyro.sample("y", dist.Normal(z + torch.randn(()), 1.0), obs=torch.tensor(0.0))
    >>> values = {"z": torch.tensor(1.0)}
    >>> def run():
    ...     trace = pyro.poutine.trace(pyro.condition(model, data=values)).get_trace()
    ...     trace.compute_log_prob()
    ...     return trace
    >>> use = RandomUse()
    >>> with use.watching(values, run):
    ...     _ = run()
    Traceback (most recent call last):
    ...
    pyro_autospec.model.randomness.HiddenRandomnessError: A global random number generator ...
    """

    #: The runs of one evaluation that are watched (a model draws the same way on each).
    WATCHED_RUNS = 4

    def __init__(self):
        self.runs = 0
        self.moved = False  # a watched run moved a generator
        self.settled = False  # the numbers the model draws were found harmless

    @contextlib.contextmanager
    def watching(
        self, values: Mapping[str, torch.Tensor], run: Callable[[], object]
    ) -> Iterator[None]:
        """Watch the run in the body, on ``values`` (every site given one); ``run()`` runs the
        model the same way again and returns its trace (log densities computed)."""
        if self.settled or self.runs >= self.WATCHED_RUNS:
            yield
            return
        self.runs += 1
        cuda = sorted({v.device.index or 0 for v in values.values() if v.device.type == "cuda"})
        generators = Generators(cuda)
        yield
        if generators.moved():
            self.moved = True
            self._explain(generators, run)

    def _explain(self, generators: Generators, run: Callable[[], object]) -> None:
        statements = _Statements(generators)
        with generators.restored():
            with statements.watching():
                densities = _densities(run())
            hidden, unexcused = statements.hidden, statements.unexcused
            if hidden:
                raise HiddenRandomnessError(
                    f"The sample site '{hidden[0]}' drew a random value while the model was "
                    "run with every site AutoSpec sees given a value: no handler saw it (a "
                    "poutine.block around it, or a handler of the model's own that stops its "
                    f"message), so it is drawn afresh on every run: {HIDDEN_RANDOMNESS}."
                )
            if unexcused:
                raise HiddenRandomnessError(
                    "A global random number generator (torch's, NumPy's or Python's) advanced "
                    f"just before the sample site '{unexcused[0]}' while the model was run "
                    f"with every one of its sites given a value: {HIDDEN_RANDOMNESS}. Numbers "
                    "that only a pyro.deterministic site or a parameter's initial value reads "
                    "are allowed where they are drawn just before that statement."
                )
            for seed in (1, 2):  # the numbers seeded afresh: do the densities move?
                generators.seed(seed)
                if not _same(_densities(run()), densities):
                    raise HiddenRandomnessError(
                        "A global random number generator (torch's, NumPy's or Python's) "
                        "advanced while the model was run with every one of its sites given a "
                        "value, and the log densities of its sites changed when the model was "
                        f"run again with other random numbers: {HIDDEN_RANDOMNESS}."
                    )
        self.settled = True
