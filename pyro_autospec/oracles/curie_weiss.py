"""The exact oracle of the Curie-Weiss (mean-field Ising) model."""

from __future__ import annotations

import math

import torch

from pyro_autospec.engine.logspace import log_normalize, logsumexp

from ._util import as_float64, chain_repeats, point_mass
from .exact import ExactOracle

__all__ = ["CurieWeissOracle"]

# Largest number of terms (rows times width) of one chunk of free marginals.
_MAX_TERMS = 1 << 18


def _real_scalar(x: float | torch.Tensor, name: str, device) -> torch.Tensor:
    t = as_float64(x, name, device)
    if t.numel() != 1:
        raise ValueError(f"{name} must be a real number; got a tensor of shape {tuple(t.shape)}")
    return t.reshape(())


class CurieWeissOracle(ExactOracle):
    """Exact conditional marginals of the Curie-Weiss model on ``n`` spins.

    Coordinate ``i`` takes value ``x_i`` in ``{0, 1}``, the spin is ``s_i = 2 x_i - 1``, and

    ``p(x) ∝ exp(beta / (2 n) * (sum_i s_i)^2 + h * sum_i s_i)``.

    Parameters
    ----------
    n : int
        Number of spins.
    beta : float
        Inverse temperature (any real; the phase transition is at ``beta = 1``).
    h : float, optional
        External field (default 0).
    device : str or torch.device, optional
        Where to keep the parameters.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        2.

    Notes
    -----
    The law is exchangeable, so a conditional depends on the pins only through their count
    ``k`` and their magnetisation ``m = sum_{i pinned} s_i``. For an unpinned ``i``,

    ``P(x_i = v | pins) ∝ sum_{j=0}^{u-1} C(u-1, j) w(m + (2v - 1) + 2j - (u - 1))``,

    with ``u = n - k`` unpinned spins, ``j`` of the other ``u - 1`` of them up, and
    ``log w(M) = beta M^2 / (2 n) + h M``. The sum is a ``logsumexp`` with log binomial
    coefficients from a table of ``lgamma``, vectorised over rows: ``O(u)`` per row for all
    coordinates (rows sorted by ``u`` and cut into cache-sized chunks). Pinned coordinates get
    a point mass. Chain queries (:meth:`log_marginals_chain`) take every row's counts from
    the prefix's and running sums along the chain: ``O(n + L u)`` per chain, with no
    ``[L, n]`` mask.

    Examples
    --------
    >>> import torch
    >>> oracle = CurieWeissOracle(4, beta=1.5)
    >>> values = torch.tensor([[1, 1, 0, 0]])
    >>> mask = torch.tensor([[True, True, False, False]])
    >>> probs = oracle.log_marginals(values, mask).exp()[0, 2]
    >>> bool(probs[1] > probs[0])  # ferromagnetic: the free spins follow the pinned ones
    True
    """

    consistent_queries = True  # its query methods (the conformance tests check them)

    def __init__(
        self,
        n: int,
        beta: float | torch.Tensor,
        h: float | torch.Tensor = 0.0,
        device: str | torch.device | None = None,
    ) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive int (the number of spins); got {n!r}")
        self.beta = _real_scalar(beta, "beta", device)
        self.h = _real_scalar(h, "h", self.beta.device)
        self.num_coords = n
        self.num_values = 2
        counts = torch.arange(n + 1, dtype=torch.float64, device=self.beta.device)
        self._log_factorials = torch.lgamma(counts + 1)  # log k!, k = 0 .. n

    def _free_marginal(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log marginal [B, 2] shared by every unpinned coordinate of a row."""
        return self._free_marginal_of_counts(mask.sum(1), (mask & (values == 1)).sum(1))

    def _free_marginal_of_counts(self, pinned: torch.Tensor, ups: torch.Tensor) -> torch.Tensor:
        """Log marginal [B, 2] of an unpinned spin given ``pinned`` [B] pins, ``ups`` [B] up.

        Rows are sorted by their number of other free spins ``u - 1`` and cut into chunks of at
        most ``2^18`` terms, each as wide as its widest row: a row costs ``O(u)``, and the
        temporaries stay in cache.
        """
        n = self.num_coords
        device = pinned.device
        batch = pinned.shape[0]
        out = torch.empty(batch, 2, dtype=torch.float64, device=device)
        others = (n - pinned - 1).clamp(min=0)  # u - 1
        magnetisation = (2 * ups - pinned).double()  # m
        order = torch.argsort(others)
        widths = (others[order] + 2).tolist()  # k = 0 .. u
        start = 0
        while start < batch:
            stop = min(batch, start + max(1, _MAX_TERMS // widths[start]))
            while stop - start > 1 and (stop - start) * widths[stop - 1] > _MAX_TERMS:
                stop = start + max(1, _MAX_TERMS // widths[stop - 1])  # widths increase
            rows = order[start:stop]
            out[rows] = self._free_marginal_chunk(
                others[rows], magnetisation[rows], widths[stop - 1]
            )
            start = stop
        return out

    def _free_marginal_chunk(
        self, others: torch.Tensor, magnetisation: torch.Tensor, width: int
    ) -> torch.Tensor:
        """:meth:`_free_marginal_of_counts` of rows with ``others + 2 <= width``: [b, 2]."""
        n = self.num_coords
        k = torch.arange(width, device=others.device)
        others = others.unsqueeze(-1)
        # total magnetisation with the spin down and k of the others up (the spin up with
        # k - 1 of them up gives the same total)
        total = magnetisation.unsqueeze(-1) - 1 - others + 2 * k  # [b, width]
        log_w = self.beta * total.square() / (2 * n) + self.h * total
        log_factorials = self._log_factorials
        log_binom = (
            log_factorials[others]
            - log_factorials[k.clamp(max=n)]
            - log_factorials[(others - k).clamp(min=0)]
        )
        log_binom = torch.where(k <= others, log_binom, float("-inf"))  # C(u - 1, k)
        shifted = torch.cat(
            [torch.full_like(log_binom[:, :1], float("-inf")), log_binom[:, :-1]], 1
        )
        terms = torch.stack([log_binom + log_w, shifted + log_w], 1)  # spin down, spin up
        return log_normalize(logsumexp(terms, dim=-1))

    def _log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        free = self._free_marginal(values, mask)
        out = free.unsqueeze(1).expand(-1, self.num_coords, -1)
        return point_mass(out, mask, values.clamp(0, 1))

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        free = self._free_marginal(values, mask)
        out = free.unsqueeze(1).expand(-1, targets.shape[1], -1)
        return point_mass(out, mask.gather(1, targets), values.gather(1, targets).clamp(0, 1))

    def _log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        # the counts of every row from the prefix's counts and running sums along the chain
        x = values.gather(1, chain).clamp(0, 1)
        inert = mask.gather(1, chain) | chain_repeats(chain)
        new = (~inert).long()
        new_up = new * (x == 1).long()
        pinned = mask.sum(1, keepdim=True) + new.cumsum(1) - new
        ups = (mask & (values == 1)).sum(1, keepdim=True) + new_up.cumsum(1) - new_up
        free = torch.zeros(*chain.shape, 2, dtype=torch.float64, device=values.device)
        free[~inert] = self._free_marginal_of_counts(pinned[~inert], ups[~inert])
        return point_mass(free, inert, x)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised ``log p(x)`` of full configurations ``x``: LongTensor[N, n] -> [N].

        Examples
        --------
        >>> import torch
        >>> oracle = CurieWeissOracle(3, beta=0.0)
        >>> oracle.log_prob(torch.tensor([[0, 1, 1]])).exp()
        tensor([0.1250], dtype=torch.float64)
        """
        n = self.num_coords
        ups = torch.arange(n + 1, dtype=torch.float64, device=self.beta.device)
        total = 2 * ups - n
        log_binom = math.lgamma(n + 1.0) - torch.lgamma(ups + 1)
        log_binom = log_binom - torch.lgamma(n - ups + 1)
        log_w = self.beta * total.square() / (2 * n) + self.h * total
        log_z = torch.logsumexp(log_binom + log_w, 0)
        magnetisation = (2 * x.to(self.beta.device) - 1).sum(-1).double()
        return self.beta * magnetisation.square() / (2 * n) + self.h * magnetisation - log_z
