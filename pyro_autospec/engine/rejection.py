"""Acceptance rules of speculative rejection sampling, in float64 log space, on tensors.

For a block ``S`` with target ``mu_S`` and draft ``nu_S`` (:doc:`/algorithm`):

1. a draft ``x ~ nu_S`` is accepted with probability ``min(1, mu_S(x) / nu_S(x))``;
2. after a rejection, exact tries ``y ~ mu_S`` are accepted with probability
   ``max(0, 1 - nu_S(y) / mu_S(y))``, which leaves ``y`` distributed as
   ``(mu_S - nu_S)_+ / TV(mu_S, nu_S)``.

Both tests compare ``log(u)`` with a log ratio ``l = log mu_S - log nu_S`` computed in float64,
never an exponentiated ratio, so neither tails nor ratios of tiny numbers are lost. The uniform
``u`` comes from the keyed stream of the block or try (:mod:`pyro_autospec.engine.keys`), so
whether the answer is certain never changes which numbers later decisions read.
"""

from __future__ import annotations

import torch

from pyro_autospec.engine import keys

__all__ = ["accept_draft", "accept_residual"]


def accept_draft(log_ratio: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accept drafts with probability ``min(1, exp(log_ratio))``.

    Parameters
    ----------
    log_ratio : DoubleTensor[...]
        ``log mu_S(x) - log nu_S(x)``; ``-inf`` (impossible under the target) and NaN are
        always rejected, ``log_ratio >= 0`` always accepted.
    u : DoubleTensor[...]
        Uniforms strictly inside (0, 1).

    Returns
    -------
    BoolTensor[...]

    Examples
    --------
    >>> import torch
    >>> accept_draft(torch.tensor([0.0, -float("inf"), -1.0]), torch.tensor([0.9, 0.1, 0.3]))
    tensor([ True, False,  True])
    """
    return keys.log(u) < log_ratio


def accept_residual(log_ratio: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accept exact tries with probability ``max(0, 1 - exp(-log_ratio))``.

    Parameters
    ----------
    log_ratio : DoubleTensor[...]
        ``log mu_S(y) - log nu_S(y)``; ``+inf`` (the draft could never propose ``y``) is always
        accepted, ``log_ratio <= 0`` never.
    u : DoubleTensor[...]
        Uniforms strictly inside (0, 1).

    Returns
    -------
    BoolTensor[...]

    Notes
    -----
    ``log(1 - exp(-l)) = log(-expm1(-l))`` is accurate for small and large ``l`` alike; it is
    ``-inf`` at ``l = 0`` and NaN below, where every comparison is False.

    Examples
    --------
    >>> import torch
    >>> accept_residual(torch.tensor([float("inf"), 0.0, 2.0]), torch.tensor([0.9, 0.1, 0.5]))
    tensor([ True, False,  True])
    """
    return keys.log(u) < torch.log(-torch.expm1(-log_ratio))
