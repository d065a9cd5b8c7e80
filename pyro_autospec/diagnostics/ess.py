"""Per-element effective sample size and split R-hat: one constant element spoils no other.

:func:`pyro.ops.stats.effective_sample_size` computes every element of a site in one batch,
and one element whose draws are all equal (a site fixed by the data, say) makes the whole
batch NaN. Here the statistics are computed element by element (in one batch for the elements
whose draws vary within every chain, one at a time for the others), so that only the
degenerate elements are NaN:

* an element whose draws are all equal (constant) has ``n_eff`` and ``r_hat`` NaN: there is
  no variance to estimate them from (ArviZ returns the number of draws as its ESS there,
  which would also hide a chain that never moved);
* an element constant within each chain but not across chains has ``n_eff`` NaN and
  ``r_hat`` infinite, as Pyro's ``split_gelman_rubin`` gives.
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


def _varies_in_every_chain(flat: torch.Tensor) -> torch.Tensor:
    """Bool[K]: element ``k`` takes two values or more in every chain."""
    return (flat != flat[:, :1]).any(1).all(0)


def effective_sample_size(value: torch.Tensor) -> torch.Tensor:
    """ESS of every element of ``value``, a ``Tensor[num_chains, num_draws, *shape]``.

    Pyro's estimator (Geyer's initial monotone sequence, as ``MCMC.summary``), computed per
    element: an element whose draws do not vary within some chain is NaN, and only it.

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
    out = torch.full(flat.shape[2:], math.nan, dtype=torch.float64)
    good = _varies_in_every_chain(flat)
    if bool(good.any()):
        out[good] = stats.effective_sample_size(flat[:, :, good])
    return out.reshape(shape)


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
    out = torch.full(flat.shape[2:], math.nan, dtype=torch.float64)
    constant = (flat == flat[:1, :1]).all(1).all(0)
    varies = ~constant
    if bool(varies.any()):
        out[varies] = stats.split_gelman_rubin(flat[:, :, varies])
    return out.reshape(shape)
