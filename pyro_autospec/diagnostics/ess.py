"""Per-element effective sample size and split R-hat: one constant element spoils no other.

:func:`pyro.ops.stats.effective_sample_size` computes every element of a site in one batch,
and one element whose draws are all equal (a site fixed by the data, say) makes the whole
batch NaN. Here the degenerate elements are set aside and the others computed in one batch,
so that only the degenerate elements are NaN:

* an element whose draws are all equal (constant) has ``n_eff`` and ``r_hat`` NaN: there is
  no variance to estimate them from (ArviZ returns the number of draws as its ESS there,
  which would also hide a chain that never moved);
* an element constant within each chain but not across chains has ``n_eff`` NaN and
  ``r_hat`` infinite, as Pyro's ``split_gelman_rubin`` gives;
* an element that varies within some chain has Pyro's ``n_eff``, also when it is constant
  within another (a rare value that one chain never drew, common with exact draws).

The ESS is Pyro's estimator with its running minimum taken by :func:`torch.cummin`: Pyro's
own builds an ``[N, N]`` table for it, which takes gigabytes at 100,000 draws, where exact
samplers are cheap.
"""

from __future__ import annotations

import math

import torch
from pyro.ops import stats

__all__ = ["effective_sample_size", "split_gelman_rubin"]


def _flat(value: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
    value = value.double()
    shape = value.shape[2:]
    return value.reshape(value.shape[:2] + (-1,)), shape


def _varies_within_a_chain(flat: torch.Tensor) -> torch.Tensor:
    """Bool[K]: element ``k`` takes two values or more in some chain."""
    return (flat != flat[:, :1]).any(1).any(0)


def effective_sample_size(value: torch.Tensor) -> torch.Tensor:
    """ESS of every element of ``value``, a ``Tensor[num_chains, num_draws, *shape]``.

    Pyro's estimator (Geyer's initial monotone sequence, as ``MCMC.summary``), computed per
    element: an element whose draws vary within no chain is NaN, and only it.

    Parameters
    ----------
    value : Tensor
        ``[num_chains, num_draws, *shape]``, at least 2 draws per chain.

    Returns
    -------
    DoubleTensor
        ``[*shape]``.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(1, 200, 3, generator=torch.Generator().manual_seed(0))
    >>> x[..., 1] = 1.0  # one constant element
    >>> ess = effective_sample_size(x)
    >>> bool(ess[1].isnan()), bool(ess[0] > 100), bool(ess[2] > 100)
    (True, True, True)
    """
    flat, shape = _flat(value)
    out = torch.full(flat.shape[2:], math.nan, dtype=torch.float64, device=flat.device)
    good = _varies_within_a_chain(flat)
    if bool(good.any()):
        out[good] = _geyer_ess(flat[:, :, good])
    return out.reshape(shape)


def _geyer_ess(flat: torch.Tensor) -> torch.Tensor:
    """Pyro's ``effective_sample_size`` of ``flat``, a ``DoubleTensor[C, N, K]``, in memory
    linear in ``N`` (its ``_cummin`` is quadratic): Stan's autocorrelation over chains, then
    Geyer's initial monotone sequence."""
    draws = flat.transpose(0, 1)  # [N, C, K]
    n, c = draws.shape[:2]
    autocovariance = stats.autocovariance(draws, dim=0)
    var_within = draws.var(0).mean(0)
    var_estimator = (n - 1) / n * var_within
    if c > 1:
        var_estimator = var_estimator + draws.mean(0).var(0)
    else:  # then rho is the chain's autocorrelation
        var_within = var_estimator
    rho = (var_estimator - var_within + autocovariance.mean(1)) / var_estimator
    rho[0] = 1.0
    pairs = (rho if n % 2 == 0 else rho[:-1]).reshape((n // 2, 2) + rho.shape[1:]).sum(1)
    tau = -1.0 + 2.0 * pairs[0]
    if pairs.shape[0] > 1:  # the positive, then monotone, sequence after the first pair
        tau = tau + 2.0 * torch.cummin(pairs[1:].clamp(min=0.0), dim=0).values.sum(0)
    return c * n / tau


def split_gelman_rubin(value: torch.Tensor) -> torch.Tensor:
    """Split R-hat of every element (Pyro's), NaN only for elements whose draws are all equal.

    Parameters
    ----------
    value : Tensor
        ``[num_chains, num_draws, *shape]``, at least 4 draws per chain.

    Returns
    -------
    DoubleTensor
        ``[*shape]``.

    Examples
    --------
    >>> import torch
    >>> x = torch.randn(2, 100, 2, generator=torch.Generator().manual_seed(0))
    >>> x[..., 0] = 0.0
    >>> r = split_gelman_rubin(x)
    >>> bool(r[0].isnan()), bool(abs(r[1] - 1.0) < 0.1)
    (True, True)
    """
    flat, shape = _flat(value)
    out = torch.full(flat.shape[2:], math.nan, dtype=torch.float64, device=flat.device)
    constant = (flat == flat[:1, :1]).all(1).all(0)
    varies = ~constant
    if bool(varies.any()):
        out[varies] = stats.split_gelman_rubin(flat[:, :, varies])
    return out.reshape(shape)
