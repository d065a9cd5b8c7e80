"""Random oracles and their parameters for the oracles' own tests (Pyro-free).

``random_hmm`` and ``random_kernel`` build random parameters, ``random_forest`` a random
TreePottsOracle. The conformance catalogue of every oracle is ``tests/catalogue/conformance.py``.
"""

from __future__ import annotations

import math

import torch

from pyro_autospec.oracles import (
    TreePottsOracle,
)


def random_hmm(n, q, seed, zeros=False, scale=2.0):
    """Random HMM parameters ``(initial, transition, emissions)`` (unnormalised probabilities,
    emission log likelihoods [n, q]); with ``zeros`` a forbidden transition and emission."""
    gen = torch.Generator().manual_seed(seed)
    initial = torch.rand(q, generator=gen, dtype=torch.float64)
    transition = torch.rand(q, q, generator=gen, dtype=torch.float64)
    emissions = torch.randn(n, q, generator=gen, dtype=torch.float64) * scale
    if zeros:
        transition[0, 1] = 0.0
        emissions[n // 2, 0] = -math.inf
    return initial, transition, emissions


def random_forest(n, seed, q, hard, forest=False):
    """A random recursive tree (or forest) with random tables, ``-inf`` entries if ``hard``."""
    gen = torch.Generator().manual_seed(seed)
    edges = []
    for i in range(1, n):
        if forest and float(torch.rand(1, generator=gen)) < 0.1:
            continue
        edges.append((int(torch.randint(0, i, (), generator=gen)), i))
    table = torch.randn(len(edges), q, q, generator=gen, dtype=torch.float64)
    if hard:
        table[:, 0, 1] = -math.inf
    fields = torch.randn(n, q, generator=gen, dtype=torch.float64)
    edges = torch.tensor(edges, dtype=torch.long).reshape(-1, 2)
    return TreePottsOracle(edges, table, fields, num_values=q)


def random_kernel(n, seed, projection_rank=None, rank=None):
    """A random marginal kernel: full rank, a projection of rank ``projection_rank``, or of
    rank ``rank`` with eigenvalues in (0.05, 0.95)."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    if projection_rank is not None:
        eig = (torch.arange(n) < projection_rank).double()
    elif rank is not None:
        eig = 0.05 + 0.9 * torch.rand(n, generator=gen, dtype=torch.float64)
        eig = torch.where(torch.arange(n) < rank, eig, 0.0)
    else:
        eig = torch.rand(n, generator=gen, dtype=torch.float64)
    return (q * eig) @ q.T


class DeclaredBorrowing:
    """``oracle`` declaring ``borrows_inputs = borrows``, every other attribute forwarded: the
    same oracle with fresh or with borrowed inputs (the tests compare both; the benchmarks'
    ``borrows=`` key measures what borrowing saves)."""

    def __init__(self, oracle, borrows: bool):
        self.inner, self.borrows_inputs = oracle, bool(borrows)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class RowsOnly:
    """``oracle`` answering ``log_marginals`` alone: no ``log_normalizer()``, targeted rows or
    chain queries (an exact oracle as a user would write it, whose self-check must find
    ``log Z`` elsewhere)."""

    def __init__(self, oracle):
        self.inner = oracle
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values

    def log_marginals(self, values, mask):
        return self.inner.log_marginals(values, mask)
