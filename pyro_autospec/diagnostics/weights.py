"""Diagnostics of importance weights: Pareto k-hat (PSIS, via ArviZ) and the weights' ESS.

For draws ``(x, sigma)`` of a guide and a target known up to a constant, the log weights are
``log w = log p(x, data) - log q_sigma(x)``. Pareto-smoothed importance sampling [1]_ fits a
generalised Pareto distribution to the largest weights; its shape ``k-hat`` says whether
self-normalised estimates can be trusted: ``k < 0.5`` good, ``0.5 <= k < 0.7`` usable with
caution (slow convergence), ``k >= 0.7`` not trustworthy (variance may be infinite).

References
----------
.. [1] A. Vehtari, D. Simpson, A. Gelman, Y. Yao, J. Gabry. Pareto smoothed importance
   sampling. JMLR 25(72), 2024.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

__all__ = ["psis", "pareto_khat", "weights_ess", "KHAT_GOOD", "KHAT_BAD"]

#: Below this k-hat the smoothed weights are reliable.
KHAT_GOOD = 0.5
#: At or above this k-hat the correction cannot be trusted.
KHAT_BAD = 0.7


def _as_numpy(log_weight) -> np.ndarray:
    if isinstance(log_weight, torch.Tensor):
        log_weight = log_weight.detach().cpu().double().numpy()
    return np.asarray(log_weight, dtype=np.float64)


def psis(log_weight) -> tuple[np.ndarray, float]:
    """Pareto-smoothed, normalised log weights and their k-hat (``arviz.psislw``).

    Parameters
    ----------
    log_weight : Tensor[N] or array[N]
        Unnormalised log importance weights; ``-inf`` allowed (zero weight).

    Returns
    -------
    smoothed : ndarray float64[N]
        Smoothed log weights, normalised so that ``exp(smoothed).sum() == 1``.
    khat : float
        The Pareto shape estimate (``nan`` if it cannot be estimated).

    Examples
    --------
    >>> import numpy as np
    >>> smoothed, khat = psis(np.random.default_rng(0).normal(size=1000))
    >>> round(float(np.exp(smoothed).sum()), 6), khat < 0.5
    (1.0, True)
    """
    import arviz as az

    lw = _as_numpy(log_weight).reshape(-1)
    finite = np.isfinite(lw)
    if finite.sum() == 0:
        raise ValueError("every importance weight is zero (log weight -inf or nan)")
    out = np.full_like(lw, -np.inf)
    if finite.sum() < 5:
        out[finite] = lw[finite] - np.logaddexp.reduce(lw[finite])
        return out, math.nan
    if np.ptp(lw[finite]) <= 1e-9 * max(1.0, float(np.abs(lw[finite]).max())):
        # Equal weights (an exact oracle or a perfect guide): no tail at all. ArviZ would
        # report k-hat = inf for the degenerate fit; the honest value is -inf.
        out[finite] = -math.log(finite.sum())
        return out, -math.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        smoothed, khat = az.psislw(lw[finite] - lw[finite].max())
    out[finite] = smoothed
    return out, float(khat)


def pareto_khat(log_weight) -> float:
    """The PSIS Pareto shape ``k-hat`` of a set of log weights (see :func:`psis`).

    Examples
    --------
    >>> import numpy as np
    >>> heavy = np.random.default_rng(0).standard_cauchy(4000)  # log of heavy-tailed weights
    >>> pareto_khat(np.log(np.abs(heavy))) > 0.7
    True
    """
    return psis(log_weight)[1]


def weights_ess(log_weight) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2`` of importance weights.

    Parameters
    ----------
    log_weight : Tensor[N] or array[N]
        Log weights (any constant offset).

    Returns
    -------
    float
        Between 1 and ``N``; ``N`` for equal weights.

    Examples
    --------
    >>> import numpy as np
    >>> round(weights_ess(np.zeros(100)), 6)
    100.0
    """
    lw = _as_numpy(log_weight).reshape(-1)
    lw = lw[np.isfinite(lw)]
    if lw.size == 0:
        return 0.0
    return float(math.exp(2 * np.logaddexp.reduce(lw) - np.logaddexp.reduce(2 * lw)))
