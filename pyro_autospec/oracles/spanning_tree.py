"""The exact oracle of (weighted) uniform spanning trees: a DPP on the edges."""

from __future__ import annotations

from typing import Any

import torch

from ._util import as_float64
from .dpp import DPPOracle
from .exact import ExactOracle

__all__ = ["SpanningTreeOracle"]


def _check_edges(num_nodes: int, edges: Any, device) -> torch.Tensor:
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 2:
        raise ValueError(f"num_nodes must be an int >= 2; got {num_nodes!r}")
    try:
        e = torch.as_tensor(edges, device=device)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"edges must be a sequence of (u, v) node pairs or a LongTensor [m, 2]: {error}"
        ) from error
    if e.dim() != 2 or e.shape[1] != 2 or e.shape[0] < 1:
        raise ValueError(
            f"edges must have shape [m, 2] (one (u, v) pair per edge); got {tuple(e.shape)}"
        )
    if e.is_floating_point() and not torch.equal(e, e.round()):
        raise ValueError("edges must hold integer node indices")
    e = e.long()
    if e.min() < 0 or e.max() >= num_nodes:
        raise ValueError(f"edges must hold node indices in [0, num_nodes) = [0, {num_nodes})")
    loops = (e[:, 0] == e[:, 1]).nonzero().flatten().tolist()
    if loops:
        raise ValueError(
            f"edges {loops} are self-loops; a self-loop is never in a spanning tree, remove it"
        )
    return e


def _is_connected(num_nodes: int, edges: torch.Tensor) -> bool:
    parent = list(range(num_nodes))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for u, v in edges.tolist():
        parent[find(u)] = find(v)
    return len({find(a) for a in range(num_nodes)}) == 1


class SpanningTreeOracle(ExactOracle):
    """Exact conditional marginals of a random spanning tree of a (multi)graph.

    ``P(T) ∝ prod_{e in T} weights[e]`` over the spanning trees ``T`` (uniform when
    ``weights`` is None). Coordinates are the edges; value 1 means the edge is in the tree.

    Parameters
    ----------
    num_nodes : int
        Number of nodes ``N`` (at least 2).
    edges : sequence of (u, v) pairs or LongTensor [m, 2]
        The edges; parallel edges are allowed, self-loops are not. The graph must be connected.
    weights : Tensor or array [m], optional
        Positive edge weights (default all 1).
    device : str or torch.device, optional
        Where to keep the kernel.

    Attributes
    ----------
    num_coords : int
        ``m``, the number of edges.
    num_values : int
        2.
    kernel : DoubleTensor[m, m]
        The transfer-current kernel.

    Notes
    -----
    The edges of a weighted uniform spanning tree form a determinantal point process with
    the transfer-current kernel ``K_ef = sqrt(w_e w_f) b_e^T Lap^+ b_f`` (``b_e`` the signed
    incidence vector of ``e``, ``Lap`` the weighted Laplacian); ``K_ee = w_e R_eff(e)``. Pinning
    an edge in (contraction) and out (deletion) are exactly the DPP Schur updates, so the
    conditionals are those of :class:`DPPOracle` with this kernel. ``Lap^+`` is computed by
    grounding node 0 (a Cholesky solve of the reduced Laplacian). Rows pinning a cycle in,
    or a cut out, are impossible (NaN or arbitrary). Probabilities within ``1e-9`` of 0 or 1
    are set to 0 or 1, so every draw has exactly ``N - 1`` edges. Chain queries
    (:meth:`log_marginals_chain`) are those of :class:`DPPOracle`: one conditioning per chain
    and a sequence of rank-one updates.

    Examples
    --------
    >>> import torch
    >>> triangle = SpanningTreeOracle(3, [(0, 1), (1, 2), (0, 2)])
    >>> values = torch.zeros(1, 3, dtype=torch.long)
    >>> mask = torch.zeros(1, 3, dtype=torch.bool)
    >>> triangle.log_marginals(values, mask).exp()[0, :, 1]  # each edge is in 2 of 3 trees
    tensor([0.6667, 0.6667, 0.6667], dtype=torch.float64)
    """

    consistent_queries = True  # its query methods (the conformance tests check them)

    def __init__(
        self,
        num_nodes: int,
        edges: Any,
        weights: Any = None,
        device: str | torch.device | None = None,
    ) -> None:
        e = _check_edges(num_nodes, edges, device)
        m = e.shape[0]
        if weights is None:
            w = torch.ones(m, dtype=torch.float64, device=e.device)
        else:
            w = as_float64(weights, "weights", e.device)
            if w.shape != (m,):
                raise ValueError(
                    f"weights must have shape [m] = [{m}] (one per edge); got {tuple(w.shape)}"
                )
            if (w <= 0).any():
                raise ValueError("weights must be positive; drop edges of weight 0 from edges")
        if not _is_connected(num_nodes, e):
            raise ValueError(
                "the graph (num_nodes, edges) is not connected, so it has no spanning tree; add "
                "edges or sample each component separately"
            )
        incidence = torch.zeros(m, num_nodes, dtype=torch.float64, device=e.device)
        rows = torch.arange(m, device=e.device)
        incidence[rows, e[:, 0]] = 1.0
        incidence[rows, e[:, 1]] = -1.0
        grounded = incidence[:, 1:] * w.sqrt().unsqueeze(-1)  # sqrt(W) B, node 0 grounded
        laplacian = grounded.T @ grounded
        factor = torch.linalg.cholesky(laplacian)
        solved = torch.cholesky_solve(grounded.T, factor)  # Lap_red^-1 B^T sqrt(W)
        kernel = grounded @ solved
        self.edges = e
        self.weights = w
        self._dpp = DPPOracle(kernel=(kernel + kernel.T) / 2)
        self.kernel = self._dpp.kernel
        self.num_nodes = num_nodes
        self.num_coords = m
        self.num_values = 2

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        return self._dpp._log_marginals_at(values, mask, targets)

    def _log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        return self._dpp._log_marginals_chain(values, mask, chain)
