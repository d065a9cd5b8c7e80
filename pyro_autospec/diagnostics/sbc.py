"""Simulation-based calibration (SBC) of an amortised diffusion guide.

For ``s = 1..S``: draw ``(theta_s, data_s)`` from the model's prior predictive, draw ``L``
values ``theta_s^(l)`` from the guide given ``data_s``, and record the rank
``r_s = #{l : theta_s^(l) < theta_s}`` of every scalar coordinate. If the guide's law given
the data is the posterior, every rank is uniform on ``{0, ..., L}`` [1]_. This module computes
the ranks for every latent site, a chi-square uniformity test per coordinate (scipy p-values)
and an ArviZ-style rank histogram with its binomial band.

All ``S`` data sets are sampled together: the guide's oracle over ``S`` data sets is one
block-diagonal oracle of dimension ``S d``, whose Euler-Maruyama path is ``S`` independent
paths (:class:`~pyro_autospec.guides.diffusion.ConditionedDenoiser`). User guide:
:doc:`/guides`.

References
----------
.. [1] S. Talts, M. Betancourt, D. Simpson, A. Vehtari, A. Gelman. Validating Bayesian
   Inference Algorithms with Simulation-Based Calibration. arXiv:1804.06788 (2018).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from pyro_autospec.engine import keys
from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.model import check_layout, discover_continuous_sites, simulate

__all__ = ["SBCResult", "sbc", "plot_sbc_ranks", "rank_uniformity_pvalue"]

#: Fewest expected counts per bin for the chi-square test.
MIN_EXPECTED = 5.0


def _bin_probs(num_ranks: int, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Bin index of every rank in ``0..num_ranks-1`` and each bin's probability."""
    edges = np.floor(np.arange(num_ranks) * num_bins / num_ranks).astype(np.int64)
    probs = np.bincount(edges, minlength=num_bins) / num_ranks
    return edges, probs


def rank_uniformity_pvalue(ranks: np.ndarray, num_posterior_samples: int, num_bins: int) -> float:
    """Chi-square p-value of ranks in ``0..L`` against the uniform law, in ``num_bins`` bins.

    Returns NaN (the test is not valid) when a bin expects fewer than 5 counts.

    Examples
    --------
    >>> import numpy as np
    >>> ranks = np.random.default_rng(0).integers(0, 100, size=1000)
    >>> bool(rank_uniformity_pvalue(ranks, 99, 10) > 1e-3)
    True
    """
    ranks = np.asarray(ranks).reshape(-1)
    edges, probs = _bin_probs(num_posterior_samples + 1, num_bins)
    observed = np.bincount(edges[ranks], minlength=num_bins)
    expected = probs * ranks.size
    if expected.min() < MIN_EXPECTED:
        return float("nan")
    # scipy.stats takes over a second to import: only a calibration check pays for it
    import scipy.stats

    return float(scipy.stats.chisquare(observed, expected).pvalue)


@dataclass
class SBCResult:
    """Ranks of the true latents among the guide's draws, per site.

    Attributes
    ----------
    ranks : OrderedDict of str -> ``LongTensor[S, *site.shape]``
        Ranks in ``0..L`` (``L = num_posterior_samples``).
    pvalues : OrderedDict of str -> ``DoubleTensor[*site.shape]``
        Chi-square uniformity p-value of every scalar coordinate (NaN if bins are too thin).
    num_posterior_samples : int
        ``L``.
    num_bins : int
        Bins of the chi-square test and of the plot.

    Examples
    --------
    >>> import torch
    >>> from collections import OrderedDict
    >>> ranks = OrderedDict(x=torch.arange(200) % 20)  # perfectly uniform ranks, L = 19
    >>> pvalues = OrderedDict(x=torch.tensor(1.0, dtype=torch.float64))
    >>> result = SBCResult(ranks, pvalues, num_posterior_samples=19, num_bins=10)
    >>> result.num_simulations, result.passed()
    (200, True)
    """

    ranks: OrderedDict
    pvalues: OrderedDict
    num_posterior_samples: int
    num_bins: int

    @property
    def num_simulations(self) -> int:
        """``S``."""
        return int(next(iter(self.ranks.values())).shape[0])

    @property
    def site_pvalues(self) -> dict[str, float]:
        """Per site, the Bonferroni-corrected smallest coordinate p-value."""
        out = {}
        for name, p in self.pvalues.items():
            flat = p.reshape(-1)
            out[name] = float(min(1.0, flat.min().item() * flat.numel()))
        return out

    @property
    def pvalue(self) -> float:
        """Bonferroni-corrected smallest p-value over every coordinate of every site."""
        flat = torch.cat([p.reshape(-1) for p in self.pvalues.values()])
        return float(min(1.0, flat.min().item() * flat.numel()))

    def passed(self, alpha: float = 0.01) -> bool:
        """Whether the combined uniformity test accepts at level ``alpha``."""
        if math.isnan(self.pvalue):
            raise ValueError(
                "the chi-square test needs >= 5 expected ranks per bin: raise num_simulations "
                "or lower num_bins"
            )
        return self.pvalue > alpha

    def __repr__(self) -> str:
        sites = ", ".join(f"{k}: p={v:.3g}" for k, v in self.site_pvalues.items())
        return (
            f"SBCResult(num_simulations={self.num_simulations}, "
            f"num_posterior_samples={self.num_posterior_samples}, {sites})"
        )

    def plot(self, **kwargs: Any) -> np.ndarray:
        """Rank histograms; see :func:`plot_sbc_ranks`."""
        return plot_sbc_ranks(self, **kwargs)


