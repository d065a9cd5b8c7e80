"""``AutoSpecKernel``: exact draws behind Pyro's ``MCMC`` driver (and ``az.from_pyro``)."""

from __future__ import annotations

import multiprocessing
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro import poutine
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.errors import check_device
from pyro_autospec.engine.keys import check_seed
from pyro_autospec.engine.methods import (
    DISCRETE,
    Schedule,
    accepts_keyword_knobs,
    given_knobs,
    method_names,
)
from pyro_autospec.infer.draws import DrawEvaluator, ModelCall, check_assignments
from pyro_autospec.infer.knobs import (
    check_count,
    check_model,
    refuse_unknown_keywords,
)
from pyro_autospec.infer.oracle_choice import build_oracle, same_call, snapshot
from pyro_autospec.infer.seeds import ChainSeeds
from pyro_autospec.infer.self_check import SelfCheck, reference_for
from pyro_autospec.model.discrete import SiteLayout, discover_sites

__all__ = ["AutoSpecKernel"]

_DISCRETE_METHODS = method_names(DISCRETE, front_end=True)

#: Earlier draws every new engine run's draws are checked against (the first ones).
_SELF_CHECK_REFERENCE = 256


#: Where the streams of ``MCMC``'s worker processes start (chain ``c``: ``WORKER_STREAM + c``),
#: away from the streams a run's stages use.
WORKER_STREAM = 2**32


def _worker_chain() -> int | None:
    """The chain a worker process of ``MCMC`` runs, or ``None`` in the main process.

    ``MCMC`` names its workers ``"0"``, ``"1"``, ...; a worker named otherwise (another
    driver's) is told apart by ``torch.initial_seed()`` reduced below ``2**62`` (distinct
    chains where the driver seeds its workers apart, not reproducible without a global seed).
    """
    if multiprocessing.parent_process() is None:
        return None
    name = multiprocessing.current_process().name
    return int(name) if name.isdigit() else torch.initial_seed() % 2**62


class _NativeDtypes(poutine.messenger.Messenger):
    """Hands the model each discrete site's value in the site's own dtype.

    ``MCMC`` stores every draw as floats, and ``Predictive`` (which ``az.from_pyro`` uses for
    the log likelihood) conditions the model on them: a Categorical value would reach the model
    as a float and break indexing such as ``probs[z]``.
    """

    def __init__(self, dtypes: dict):
        super().__init__()
        self.dtypes = dtypes

    def _pyro_post_sample(self, msg):
        dtype = self.dtypes.get(msg["name"])
        value = msg["value"]
        if dtype is not None and torch.is_tensor(value) and value.dtype != dtype:
            msg["value"] = value.to(dtype)


class _ModelWithNativeDtypes:
    """The user's model, called under :class:`_NativeDtypes` once the sites are known."""

    def __init__(self, model: Callable):
        self.model = model
        self.dtypes: dict = {}
        self.__name__ = getattr(model, "__name__", type(model).__name__)
        self.__doc__ = getattr(model, "__doc__", None)

    def __call__(self, *args, **kwargs):
        with _NativeDtypes(self.dtypes):
            return self.model(*args, **kwargs)


