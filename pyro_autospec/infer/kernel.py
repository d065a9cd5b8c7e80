"""``AutoSpecKernel``: exact draws behind Pyro's ``MCMC`` driver (and ``az.from_pyro``)."""

from __future__ import annotations

import multiprocessing
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

from pyro_autospec.infer.autospec import build_oracle, chain_seeds, check_schedule
from pyro_autospec.infer.sites import SiteLayout, discover_sites

__all__ = ["AutoSpecKernel"]


class AutoSpecKernel(MCMCKernel):
    """An :class:`~pyro.infer.mcmc.mcmc_kernel.MCMCKernel` whose every step is an exact draw.

    ``MCMC(AutoSpecKernel(model), num_samples=..., warmup_steps=0).run(*args)`` runs the
    autospeculation engine on batches of ``draws_per_run`` independent exact draws and hands
    them out one per ``sample`` call; warmup steps are unnecessary (and only waste draws).
    ``MCMC`` concatenates sites into one float vector, so the values it stores are floats
    (Categorical sites included); :class:`~pyro_autospec.infer.autospec.AutoSpec` keeps native
    dtypes and is the richer interface.

    Parameters
    ----------
    model : callable
        A Pyro model with enumerable discrete latent sites only (see ``AutoSpec``).
    oracle : "enum" or MarginalOracle
        As in :class:`~pyro_autospec.infer.autospec.AutoSpec`.
    method : {"autospec", "sequential", "speculative", "agr24"}
    max_plate_nesting : int, optional
    seed : int, torch.Generator or None
        ``None`` follows torch's global RNG (``pyro.set_rng_seed``). Chains run in one process
        continue one generator, so they differ; when ``MCMC`` runs chains in worker processes
        (it reseeds each worker with ``initial_seed + chain_id``) the worker's
        ``torch.initial_seed()`` is mixed into an int seed so that chains still differ.
    draws_per_run : int
        Exact draws per engine run (one batch of parallel samplers).
    disable_progbar : bool
        Hide the engine's own bar (``MCMC`` shows its bar over steps). Default True.
    **schedule
        Engine knobs (``rho``, ``max_block``, ``max_rows_per_round``, ``max_elements``).

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
        **schedule: Any,
    ):
        if draws_per_run < 1:
            raise ValueError(f"draws_per_run must be >= 1; got {draws_per_run}")
        self.model = model
        self.oracle = oracle
        if method not in ("autospec", "sequential", "speculative", "agr24"):
            raise ValueError(
                "method must be one of ('autospec', 'sequential', 'speculative', 'agr24'); "
                f"got {method!r}"
            )
        self.method = method
        self.max_plate_nesting = max_plate_nesting
        self.draws_per_run = int(draws_per_run)
        self.disable_progbar = disable_progbar
        self.schedule = check_schedule(schedule)
        self._seed = None
        if seed is None or isinstance(seed, torch.Generator):
            self._generator = seed
        else:
            self._seed = int(seed)
            self._generator = torch.Generator().manual_seed(self._seed)
        self.layout: SiteLayout | None = None
        self._oracle = None
        self._buffer: list[dict[str, torch.Tensor]] = []
        self._counts = {"rounds": 0, "oracle_rows": 0, "draws": 0, "sample_rounds": 0}
        self._initial_params = None

    # -- MCMCKernel interface -------------------------------------------------------------
    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        """Find the discrete sites and build the oracle; called by ``MCMC`` once per chain."""
        self._args, self._kwargs = args, kwargs
        if self._seed is not None and multiprocessing.parent_process() is not None:
            self._generator = torch.Generator().manual_seed(
                (self._seed * 1_000_003 + torch.initial_seed()) % 2**63
            )
        self.layout = discover_sites(
            self.model, args, kwargs, max_plate_nesting=self.max_plate_nesting
        )
        self._oracle = build_oracle(self.oracle, self.model, args, kwargs, self.layout)
        self._buffer = []
        self._counts = {"rounds": 0, "oracle_rows": 0, "draws": 0, "sample_rounds": 0}
        self._initial_params = None

    @property
    def transforms(self) -> dict:
        """No transforms: discrete values are sampled as they are."""
        return {}

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
        from pyro_autospec.engine import sample_any_order

        if self.layout is None:
            raise RuntimeError("AutoSpecKernel.setup(warmup_steps, *args) must run first")
        (seed,) = chain_seeds(self._generator, 1)
        result = sample_any_order(
            self._oracle,
            self.draws_per_run,
            method=self.method,
            seed=seed,
            progress=not self.disable_progbar,
            **self.schedule,
        )
        self._counts["rounds"] += result.rounds
        self._counts["oracle_rows"] += result.oracle_rows
        values = self.layout.from_coords(result.samples.cpu())
        rounds = result.sample_rounds.tolist()
        self._buffer = [
            ({name: v[i].to(torch.get_default_dtype()) for name, v in values.items()}, rounds[i])
            for i in range(self.draws_per_run - 1, -1, -1)
        ]

    def _next(self) -> dict[str, torch.Tensor]:
        if not self._buffer:
            self._refill()
        params, rounds = self._buffer.pop()
        self._counts["draws"] += 1
        self._counts["sample_rounds"] += rounds
        return params
