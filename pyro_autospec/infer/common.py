"""Helpers every run kind shares: seeds, schedule knobs, oracles, the exactness self-check, and
MCMC-style summaries that also work for a handful of draws.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from itertools import product
from typing import Any

import numpy as np
import torch
from pyro.ops import stats

from pyro_autospec.diagnostics.ess import effective_sample_size, split_gelman_rubin
from pyro_autospec.engine.keys import check_seed
from pyro_autospec.engine.methods import DISCRETE, knob_names, method_names
from pyro_autospec.model.discrete import SiteLayout
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.parallel.groups import broadcast_seeds

__all__ = [
    "CORRECTIONS",
    "METHODS",
    "MIN_DRAWS_FOR_DIAGNOSTICS",
    "SelfCheck",
    "SelfCheckError",
    "build_oracle",
    "chain_seeds",
    "check_exact_draws",
    "check_schedule",
    "print_summary_table",
    "site_diagnostics",
    "summary_table",
]

#: The engine's schedule knobs on ``[q]^n`` (each method accepts its own; the engine checks).
SCHEDULE_KNOBS = knob_names(DISCRETE)
CORRECTIONS = (None, "importance", "imh")
#: The methods the front end offers (discrete and diffusion), from the engine's one list.
METHODS = method_names(front_end=True)
#: ``split_gelman_rubin`` and ``effective_sample_size`` need this many draws per chain.
MIN_DRAWS_FOR_DIAGNOSTICS = 4


class SelfCheckError(RuntimeError):
    """``log p(x, data) - log q(x)`` was not constant across draws of an exact oracle."""


def check_schedule(schedule: dict) -> dict:
    """Reject unknown schedule keywords early, naming the accepted ones.

    Examples
    --------
    >>> check_schedule({"rho": 2.0})
    {'rho': 2.0}
    """
    unknown = sorted(set(schedule) - set(SCHEDULE_KNOBS))
    if unknown:
        raise TypeError(
            f"unknown keyword(s) {unknown}; the schedule knobs passed to the engine are "
            f"{list(SCHEDULE_KNOBS)} (the device is the keyword device=)"
        )
    return dict(schedule)


def chain_seeds(
    seed: int | torch.Generator | np.random.Generator | None,
    num: int,
    *,
    distributed: bool = False,
) -> list[int]:
    """``num`` engine seeds from ``seed``; ``None`` draws them from torch's global RNG.

    ``seed`` is checked by :func:`~pyro_autospec.engine.keys.check_seed` (the check of every
    entry point): an int in ``[0, 2**64)``, a torch or NumPy generator, or ``None``.

    With ``seed=None`` the draws follow ``pyro.set_rng_seed`` like every Pyro sampler. With
    ``distributed=True`` every rank of the ``torch.distributed`` group gets rank 0's seeds
    (:func:`~pyro_autospec.parallel.groups.broadcast_seeds`), so that ``seed=None`` does not
    give each rank a different run.

    Examples
    --------
    >>> chain_seeds(0, 2) == chain_seeds(0, 2)
    True
    """
    seed = check_seed(seed)
    if isinstance(seed, np.random.Generator):
        seeds = [int(s) for s in seed.integers(0, 2**62, size=num)]
    else:
        gen = torch.Generator().manual_seed(seed) if isinstance(seed, int) else seed
        draws = torch.randint(0, 2**62, (num,), generator=gen, device=gen.device if gen else "cpu")
        seeds = [int(s) for s in draws.tolist()]
    if distributed:
        seeds = broadcast_seeds(seeds)
    return seeds


def build_oracle(
    oracle: Any,
    model: Callable,
    args: tuple,
    kwargs: dict,
    layout: SiteLayout,
    device: torch.device | str | None = None,
):
    """``"enum"``: a compiled :class:`~pyro_autospec.model.enum.EnumOracle`; else check it.

    A user's oracle is checked against ``layout`` by one probe query
    (:meth:`~pyro_autospec.model.discrete.SiteLayout.check_oracle`).

    Examples
    --------
    >>> import pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model():
    ...     pyro.sample("z", dist.Bernoulli(0.5))
    >>> build_oracle("enum", model, (), {}, discover_sites(model))
    EnumOracle(num_coords=1, num_values=2, sites=['z'])
    """
    if isinstance(oracle, str):
        if oracle != "enum":
            raise ValueError(
                f"oracle must be 'enum' or a MarginalOracle instance; got the string {oracle!r}"
            )

        return EnumOracle(model, args, kwargs, layout=layout, device=device)
    layout.check_oracle(oracle)
    return oracle


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def check_exact_draws(
    log_joint: torch.Tensor,
    oracle_log_prob: torch.Tensor,
    magnitude: torch.Tensor,
    dtype: torch.dtype,
    *,
    log_normalizer: torch.Tensor | None = None,
    custom_oracle: bool = False,
) -> float:
    """The runtime self-check: ``log p(x, data) - log q(x)`` must not vary across draws.

    For an exact oracle ``q(x) = p(x, data) / Z``, so the difference is ``log Z`` for every
    draw (for a family, ``log Z`` of each draw's target, given as ``log_normalizer``). It is
    checked within a tolerance of ``16 eps(dtype) (|terms| + 1)``, where ``|terms|`` is the sum
    of the absolute values of the log-density terms of the draw and ``dtype`` the model's
    precision: the oracle and the model then compute the same float terms and only rounding
    differs.

    Parameters
    ----------
    log_joint, oracle_log_prob, magnitude : DoubleTensor[N]
    dtype : torch.dtype
        The lowest precision among the model's log densities (and the oracle's output).
    log_normalizer : DoubleTensor[N], optional
        Each draw's ``log Z``; without it the differences must agree with each other.
    custom_oracle : bool
        Word the error for an oracle the user passed.

    Returns
    -------
    float
        The largest deviation seen.

    Raises
    ------
    SelfCheckError
        With the draws that disagree and what to do.

    Examples
    --------
    >>> import torch
    >>> lp = torch.tensor([-3.0, -4.0], dtype=torch.float64)
    >>> q = torch.tensor([-1.0, -2.0], dtype=torch.float64)  # lp - q = -2 for both draws
    >>> check_exact_draws(lp, q, lp.abs(), torch.float32)
    0.0
    """
    diff = log_joint.double() - oracle_log_prob.double().to(log_joint.device)
    tolerance = 16.0 * max(_eps(dtype), 1e-15) * (magnitude.double().to(diff.device) + 1.0)
    if log_normalizer is not None:
        deviation = diff - log_normalizer.double().to(diff.device)
        what = "differs from the log normaliser of the draw's target"
    else:
        finite = diff[torch.isfinite(diff)]
        center = finite.median() if finite.numel() else torch.tensor(0.0, dtype=diff.dtype)
        deviation = diff - center
        tolerance = tolerance + tolerance.median()
        what = "varies across draws"
    bad = ~(deviation.abs() <= tolerance)
    if not bool(bad.any()):
        return float(deviation.abs().max()) if deviation.numel() else 0.0
    i = int(bad.nonzero()[0, 0])
    spread = float(deviation[bad].abs().max())
    if custom_oracle:
        advice = (
            "The oracle passed as oracle= is not exact for this model (coordinates in another "
            "order, an approximation, or a different density). Pass an approximate oracle as "
            "guide= with correction='importance' or 'imh', which correct its draws."
        )
    else:
        advice = (
            "The enumeration oracle and the model's log density disagree: the model uses a "
            "handler or construct AutoSpec does not reproduce. Please report it with the model; "
            "meanwhile use pyro.infer.infer_discrete or MCMC."
        )
    raise SelfCheckError(
        f"Self-check failed: log p(x, data) - log q(x) {what} by up to {spread:.3g} "
        f"(tolerance {float(tolerance[i]):.2g} from {dtype} precision), so the draws are NOT "
        f"exact draws of the model's posterior. Draw {i}: log p(x, data) = "
        f"{float(log_joint[i]):.6g}, log q(x) = {float(oracle_log_prob[i]):.6g}. {advice}"
    )


class SelfCheck:
    """The self-check of a whole run: every draw of every chain (or engine run) pooled.

    For an exact oracle, ``log p(x, data) - log q(x)`` is one constant ``log Z`` for every draw
    of the run, whichever chain or engine run produced it; checking each chain on its own
    compares nothing when a chain holds one draw. Every path from a model to exact draws
    (:class:`~pyro_autospec.infer.discrete_run.DiscreteRun`,
    :class:`~pyro_autospec.infer.mixed_run.MixedRun`,
    :class:`~pyro_autospec.infer.kernel.AutoSpecKernel`) adds its draws here and calls
    :meth:`check`, which runs :func:`check_exact_draws` on all of them.

    Parameters
    ----------
    oracle : MarginalOracle
        The oracle that produced the draws. If it has ``log_normalizer()`` (one ``log Z``, or
        one per draw of a family), each draw is compared with it; otherwise the draws are
        compared with each other.
    custom_oracle : bool
        Word the error for an oracle the user passed.
    log_normalizer : float, optional
        ``log Z`` of the draws' law when the sampler knows it (forward filtering's), used in
        place of ``oracle.log_normalizer()``.
    keep : int, optional
        Pool at most this many earlier draws (the first ones) with each new batch, for a
        sampler that checks as it goes (:class:`~pyro_autospec.infer.kernel.AutoSpecKernel`):
        every new draw is still compared with the reference draws, in bounded memory.

    Examples
    --------
    >>> import torch
    >>> class Oracle:  # an exact oracle of a density with log Z = log 2
    ...     pass
    >>> check = SelfCheck(Oracle())
    >>> lp = torch.tensor([-2.0], dtype=torch.float64)
    >>> check.add(lp, lp - 0.5, lp.abs(), torch.float64)
    >>> check.add(lp - 1.0, lp - 1.5, lp.abs(), torch.float64)  # another chain, same log Z
    >>> check.check()
    0.0
    """

    def __init__(
        self,
        oracle: Any,
        *,
        custom_oracle: bool = False,
        log_normalizer: float | None = None,
        keep: int | None = None,
    ):
        self.oracle = oracle
        self.log_normalizer = log_normalizer
        self.custom_oracle = custom_oracle
        self.keep = keep
        self._parts: list[tuple[torch.Tensor, ...]] = []
        self._dtype: torch.dtype | None = None
        self.max_error: float | None = None

    def add(
        self,
        log_joint: torch.Tensor,
        oracle_log_prob: torch.Tensor,
        magnitude: torch.Tensor,
        dtype: torch.dtype,
    ) -> None:
        """Add a batch of draws (DoubleTensors[N]; ``dtype`` as in :func:`check_exact_draws`)."""
        device = log_joint.device
        self._parts.append(
            (
                log_joint.detach().double(),
                oracle_log_prob.detach().double().to(device),
                magnitude.detach().double().to(device),
            )
        )
        if self._dtype is None or _eps(dtype) > _eps(self._dtype):
            self._dtype = dtype

    def check(self) -> float:
        """Check every draw added so far; return the largest deviation (also ``max_error``).

        Raises
        ------
        SelfCheckError
            When the draws disagree (see :func:`check_exact_draws`).
        """
        if not self._parts:
            return 0.0
        device = self._parts[0][0].device
        lp, q, magnitude = (torch.cat([p[k].to(device) for p in self._parts]) for k in range(3))
        normalizer = getattr(self.oracle, "log_normalizer", None)
        if self.log_normalizer is not None:
            normalizer = torch.tensor(float(self.log_normalizer), dtype=torch.float64)
            normalizer = normalizer.to(device)
        elif normalizer is not None:
            normalizer = normalizer().double().to(device)
            if normalizer.numel() == 1:
                normalizer = normalizer.reshape(()).expand_as(lp)
        error = check_exact_draws(
            lp,
            q,
            magnitude,
            self._dtype,
            log_normalizer=normalizer,
            custom_oracle=self.custom_oracle,
        )
        self.max_error = error if self.max_error is None else max(self.max_error, error)
        if self.keep is not None and lp.numel() > self.keep:
            self._parts = [(lp[: self.keep], q[: self.keep], magnitude[: self.keep])]
        return self.max_error


def site_diagnostics(samples: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """``n_eff`` and ``r_hat`` of every site, or NaN with a note when there are too few draws.

    Parameters
    ----------
    samples : dict
        ``name -> Tensor[num_chains, num_draws, *shape]`` (any dtype; cast to float64).

    Returns
    -------
    diagnostics : dict
        ``name -> {"n_eff": Tensor[*shape], "r_hat": Tensor[*shape]}``.
    unavailable : dict
        ``{"n_eff": reason, "r_hat": reason}`` when draws per chain are fewer than
        :data:`MIN_DRAWS_FOR_DIAGNOSTICS` (empty otherwise).

    Examples
    --------
    >>> import torch
    >>> diagnostics, unavailable = site_diagnostics({"z": torch.tensor([[0, 1]])})
    >>> diagnostics["z"]["r_hat"], unavailable["r_hat"]
    (tensor(nan, dtype=torch.float64), 'needs at least 4 draws per chain, got 2')
    """
    out, unavailable = {}, {}
    for name, value in samples.items():
        value = value.double()
        shape = value.shape[2:]
        if value.shape[1] < MIN_DRAWS_FOR_DIAGNOSTICS:
            nan = torch.full(shape, math.nan, dtype=torch.float64)
            out[name] = OrderedDict([("n_eff", nan), ("r_hat", nan.clone())])
            reason = (
                f"needs at least {MIN_DRAWS_FOR_DIAGNOSTICS} draws per chain, got {value.shape[1]}"
            )
            unavailable = {"n_eff": reason, "r_hat": reason}
            continue
        # per element: one constant element leaves the others' n_eff and r_hat finite
        out[name] = OrderedDict(
            [("n_eff", effective_sample_size(value)), ("r_hat", split_gelman_rubin(value))]
        )
    return out, unavailable


def summary_table(samples: Mapping[str, torch.Tensor], prob: float = 0.9) -> dict:
    """Mean, std, median, credible interval, ``n_eff`` and ``r_hat`` of every site.

    Like :func:`pyro.infer.mcmc.util.summary`, but on float copies (integer sites work) and
    for any number of draws (statistics that need more are NaN).

    Parameters
    ----------
    samples : dict
        ``name -> Tensor[num_chains, num_draws, *shape]``.
    prob : float
        Mass of the credible interval (highest posterior density).

    Returns
    -------
    dict
        ``name -> OrderedDict(statistic -> Tensor[*shape])``.

    Examples
    --------
    >>> import torch
    >>> table = summary_table({"z": torch.tensor([[0, 1, 1, 0, 1]])})
    >>> list(table["z"]), float(table["z"]["mean"])
    (['mean', 'std', 'median', '5.0%', '95.0%', 'n_eff', 'r_hat'], 0.6)
    """
    diagnostics, _ = site_diagnostics(samples)
    lower, upper = f"{50 * (1 - prob):.1f}%", f"{50 * (1 + prob):.1f}%"
    out = {}
    for name, value in samples.items():
        flat = value.double().reshape((-1,) + value.shape[2:])
        std = flat.std(0) if flat.shape[0] > 1 else torch.full_like(flat[0], math.nan)
        hpdi = stats.hpdi(flat, prob=prob) if flat.shape[0] > 1 else (flat[0], flat[0])
        out[name] = OrderedDict(
            [
                ("mean", flat.mean(0)),
                ("std", std),
                ("median", flat.median(0)[0]),
                (lower, hpdi[0]),
                (upper, hpdi[1]),
                ("n_eff", diagnostics[name]["n_eff"]),
                ("r_hat", diagnostics[name]["r_hat"]),
            ]
        )
    return out


def print_summary_table(samples: Mapping[str, torch.Tensor], prob: float = 0.9) -> None:
    """Print :func:`summary_table` in the layout of :func:`pyro.infer.mcmc.util.print_summary`.

    Examples
    --------
    >>> import torch
    >>> print_summary_table({"z": torch.tensor([[0, 1, 1]])})  # doctest: +NORMALIZE_WHITESPACE
    <BLANKLINE>
                    mean       std    median      5.0%     95.0%     n_eff     r_hat
             z      0.67      0.58      1.00      0.00      1.00       nan       nan
    <BLANKLINE>
    """
    if not samples:
        return
    table = summary_table(samples, prob)
    names = {
        k: k + "[" + ",".join(str(s - 1) for s in v.shape[2:]) + "]" for k, v in samples.items()
    }
    width = max(max(len(n) for n in names.values()), 10)
    name_format = "{:>" + str(width) + "}"
    columns = [""] + list(next(iter(table.values())).keys())
    print()
    print((name_format + " {:>9}" * 7).format(*columns))
    row_format = name_format + " {:>9.2f}" * 7
    for name, row in table.items():
        shape = row["mean"].shape
        if len(shape) == 0:
            print(row_format.format(name, *[float(v) for v in row.values()]))
            continue
        for index in product(*map(range, shape)):
            label = name + "[" + ",".join(map(str, index)) + "]"
            print(row_format.format(label, *[float(v[index]) for v in row.values()]))
    print()