class _Cast:
    """A ``transforms`` entry of ``MCMC``: ``inv`` casts the stored floats to ``dtype``."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def inv(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.dtype)

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(torch.get_default_dtype())


class AutoSpecKernel(MCMCKernel):
    """An :class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel` whose every step is an exact draw.

    ``MCMC(AutoSpecKernel(model), num_samples=..., warmup_steps=0).run(*args)`` runs the
    autospeculation engine on batches of ``draws_per_run`` independent exact draws and hands
    them out one per ``sample`` call; warmup steps are unnecessary (and only waste draws).

    *Dtypes.* ``MCMC`` concatenates the sites of a draw into one float vector. Sites whose
    native dtype is floating (Bernoulli, Binomial, OneHotCategorical) come back from
    ``mcmc.get_samples()`` in it (``kernel.transforms`` casts them back). Categorical sites stay
    float in ``MCMC``'s store: Pyro 1.9's ``MCMC.diagnostics`` / ``summary`` (and so
    ``az.from_pyro``, which calls them) fail on integer tensors. ``kernel.model``, which
    ``az.from_pyro`` and ``Predictive`` run, hands the model every discrete value in its native
    dtype, so models that index with a Categorical value (``probs[z]``) work and
    ``az.from_pyro(mcmc)`` gets a correct ``log_likelihood`` group.
    :class:`~pyro_autospec.infer.autospec.AutoSpec` keeps native dtypes everywhere and is the
    richer interface.

    *Self-check.* As in :class:`~pyro_autospec.infer.autospec.AutoSpec`, the model is evaluated
    at every draw and ``log p(x, data) - log q(x)`` must be the same for all of them
    (:class:`~pyro_autospec.infer.self_check.SelfCheck`): each engine run's draws are checked
    together with the first draws of the run (of every chain that ``MCMC`` runs in this
    process with the same arguments), so that one draw per engine run is still compared. The
    first engine run's batch also evaluates the check's own assignments, never returned, as
    ``AutoSpec`` does: assignments drawn uniformly from the sites' supports, at which the law
    of the enumeration is read by forward filtering, and extra draws up to 64
    (:func:`~pyro_autospec.infer.draws.check_assignments`), so that a model the enumeration
    does not reproduce fails where the draws rarely go. An
    ``oracle=`` without ``log_normalizer()`` is compared with ``log Z`` from an exact
    elimination of the model's discrete sites where it fits and is cheap
    (:func:`~pyro_autospec.infer.self_check.reference_log_normalizer`). A failure raises
    :class:`~pyro_autospec.infer.self_check.SelfCheckError` from ``mcmc.run``.

    Parameters
    ----------
    model : callable
        A Pyro model with enumerable discrete latent sites only (see ``AutoSpec``).
    oracle : "enum" or MarginalOracle
        As in :class:`~pyro_autospec.infer.autospec.AutoSpec`.
    method : {"autospec", "sequential", "speculative", "agr24"}
    max_plate_nesting : int, optional
    seed : int, torch.Generator, numpy.random.Generator or None
        ``None`` follows torch's global RNG (``pyro.set_rng_seed``). An int must lie in
        ``[0, 2**64)`` (:func:`~pyro_autospec.engine.keys.check_seed`). Chains run in one process
        continue one generator, so they differ. When ``MCMC`` runs chains in worker processes
        (with more than two CPUs), each worker draws from a stream of its chain (the number
        ``MCMC`` gives the worker) beside the seed's own: the chains differ and an int seed,
        or a seeded generator, reproduces them whatever torch's global seed. The two ways
        of running give different draws for the same seed. A worker runs torch on one
        thread: a process forked after its parent ran a parallel torch operation can hang in
        its own first one.
    draws_per_run : int
        Exact draws per engine run (one batch of parallel samplers).
    disable_progbar : bool
        Hide the engine's own bar (``MCMC`` shows its bar over steps). Default True.
    device : torch.device or str, optional
        Where the oracle and the engine run (as in
        :class:`~pyro_autospec.infer.autospec.AutoSpec`); by default the device of the model's
        tensors. ``MCMC`` receives each draw on the CPU, as it stores them.
    schedule : Schedule or dict, optional
        The engine's schedule knobs in one typed object (:class:`~pyro_autospec.Schedule`:
        ``rho``, ``max_block``, ``max_rows_per_round``, ``max_elements``,
        ``max_concurrent_draws``). The knobs as keywords (``max_block=8``), the old spelling,
        still work with a :class:`FutureWarning` (not both ways for one knob; a cap given as a
        keyword replaces the schedule's).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro.infer import MCMC
    >>> def model(data):
    ...     z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
    ...     pyro.sample("y", dist.Normal(z.float(), 1.0), obs=data)
    >>> mcmc = MCMC(AutoSpecKernel(model, seed=0), num_samples=20, warmup_steps=0,
    ...             disable_progbar=True)
    >>> mcmc.run(torch.tensor(1.5))
    >>> mcmc.get_samples()["z"].shape
    torch.Size([20])
    >>> mcmc.diagnostics()["divergences"]
    {'chain 0': []}
    """

    @accepts_keyword_knobs(refuse_unknown_keywords)
    def __init__(
        self,
        model: Callable,
        *,
        oracle: Any = "enum",
        method: str = "autospec",
        max_plate_nesting: int | None = None,
        seed: int | torch.Generator | None = None,
        draws_per_run: int = 1000,
        disable_progbar: bool = True,
        device: torch.device | str | None = None,
        schedule: Schedule | Mapping | None = None,
    ):
        check_count("draws_per_run", draws_per_run, 1)
        self.device = None if device is None else check_device(device)
        check_model(model, "AutoSpecKernel")
        check_count("max_plate_nesting", max_plate_nesting, 0, optional=True)
        self.user_model = model
        self.model = _ModelWithNativeDtypes(model)
        self.oracle = oracle
        if method not in _DISCRETE_METHODS:
            raise ValueError(f"method must be one of {_DISCRETE_METHODS}; got {method!r}")
        self.method = method
        self.max_plate_nesting = max_plate_nesting
        self.draws_per_run = int(draws_per_run)
        self.disable_progbar = disable_progbar
        self.schedule = given_knobs(schedule)
        self._seed = check_seed(seed)
        self._seeds = ChainSeeds(self._seed)  # one stream: the chains of a process continue it
        self.layout: SiteLayout | None = None
        self._oracle = None
        self._device: torch.device | str | None = None
        self._buffer: list[dict[str, torch.Tensor]] = []
        self._counts = {"rounds": 0, "oracle_rows": 0, "draws": 0, "sample_rounds": 0}
        self._initial_params = None
        self._self_check: SelfCheck | None = None
        self._probes_pending = False
        self._draws: DrawEvaluator | None = None
        self._checked_call: Any = None
        self._call: Any = None
        #: Largest deviation of ``log p(x, data) - log q(x)`` from its common value so far.
        self.max_self_check_error: float | None = None

    # -- MCMCKernel interface -------------------------------------------------------------
    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Find the discrete sites of ``model(*args, **kwargs)``; called by ``MCMC`` once per
        chain, and in the main process when the chains ran in worker processes (for the
        ``transforms`` and the dtypes of ``kernel.model``). The oracle is built on the first
        draw."""
        self._args, self._kwargs = args, kwargs
        chain = _worker_chain()
        if chain is not None and multiprocessing.current_process().name.isdigit():
            # a worker MCMC forked: torch's parallel operations can hang in a process forked
            # after its parent ran one (OpenMP is not fork-safe; Pyro's own kernels hang there
            # too), and the worker is one chain of several on their own CPUs anyway
            torch.set_num_threads(1)
        if chain is not None and self._seed is not None:
            # a worker of MCMC: a stream of its own chain. An int seed is the root; a
            # generator, copied unchanged into every worker, gives the root its first number
            root = self._seed if isinstance(self._seed, int) else ChainSeeds(self._seed)(1)[0]
            self._seeds = ChainSeeds(root, stream=WORKER_STREAM + chain)
        self.layout = discover_sites(
            self.user_model, args, kwargs, max_plate_nesting=self.max_plate_nesting
        )
        self.model.dtypes = {site.name: site.dtype for site in self.layout.sites}
        self._call = snapshot((args, kwargs))
        self._oracle = None
        self._buffer = []
        self._counts = {"rounds": 0, "oracle_rows": 0, "draws": 0, "sample_rounds": 0}
        self._initial_params = None

    def _prepare(self) -> None:
        """Build the oracle and the draws' evaluation for the arguments of the last setup."""
        args, kwargs = self._args, self._kwargs
        self._oracle = build_oracle(
            self.oracle, self.user_model, args, kwargs, self.layout, self.device
        )
        # every setup (a chain) checks its draws afresh, the check's probes included: between
        # two MCMC runs with the same arguments the model's parameters (an SVI step) or the
        # tensors it closes over may have changed, and draws of two laws share no log Z
        custom = not isinstance(self.oracle, str)
        log_z, _ = reference_for(
            self._oracle, custom, self.user_model, args, kwargs, self.layout, self.device
        )
        self._self_check = SelfCheck(
            self._oracle, custom_oracle=custom, log_normalizer=log_z, keep=_SELF_CHECK_REFERENCE
        )
        self._probes_pending = True  # the next run's batch takes the check's assignments
        if not same_call(self._call, self._checked_call):  # the largest error over new data
            self.max_self_check_error = None
        self._checked_call = self._call
        # where the engine and the draws' evaluation run: device=, else the oracle's
        self._device = self.device or getattr(self._oracle, "device", None)
        self._draws = DrawEvaluator(
            ModelCall(self.user_model, args, kwargs),
            self.layout,
            self_check=self._self_check,
            device=self._device,
            outputs=False,
        )

    @property
    def transforms(self) -> dict | None:
        """Casts back to each site's native floating dtype (Categorical sites stay float).

        ``None`` before :meth:`setup`: ``MCMC`` then sets the kernel up in the main process
        (its chains may have run in worker processes) to read them.
        """
        if self.layout is None:
            return None
        return {s.name: _Cast(s.dtype) for s in self.layout.sites if s.dtype.is_floating_point}

    @property
    def initial_params(self) -> dict[str, torch.Tensor]:
        """A first state: the first exact draw (float values)."""
        if self._initial_params is None:
            self._initial_params = self._next()
        return self._initial_params

    @initial_params.setter
    def initial_params(self, params: dict[str, torch.Tensor]) -> None:
        self._initial_params = params

    def sample(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return the next exact draw (independent of ``params``), values as floats."""
        return self._next()

    def logging(self) -> OrderedDict:
        """Shown in ``MCMC``'s progress bar: mean rounds per draw so far."""
        draws = max(self._counts["draws"], 1)
        return OrderedDict([("rounds/draw", f"{self._counts['sample_rounds'] / draws:.1f}")])

    def diagnostics(self) -> dict[str, Any]:
        """``divergences`` (none: draws are exact), ``acceptance rate`` 1 and engine counts."""
        return {
            "divergences": [],
            "acceptance rate": 1.0,
            "rounds": self._counts["rounds"],
            "oracle_rows": self._counts["oracle_rows"],
        }

    # -- internals ---------------------------------------------------------------------------
    def _refill(self) -> None:
        if self.layout is None:
            raise RuntimeError("AutoSpecKernel.setup(warmup_steps, *args) must run first")
        if self._oracle is None:
            self._prepare()
        (seed,) = self._seeds(1)
        result = sample_any_order(
            self._oracle,
            self.draws_per_run,
            method=self.method,
            seed=seed,
            device=self._device,
            progress=not self.disable_progbar,
            schedule=self.schedule,
        )
        self._counts["rounds"] += result.rounds
        self._counts["oracle_rows"] += result.oracle_rows
        # the draws' values, log joint and the self-check of this engine run's draws, pooled
        # with the first earlier ones
        checks = None
        if self._probes_pending:  # the first run of a check: uniform probes, extra draws
            self._probes_pending = False
            checks = check_assignments(self.layout, self._oracle, seed, self.draws_per_run)
        evaluated = self._draws.evaluate(result.samples, result.log_prob, checks=checks)
        error, largest = self._draws.check(), self.max_self_check_error
        self.max_self_check_error = error if largest is None else max(largest, error)
        values = evaluated.values
        rounds = result.sample_rounds.tolist()
        self._buffer = [
            (
                {name: v[i].cpu().to(torch.get_default_dtype()) for name, v in values.items()},
                rounds[i],
            )
            for i in range(self.draws_per_run - 1, -1, -1)
        ]

    def _next(self) -> dict[str, torch.Tensor]:
        if not self._buffer:
            self._refill()
        params, rounds = self._buffer.pop()
        self._counts["draws"] += 1
        self._counts["sample_rounds"] += rounds
        return params
