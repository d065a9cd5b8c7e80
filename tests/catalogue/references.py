"""Brute-force log probabilities of the structured oracles' laws.

Each ``*_log_prob(parameters)`` returns a function of a tuple of values (one state) giving its
unnormalised (or normalised) log probability, slow and obviously correct; enumerate it over
every state with ``tests.catalogue.oracle_reference.enumerate_joint``.
"""

import math

import torch


def chain_log_prob(initial, transition):
    init = initial / initial.sum()
    trans = transition / transition.sum(1, keepdim=True)

    def log_prob(x):
        p = init[x[0]]
        for a, b in zip(x[:-1], x[1:], strict=False):
            p = p * trans[a, b]
        return math.log(p) if p > 0 else -math.inf

    return log_prob


def hmm_log_prob(initial, transition, emissions):
    init = (initial / initial.sum()).log()
    trans = (transition / transition.sum(1, keepdim=True)).log()

    def log_prob(x):
        total = init[x[0]] + emissions[0, x[0]]
        for i in range(1, len(x)):
            total = total + trans[x[i - 1], x[i]] + emissions[i, x[i]]
        return float(total)

    return log_prob


def potts_log_prob(edges, table, fields):
    def log_prob(x):
        total = sum(float(fields[i, v]) for i, v in enumerate(x))
        for k, (u, v) in enumerate(edges):
            total += float(table[k, x[u], x[v]])
        return total

    return log_prob


def dpp_log_prob(kernel):
    n = kernel.shape[0]

    def log_prob(x):
        # P(X = A) = |det(K - diag(1 - x))|
        d = torch.tensor([0.0 if v else 1.0 for v in x], dtype=torch.float64)
        p = abs(float(torch.linalg.det(kernel - torch.diag(d))))
        return math.log(p) if p > 1e-14 else -math.inf

    assert len(range(n)) == n
    return log_prob


def spanning_tree_log_prob(num_nodes, edges, weights):
    def log_prob(x):
        chosen = [k for k, v in enumerate(x) if v]
        if len(chosen) != num_nodes - 1:
            return -math.inf
        parent = list(range(num_nodes))

        def find(a):
            while parent[a] != a:
                a = parent[a]
            return a

        for k in chosen:
            u, v = find(edges[k][0]), find(edges[k][1])
            if u == v:
                return -math.inf  # a cycle
            parent[u] = v
        return sum(math.log(weights[k]) for k in chosen)

    return log_prob


def curie_weiss_log_prob(n, beta, h):
    def log_prob(x):
        m = sum(2 * v - 1 for v in x)
        return beta * m * m / (2 * n) + h * m

    return log_prob


def pairwise_chain_log_prob(unary, pairwise):
    """``sum_i unary[i, x_i] + sum_i pairwise[i, x_i, x_{i + 1}]`` (PairwiseChainOracle)."""

    def log_prob(x):
        total = sum(float(unary[i, v]) for i, v in enumerate(x))
        return total + sum(float(pairwise[i, a, b]) for i, (a, b) in enumerate(zip(x, x[1:])))

    return log_prob


def posterior_log_prob(model, args, layout):
    """``log p(x | data)`` of a Pyro model's discrete sites by
    :func:`~pyro_autospec.model.enumerate_posterior` (a sum over every assignment), as a
    function of a tuple of support indices; ``-inf`` outside the sites' supports."""
    from pyro_autospec.model import enumerate_posterior

    states, log_probs = enumerate_posterior(model, args, layout=layout)
    table = {tuple(s.tolist()): float(lp) for s, lp in zip(states, log_probs, strict=True)}
    return lambda x: table.get(tuple(int(v) for v in x), -math.inf)