def sbc(
    model: Any,
    guide: Any,
    num_simulations: int,
    *args: Any,
    num_posterior_samples: int = 99,
    num_bins: int | None = None,
    model_kwargs: dict | None = None,
    method: str = "sequential",
    chunk_size: int = 256,
    seed: int | None = None,
    disable_progbar: bool = False,
) -> SBCResult:
    """Simulation-based calibration of a diffusion guide over the model's prior predictive.

    Parameters
    ----------
    model : callable
        The Pyro model (the guide's layout must match it).
    guide : DiffusionGuide
        The amortised guide (``layout``, ``times``, ``oracle_for_data``).
    num_simulations : int
        ``S``, prior predictive data sets.
    *args
        The model's arguments (default: the guide's ``model_args``).
    num_posterior_samples : int
        ``L``, guide draws per data set; ranks lie in ``0..L``.
    num_bins : int, optional
        Bins of the uniformity test; default ``max(2, min(20, S // 10, L + 1))``.
    model_kwargs : dict, optional
        The model's keyword arguments.
    method : {"sequential", "autospec"}
        How the guide's draws are made: both give the law of the guide's chain (sequential is
        cheaper on a CPU).
    chunk_size : int
        Data sets per engine run (memory).
    seed : int, optional
        Seeds the simulations and the draws.
    disable_progbar : bool
        Hide the progress bar over chunks.

    Returns
    -------
    SBCResult

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.guides.diffusion import DiffusionGuide
    >>> def model(y):
    ...     loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", 3):
    ...         pyro.sample("y", dist.Normal(loc, 1.0), obs=y)
    >>> guide = DiffusionGuide(model, (torch.zeros(3),), hidden_dim=8, num_steps=16)
    >>> result = sbc(model, guide, 50, num_posterior_samples=19, seed=0, disable_progbar=True)
    >>> result.ranks["loc"].shape, int(result.ranks["loc"].max()) <= 19
    (torch.Size([50]), True)
    """
    if not isinstance(num_posterior_samples, int) or num_posterior_samples < 1:
        raise ValueError(
            f"num_posterior_samples must be a positive int; got {num_posterior_samples!r}"
        )
    if not (hasattr(guide, "times") and callable(getattr(guide, "oracle_for_data", None))):
        raise TypeError(
            f"sbc calibrates a DiffusionGuide (an amortised guide of continuous sites, with "
            f"times and oracle_for_data); got {type(guide).__name__}. An AnyOrderGuide's "
            f"draws are checked by AutoSpec(model, guide=guide, correction='imh' or "
            f"'importance'), whose summary reports the weights' Pareto k-hat and ESS"
        )
    if not args and model_kwargs is None:
        args, model_kwargs = guide.model_args, guide.model_kwargs
    model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
    layout = discover_continuous_sites(
        model, args, model_kwargs, max_plate_nesting=guide.layout.max_plate_nesting
    )
    check_layout(guide.layout, layout)
    y_true, data = simulate(model, args, model_kwargs, layout, num_simulations, seed=seed)
    truth = layout.from_unconstrained(y_true)
    num, draws = int(num_simulations), int(num_posterior_samples)
    # each chunk's draws keyed from the run's seed (None: one draw of torch's global stream)
    root = keys.seed_value(seed)
    ranks = {name: [] for name in layout.names}
    starts = range(0, num, chunk_size)
    for chunk, start in enumerate(tqdm(starts, desc="sbc", disable=disable_progbar)):
        stop = min(start + chunk_size, num)
        oracle = guide.oracle_for_data(data[start:stop])
        result = sample_diffusion(
            oracle, draws, times=guide.times, method=method, seed=keys.derive_seed(root, chunk)
        )
        y = result.samples.detach().cpu().to(y_true.dtype).reshape(draws * (stop - start), -1)
        values = layout.from_unconstrained(y)
        for site in layout.sites:
            v = values[site.name].reshape((draws, stop - start) + tuple(site.shape))
            ranks[site.name].append((v < truth[site.name][start:stop]).sum(0))
    if num_bins is None:
        num_bins = max(2, min(20, num // 10, draws + 1))
    out_ranks, pvalues = OrderedDict(), OrderedDict()
    for site in layout.sites:
        r = torch.cat(ranks[site.name]).long()
        out_ranks[site.name] = r
        flat = r.reshape(num, -1).numpy()
        p = [rank_uniformity_pvalue(flat[:, j], draws, num_bins) for j in range(flat.shape[1])]
        pvalues[site.name] = torch.tensor(p, dtype=torch.float64).reshape(tuple(site.shape))
    return SBCResult(out_ranks, pvalues, draws, int(num_bins))


def plot_sbc_ranks(
    result: SBCResult,
    *,
    var_names: list[str] | None = None,
    num_bins: int | None = None,
    max_panels: int = 12,
    prob: float = 0.99,
    axes: Any = None,
) -> np.ndarray:
    """ArviZ-style rank histograms with the ``prob`` band of a uniform histogram.

    Parameters
    ----------
    result : SBCResult
    var_names : list of str, optional
        Sites to plot (default all).
    num_bins : int, optional
        Default ``result.num_bins``.
    max_panels : int
        At most this many scalar coordinates are drawn.
    prob : float
        Mass of the grey band: binomial quantiles of each bin's count under uniform ranks.
    axes : array of matplotlib Axes, optional

    Returns
    -------
    numpy.ndarray of matplotlib Axes

    Examples
    --------
    >>> import torch
    >>> from collections import OrderedDict
    >>> ranks = OrderedDict(x=torch.randint(0, 20, (200, 2)))
    >>> result = SBCResult(ranks, OrderedDict(x=torch.ones(2, dtype=torch.float64)), 19, 10)
    >>> plot_sbc_ranks(result).shape
    (2,)
    """
    import matplotlib.pyplot as plt

    num_bins = num_bins or result.num_bins
    names = var_names or list(result.ranks)
    panels = []
    for name in names:
        r = result.ranks[name].reshape(result.num_simulations, -1)
        shape = tuple(result.ranks[name].shape[1:])
        for j in range(r.shape[1]):
            label = name if not shape else f"{name}{list(np.unravel_index(j, shape))}"
            panels.append((label, r[:, j].numpy(), result.pvalues[name].reshape(-1)[j].item()))
    panels = panels[:max_panels]
    if axes is None:
        cols = min(4, len(panels))
        rows = math.ceil(len(panels) / cols)
        _, axes = plt.subplots(rows, cols, figsize=(3 * cols, 2.4 * rows), squeeze=False)
    axes = np.asarray(axes).reshape(-1)
    edges, probs = _bin_probs(result.num_posterior_samples + 1, num_bins)
    num = result.num_simulations
    import scipy.stats  # see rank_uniformity_pvalue

    lower = scipy.stats.binom.ppf((1 - prob) / 2, num, probs)
    upper = scipy.stats.binom.ppf(1 - (1 - prob) / 2, num, probs)
    centres = np.arange(num_bins)
    for ax, (label, ranks, p) in zip(axes, panels, strict=False):
        counts = np.bincount(edges[ranks], minlength=num_bins)
        ax.fill_between(centres, lower, upper, step="mid", color="0.85", label=f"{prob:.0%} band")
        ax.bar(centres, counts, width=1.0, color="C0", alpha=0.8, edgecolor="white")
        ax.axhline(num * probs.mean(), color="0.4", lw=1)
        ax.set_title(f"{label}  (p={p:.2g})", fontsize=9)
        ax.set_yticks([])
        ax.set_xlabel("rank bin")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return axes[: len(panels)]
