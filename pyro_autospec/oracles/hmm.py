"""The exact oracle of the hidden states of a hidden Markov model given its observations."""

from __future__ import annotations

from typing import Any

import torch

from pyro_autospec.engine.logspace import log_matmul, log_normalize

from ._util import as_float64, point_mass
from .markov import SeparatorOracle, check_chain_parameters

__all__ = ["HMMOracle", "PairwiseChainOracle"]

# Largest number of entries of the per-query [chunk, q, q] temporaries.
_MAX_WORK_ENTRIES = 1 << 22


def _log_identity(q: int, device: torch.device) -> torch.Tensor:
    eye = torch.full((q, q), float("-inf"), dtype=torch.float64, device=device)
    eye.diagonal().fill_(0.0)
    return eye


def _floor_log2(x: torch.Tensor) -> torch.Tensor:
    """``floor(log2(x))`` of positive integers, exactly."""
    return torch.frexp(x.double()).exponent.long() - 1


class PairwiseChainOracle(SeparatorOracle):
    """Exact conditional marginals of a chain-structured pairwise model on ``[q]^n``.

    The law is

    ``p(x) ∝ exp(sum_i unary[i, x_i] + sum_{i < n - 1} pairwise[i, x_i, x_{i+1}])``,

    a Markov random field on the path ``0 - 1 - ... - n-1`` with any (inhomogeneous) log
    potentials: a hidden Markov model's posterior, a chain CRF, or the factor graph of a Pyro
    model whose factors each touch one site or two consecutive ones
    (:class:`~pyro_autospec.model.EnumOracle` lowers such models to this oracle).

    Parameters
    ----------
    unary : Tensor or array [n, q]
        Log potentials of each site; ``-inf`` (impossible) is allowed, NaN and ``+inf`` are not.
    pairwise : Tensor or array [n - 1, q, q]
        ``pairwise[i, u, v]``: log potential of ``(x_i, x_{i+1}) = (u, v)``; ``-inf`` allowed.
    device : str or torch.device, optional
        Where to keep the parameters.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        ``q``.

    Raises
    ------
    ValueError
        For wrong shapes, NaN or ``+inf``, or when every assignment has weight 0.

    Notes
    -----
    Pinned sites are separators. With ``M_j = exp(pairwise[j]) diag(exp(unary[j + 1]))`` and
    nearest pins ``l < i < r``,

    ``P(x_i = v | pins) ∝ [M_l ... M_{i-1}][x_l, v] * [M_i ... M_{r-1}][v, x_r]``,

    where the left factor is the forward message ``alpha_i(v)`` when no pin lies left of ``i``
    and the right factor the backward message ``beta_i(v)`` when none lies right of it.

    Any product ``M_a ... M_b`` is two precomputed matrices of a *disjoint sparse table*: for
    every level ``k`` and position ``p``, the product from ``p`` to the middle of its
    ``2^(k+1)``-block (left half) or from the middle to ``p`` (right half). A query is then a
    gather of one row (or column) and one matrix and a vector-matrix product: ``O(q^2)`` per
    (row, target) whatever the distance between pins. Memory is ``n log2(n) q^2`` floats.
    Every matrix is stored in log space and every product is an exact ``logsumexp``
    (building the table costs ``O(n log2(n)^2 q^3)``), so large log potentials neither
    overflow nor underflow.
    Pinned coordinates get a point mass; rows conditioned on an impossible assignment are NaN.
    Chain queries (:meth:`log_marginals_chain`) find nearest pins as
    :class:`MarkovChainOracle` does (once per chain, then within the chain), then combine
    each row in ``O(q^2)``: ``O(n / 8 + L log n + L q^2)`` per chain.

    Examples
    --------
    >>> import torch
    >>> unary = torch.tensor([[0.0, -1.0], [0.0, 0.0], [-1.0, 0.0]])
    >>> agree = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    >>> oracle = PairwiseChainOracle(unary, agree.expand(2, 2, 2))
    >>> values = torch.tensor([[1, 0, 0]])
    >>> mask = torch.tensor([[True, False, False]])
    >>> oracle.log_marginals(values, mask).exp()[0, 1].round(decimals=4)
    tensor([0.0609, 0.9391], dtype=torch.float64)
    """

    def __init__(self, unary: Any, pairwise: Any, device: str | torch.device | None = None) -> None:
        unary = as_float64(unary, "unary", device, allow_neg_inf=True)
        pairwise = as_float64(pairwise, "pairwise", unary.device, allow_neg_inf=True)
        if unary.dim() != 2 or unary.shape[0] < 1 or unary.shape[1] < 1:
            raise ValueError(f"unary must have shape [n, q]; got {tuple(unary.shape)}")
        n, q = unary.shape
        if tuple(pairwise.shape) != (n - 1, q, q):
            raise ValueError(
                f"pairwise must have shape [n - 1, q, q] = [{n - 1}, {q}, {q}] (one matrix per "
                f"pair of consecutive sites); got {tuple(pairwise.shape)}"
            )
        self.num_coords, self.num_values = n, q
        self.unary = unary
        self.pairwise = pairwise
        if not self._build_messages(unary[0], pairwise + unary[1:].unsqueeze(1)):
            raise ValueError(
                "every assignment has weight 0 under these potentials (-inf on every path)"
            )

    def _build_messages(self, first: torch.Tensor, edges: torch.Tensor) -> bool:
        """The range-product table of ``edges`` [n - 1, q, q] and the unpinned messages.

        ``first`` [q] is the log weight of ``x_0``. Sets ``_table``, ``log_alpha`` and
        ``log_beta`` [n, q]; returns False if every path has weight 0 (nothing is possible).
        """
        n, q = self.num_coords, self.num_values
        device = first.device
        self._build_table(edges)
        sites = torch.arange(1, n, device=device)
        level1, pos1, level2, pos2 = self._ranges(torch.zeros_like(sites), sites - 1)
        start = log_normalize(first)
        row = log_matmul(start.unsqueeze(0), self._table[level1, pos1])  # [n-1, 1, q]
        forward = log_matmul(row, self._table[level2, pos2]).squeeze(-2)
        alpha = log_normalize(torch.cat([start.unsqueeze(0), forward], 0))
        sites = torch.arange(0, n - 1, device=device)
        level1, pos1, level2, pos2 = self._ranges(sites, torch.full_like(sites, n - 2))
        ones = torch.zeros(q, 1, dtype=torch.float64, device=device)
        column = log_matmul(self._table[level2, pos2], ones)  # [n-1, q, 1]
        backward = log_matmul(self._table[level1, pos1], column).squeeze(-1)
        beta = log_normalize(
            torch.cat([backward, torch.zeros(1, q, dtype=torch.float64, device=device)], 0)
        )
        self.log_alpha = alpha
        self.log_beta = beta
        return not bool(torch.isnan(alpha).any() or torch.isnan(beta).any())

    def _build_table(self, edges: torch.Tensor) -> None:
        """The disjoint sparse table of products of ``edges`` [E, q, q] (log space).

        ``table[0, p]`` is edge ``p`` (``table[0, size]`` the identity); ``table[k + 1, p]`` is
        the product from ``p`` to the end of its half-block (left half) or from the start of
        its half-block to ``p`` (right half), for half-blocks of length ``2^k``.
        """
        num_edges, q = edges.shape[0], self.num_values
        device = edges.device
        size = 1
        while size < num_edges:
            size *= 2
        identity = _log_identity(q, device)
        padded = identity.expand(size + 1, q, q).clone()
        padded[:num_edges] = edges
        levels = [padded]
        half = 1
        while half < size:
            blocks = padded[:size].reshape(size // (2 * half), 2, half, q, q)
            left = blocks[:, 0].clone()  # suffix products within the left half
            right = blocks[:, 1].clone()  # prefix products within the right half
            step = 1
            while step < half:
                left[:, :-step] = log_matmul(left[:, :-step], left[:, step:])
                right[:, step:] = log_matmul(right[:, :-step], right[:, step:])
                step *= 2
            level = torch.stack([left, right], 1).reshape(size, q, q)
            levels.append(torch.cat([level, identity.unsqueeze(0)], 0))
            half *= 2
        self._table = torch.stack(levels, 0)  # [levels, size + 1, q, q]
        self._table_size = size

    def _ranges(
        self, lo: torch.Tensor, hi: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Table entries ``(level1, pos1, level2, pos2)`` whose product is edges ``lo..hi``."""
        single = lo == hi
        level = torch.where(single, 0, _floor_log2((lo ^ hi).clamp(min=1)) + 1)
        pos2 = torch.where(single, self._table_size, hi)
        return level, lo, level, pos2

    def _combine(
        self,
        values: torch.Tensor,
        sites: torch.Tensor,
        left: torch.Tensor,
        right: torch.Tensor,
        pinned: torch.Tensor,
    ) -> torch.Tensor:
        batch, k = sites.shape
        q = self.num_values
        flat = [
            t.reshape(-1)
            for t in (
                sites,
                left,
                right,
                values.gather(1, left.clamp(min=0)),
                values.gather(1, right.clamp(max=self.num_coords - 1)),
            )
        ]
        chunk = max(1, _MAX_WORK_ENTRIES // (q * q))
        parts = [
            self._combine_flat(*(t[s : s + chunk] for t in flat))
            for s in range(0, batch * k, chunk)
        ]
        if parts:
            out = torch.cat(parts, 0).reshape(batch, k, q)
        else:
            out = torch.empty(batch, k, q, dtype=torch.float64, device=values.device)
        return point_mass(out, pinned, values.gather(1, sites))

    def _combine_flat(
        self,
        sites: torch.Tensor,
        left: torch.Tensor,
        right: torch.Tensor,
        x_left: torch.Tensor,
        x_right: torch.Tensor,
    ) -> torch.Tensor:
        """Unnormalised-then-normalised log marginals [m, q] of ``m`` flat queries."""
        n, q = self.num_coords, self.num_values
        table = self._table
        has_left = (left >= 0) & (left < sites)
        has_right = (right < n) & (right > sites)
        x_left = x_left.clamp(0, q - 1)
        x_right = x_right.clamp(0, q - 1)
        # forward: row x_l of M_l ... M_{i-1}
        lo = torch.where(has_left, left, 0)
        hi = torch.where(has_left, sites - 1, 0)
        level1, pos1, level2, pos2 = self._ranges(lo, hi)
        row = table[level1, pos1, x_left]  # [m, q]
        forward = log_matmul(row.unsqueeze(-2), table[level2, pos2]).squeeze(-2)
        forward = torch.where(has_left.unsqueeze(-1), forward, self.log_alpha[sites])
        # backward: column x_r of M_i ... M_{r-1}
        lo = torch.where(has_right, sites, 0)
        hi = torch.where(has_right, right - 1, 0)
        level1, pos1, level2, pos2 = self._ranges(lo, hi)
        column = table[level2, pos2, :, x_right]  # [m, q]
        backward = log_matmul(table[level1, pos1], column.unsqueeze(-1)).squeeze(-1)
        backward = torch.where(has_right.unsqueeze(-1), backward, self.log_beta[sites])
        return log_normalize(forward + backward)


class HMMOracle(PairwiseChainOracle):
    """Exact posterior conditionals of the hidden states of an HMM given its observations.

    The joint law of the hidden chain ``x`` is

    ``p(x | y) ∝ initial[x_0] e_0(x_0) prod_{i >= 1} transition[x_{i-1}, x_i] e_i(x_i)``,

    with ``log e_i(v) = emission_log_likelihoods[i, v]`` (the log likelihood of the observation
    at site ``i`` under hidden state ``v``). Coordinates are the hidden states.

    Parameters
    ----------
    initial : Tensor or array [q]
        Law of ``x_0`` (probabilities, normalised here).
    transition : Tensor or array [q, q]
        ``transition[u, v] = P(x_{i+1} = v | x_i = u)`` (rows normalised here; zeros allowed).
    emission_log_likelihoods : Tensor or array [n, q]
        ``log p(y_i | x_i = v)``; ``-inf`` (impossible) is allowed, NaN and ``+inf`` are not.
    device : str or torch.device, optional
        Where to keep the parameters.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        ``q``.

    Notes
    -----
    A :class:`PairwiseChainOracle` with ``unary = log initial + emissions`` at site 0 and the
    emissions elsewhere, and ``pairwise = log transition`` on every edge: pinned sites are
    separators, the forward message is ``alpha_i(v) ∝ p(x_i = v, y_{0..i})`` and the backward
    one ``beta_i(v) = p(y_{i+1..} | x_i = v)``, and every query costs ``O(q^2)`` per (row,
    target) whatever the distance between pins. Pinned coordinates get a point mass; rows
    conditioned on an impossible assignment are NaN.

    Examples
    --------
    >>> import torch
    >>> emissions = torch.tensor([[0.0, -2.0], [-2.0, 0.0], [0.0, -2.0]])
    >>> oracle = HMMOracle([0.5, 0.5], [[0.8, 0.2], [0.2, 0.8]], emissions)
    >>> values = torch.tensor([[0, 0, 1]])
    >>> mask = torch.tensor([[True, False, True]])
    >>> oracle.log_marginals(values, mask).exp()[0, 1].round(decimals=4)
    tensor([0.1192, 0.8808], dtype=torch.float64)
    >>> oracle.log_marginals_at(values, mask, torch.tensor([[1, 1]])).shape
    torch.Size([1, 2, 2])
    """

    def __init__(
        self,
        initial: Any,
        transition: Any,
        emission_log_likelihoods: Any,
        device: str | torch.device | None = None,
    ) -> None:
        init = as_float64(initial, "initial", device)
        trans = as_float64(transition, "transition", device)
        check_chain_parameters(init, trans)
        emissions = as_float64(
            emission_log_likelihoods, "emission_log_likelihoods", init.device, allow_neg_inf=True
        )
        q = init.shape[0]
        if emissions.dim() != 2 or emissions.shape[1] != q or emissions.shape[0] < 1:
            raise ValueError(
                f"emission_log_likelihoods must have shape [n, q] = [n, {q}] (one row of log "
                f"likelihoods per site); got {tuple(emissions.shape)}"
            )
        self.num_coords = emissions.shape[0]
        self.num_values = q
        self.log_initial = (init / init.sum()).log()
        self.log_transition = (trans / trans.sum(1, keepdim=True)).log()
        self.emission_log_likelihoods = emissions
        # edge matrices M_j = T diag(e_{j+1}), j = 0 .. n-2
        edges = self.log_transition.unsqueeze(0) + emissions[1:].unsqueeze(1)
        first = self.log_initial + emissions[0]
        if bool(torch.isneginf(first).all()):
            raise ValueError(
                "emission_log_likelihoods[0] is -inf for every state the initial law allows; "
                "the observations are impossible under this model"
            )
        if not self._build_messages(first, edges):
            raise ValueError(
                "the observations are impossible under this model (every hidden path has an "
                "emission log likelihood of -inf or a forbidden transition); check "
                "emission_log_likelihoods and transition"
            )
