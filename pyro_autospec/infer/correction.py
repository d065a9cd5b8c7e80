"""Correcting a guide's draws to the exact posterior (``AutoSpec(..., correction=...)``).

The discrete run (:mod:`pyro_autospec.infer.discrete_run`) weighs each draw of a guide by the
model's joint density and corrects the draws. A guide's draw ``(x, sigma)`` has density
``Uniform(sigma) q_sigma(x)`` and known ``log q_sigma(x)``; with
``log w = log p(x, data) - log q_sigma(x)`` (see :doc:`/guides`):

* :func:`importance_resample`: sampling-importance-resampling with Pareto-smoothed weights
  (PSIS). Consistent as the number of draws grows; the resampled draws repeat (their ESS is
  at most the weights' ESS).
* :func:`independent_metropolis_hastings`: a Markov chain with the guide as independent
  proposal, accepting ``x'`` with probability ``min(1, w(x') / w(x))``. Exact MCMC for
  ``p(x | data)`` on the extended space ``(x, sigma)`` (target ``p(x | data) Uniform(sigma)``),
  so R-hat and ESS mean what they mean for any MCMC.
"""

from __future__ import annotations

import numpy as np
import torch

from pyro_autospec.diagnostics.weights import psis
from pyro_autospec.engine import keys

__all__ = ["importance_resample", "independent_metropolis_hastings"]


def _uniforms(seed, tag: int, num: int) -> np.ndarray:
    """``num`` keyed uniforms in (0, 1) of ``seed`` (an int, a generator drawn from once, or
    ``None`` for a seed from torch's global generator), from the engine's keyed generator."""
    root = keys.seed_key(keys.check_seed(seed))
    return keys.host_uniform(np.int64(root), tag, np.arange(num, dtype=np.int64))


def importance_resample(
    log_weight: torch.Tensor,
    num_samples: int | None = None,
    *,
    seed: int | np.random.Generator | torch.Generator | None = None,
    smooth: bool = True,
) -> tuple[torch.Tensor, float]:
    """Indices of a multinomial resample by (Pareto-smoothed) importance weights.

    Parameters
    ----------
    log_weight : Tensor[N]
        Unnormalised log weights (``-inf``: zero weight).
    num_samples : int, optional
        Draws to return (default ``N``).
    seed : int, numpy or torch Generator, optional
        The root of the keyed uniforms (:mod:`~pyro_autospec.engine.keys`); a generator is
        drawn from once. ``None``: a seed from torch's global generator.
    smooth : bool
        Use PSIS-smoothed weights (default) rather than the raw ones.

    Returns
    -------
    index : LongTensor[num_samples]
        Indices into the draws, with replacement.
    khat : float
        The PSIS Pareto shape of the weights.

    Examples
    --------
    >>> import torch
    >>> index, khat = importance_resample(torch.tensor([0.0, -float("inf"), 1.0]), 6, seed=0)
    >>> bool((index != 1).all())
    True
    """
    lw = torch.as_tensor(log_weight, dtype=torch.float64).reshape(-1)
    num = lw.shape[0] if num_samples is None else int(num_samples)
    smoothed, khat = psis(lw)
    if not smooth:
        raw = lw.numpy()
        smoothed = raw - np.logaddexp.reduce(raw[np.isfinite(raw)])
    probs = np.exp(smoothed)
    probs = probs / probs.sum()
    # inverse CDF of keyed uniforms: a zero-weight draw owns an empty interval; a uniform that
    # rounds onto the total takes the last draw with weight
    cdf = np.cumsum(probs)
    u = _uniforms(seed, keys.Tag.RESAMPLE, num) * cdf[-1]
    last = int(np.flatnonzero(probs > 0)[-1])
    index = np.minimum(np.searchsorted(cdf, u, side="right"), last)
    return torch.as_tensor(index, dtype=torch.long), khat


def independent_metropolis_hastings(
    log_weight: torch.Tensor,
    *,
    seed: int | np.random.Generator | torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run one independent Metropolis-Hastings chain over a sequence of proposals.

    Proposal ``t`` (a fresh guide draw) replaces the current state with probability
    ``min(1, w_t / w_current)``. The chain starts at proposal 0.

    Parameters
    ----------
    log_weight : Tensor[T]
        Log weights ``log p(x_t, data) - log q_sigma_t(x_t)`` of the proposals, in order.
    seed : int, numpy or torch Generator, optional
        The root of the keyed uniforms, as in :func:`importance_resample`.

    Returns
    -------
    index : LongTensor[T]
        ``index[t]``: the proposal that is the chain's state after step ``t``.
    accepted : BoolTensor[T]
        Whether step ``t`` moved (``accepted[0]`` is True: the start).
    accept_prob : DoubleTensor[T]
        The acceptance probability of step ``t`` (``1`` at the start).

    Examples
    --------
    >>> import torch
    >>> log_weight = torch.tensor([0.0, -50.0, 1.0])
    >>> index, accepted, _ = independent_metropolis_hastings(log_weight, seed=0)
    >>> index.tolist(), accepted.tolist()
    ([0, 0, 2], [True, False, True])
    """
    lw = torch.as_tensor(log_weight, dtype=torch.float64).reshape(-1).numpy()
    if not np.isfinite(lw[0]):
        finite = np.flatnonzero(np.isfinite(lw))
        if finite.size == 0:
            raise ValueError("every proposal has zero weight under the model")
    log_u = np.log(_uniforms(seed, keys.Tag.ACCEPT, lw.size))
    index = np.zeros(lw.size, dtype=np.int64)
    accepted = np.zeros(lw.size, dtype=bool)
    accept_prob = np.ones(lw.size, dtype=np.float64)
    current, current_lw = 0, lw[0]
    accepted[0] = True
    for t in range(1, lw.size):
        if current_lw > -np.inf:
            accept_prob[t] = min(1.0, float(np.exp(min(0.0, lw[t] - current_lw))))
        # current_lw = -inf (an impossible start) accepts any possible proposal.
        if lw[t] > -np.inf and (current_lw == -np.inf or log_u[t] < lw[t] - current_lw):
            current, current_lw = t, lw[t]
            accepted[t] = True
        index[t] = current
    return torch.as_tensor(index), torch.as_tensor(accepted), torch.as_tensor(accept_prob)
