"""The exact oracle of Potts and Ising models on trees and forests (belief propagation)."""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from pyro_autospec.engine.logspace import log_normalize, logsumexp

from ._util import (
    as_float64,
    chain_repeats,
    pinned_with_chain,
    point_mass,
)
from .exact import ChainThen, ExactOracle

__all__ = ["TreePottsOracle"]

# Largest number of entries of the per-level [rows, nodes, q, q] temporaries.
_MAX_WORK_ENTRIES = 1 << 23


def _check_forest_edges(edges: Any, num_nodes: int | None) -> tuple[torch.Tensor, int]:
    try:
        e = torch.as_tensor(edges)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"edges must be a sequence of (u, v) node pairs or a LongTensor [m, 2]: {error}"
        ) from error
    if e.numel() == 0:
        e = e.reshape(0, 2)
    if e.dim() != 2 or e.shape[1] != 2:
        raise ValueError(
            f"edges must have shape [m, 2] (one (u, v) pair per edge); got {tuple(e.shape)}"
        )
    if e.is_floating_point() and not torch.equal(e, e.round()):
        raise ValueError("edges must hold integer node indices")
    e = e.long().cpu()
    if num_nodes is None:
        num_nodes = int(e.max()) + 1 if e.numel() else 0
    if num_nodes < 1:
        raise ValueError("the model needs at least one node: pass fields of shape [num_nodes, q]")
    if e.numel() and (e.min() < 0 or e.max() >= num_nodes):
        raise ValueError(
            f"edges must hold node indices in [0, num_nodes) = [0, {num_nodes}) (num_nodes is "
            f"fields.shape[0])"
        )
    parent = list(range(num_nodes))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for k, (u, v) in enumerate(e.tolist()):
        ru, rv = find(u), find(v)
        if ru == rv:
            raise ValueError(
                f"edges[{k}] = ({u}, {v}) closes a cycle (or is a self-loop or a repeated edge); "
                f"TreePottsOracle needs a forest. Merge parallel edges into one coupling; for "
                f"graphs with cycles use TabularOracle (small n)"
            )
        parent[ru] = rv
    return e, num_nodes


