"""Acceptance rules of speculative rejection sampling, in float64 log space.

For a block ``S`` with target ``mu_S`` and draft ``nu_S`` (ALGORITHM.md section 3):

1. a draft ``x ~ nu_S`` is accepted with probability ``min(1, mu_S(x) / nu_S(x))``;
2. after a rejection, exact tries ``y ~ mu_S`` are accepted with probability
   ``max(0, 1 - nu_S(y) / mu_S(y))``, which leaves ``y`` distributed as
   ``(mu_S - nu_S)_+ / TV(mu_S, nu_S)``.

Both tests compare ``log(u)`` with a log ratio ``l = log mu_S - log nu_S`` computed in float64,
never an exponentiated ratio, so neither tails nor ratios of tiny numbers are lost.

Both draw their uniform on every call, also where the answer is certain (``l >= 0`` for a
draft, ``l <= 0`` for a try). Otherwise the random stream would depend on the sign of ``l``
where ``l`` is exactly zero in exact arithmetic (the first coordinate of a block, or any
coordinate whose conditional does not depend on the drafted ones): a rounding difference of
``1e-16`` between a CPU and a GPU would then shift every later draw, and the same seed would
not give the same samples on every device.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["accept_draft", "accept_residual"]


def accept_draft(log_ratio: float, rng: np.random.Generator) -> bool:
    """Accept a draft with probability ``min(1, exp(log_ratio))``.

    Parameters
    ----------
    log_ratio : float
        ``log mu_S(x) - log nu_S(x)`` in float64; ``-inf`` (impossible under the target) is
        always rejected.
    rng : numpy.random.Generator
        Source of the uniform.
    """
    log_u = math.log1p(-rng.random())  # 1 - U is uniform on (0, 1]; drawn on every call
    if log_ratio >= 0.0:
        return True
    if log_ratio == -math.inf:
        return False
    return log_u < log_ratio


def accept_residual(log_ratio: float, rng: np.random.Generator) -> bool:
    """Accept an exact try with probability ``max(0, 1 - exp(-log_ratio))``.

    Parameters
    ----------
    log_ratio : float
        ``log mu_S(y) - log nu_S(y)``; ``+inf`` (the draft could never propose ``y``) is
        always accepted, ``log_ratio <= 0`` never.
    rng : numpy.random.Generator
        Source of the uniform.
    """
    log_u = math.log1p(-rng.random())  # drawn on every call (see the module docstring)
    if log_ratio <= 0.0:
        return False
    if log_ratio == math.inf:
        return True
    # log(1 - exp(-l)) = log(-expm1(-l)), accurate for small and large l alike.
    return log_u < math.log(-math.expm1(-log_ratio))
