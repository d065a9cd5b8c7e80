"""MCMC-style summaries of draws that also work for a handful of them.

``n_eff`` and ``r_hat`` of every site (NaN, with the reason, below
:data:`MIN_DRAWS_FOR_DIAGNOSTICS` draws per chain), and the table of
:func:`pyro.infer.mcmc.util.summary` on float copies (integer sites work), printed in Pyro's
layout.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from itertools import product
from typing import Any

import torch
from pyro.ops import stats

from pyro_autospec.diagnostics.ess import effective_sample_size, split_gelman_rubin

__all__ = [
    "MIN_DRAWS_FOR_DIAGNOSTICS",
    "check_prob",
    "print_summary_table",
    "site_diagnostics",
    "summary_table",
]

#: ``split_gelman_rubin`` and ``effective_sample_size`` need this many draws per chain.
MIN_DRAWS_FOR_DIAGNOSTICS = 4


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


def check_prob(prob: Any) -> None:
    """Refuse a credible interval's mass outside ``(0, 1)`` (Pyro's own ``hpdi`` fails on it
    with an ``IndexError`` from deep inside).

    Examples
    --------
    >>> check_prob(0.9), check_prob(torch.tensor(0.5))
    (None, None)
    >>> check_prob(90)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: prob is the mass of the credible interval, strictly between 0 and 1 ...
    """
    try:  # a float, a NumPy or torch scalar, as Pyro's summary takes; never a bool
        value = float(prob) if not isinstance(prob, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 < value < 1.0:
        raise ValueError(
            "prob is the mass of the credible interval, strictly between 0 and 1 (0.9 for a "
            f"90% interval); got {prob!r}"
        )


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

    Raises
    ------
    ValueError
        If ``prob`` is not a number strictly between 0 and 1.

    Examples
    --------
    >>> import torch
    >>> table = summary_table({"z": torch.tensor([[0, 1, 1, 0, 1]])})
    >>> list(table["z"]), float(table["z"]["mean"])
    (['mean', 'std', 'median', '5.0%', '95.0%', 'n_eff', 'r_hat'], 0.6)
    """
    check_prob(prob)
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
