"""Small tabular targets for the engine's exactness tests: ``TARGETS`` maps a name to a
function returning a DoubleTensor [q]*n of unnormalised log weights."""

import itertools

import torch


def joint_states(n, q):
    return torch.tensor(list(itertools.product(range(q), repeat=n)))


def pairs_equal_target(n=6, q=2, seed=0):
    """Random weights restricted to x0 = x1, x2 = x3, ...: a fixed order's drafts fail often."""
    g = torch.Generator().manual_seed(seed)
    states = joint_states(n, q)
    logits = 1.5 * torch.randn(q**n, generator=g, dtype=torch.float64)
    equal = torch.ones(q**n, dtype=torch.bool)
    for i in range(0, n - 1, 2):
        equal &= states[:, i] == states[:, i + 1]
    logits = torch.where(equal, logits, torch.tensor(-torch.inf, dtype=torch.float64))
    return logits.reshape([q] * n)


def potts_target(n=5, q=3, coupling=1.2, seed=1):
    """A random Potts-like table: random pair couplings and fields on the complete graph."""
    g = torch.Generator().manual_seed(seed)
    states = joint_states(n, q)
    J = coupling * torch.randn(n, n, generator=g, dtype=torch.float64)
    h = torch.randn(n, q, generator=g, dtype=torch.float64)
    same = (states[:, :, None] == states[:, None, :]).double()
    energy = (J.triu(1) * same).sum((1, 2)) + h[torch.arange(n), states].sum(1)
    return energy.reshape([q] * n)


def near_deterministic_target(n=6, q=2, eps=1e-3):
    """Almost all mass on the all-equal states: the product draft is terrible."""
    states = joint_states(n, q)
    all_equal = (states == states[:, :1]).all(1)
    probs = torch.where(all_equal, torch.tensor(1.0), torch.tensor(eps)).double()
    return probs.log().reshape([q] * n)


TARGETS = {
    "pairs_equal": pairs_equal_target,
    "potts": potts_target,
    "near_deterministic": near_deterministic_target,
}