class TreePottsOracle(ChainThen, ExactOracle):
    """Exact conditional marginals of a Potts model on a tree or forest.

    ``p(x) ∝ exp(sum_{e = (u, v)} psi_e(x_u, x_v) + sum_i fields[i, x_i])`` on ``[q]^N``,
    where ``psi_e(a, b) = couplings[e] * 1[a == b]`` (Potts) or a full table
    ``couplings[e, a, b]``. The Ising model is ``num_values = 2``; see :meth:`ising` for the
    spin convention.

    Parameters
    ----------
    edges : sequence of (u, v) pairs or LongTensor [m, 2]
        The edges of a forest on the nodes ``0 .. N-1`` (no cycles, no repeated edges).
    couplings : float, Tensor [m] or Tensor [m, q, q]
        Potts couplings (finite), or log-potential tables ``psi_e(x_u, x_v)`` with
        ``x_u`` the value of ``edges[e][0]``; tables may hold ``-inf`` (hard constraints, e.g.
        proper colourings).
    fields : Tensor [N, q] or None
        Log node potentials (``-inf`` allowed). None means zero fields on
        ``N = 1 + max node index`` nodes.
    num_values : int
        ``q`` (at least 2).
    device : str or torch.device, optional
        Where to keep the parameters.

    Attributes
    ----------
    num_coords : int
        ``N``, the number of nodes.
    num_values : int
        ``q``.

    Notes
    -----
    Pins clamp the node potentials (``-inf`` off the pinned value) and sum-product belief
    propagation on the clamped forest is exact. Each component is rooted at its smallest node;
    the upward pass sends the messages of all nodes of one depth at once (deepest first) and
    the downward pass does the same from the roots, so a call costs ``O(depth)`` batched steps
    and ``O(B N q^2)`` work. The downward message to a child must exclude the child's own
    upward message; rather than dividing (``-inf - -inf``), each node keeps the sum of the
    finite incoming log messages and the count of ``-inf`` ones, which stays exact with hard
    constraints. Messages are normalised at every step. Pinned coordinates get a point mass;
    :meth:`log_marginals` rows conditioned on an impossible assignment are NaN (targeted rows
    and chains there may hold NaN or any values, as the protocol allows). For long chains
    prefer :class:`MarkovChainOracle` (depth-free).

    Chain queries (:meth:`log_marginals_chain`) reuse the prefix's work. The *marked* nodes of
    a chain are its coordinates and their ancestors, up to the first node pinned by the
    prefix (a pinned node cuts the tree) or a root. One upward pass per chain with the
    prefix's pins gives every marked node the messages of its unmarked children; then the
    rows (one per chain coordinate, pinning the coordinates before it) run their upward and
    downward passes over the marked nodes only. With ``A`` marked nodes (at most
    ``min(N, L (depth + 1))``), a chain costs ``O(N q^2 + L A q^2)`` in ``O(depth)`` batched
    steps, against ``O(L N q^2)`` for ``L`` rows. Models without ``-inf`` potentials go
    further: row ``j`` adds one pin to row ``j - 1``, which changes the upward messages on
    one path only, and a row needs downward messages on the path to its target only. So
    each marked node keeps one *version* per pin below it, updated by the difference of one
    child's message, and the downward pass visits the targets' paths:
    ``O(N q^2 + (A + L h) q^2)`` with paths of ``h`` marked nodes.
    Targeted rows (:meth:`log_marginals_at`) work the same way, as one row that reads all its
    targets: ``O(N q^2 + A q^2)`` for ``T`` targets with ``A`` marked nodes (at most
    ``min(N, T (depth + 1))``), about half of a pass over the whole forest and fewer steps.
    :meth:`log_marginals_chain_then` answers a chain and the row after it (the next block's
    draft row) with one upward pass for both.

    Examples
    --------
    >>> import torch
    >>> star = [(0, 1), (0, 2), (0, 3)]
    >>> oracle = TreePottsOracle(star, couplings=1.0, fields=torch.zeros(4, 3), num_values=3)
    >>> values = torch.tensor([[2, 0, 0, 0]])
    >>> mask = torch.tensor([[True, False, False, False]])
    >>> oracle.log_marginals(values, mask).exp()[0, 1]  # leaves follow the pinned centre
    tensor([0.2119, 0.2119, 0.5761], dtype=torch.float64)
    """

    consistent_queries = True  # its query methods (the conformance tests check them)

    def __init__(
        self,
        edges: Any,
        couplings: Any,
        fields: Any,
        num_values: int,
        device: str | torch.device | None = None,
    ) -> None:
        if not isinstance(num_values, int) or isinstance(num_values, bool) or num_values < 2:
            raise ValueError(f"num_values must be an int >= 2 (q); got {num_values!r}")
        q = num_values
        if fields is not None:
            f = as_float64(fields, "fields", device, allow_neg_inf=True)
            if f.dim() != 2 or f.shape[1] != q:
                raise ValueError(
                    f"fields must have shape [num_nodes, num_values] = [N, {q}]; "
                    f"got {tuple(f.shape)}"
                )
            e, n = _check_forest_edges(edges, f.shape[0])
        else:
            e, n = _check_forest_edges(edges, None)
            f = torch.zeros(n, q, dtype=torch.float64, device=device)
        device = f.device
        m = e.shape[0]
        c = as_float64(couplings, "couplings", device, allow_neg_inf=True)
        if c.dim() == 0:
            c = c.expand(m)
        if c.shape == (m,):
            if torch.isinf(c).any():
                raise ValueError(
                    "couplings must be finite; express hard constraints as [m, q, q] tables"
                )
            table = c[:, None, None] * torch.eye(q, dtype=torch.float64, device=device)
        elif c.shape == (m, q, q):
            table = c
        else:
            raise ValueError(
                f"couplings must be a number, a tensor [m] = [{m}] (Potts) or [m, q, q] = "
                f"[{m}, {q}, {q}] (log-potential tables); got {tuple(c.shape)}"
            )
        self.edges = e.to(device)
        self.couplings = table
        self.fields = f
        self.num_coords = n
        self.num_values = q
        self._build_schedule(e, table)

    @classmethod
    def ising(
        cls,
        edges: Any,
        coupling: Any,
        field: Any = 0.0,
        num_nodes: int | None = None,
        device: str | torch.device | None = None,
    ) -> TreePottsOracle:
        """The Ising model ``p(s) ∝ exp(sum_e J_e s_u s_v + sum_i h_i s_i)``, ``s = 2 x - 1``.

        Parameters
        ----------
        edges : sequence of (u, v) pairs or LongTensor [m, 2]
        coupling : float or Tensor [m]
            ``J``.
        field : float or Tensor [N]
            ``h``.
        num_nodes : int, optional
            ``N`` (default: from ``field`` if it is a vector, else ``1 + max node index``).
        device : str or torch.device, optional

        Examples
        --------
        >>> oracle = TreePottsOracle.ising([(0, 1), (1, 2)], coupling=0.5, field=0.1)
        >>> oracle.num_coords, oracle.num_values
        (3, 2)
        """
        e, n = _check_forest_edges(edges, num_nodes)
        h = as_float64(field, "field", device)
        if h.dim() == 1 and num_nodes is None:
            e, n = _check_forest_edges(edges, h.shape[0])
        h = h.expand(n) if h.dim() == 0 else h
        if h.shape != (n,):
            raise ValueError(f"field must be a number or a tensor [num_nodes] = [{n}]")
        j = as_float64(coupling, "coupling", h.device)
        # J s_u s_v = 2 J 1[x_u == x_v] - J and h s = h (2 x - 1): constants drop out
        return cls(e, 2 * j, torch.stack([-h, h], -1), num_values=2, device=h.device)

    def _build_schedule(self, edges: torch.Tensor, table: torch.Tensor) -> None:
        """Root every component at its smallest node; group nodes by depth."""
        n, q = self.num_coords, self.num_values
        neighbours: list[list[tuple[int, int, bool]]] = [[] for _ in range(n)]
        for k, (u, v) in enumerate(edges.tolist()):
            neighbours[u].append((v, k, False))  # table[k] is indexed (x_u, x_v)
            neighbours[v].append((u, k, True))
        parent = [-1] * n
        depth = [-1] * n
        parent_edge = [0] * n
        child_is_first = [True] * n  # whether the child is edges[k][0]
        for root in range(n):
            if depth[root] >= 0:
                continue
            depth[root] = 0
            queue = deque([root])
            while queue:
                a = queue.popleft()
                for b, k, a_is_second in neighbours[a]:
                    if depth[b] < 0:
                        depth[b] = depth[a] + 1
                        parent[b] = a
                        parent_edge[b] = k
                        child_is_first[b] = a_is_second
                        queue.append(b)
        device = table.device
        psi = torch.zeros(n, q, q, dtype=torch.float64, device=device)  # psi[c, x_c, x_parent]
        for c in range(n):
            if parent[c] >= 0:
                t = table[parent_edge[c]]
                psi[c] = t if child_is_first[c] else t.T
        self._psi = psi
        # whether a potential is -inf (hard constraints): messages may then be -inf
        self._hard = not bool(torch.isfinite(psi).all() and torch.isfinite(self.fields).all())
        self._parent = torch.tensor(parent, dtype=torch.long, device=device)
        max_depth = max(depth)
        self._levels = [
            torch.tensor([c for c in range(n) if depth[c] == d], dtype=torch.long, device=device)
            for d in range(max_depth + 1)
        ]
        # The same forest with nodes renumbered by depth ("positions"), so that every level is
        # a slice: what chain queries work on.
        order = torch.cat(self._levels)
        position = torch.empty_like(order)
        position[order] = torch.arange(n, device=device)
        self._order = order
        self._position = position
        parent_position = torch.where(
            self._parent[order] >= 0, position[self._parent[order].clamp(min=0)], -1
        )
        self._parent_position = parent_position
        self._psi_position = psi[order].contiguous()
        self._depth_position = torch.tensor(depth, dtype=torch.long, device=device)[order]
        starts = [0]
        for level in self._levels:
            starts.append(starts[-1] + len(level))
        self._level_starts = starts

    def _belief_propagation(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log marginals [B, N, q] of one chunk of rows."""
        q = self.num_values
        clash = mask.unsqueeze(-1) & (values.unsqueeze(-1) != torch.arange(q, device=values.device))
        phi = self.fields.unsqueeze(0) + torch.where(clash, float("-inf"), 0.0)  # [B, N, q]
        finite_in = torch.zeros_like(phi)  # sum of the finite incoming upward messages
        zeros_in = torch.zeros_like(phi)  # count of the -inf ones
        up = torch.zeros_like(phi)
        inf = float("-inf")
        for level in reversed(self._levels[1:]):
            belief = phi[:, level] + torch.where(zeros_in[:, level] > 0, inf, finite_in[:, level])
            message = _send(belief, self._psi[level], upward=True)  # [B, C, q]
            message = log_normalize_safe(message)
            up[:, level] = message
            finite = torch.isfinite(message)
            parents = self._parent[level]
            finite_in.index_add_(1, parents, torch.where(finite, message, 0.0))
            zeros_in.index_add_(1, parents, (~finite).double())
        down = torch.zeros_like(phi)
        for level in self._levels[1:]:
            parents = self._parent[level]
            own = up[:, level]
            own_finite = torch.isfinite(own)
            excl_finite = finite_in[:, parents] - torch.where(own_finite, own, 0.0)
            excl_zeros = zeros_in[:, parents] - (~own_finite).double()
            partial = phi[:, parents] + down[:, parents]
            partial = partial + torch.where(excl_zeros > 0.5, inf, excl_finite)  # [B, C, q]
            message = _send(partial, self._psi[level], upward=False)  # over x_p
            down[:, level] = log_normalize_safe(message)
        belief = phi + down + torch.where(zeros_in > 0.5, inf, finite_in)
        return log_normalize(belief)

    def _log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, q = self.num_coords, self.num_values
        step = max(1, _MAX_WORK_ENTRIES // (n * q * q))
        parts = [
            self._belief_propagation(values[s : s + step], mask[s : s + step])
            for s in range(0, values.shape[0], step)
        ]
        if not parts:
            return torch.empty(0, n, q, dtype=torch.float64, device=values.device)
        out = torch.cat(parts, 0)
        return point_mass(out, mask, values)

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        return self._marked_queries(values, mask, targets, nested=False)

    # -- chain queries ------------------------------------------------------------------------
    def _log_marginals_chain(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor
    ) -> torch.Tensor:
        return self._marked_queries(values, mask, chain, nested=True)

    def _log_marginals_chain_then(
        self, values: torch.Tensor, mask: torch.Tensor, chain: torch.Tensor, then: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._hard:  # by events, see _chain_events
            return self._marked_queries(values, mask, chain, nested=True, then=then)
        return (
            self._marked_queries(values, mask, chain, nested=True),
            self._marked_queries(values, pinned_with_chain(mask, chain), then, nested=False),
        )

    def _marked_queries(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        chain: torch.Tensor,
        nested: bool,
        then: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Chain queries (``nested``) or targeted rows, over the marked nodes only.

        ``nested``: row ``j`` of chain ``c`` pins ``mask[c]`` and ``chain[c, :j]`` and reads
        ``chain[c, j]``. Otherwise chain ``c`` is one row pinning ``mask[c]`` that reads every
        ``chain[c, j]``: the full upward pass is shared and the downward pass visits only the
        targets and their ancestors (a row with ``T`` targets costs ``O(N q^2 + A q^2)``
        against ``2 N q^2`` for belief propagation over the whole forest). ``then`` [C, T]
        (nested, models without ``-inf`` potentials): also the row after the whole chain,
        reading ``then[c]``; the answers are then ``(out [C, L, q], after [C, T, q])``.
        """
        num_chains, length = chain.shape
        n, q = self.num_coords, self.num_values
        device = values.device
        inert = mask.gather(1, chain)  # point masses
        if nested:
            inert |= chain_repeats(chain)
        out = point_mass(
            torch.zeros(num_chains, length, q, dtype=torch.float64, device=device),
            inert,
            values.gather(1, chain),
        )
        after = None
        if then is not None:
            done = pinned_with_chain(mask, chain).gather(1, then)
            after = point_mass(
                torch.zeros(num_chains, then.shape[1], q, dtype=torch.float64, device=device),
                done,
                values.gather(1, then),
            )
        # rows each chain needs: up to its last non-inert step (not nested: all, read at once)
        if not nested:
            needed = length * (~inert).any(1)
        elif length:
            steps = torch.arange(length, device=device)
            needed = torch.where(inert, 0, steps + 1).amax(1)
        else:
            needed = inert.sum(1)
        busy = needed > 0
        if then is not None:
            busy |= ~done.all(1)
        live = busy.nonzero().flatten()
        if not len(live):
            return out if then is None else (out, after)
        # positions (nodes renumbered by depth)
        mask_p = mask.index_select(0, live).index_select(1, self._order)
        chain_p = self._position[chain.index_select(0, live)]
        read_p = chain_p
        if then is not None:
            then_p = self._position[then.index_select(0, live)]
            read_p = torch.cat([chain_p, then_p], 1)
        marks = self._ancestor_marks(mask_p, read_p)  # [C, n]
        sizes = marks.sum(1)
        order = torch.argsort(sizes, stable=True)
        size_list = sizes[order].tolist()
        needed_list = needed[live][order].tolist()
        events = not self._hard  # see _chain_events
        depth = len(self._levels)
        then_width = 0 if then is None else then.shape[1]
        start = 0
        while start < len(live):  # chunks of chains of similar sizes
            stop, longest = start, 0
            while stop < len(live):
                longest = max(longest, needed_list[stop])
                if events:  # versions and downward visits
                    reads = (2 if nested else 1) * longest
                    work = size_list[stop] + (reads + then_width) * depth
                else:  # (row, marked node) pairs
                    work = (longest if nested else 1) * (size_list[stop] + 1)
                entries = n * q * (q + 4) + work * q * (q + 8)
                if stop > start and (stop + 1 - start) * entries > _MAX_WORK_ENTRIES:
                    break
                stop += 1
            rows = order[start:stop]
            longest = max(needed_list[start:stop])
            chunk = (
                values.index_select(0, live[rows]).index_select(1, self._order),
                mask_p.index_select(0, rows),
                chain_p.index_select(0, rows)[:, :longest],
                marks.index_select(0, rows),
            )
            if events:
                extra = None if then is None else then_p.index_select(0, rows)
                answer, tail = self._chain_events(*chunk, nested, extra)
                if tail is not None:
                    after[live[rows]] = tail
            else:
                answer = self._chain_chunk(*chunk, nested)
            out[live[rows], :longest] = answer
            start = stop
        return out if then is None else (out, after)

    def _ancestor_marks(self, mask_p: torch.Tensor, chain_p: torch.Tensor) -> torch.Tensor:
        """BoolTensor[C, n] (positions): the chain nodes and their ancestors, up to the first
        node pinned by the prefix or a root (a pinned node cuts the tree: nothing above it
        changes what the chain pins below it do)."""
        num_chains, n = mask_p.shape
        marks = torch.zeros(num_chains, n + 1, dtype=torch.bool, device=mask_p.device)
        current = chain_p
        active = torch.ones_like(chain_p, dtype=torch.bool)
        for _ in range(len(self._levels)):
            marks.scatter_(1, torch.where(active, current, n), True)
            parent = self._parent_position[current]
            active = active & (parent >= 0) & ~mask_p.gather(1, current)
            if not bool(active.any()):
                break
            current = parent.clamp(min=0)
        return marks[:, :n]

    def _prefix_pass(
        self, values_p: torch.Tensor, mask_p: torch.Tensor, marks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The upward pass of each chain's prefix, in which marked nodes with a marked parent
        send nothing (they are recomputed per row).

        Returns
        -------
        phi : DoubleTensor[C, n, q]
            Fields with the prefix's pins (``-inf`` off a pinned value).
        static : DoubleTensor[C, n, q]
            Sum of the finite messages of each node's children that send here (at a marked
            node: its unmarked children).
        zeros : DoubleTensor[C, n, q] or None
            Count of the ``-inf`` ones (None for models without ``-inf`` potentials).
        linked : BoolTensor[C, n]
            Whether a node's parent is marked.
        """
        num_chains, n = mask_p.shape
        starts = self._level_starts
        psi = self._psi_position
        parent_p = self._parent_position
        inf = float("-inf")
        arange_q = torch.arange(self.num_values, device=values_p.device)
        fields_p = self.fields.index_select(0, self._order)
        clash = mask_p.unsqueeze(-1) & (values_p.unsqueeze(-1) != arange_q)
        phi = fields_p + torch.where(clash, inf, 0.0)  # [C, n, q]
        # -inf messages (only with -inf potentials) are counted apart, see the class notes
        hard = self._hard
        finite_in = torch.zeros_like(phi)
        zeros_in = torch.zeros_like(phi) if hard else None
        linked = (parent_p >= 0) & marks.gather(1, parent_p.clamp(min=0).expand(num_chains, n))
        quiet = ~(marks & linked)  # what sends here: all but the marked nodes' marked children
        for d in range(len(self._levels) - 1, 0, -1):
            level = slice(starts[d], starts[d + 1])
            belief = phi[:, level] + finite_in[:, level]
            if hard:
                belief = torch.where(zeros_in[:, level] > 0, inf, belief)
                message = log_normalize_safe(_send(belief, psi[level], upward=True))
            else:  # finite: normalise without the checks
                message = _send(belief, psi[level], upward=True)
                message = message - message.amax(-1, keepdim=True)
            sends = quiet[:, level].unsqueeze(-1)
            parents = parent_p[level]
            if hard:
                finite = torch.isfinite(message)
                zeros_in.index_add_(1, parents, (~finite & sends).double())
                sends = finite & sends
            finite_in.index_add_(1, parents, torch.where(sends, message, 0.0))
        return phi, finite_in, zeros_in, linked

    def _chain_events(
        self,
        values_p: torch.Tensor,
        mask_p: torch.Tensor,
        chain_p: torch.Tensor,
        marks: torch.Tensor,
        nested: bool = True,
        then_p: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Chain answers [C, L, q] of one chunk of chains by *events*, for models without
        ``-inf`` potentials (every message finite); everything in positions. Not ``nested``:
        one row per chain, with the prefix's pins only, that reads every chain node (no
        events; only the downward paths). ``then_p`` [C, T] (nested only): one more row per
        chain, after the whole chain, that reads these nodes; its answers [C, T, q] are
        returned second (None without ``then_p``).

        Row ``j`` differs from row ``j - 1`` by one pin, ``chain[j - 1]``. So the upward
        message of a marked node changes only at the steps that pin a node of its subtree:
        an *event* of the node. Its *versions* (version 0, the prefix alone, then one per
        event) hold its incoming messages and its upward message; a row reads, at every node,
        the last version before it. Incoming messages are updated by differences: an event
        of a node is an event of exactly one child (or its own pin), whose message changed
        from its previous version to the new one. The downward pass runs only where a row
        reads it, along the path from the row's target to its highest marked ancestor.
        With ``A`` marked nodes and paths of ``h`` marked nodes, a chain costs
        ``O(N q^2 + (A + L h) q^2)`` against ``O(N q^2 + L A q^2)`` for the dense pass of
        :meth:`_chain_chunk` (which models with ``-inf`` potentials take).
        """
        num_chains, n = mask_p.shape
        length = chain_p.shape[1]
        q = self.num_values
        device = values_p.device
        arange_q = torch.arange(q, device=device)
        psi = self._psi_position
        parent_p = self._parent_position
        phi, static, _, linked = self._prefix_pass(values_p, mask_p, marks)
        steps = torch.arange(length, device=device)
        # rank[c, v]: the first step that pins node v (`length`: none)
        rank = torch.full((num_chains, n), length, dtype=torch.long, device=device)
        new = ~mask_p.gather(1, chain_p)  # the rows that need a belief
        if nested:  # a chain node's first step
            rank.scatter_reduce_(1, chain_p, steps.expand(num_chains, length), reduce="amin")
            new &= rank.gather(1, chain_p) == steps
        climbs = marks & linked  # a marked node whose parent is marked: its changes go up
        row_c, row_j = new.nonzero(as_tuple=True)
        row_v = chain_p[row_c, row_j]
        # events: the walk from every newly pinned node up its marked ancestors, and the
        # walk of every row from its target up (the nodes whose downward messages it needs)
        none = row_c[:0]
        ev_c, ev_v, ev_t, ev_child, _ = _climb(
            climbs, parent_p, *((row_c, row_v, row_j) if nested else (none, none, none))
        )
        starts = (row_c, row_v, row_j)
        if then_p is not None:  # the row after the chain: its targets not pinned by then
            done = mask_p.gather(1, then_p) | (rank.gather(1, then_p) < length)
            then_c, then_k = (~done).nonzero(as_tuple=True)
            then_v = then_p[then_c, then_k]
            starts = tuple(torch.cat(x) for x in zip(starts, (then_c, then_v, then_k * 0 + length)))
        path_c, path_v, path_j, path_parent, path_levels = _climb(
            climbs, parent_p, *starts, upward=False
        )
        # versions: every event, and version 0 (step -1) of every marked node, sorted by
        # (node, chain, step) so that a level is a slice and a node's versions are consecutive
        v0_c, v0_v = marks.nonzero(as_tuple=True)
        c = torch.cat([ev_c, v0_c])
        v = torch.cat([ev_v, v0_v])
        t = torch.cat([ev_t, torch.full_like(v0_c, -1)])
        span = length + 2

        def key(node, chain, step):
            return (node * num_chains + chain) * span + step + 1

        keys, perm = torch.sort(key(v, c, t))
        c, v, t = c.index_select(0, perm), v.index_select(0, perm), t.index_select(0, perm)
        where = torch.empty_like(perm)
        where[perm] = torch.arange(perm.numel(), device=device)
        child = torch.cat([ev_child, torch.full_like(v0_c, -1)]).index_select(0, perm)
        child = torch.where(child >= 0, where.index_select(0, child.clamp(min=0)), -1)
        first = torch.searchsorted(keys, key(v, c, -1))  # each version's version 0
        parent_first = torch.searchsorted(keys, key(parent_p[v].clamp(min=0), c, -1))
        flat = c * n + v  # (chain, node) in [C n]
        sends_first = (t < 0) & climbs.view(-1).index_select(0, flat)
        value = values_p.reshape(-1).index_select(0, flat)
        pinned = (rank.view(-1).index_select(0, flat) <= t).unsqueeze(-1) & (
            value.unsqueeze(-1) != arange_q
        )
        phi_v = phi.view(-1, q).index_select(0, flat) + torch.where(pinned, float("-inf"), 0.0)
        incoming = static.view(-1, q).index_select(0, flat)  # completed level by level
        psi_v = psi.index_select(0, v)
        up = torch.zeros_like(incoming)
        level_keys = key(torch.tensor(self._level_starts, device=device), 0, -1)
        bounds = torch.searchsorted(keys, level_keys).tolist()
        for d in range(len(bounds) - 2, -1, -1):  # deepest first
            lo, hi = bounds[d], bounds[d + 1]
            if lo == hi:
                continue
            below = child[lo:hi]
            has = below >= 0
            # an event's previous version is the entry before it; entries without a child
            # read entry 0 (ignored), which exists even when it is the only one
            below = torch.where(has, below, 0)
            delta = up.index_select(0, below) - up.index_select(0, (below - 1).clamp(min=0))
            running = torch.where(has.unsqueeze(-1), delta, 0.0).cumsum(0)
            head = first[lo:hi]
            incoming[lo:hi] = (
                incoming.index_select(0, head) + running - running.index_select(0, head - lo)
            )
            message = _send(phi_v[lo:hi] + incoming[lo:hi], psi_v[lo:hi], upward=True)
            up[lo:hi] = message - message.amax(-1, keepdim=True)  # finite: no -inf potentials
            go = sends_first[lo:hi].nonzero().flatten()
            incoming.index_add_(0, parent_first[lo:hi][go], up[lo:hi].index_select(0, go))
        # downward, from the highest marked ancestors (message 1) to the targets
        at = torch.searchsorted(keys, key(path_v, path_c, path_j)) - 1  # version read by row j
        down = torch.zeros(path_v.numel(), q, dtype=torch.float64, device=device)
        psi_path = psi.index_select(0, path_v)
        for lo, hi in reversed(path_levels):
            above = path_parent[lo:hi]
            go = (above >= 0).nonzero().flatten()
            if not go.numel():
                continue
            above, here = above.index_select(0, go), at[lo:hi].index_select(0, go)
            there = at.index_select(0, above)
            partial = (
                phi_v.index_select(0, there)
                + down.index_select(0, above)
                + incoming.index_select(0, there)
                - up.index_select(0, here)
            )
            message = _send(partial, psi_path[lo:hi].index_select(0, go), upward=False)
            down[lo + go] = message - message.amax(-1, keepdim=True)
        reads = starts[0].numel()  # the walks start with the targets
        target = at[:reads]
        belief = phi_v.index_select(0, target) + incoming.index_select(0, target) + down[:reads]
        belief = log_normalize(belief)
        rows = row_c.numel()
        out = torch.zeros(num_chains, length, q, dtype=torch.float64, device=device)
        out[row_c, row_j] = belief[:rows]
        pinned = mask_p.gather(1, chain_p) | (rank.gather(1, chain_p) < steps)
        out = point_mass(out, pinned, values_p.gather(1, chain_p))
        if then_p is None:
            return out, None
        after = torch.zeros(num_chains, then_p.shape[1], q, dtype=torch.float64, device=device)
        after[then_c, then_k] = belief[rows:]
        return out, point_mass(after, done, values_p.gather(1, then_p))

    def _chain_chunk(
        self,
        values_p: torch.Tensor,
        mask_p: torch.Tensor,
        chain_p: torch.Tensor,
        marks: torch.Tensor,
        nested: bool = True,
    ) -> torch.Tensor:
        """Chain answers [C, L, q] of one chunk of chains, everything in positions.

        1. One upward pass per chain with the prefix's pins, in which the marked nodes (the
           chain nodes and their ancestors) send nothing to a marked parent: it leaves, at
           every marked node, the sum of the messages of its unmarked children ("static").
        2. Per row ``j`` (pins: the prefix and ``chain[:j]``), an upward then a downward pass
           over the marked nodes only, level by level, with the static sums. The marked nodes
           of a level are a slice of "slots" (as many as the chain with the most of them
           there), so that a level reads slices; only parents are gathered.
        A marked node whose parent is unmarked is a root or pinned by the prefix: its
        downward message is 1 (exact for a root; a pinned node's messages to its children
        depend only on its value). Not ``nested``: one row per chain, with the prefix's pins
        only, that reads every chain node.
        """
        num_chains, n = mask_p.shape
        length = chain_p.shape[1]
        rows = length if nested else 1  # rows per chain
        q = self.num_values
        device = values_p.device
        inf = float("-inf")
        arange_q = torch.arange(q, device=device)
        starts = self._level_starts
        psi = self._psi_position
        parent_p = self._parent_position
        hard = self._hard
        # 1. the prefix's upward pass
        phi, finite_in, zeros_in, linked = self._prefix_pass(values_p, mask_p, marks)
        # 2. slots: level d holds slots offset[d] .. offset[d] + width[d]; slot `size` is a
        # dummy (padding, and the parent of nodes without a marked parent)
        count = marks.long().cumsum(1)
        before = torch.cat([torch.zeros(num_chains, 1, dtype=torch.long, device=device), count], 1)
        bounds = torch.tensor(starts, device=device)
        level_lo = before.index_select(1, bounds[:-1])  # [C, levels]: marked before level d
        widths = (before.index_select(1, bounds[1:]) - level_lo).amax(0)
        offsets = widths.cumsum(0) - widths
        size = int(widths.sum())
        width_list, offset_list = widths.tolist(), offsets.tolist()
        depth = self._depth_position  # [n]
        slot_of = offsets[depth] + (count - 1) - level_lo.gather(1, depth.expand(num_chains, n))
        slot_of = torch.where(marks, slot_of, size)  # [C, n]
        nodes = torch.full((num_chains, size + 1), n, dtype=torch.long, device=device)
        nodes.scatter_(1, slot_of, torch.arange(n, device=device).expand(num_chains, n))
        nodes[:, size] = n
        real = nodes < n
        node_c = nodes.clamp(max=n - 1)
        parent_of = parent_p[node_c]
        has_parent = real & (parent_of >= 0) & marks.gather(1, parent_of.clamp(min=0))
        parent_slot = torch.where(has_parent, slot_of.gather(1, parent_of.clamp(min=0)), size)
        index_q = node_c.unsqueeze(-1).expand(-1, -1, q)
        keep = real.unsqueeze(-1)
        # per-row state is [C, s + 1, rows, q], flattened to [C (s + 1), rows, q] so that the
        # messages of a level go to their parents by one index_add_ over whole [rows, q] blocks
        slots_total = size + 1
        first_slot = slots_total * torch.arange(num_chains, device=device).unsqueeze(1)
        flat_parent = parent_slot + first_slot
        static_finite = torch.where(keep, finite_in.gather(1, index_q), 0.0).unsqueeze(2)
        node_phi = torch.where(keep, phi.gather(1, index_q), 0.0)
        node_psi = psi[node_c].unsqueeze(2)  # [C, s + 1, 1, q, q]
        chain_slot = slot_of.gather(1, chain_p)  # [C, L]
        steps = torch.arange(rows, device=device)
        # rank[c, s]: the first row that pins slot s (`rows`: none)
        rank = torch.full((num_chains, slots_total), rows, dtype=torch.long, device=device)
        if nested:
            rank.scatter_reduce_(1, chain_slot, steps.expand(num_chains, length), reduce="amin")
            rank[:, size] = length
        # phi of every row, with the chain pins of that row
        pinned_at = rank.unsqueeze(2) < steps  # [C, s + 1, rows]
        clash = values_p.gather(1, node_c).unsqueeze(-1) != arange_q  # [C, s + 1, q]
        total = node_phi.unsqueeze(2) + torch.where(
            pinned_at.unsqueeze(-1) & clash.unsqueeze(2), inf, 0.0
        )
        total += static_finite  # [C, s + 1, rows, q]
        shape = (num_chains * slots_total, rows, q)
        dynamic = torch.zeros(shape, dtype=torch.float64, device=device)
        up = torch.zeros(num_chains, slots_total, rows, q, dtype=torch.float64, device=device)
        if hard:  # counts of -inf incoming messages, static and per row
            static_zeros = torch.where(keep, zeros_in.gather(1, index_q), 0.0).unsqueeze(2)
            zeros = torch.zeros(shape, dtype=torch.float64, device=device)
        levels = [d for d in range(len(width_list)) if width_list[d] > 0]
        view = (num_chains, slots_total, rows, q)
        for d in reversed(levels[1:] if levels and levels[0] == 0 else levels):
            slots = slice(offset_list[d], offset_list[d] + width_list[d])
            incoming = dynamic.view(view)[:, slots]
            if hard:
                blocked = static_zeros[:, slots] + zeros.view(view)[:, slots]
                incoming = torch.where(blocked > 0.5, inf, incoming)
            message = log_normalize_safe(
                _send(total[:, slots] + incoming, node_psi[:, slots], upward=True)
            )
            up[:, slots] = message
            index = flat_parent[:, slots].reshape(-1)
            if hard:
                finite = torch.isfinite(message)
                zeros.index_add_(0, index, (~finite).double().view(-1, rows, q))
                message = torch.where(finite, message, 0.0)
            dynamic.index_add_(0, index, message.view(-1, rows, q))
        # downward: `total` = phi + down + the finite incoming upward messages (`zeros`: the
        # count of -inf ones); a child's message excludes its own upward message
        total += dynamic.view(view)
        del dynamic
        flat_total = total.view(shape)
        if hard:
            zeros = zeros.view(view)
            zeros += static_zeros
            flat_zeros = zeros.view(shape)
        for d in levels:
            if d == 0:
                continue
            slots = slice(offset_list[d], offset_list[d] + width_list[d])
            index = flat_parent[:, slots].reshape(-1)
            width = width_list[d]
            own = up[:, slots]
            parent_total = flat_total.index_select(0, index).view(num_chains, width, rows, q)
            if hard:
                own_finite = torch.isfinite(own)
                excluded = (
                    flat_zeros.index_select(0, index).view(own.shape) - (~own_finite).double()
                )
                partial = parent_total - torch.where(own_finite, own, 0.0)
                partial = torch.where(excluded > 0.5, inf, partial)
            else:
                partial = parent_total - own
            message = log_normalize_safe(_send(partial, node_psi[:, slots], upward=False))
            linked_slots = (parent_slot[:, slots] != size).view(num_chains, -1, 1, 1)
            total[:, slots] += torch.where(linked_slots, message, 0.0)
        # beliefs of the targets: row j reads the slot of chain[j] (not nested: the one row
        # reads them all)
        read = (chain_slot + first_slot) * rows + (steps if nested else 0)  # [C, L]
        belief = total.view(-1, q).index_select(0, read.view(-1))
        if hard:
            blocked = zeros.view(-1, q).index_select(0, read.view(-1))
            belief = torch.where(blocked > 0.5, inf, belief)
        out = log_normalize(belief.view(num_chains, length, q))
        pinned = mask_p.gather(1, chain_p)
        if nested:
            pinned |= rank.gather(1, chain_slot) < steps
        return point_mass(out, pinned, values_p.gather(1, chain_p))


def _climb(
    climbs: torch.Tensor,
    parent: torch.Tensor,
    chain: torch.Tensor,
    node: torch.Tensor,
    step: torch.Tensor,
    upward: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Walks from ``node`` up to the parents while ``climbs[chain, node]``, flattened.

    Parameters
    ----------
    climbs : BoolTensor[C, n]
    parent : LongTensor[n]
    chain, node, step : LongTensor[K]
        Where the walks start (their chain and step ride along).
    upward : bool
        Which neighbour each visit links to.

    Returns
    -------
    chain, node, step : LongTensor[P]
        Every visit: the walks' first visits (in the order of ``node``), then their second
        ones, and so on.
    link : LongTensor[P]
        ``upward``: the visit below (``-1`` at a walk's start); else the visit above (``-1``
        at a walk's end).
    levels : list of (int, int)
        The index range of the ``k``-th visits, for every ``k``.
    """
    parts, links, levels = [], [], []
    below = torch.full_like(node, -1)
    count = 0
    while node.numel():
        size = node.numel()
        go = climbs.view(-1).index_select(0, chain * climbs.shape[1] + node).nonzero().flatten()
        above = torch.full_like(node, -1)
        above[go] = count + size + torch.arange(go.numel(), device=node.device)
        parts.append((chain, node, step))
        links.append(below if upward else above)
        levels.append((count, count + size))
        below = count + go
        count += size
        chain, node, step = chain[go], parent[node[go]], step[go]
    if not parts:
        return node, node, node, node, levels
    chain, node, step = (torch.cat(x) for x in zip(*parts))
    return chain, node, step, torch.cat(links), levels


def _send(belief: torch.Tensor, psi: torch.Tensor, upward: bool) -> torch.Tensor:
    """A message: ``logsumexp_a(belief[..., a] + psi[..., a, b])`` over ``b`` (``upward``, psi
    indexed (child, parent)) or ``logsumexp_b(belief[..., b] + psi[..., a, b])`` over ``a``.

    For small ``q`` a fold of ``torch.logaddexp`` over the summed value on ``[..., q]`` slices:
    one fused kernel per term (exact with ``-inf``), without reductions over a tiny dimension.
    """
    q = belief.shape[-1]
    if q > 8:
        if upward:
            return logsumexp(belief.unsqueeze(-1) + psi, dim=-2)
        return logsumexp(belief.unsqueeze(-2) + psi, dim=-1)
    if upward:
        terms = [belief[..., a : a + 1] + psi[..., a, :] for a in range(q)]
    else:
        terms = [belief[..., b : b + 1] + psi[..., :, b] for b in range(q)]
    total = terms[0]
    for term in terms[1:]:
        total = torch.logaddexp(total, term)
    return total


def log_normalize_safe(message: torch.Tensor) -> torch.Tensor:
    """Shift a log message so that its largest entry is 0 (all ``-inf`` stays ``-inf``)."""
    top = message.amax(-1, keepdim=True)
    return message - torch.where(torch.isfinite(top), top, 0.0)
