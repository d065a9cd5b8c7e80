"""What a guide reads from the model: its pairwise expansion, per data set.

A guide network works better when it sees the model. This module reads, from the model's own
log joint (nothing else: any Pyro model with discrete latent sites will do), the expansion

``log p(x, data) = log p(b, data) + sum_i unary[i, x_i] + sum_e pairwise[e, x_i, x_j]``

(the last sum over the edges ``e = (i, j)``)

around a base assignment ``b``: ``unary[i, v] = log p(b with x_i = v) - log p(b)`` and
``pairwise[e, v, w]`` the second difference of ``log p`` in ``(x_i, x_j)`` at ``b``. Each
pairwise table is then double-centred and its row and column means moved into the unary
terms (the same sum): the unary terms become each site's own evidence rather than its
conditional with every neighbour at ``b`` (for an Ising model, the spin-symmetric gauge), which
is where belief propagation from uniform messages should start; uncentred, it started every
draw of a two-mode posterior in the mode of ``b``. The expansion is exact when every factor
of the model involves at most two latent coordinates (Ising and Potts models, hidden Markov
chains, grids, mixtures with fixed parameters); for larger factors it is the second-order part
of the model, and the network learns the rest. The *edges* (which coordinates share a factor)
are found by probing every pair once (``O(n^2)`` evaluations of the log joint, batched); a
user who knows them can pass them.

For a new data set only the potentials on the known edges are recomputed (``O(n + E)``
evaluations): that is how one guide serves many data sets (:meth:`AnyOrderGuide.oracle`,
:meth:`AnyOrderGuide.fit_simulation`).

Log joints that are ``-inf`` (hard constraints) are floored at ``log p(b) - LOG_FLOOR`` before
differencing, so the expansion is finite; the guide then only approximates such constraints,
and the importance correction handles the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pyro_autospec.model import AutoSpecModelError, SiteLayout
from pyro_autospec.model.simulation import joint_log_prob

__all__ = [
    "LOG_FLOOR",
    "ModelStructure",
    "probe_potentials",
    "probe_structure",
]

#: Log joints below ``log p(base) - LOG_FLOOR`` are raised to it before differencing.
LOG_FLOOR = 50.0


@dataclass
class ModelStructure:
    """The pairwise expansion of a model's log joint for one data set.

    Attributes
    ----------
    base : LongTensor[n]
        The base assignment ``b`` (support indices), with ``log p(b, data)`` finite.
    unary : DoubleTensor[n, q]
        ``log p(b with x_i = v) - log p(b)`` plus the row and column means moved out of
        ``pairwise``; ``-inf`` outside each coordinate's support.
    edges : LongTensor[E, 2]
        Pairs ``(i, j)``, ``i < j``, whose second difference is above the tolerance.
    pairwise : DoubleTensor[E, q, q]
        The interaction of ``x_i = v, x_j = w``: the second differences at ``b``,
        double-centred over the supports (their row and column means moved into ``unary``,
        which leaves the expansion's sum unchanged).
    log_base : float
        ``log p(b, data)``.

    Examples
    --------
    The expansion of a pairwise model is exact (:func:`probe_structure` builds it):

    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def chain():
    ...     with pyro.plate("sites", 3):
    ...         z = pyro.sample("z", dist.Bernoulli(torch.tensor([0.2, 0.5, 0.7])))
    ...     s = 2 * z - 1
    ...     pyro.factor("coupling", 0.8 * (s[..., 1:] * s[..., :-1]).sum(-1, keepdim=True))
    >>> layout = discover_sites(chain)
    >>> structure = probe_structure(chain, (), {}, layout)
    >>> structure.edges.tolist(), structure.num_edges
    ([[0, 1], [1, 2]], 2)
    >>> x = torch.tensor([[0, 1, 1], [1, 0, 1]])
    >>> exact = joint_log_prob(chain, (), {}, layout, x)
    >>> bool(torch.allclose(structure.log_prob(x), exact.double(), atol=1e-5))
    True
    """

    base: torch.Tensor
    unary: torch.Tensor
    edges: torch.Tensor
    pairwise: torch.Tensor
    log_base: float

    @property
    def num_edges(self) -> int:
        """``E``."""
        return int(self.edges.shape[0])

    def log_prob(self, values: torch.Tensor) -> torch.Tensor:
        """The expansion at ``values`` LongTensor[N, n]: DoubleTensor[N] (for checks).

        Equal to ``log p(values, data)`` for a pairwise model, up to the floor.
        """
        values = torch.as_tensor(values).long()
        n = values.shape[1]
        out = self.unary[torch.arange(n), values].sum(-1) + self.log_base
        if self.num_edges:
            i, j = self.edges[:, 0], self.edges[:, 1]
            out = out + self.pairwise[torch.arange(self.num_edges), values[:, i], values[:, j]].sum(
                -1
            )
        return out


def _alternatives(base: torch.Tensor, sizes: torch.Tensor) -> list[torch.Tensor]:
    """For each coordinate, its support values other than the base value."""
    return [
        torch.tensor([v for v in range(int(s)) if v != int(b)], dtype=torch.long)
        for b, s in zip(base.tolist(), sizes.tolist(), strict=True)
    ]


def _find_base(evaluate, sizes: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    n = sizes.shape[0]
    candidates = [torch.zeros(n, dtype=torch.long)]
    for _ in range(63):
        candidates.append((torch.rand(n, generator=generator) * sizes).long())
    stacked = torch.stack(candidates)
    lp = evaluate(stacked)
    finite = torch.isfinite(lp)
    if not bool(finite.any()):
        raise AutoSpecModelError(
            "found no assignment of the discrete sites with log p(x, data) > -inf among 64 "
            "tries (all zeros, then random): the guide needs one to read the model's structure; "
            "check the model and its data"
        )
    return stacked[int(finite.nonzero()[0, 0])]


def _floored(lp: torch.Tensor, log_base: float) -> torch.Tensor:
    return lp.clamp_min(log_base - LOG_FLOOR)


def _unary_probes(base, alts):
    idx, val = [], []
    for i, a in enumerate(alts):
        idx.append(torch.full((a.numel(),), i, dtype=torch.long))
        val.append(a)
    return torch.cat(idx), torch.cat(val)


def _pair_probes(base, alts, pairs):
    """Assignments for every (i, j) in pairs and every alternative value pair."""
    rows_i, rows_j, vals_i, vals_j, edge = [], [], [], [], []
    for e, (i, j) in enumerate(pairs.tolist()):
        ai, aj = alts[i], alts[j]
        vi = ai.repeat_interleave(aj.numel())
        vj = aj.repeat(ai.numel())
        rows_i.append(torch.full_like(vi, i))
        rows_j.append(torch.full_like(vj, j))
        vals_i.append(vi)
        vals_j.append(vj)
        edge.append(torch.full_like(vi, e))
    if not rows_i:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, empty, empty, empty
    return tuple(torch.cat(t) for t in (rows_i, rows_j, vals_i, vals_j, edge))


def _assignments(base, positions, values):
    """``base`` with ``x[positions[k]] = values[k]``, several positions per row allowed."""
    out = base.unsqueeze(0).repeat(positions[0].shape[0], 1)
    rows = torch.arange(out.shape[0])
    for pos, val in zip(positions, values, strict=True):
        out[rows, pos] = val
    return out


def _all_pairs_count(alts) -> int:
    counts = torch.tensor([a.numel() for a in alts], dtype=torch.float64)
    return int(round(float((counts.sum() ** 2 - (counts**2).sum()) / 2)))


def probe_structure(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: SiteLayout,
    *,
    edges: torch.Tensor | None = None,
    tolerance: float | None = None,
    max_probes: int = 2**21,
    seed: int = 0,
) -> ModelStructure:
    """Read the pairwise expansion of ``log p(x, data)`` (and the interaction graph) from a model.

    Parameters
    ----------
    model : callable
    args, kwargs
        The model's arguments (data included).
    layout : SiteLayout
        From :func:`~pyro_autospec.model.discover_sites`.
    edges : LongTensor[E, 2], optional
        The interacting pairs, if known (then only they are probed). ``None``: probe every pair.
    tolerance : float, optional
        Second differences at most this large (in absolute value) are not edges. Default
        ``1e-6 * (1 + |log p(b, data)|)``, far above float32 rounding of the log joint.
    max_probes : int
        Refuse to probe every pair when that takes more evaluations of the log joint than
        this (about 30,000 per second on one CPU core for a small model).
    seed : int
        For the random base assignments tried when all zeros is impossible.

    Returns
    -------
    ModelStructure

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def chain():
    ...     with pyro.plate("sites", 4):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     pyro.factor("coupling", (z[..., 1:] * z[..., :-1]).sum(-1, keepdim=True))
    >>> structure = probe_structure(chain, (), {}, discover_sites(chain))
    >>> structure.edges.tolist()
    [[0, 1], [1, 2], [2, 3]]
    """
    kwargs = {} if kwargs is None else kwargs
    sizes = layout.support_sizes

    def evaluate(coords):
        return joint_log_prob(model, args, kwargs, layout, coords)

    base = _find_base(evaluate, sizes, torch.Generator().manual_seed(seed))
    log_base = float(evaluate(base.unsqueeze(0))[0])
    alts = _alternatives(base, sizes)
    if edges is None:
        count = _all_pairs_count(alts)
        if count > max_probes:
            raise ValueError(
                f"finding which of the {layout.num_coords} coordinates interact takes {count} "
                f"evaluations of the log joint (more than max_probes={max_probes}); pass "
                f"edges= (the pairs that share a factor), raise max_probes, or use "
                f"architecture='mlp'"
            )
        candidates = torch.triu_indices(layout.num_coords, layout.num_coords, 1).T
    else:
        candidates = _check_edges(edges, layout.num_coords)
    unary, pairwise = _potentials(
        evaluate, base, log_base, alts, sizes, layout.num_values, candidates
    )
    if edges is None:
        tol = 1e-6 * (1.0 + abs(log_base)) if tolerance is None else float(tolerance)
        keep = pairwise.abs().flatten(1).amax(-1) > tol
        candidates, pairwise = candidates[keep], pairwise[keep]
    candidates = candidates.contiguous()
    unary, pairwise = _centre(unary[None], pairwise[None], candidates, sizes)
    return ModelStructure(base, unary[0], candidates, pairwise[0], log_base)


def _centre(unary, pairwise, edges, sizes):
    """Double-centre every pairwise potential over its supports and move its row and column
    means into the unary potentials (the same log joint, ``[K, n, q]`` and ``[K, E, q, q]``).

    The raw expansion pins every neighbour to the base value: a site's unary term is its
    conditional with all neighbours at ``b``, far from its marginal under strong couplings.
    Centred, the unary terms are the sites' own evidence and belief propagation, which starts
    from uniform messages, starts from there (for an Ising model: the spin-symmetric gauge).
    """
    if edges.shape[0] == 0:
        return unary, pairwise
    q = unary.shape[-1]
    i, j = edges[:, 0], edges[:, 1]
    inside = torch.arange(q)[None, :] < sizes[:, None]  # [n, q]
    support = (inside[i][:, :, None] & inside[j][:, None, :]).to(pairwise.dtype)  # [E, q, q]
    rows = (pairwise * support).sum(-1) / support.sum(-1).clamp_min(1.0)  # [K, E, q]
    cols = (pairwise * support).sum(-2) / support.sum(-2).clamp_min(1.0)
    grand = (pairwise * support).sum((-1, -2)) / support.sum((-1, -2))  # [K, E]
    centred = pairwise - rows[..., :, None] - cols[..., None, :] + grand[..., None, None]
    centred = centred * support
    unary = unary.clone()
    row_part = (rows - grand[..., None]) * inside[i].to(pairwise.dtype)
    col_part = cols * inside[j].to(pairwise.dtype)
    unary.index_add_(1, i, row_part.to(unary.dtype))
    unary.index_add_(1, j, col_part.to(unary.dtype))
    return unary, centred


def _check_edges(edges, n: int) -> torch.Tensor:
    edges = torch.as_tensor(edges, dtype=torch.long)
    if edges.dim() != 2 or edges.shape[1] != 2:
        raise ValueError(f"edges must be a LongTensor[E, 2]; got shape {tuple(edges.shape)}")
    if edges.numel() and (bool((edges < 0).any()) or bool((edges >= n).any())):
        raise ValueError(f"edges must index coordinates 0..{n - 1}")
    if bool((edges[:, 0] == edges[:, 1]).any()):
        raise ValueError("edges must join two different coordinates")
    edges = torch.sort(edges, dim=1).values
    return torch.unique(edges, dim=0)


def _potentials(evaluate, base, log_base, alts, sizes, q, pairs):
    n = base.shape[0]
    idx, val = _unary_probes(base, alts)
    unary = torch.full((n, q), -math.inf, dtype=torch.float64)
    inside = torch.arange(q)[None, :] < sizes[:, None]
    unary[inside] = 0.0
    if idx.numel():
        lp = _floored(evaluate(_assignments(base, [idx], [val])), log_base)
        unary[idx, val] = lp - log_base
    pi, pj, vi, vj, edge = _pair_probes(base, alts, pairs)
    pairwise = torch.zeros(pairs.shape[0], q, q, dtype=torch.float64)
    if pi.numel():
        lp = _floored(evaluate(_assignments(base, [pi, pj], [vi, vj])), log_base)
        pairwise[edge, vi, vj] = lp - log_base - unary[pi, vi] - unary[pj, vj]
    return unary, pairwise


def probe_potentials(
    model: Callable,
    args: tuple,
    kwargs: dict | None,
    layout: SiteLayout,
    structure: ModelStructure,
    observed: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The potentials of :class:`ModelStructure` on its known edges, for other data sets.

    Parameters
    ----------
    model, args, kwargs, layout
        As in :func:`probe_structure` (``args`` give the data when ``observed`` is ``None``).
    structure : ModelStructure
        Fixes the base assignment and the edges.
    observed : dict, optional
        ``name -> Tensor[K, *value_shape]``: ``K`` data sets (values of the observed sites).

    Returns
    -------
    unary : DoubleTensor[K, n, q]
    pairwise : DoubleTensor[K, E, q]
        ``K = 1`` when ``observed`` is ``None``.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec.model import discover_sites
    >>> def model(y):
    ...     with pyro.plate("p", 3):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(z, 1.0), obs=y)
    >>> y = torch.zeros(3)
    >>> layout = discover_sites(model, (y,))
    >>> structure = probe_structure(model, (y,), {}, layout)
    >>> unary, pairwise = probe_potentials(model, (y,), {}, layout, structure,
    ...                                    {"y": torch.ones(2, 3)})
    >>> unary.shape, round(float(unary[0, 0, 1]), 3)
    (torch.Size([2, 3, 2]), 0.5)
    """
    kwargs = {} if kwargs is None else kwargs
    sizes = layout.support_sizes
    alts = _alternatives(structure.base, sizes)
    if observed is None:
        unary, pairwise = _potentials(
            lambda c: joint_log_prob(model, args, kwargs, layout, c),
            structure.base,
            float(joint_log_prob(model, args, kwargs, layout, structure.base[None])[0]),
            alts,
            sizes,
            layout.num_values,
            structure.edges,
        )
        return _centre(unary[None], pairwise[None], structure.edges, sizes)
    observed = {k: torch.as_tensor(v) for k, v in observed.items()}
    num_sets = next(iter(observed.values())).shape[0]
    idx, val = _unary_probes(structure.base, alts)
    pi, pj, vi, vj, edge = _pair_probes(structure.base, alts, structure.edges)
    probes = _stack_probes(structure.base, idx, val, pi, pj, vi, vj)
    per_set = probes.shape[0]
    coords = probes.repeat(num_sets, 1)
    data = {k: v.repeat_interleave(per_set, 0) for k, v in observed.items()}
    lp = joint_log_prob(model, args, kwargs, layout, coords, data).reshape(num_sets, per_set)
    log_base = lp[:, :1]
    lp = lp.clamp_min(log_base - LOG_FLOOR)
    n, q = structure.base.shape[0], layout.num_values
    unary = torch.full((num_sets, n, q), -math.inf, dtype=torch.float64)
    inside = torch.arange(q)[None, :] < sizes[:, None]
    unary[:, inside] = 0.0
    k = idx.numel()
    unary[:, idx, val] = lp[:, 1 : 1 + k] - log_base
    pairwise = torch.zeros(num_sets, structure.num_edges, q, q, dtype=torch.float64)
    if pi.numel():
        pairwise[:, edge, vi, vj] = lp[:, 1 + k :] - log_base - unary[:, pi, vi] - unary[:, pj, vj]
    return _centre(unary, pairwise, structure.edges, sizes)


def _stack_probes(base, idx, val, pi, pj, vi, vj):
    parts = [base[None]]
    if idx.numel():
        parts.append(_assignments(base, [idx], [val]))
    if pi.numel():
        parts.append(_assignments(base, [pi, pj], [vi, vj]))
    return torch.cat(parts)
