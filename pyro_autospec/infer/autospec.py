"""``AutoSpec(model)``: exact draws of a Pyro model's discrete latent sites, used like ``MCMC``.

References
----------
.. [1] N. Anari, R. Baronio, X. Chen, A. Haqi, F. Koehler, Y. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.infer.mcmc.util import diagnostics as _mcmc_diagnostics
from pyro.infer.mcmc.util import print_summary, select_samples

from pyro_autospec.infer.sites import SiteLayout, discover_sites, log_joint

__all__ = ["AutoSpec", "build_oracle", "chain_seeds", "check_schedule"]

_SCHEDULE_KNOBS = ("rho", "max_block", "max_rows_per_round", "max_elements")


def check_schedule(schedule: dict) -> dict:
    """Reject unknown schedule keywords early, naming the accepted ones."""
    unknown = sorted(set(schedule) - set(_SCHEDULE_KNOBS))
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {unknown}; the schedule knobs passed to the engine are "
            f"{list(_SCHEDULE_KNOBS)}"
        )
    return dict(schedule)


def chain_seeds(seed: int | torch.Generator | None, num: int) -> list[int]:
    """``num`` engine seeds from ``seed``; ``None`` draws them from torch's global RNG.

    With ``seed=None`` the draws follow ``pyro.set_rng_seed`` like every Pyro sampler.
    """
    if seed is None:
        gen = None
    elif isinstance(seed, torch.Generator):
        gen = seed
    elif isinstance(seed, (int, np.integer)):
        gen = torch.Generator().manual_seed(int(seed))
    else:
        raise TypeError(
            f"seed must be an int, a torch.Generator or None; got {type(seed).__name__}"
        )
    draws = torch.randint(0, 2**62, (num,), generator=gen, device=gen.device if gen else "cpu")
    return [int(s) for s in draws.tolist()]


def build_oracle(oracle: Any, model: Callable, args: tuple, kwargs: dict, layout: SiteLayout):
    """``"enum"``: an :class:`~pyro_autospec.oracles.enum.EnumOracle`; else check the oracle."""
    if isinstance(oracle, str):
        if oracle != "enum":
            raise ValueError(
                f"oracle must be 'enum' or a MarginalOracle instance; got the string {oracle!r}"
            )
        from pyro_autospec.oracles.enum import EnumOracle

        return EnumOracle(model, args, kwargs, layout=layout)
    layout.check_oracle(oracle)
    return oracle


def _integer_dtype(value: torch.Tensor) -> bool:
    return not value.is_floating_point() or bool((value == value.round()).all())


class AutoSpec:
    """Exact, independent draws of a Pyro model's discrete latent sites given its data.

    ``AutoSpec`` has the interface of :class:`pyro.infer.MCMC` (``run``, ``get_samples``,
    ``diagnostics``, ``summary``) but its draws are exact and independent: every draw follows
    the chain rule of the posterior ``p(x | data)`` over the model's discrete latent sites in
    a uniformly random order, and autospeculation [1]_ samples ``n`` coordinates in about
    ``sqrt(n)`` batched oracle calls ("rounds") instead of ``n``.

    Parameters
    ----------
    model : callable
        A Pyro model whose latent sites are all enumerable discrete sites (Bernoulli,
        Categorical, OneHotCategorical, Binomial, BetaBinomial), inside plates or not.
        Continuous latent sites must be conditioned (``poutine.condition``) first.
    num_samples : int
        Draws per chain.
    num_chains : int
        Chains: independent batches of exact draws (one engine run each, seeded separately).
    oracle : "enum" or MarginalOracle
        ``"enum"``: exact conditional marginals by Pyro's enumeration
        (:class:`~pyro_autospec.oracles.enum.EnumOracle`). Or any object with ``num_coords``,
        ``num_values`` and ``log_marginals(values, mask)`` that follows the coordinate mapping
        of :mod:`pyro_autospec.infer.sites`: sites in trace order, each site's values
        flattened in C order over its batch shape (``OneHotCategorical``: one coordinate per
        event), values as indices into ``enumerate_support``, ``num_values`` the largest
        support. The mapping is checked by one probe query before sampling.
    method : {"autospec", "sequential"}
        ``"sequential"`` is the chain-rule reference (``n`` rounds per draw).
    max_plate_nesting : int, optional
        Found from the model when ``None``.
    seed : int, torch.Generator or None
        ``None`` follows torch's global RNG (``pyro.set_rng_seed``).
    disable_progbar : bool
        Hide the ``tqdm`` bar over rounds.
    save_params : list of str, optional
        Sites to keep in :meth:`get_samples` (default: all discrete latent sites).
    **schedule
        Engine knobs ``rho``, ``max_block``, ``max_rows_per_round``, ``max_elements``; they
        move rounds against rows and never change the law of the draws.

    Attributes
    ----------
    layout : SiteLayout
        The coordinate mapping (after :meth:`run`).
    results : list of SampleResult
        The engine's result for every chain (after :meth:`run`).

    Notes
    -----
    With an exact oracle every draw is an exact, independent draw of ``p(x | data)``; with an
    approximate oracle ``q``, each draw is exact for ``q``'s chain rule in its order, and
    ``get_extra_fields()["lp"] - get_extra_fields()["oracle_log_prob"]`` are valid log
    importance weights (ALGORITHM.md section 6).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(data):
    ...     with pyro.plate("pixels", 4):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=data)
    >>> autospec = AutoSpec(model, num_samples=50, num_chains=2, seed=0, disable_progbar=True)
    >>> autospec.run(torch.tensor([1.2, -0.7, 0.3, 2.0]))
    AutoSpec(method='autospec', num_samples=50, num_chains=2, sites=['z'])
    >>> samples = autospec.get_samples()
    >>> samples["z"].shape, samples["z"].dtype
    (torch.Size([100, 4]), torch.float32)
    >>> autospec.get_samples(group_by_chain=True)["z"].shape
    torch.Size([2, 50, 4])
    """

    def __init__(
        self,
        model: Callable,
        *,
        num_samples: int,
        num_chains: int = 1,
        oracle: Any = "enum",
        method: str = "autospec",
        max_plate_nesting: int | None = None,
        seed: int | torch.Generator | None = None,
        disable_progbar: bool = False,
        save_params: Sequence[str] | None = None,
        **schedule: Any,
    ):
        if not callable(model):
            raise TypeError(f"model must be callable; got {type(model).__name__}")
        if not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int; got {num_samples!r}")
        if not isinstance(num_chains, (int, np.integer)) or num_chains < 1:
            raise ValueError(f"num_chains must be a positive int; got {num_chains!r}")
        if method not in ("autospec", "sequential", "speculative", "agr24"):
            raise ValueError(f"method must be 'autospec' or 'sequential'; got {method!r}")
        self.model = model
        self.num_samples = int(num_samples)
        self.num_chains = int(num_chains)
        self.oracle = oracle
        self.method = method
        self.max_plate_nesting = max_plate_nesting
        self.seed = seed
        self.disable_progbar = disable_progbar
        self.save_params = None if save_params is None else list(save_params)
        self.schedule = check_schedule(schedule)
        self.layout: SiteLayout | None = None
        self.results: list = []
        self._samples: dict[str, torch.Tensor] | None = None
        self._extra: dict[str, torch.Tensor] = {}
        self._pointwise: dict[str, torch.Tensor] = {}
        self._args: tuple = ()
        self._kwargs: dict = {}

    def __repr__(self) -> str:
        sites = self.layout.names if self.layout is not None else None
        return (
            f"AutoSpec(method={self.method!r}, num_samples={self.num_samples}, "
            f"num_chains={self.num_chains}, sites={sites})"
        )

    @poutine.block
    def run(self, *args: Any, **kwargs: Any) -> AutoSpec:
        """Draw ``num_chains * num_samples`` exact samples of the discrete latent sites.

        Parameters
        ----------
        *args, **kwargs
            The model's arguments (data included).

        Returns
        -------
        AutoSpec
            ``self``.
        """
        from pyro_autospec.engine import sample_any_order

        self._args, self._kwargs = args, kwargs
        layout = discover_sites(self.model, args, kwargs, max_plate_nesting=self.max_plate_nesting)
        if self.save_params is not None:
            unknown = sorted(set(self.save_params) - set(layout.names))
            if unknown:
                raise ValueError(
                    f"save_params names {unknown}, which are not discrete latent sites of the "
                    f"model ({layout.names})"
                )
        oracle = build_oracle(self.oracle, self.model, args, kwargs, layout)
        self.layout = layout
        self.results = []
        per_chain = {name: [] for name in layout.names}
        extra = {"n_rounds": [], "oracle_rows": [], "lp": [], "oracle_log_prob": []}
        pointwise = {name: [] for name in layout.observed}
        for seed in chain_seeds(self.seed, self.num_chains):
            result = sample_any_order(
                oracle,
                self.num_samples,
                method=self.method,
                seed=seed,
                progress=not self.disable_progbar,
                **self.schedule,
            )
            self.results.append(result)
            values = layout.from_coords(result.samples.cpu())
            lp, pw = log_joint(self.model, args, kwargs, layout, values, pointwise=True)
            for name in layout.names:
                per_chain[name].append(values[name])
            for name in pointwise:
                pointwise[name].append(pw[name])
            extra["n_rounds"].append(result.sample_rounds.cpu().long())
            extra["oracle_rows"].append(
                torch.full(
                    (self.num_samples,), result.oracle_rows / self.num_samples, dtype=torch.float64
                )
            )
            extra["lp"].append(lp)
            extra["oracle_log_prob"].append(result.log_prob.cpu().double())
        self._samples = OrderedDict((k, torch.stack(v)) for k, v in per_chain.items())
        self._extra = {k: torch.stack(v) for k, v in extra.items()}
        self._pointwise = {k: torch.stack(v) for k, v in pointwise.items()}
        return self

    def _check_run(self) -> None:
        if self._samples is None:
            raise RuntimeError("call AutoSpec.run(*args, **kwargs) first")

    def _saved(self) -> dict[str, torch.Tensor]:
        self._check_run()
        if self.save_params is None:
            return dict(self._samples)
        return {k: v for k, v in self._samples.items() if k in self.save_params}

    def get_samples(
        self,
        num_samples: int | None = None,
        group_by_chain: bool = False,
        include_discrete: bool = True,
    ) -> dict[str, torch.Tensor]:
        """The draws, keyed by site name, in the model's shapes and dtypes.

        Parameters
        ----------
        num_samples : int, optional
            Resample this many draws with replacement (as ``MCMC.get_samples``).
        group_by_chain : bool
            Keep the chain dimension: ``Tensor[num_chains, num_samples, *shape]``; otherwise
            ``Tensor[num_chains * num_samples, *shape]``.
        include_discrete : bool
            ``False`` drops discrete sites; every site AutoSpec samples is discrete, so the
            result is then empty (the keyword matches ``MCMC``'s).

        Returns
        -------
        dict
            ``name -> Tensor``; Categorical sites are long, Bernoulli sites float, as the model
            samples them.
        """
        samples = self._saved() if include_discrete else {}
        if not samples:
            return {}
        return select_samples(samples, num_samples, group_by_chain)

    def get_extra_fields(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Per-draw statistics of the run.

        Returns
        -------
        dict
            Each ``Tensor[num_chains, num_samples]`` (``group_by_chain``) or flattened:

            * ``n_rounds`` (long): rounds in which the draw had an oracle query in flight (its
              latency; the sequential sampler takes ``n`` per draw);
            * ``oracle_rows`` (float64): the chain's oracle rows divided by its draws (the
              engine counts rows per run, not per draw);
            * ``lp`` (float64): ``log p(x, data)``, the model's log joint at the draw;
            * ``oracle_log_prob`` (float64): the draw's log probability under the oracle's
              chain rule (for an exact oracle ``log p(x | data)``).
        """
        self._check_run()
        if group_by_chain:
            return dict(self._extra)
        return {k: v.reshape(-1) for k, v in self._extra.items()}

    def _float_samples(self) -> dict[str, torch.Tensor]:
        return {k: v.double() for k, v in self._saved().items()}

    def diagnostics(self) -> dict[str, Any]:
        """ESS and split R-hat per site (on float copies), divergences and engine counts.

        Returns
        -------
        dict
            ``site -> {"n_eff": Tensor, "r_hat": Tensor}`` as ``MCMC.diagnostics``, plus
            ``"divergences"`` (``{"chain i": []}``: exact draws never diverge), ``"rounds"``,
            ``"oracle_rows"``, ``"mean rounds per draw"`` and ``"wall_time"`` per chain.
        """
        self._check_run()
        diag = _mcmc_diagnostics(self._float_samples(), group_by_chain=True)
        chains = [f"chain {i}" for i in range(self.num_chains)]
        diag["divergences"] = {c: [] for c in chains}
        diag["rounds"] = {c: r.rounds for c, r in zip(chains, self.results, strict=True)}
        diag["oracle_rows"] = {c: r.oracle_rows for c, r in zip(chains, self.results, strict=True)}
        diag["mean rounds per draw"] = {
            c: float(r.sample_rounds.double().mean())
            for c, r in zip(chains, self.results, strict=True)
        }
        diag["wall_time"] = {c: r.wall_time for c, r in zip(chains, self.results, strict=True)}
        return diag

    def rounds_summary(self) -> str:
        """One paragraph: rounds per draw against the sequential sampler's ``n``."""
        self._check_run()
        n = self.layout.num_coords
        per_draw = torch.cat([r.sample_rounds.double() for r in self.results])
        mean = float(per_draw.mean())
        whole = max(r.rounds for r in self.results)
        rows = sum(r.oracle_rows for r in self.results) / (self.num_samples * self.num_chains)
        change = 1.0 - mean / n
        verdict = (
            f"{100 * change:.0f}% fewer rounds than sequential"
            if change >= 0
            else f"{100 * -change:.0f}% MORE rounds than sequential"
        )
        return (
            f"Rounds ({self.method}): {mean:.2f} per draw on average (max "
            f"{int(per_draw.max())}); the sequential sampler takes {n} per draw (n = {n} "
            f"coordinates): {verdict}.\n"
            f"Whole run: {whole} rounds per chain of {self.num_samples} draws (sequential: {n}); "
            f"{rows:.1f} oracle rows per draw (sequential: {n})."
        )

    def summary(self, prob: float = 0.9) -> None:
        """Print a table like ``MCMC.summary``, discrete sites included, and the rounds saved.

        Parameters
        ----------
        prob : float
            Mass of the credible interval.
        """
        self._check_run()
        print_summary(self._float_samples(), prob=prob, group_by_chain=True)
        print("Number of divergences: 0")
        print(self.rounds_summary())

    def to_inference_data(
        self,
        coords: dict | None = None,
        dims: dict | None = None,
        log_likelihood: bool = True,
    ):
        """ArviZ data: posterior, sample_stats, observed_data and the pointwise log likelihood.

        The log likelihood of every observed site is computed by the project from one batched
        conditioned trace per chain (not ``Predictive``). Integer-valued sites (Bernoulli,
        Binomial, OneHotCategorical) are stored as int64 so ArviZ plots them as histograms.

        Parameters
        ----------
        coords, dims : dict, optional
            As in ``az.from_pyro``.
        log_likelihood : bool
            Include the ``log_likelihood`` group (arrays ``[chain, draw, *batch_shape]``).

        Returns
        -------
        arviz.InferenceData (ArviZ 0.x) or xarray.DataTree (ArviZ 1.x)
        """
        from pyro_autospec.diagnostics.arviz import to_inference_data

        self._check_run()
        posterior = {}
        for name, value in self._saved().items():
            posterior[name] = value.long() if _integer_dtype(value) else value
        extra = self._extra
        sample_stats = {
            "lp": extra["lp"],
            "n_rounds": extra["n_rounds"],
            "oracle_rows": extra["oracle_rows"],
            "oracle_log_prob": extra["oracle_log_prob"],
            "diverging": torch.zeros(extra["lp"].shape, dtype=torch.bool),
        }
        return to_inference_data(
            posterior,
            sample_stats=sample_stats,
            log_likelihood=dict(self._pointwise) if log_likelihood else None,
            observed_data=dict(self.layout.observed),
            coords=coords,
            dims=dims,
            attrs={"inference_library": "pyro_autospec", "method": self.method},
        )
