"""The bodies of :class:`~pyro_autospec.guides.AnyOrderGuide`: any-order networks ``q(x_i | x_S)``.

Every body maps a batch of queries ``(values, mask)`` and a *context* (what the guide knows of
the data set: the potentials of :mod:`pyro_autospec.guides.structure`) to logits of every
coordinate, ``[B, n, q]``. The output never depends on ``values`` where ``mask`` is False.

* :class:`GraphNet` (``"graph"``): loopy belief propagation on the model's own pairwise
  expansion (the factor graph read from the model), followed by a learned message-passing
  correction on the same graph (neural enhanced belief propagation [1]_). Untrained, it *is*
  belief propagation; its weights are shared by all coordinates, so one guide serves any data
  set of the model (amortised through the potentials).
* :class:`ResidualMLP` (``"mlp"``): the order-agnostic NADE of Uria, Murray and
  Larochelle [2]_ with the unary potentials as extra inputs. Answers a chain query in one pass
  (its first layer is linear in the pinned values, so the ``L`` nested prefixes of a chain are
  a cumulative sum).
* :class:`MaskedTransformer` (``"transformer"``): one token per coordinate (value embedding or
  a ``MASK`` token, plus a position embedding and the unary potentials), a bidirectional
  encoder.

References
----------
.. [1] V. Garcia Satorras, M. Welling. Neural Enhanced Belief Propagation on Factor Graphs.
   AISTATS 2021.
.. [2] B. Uria, I. Murray, H. Larochelle. A Deep and Tractable Density Estimator. ICML 2014.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

__all__ = ["GraphNet", "GuideContext", "MaskedTransformer", "ResidualMLP", "unary_features"]

#: Log potentials are clipped to this range before they enter a network as features.
_FEATURE_CLIP = 20.0
#: Numbers each edge carries per round of the graph network's learned message passing.
_MESSAGE_CHANNELS = 4


@dataclass
class GuideContext:
    """What a guide knows of ``K`` data sets: their potentials.

    Attributes
    ----------
    unary : Tensor[K, n, q]
        Unary potentials (``-inf`` outside each coordinate's support).
    slots : Tensor[K, n, D, q, q] or None
        Pairwise potentials per neighbour slot (``"graph"`` only).
    """

    unary: torch.Tensor
    slots: torch.Tensor | None = None

    @property
    def num_sets(self) -> int:
        """``K``."""
        return int(self.unary.shape[0])

    def subset(self, index: torch.Tensor) -> GuideContext:
        """The data sets ``index`` (LongTensor[k]) as a context of ``k`` sets."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.unary.device)
        slots = None if self.slots is None else self.slots[index]
        return GuideContext(self.unary[index], slots)

    def rows(self, index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-row context for rows of data sets ``index`` (LongTensor[B]; ``None``: set 0,
        broadcast): ``unary`` [B|1, n, q], ``slots`` [B|1, n, D, q, q] or ``None``."""
        if index is None:
            if self.num_sets != 1:
                raise ValueError(f"a context of {self.num_sets} data sets needs a row index")
            return self.unary, self.slots
        return self.unary[index], None if self.slots is None else self.slots[index]


def unary_features(unary: torch.Tensor) -> torch.Tensor:
    """Unary potentials ``[..., n, q]`` -> bounded features: per-coordinate log-softmax, clipped.

    ``-inf`` (values outside a coordinate's support) becomes ``-20``.

    Examples
    --------
    >>> import torch
    >>> unary_features(torch.tensor([[[0.0, 0.0], [1.0, -float("inf")]]]))
    tensor([[[ -0.6931,  -0.6931],
             [  0.0000, -20.0000]]])
    """
    out = torch.log_softmax(unary.clamp_min(-1e4), dim=-1)
    return out.clamp(-_FEATURE_CLIP, 0.0)


class ResidualMLP(nn.Module):
    """Order-agnostic NADE: ``[one-hot pinned values, mask, unary features] -> logits [B, n, q]``.

    Parameters
    ----------
    n, q : int
        Coordinates and values.
    hidden_dim, num_layers : int
        Width and number of residual blocks.

    Examples
    --------
    >>> import torch
    >>> net = ResidualMLP(n=4, q=3, hidden_dim=16, num_layers=1)
    >>> values, mask = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool)
    >>> net(values, mask, torch.zeros(1, 4, 3)).shape
    torch.Size([2, 4, 3])
    >>> chain = torch.tensor([[2, 0, 1], [3, 1, 0]])  # pin chain[:j], then query chain[j]
    >>> net.forward_chain(values, mask, torch.zeros(1, 4, 3), chain).shape
    torch.Size([2, 3, 3])
    """

    def __init__(self, n: int, q: int, hidden_dim: int, num_layers: int):
        super().__init__()
        self.n, self.q = n, q
        self.inp = nn.Linear(n * (q + 1), hidden_dim)
        self.context = nn.Linear(n * q, hidden_dim, bias=False)
        nn.init.zeros_(self.context.weight)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim))
            for _ in range(num_layers)
        )
        self.out = nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, n * q))

    def _first(self, values: torch.Tensor, mask: torch.Tensor, unary: torch.Tensor):
        b = values.shape[0]
        dtype = self.inp.weight.dtype
        onehot = nn.functional.one_hot(values.clamp(0, self.q - 1), self.q).to(dtype)
        onehot = onehot * mask.unsqueeze(-1).to(dtype)
        h = self.inp(torch.cat([onehot.reshape(b, -1), mask.to(dtype)], dim=-1))
        return h + self.context(unary_features(unary).reshape(unary.shape[0], -1).to(dtype))

    def _body(self, h: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            h = h + block(h)
        return self.out[:-1](h)  # [B, h], before the last linear layer

    def forward(self, values, mask, unary):
        """``values`` LongTensor[B, n], ``mask`` BoolTensor[B, n], ``unary`` Tensor[B|1, n, q]."""
        h = self._body(self._first(values, mask, unary))
        return self.out[-1](h).reshape(values.shape[0], self.n, self.q)

    def _gathered_head(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        last = self.out[-1]
        weight = last.weight.reshape(self.n, self.q, -1)[targets]  # [B, k, q, h]
        bias = last.bias.reshape(self.n, self.q)[targets]  # [B, k, q]
        return torch.einsum("bh,bkqh->bkq", h, weight) + bias

    def forward_at(self, values, mask, unary, targets):
        """Logits of the ``targets`` [B, k] only: [B, k, q] (the last layer's rows of them)."""
        return self._gathered_head(self._body(self._first(values, mask, unary)), targets)

    def forward_chain(self, values, mask, unary, chain):
        """Chain query: ``out[c, j]`` = logits of ``chain[c, j]`` given the prefix and
        ``chain[c, :j]`` pinned: [C, L, q]. The first layer's input grows by one pinned
        coordinate per step, so its ``L`` outputs are one cumulative sum."""
        c, length = chain.shape
        dtype = self.inp.weight.dtype
        h0 = self._first(values, mask, unary)  # [C, h], the prefix alone
        n, q = self.n, self.q
        weight = self.inp.weight  # [h, n * (q + 1)]
        chain_values = values.gather(1, chain).clamp(0, q - 1)  # [C, L]
        value_cols = weight[:, chain * q + chain_values]  # [h, C, L]
        mask_cols = weight[:, n * q + chain]  # [h, C, L]
        step = (value_cols + mask_cols).permute(1, 2, 0).to(dtype)  # [C, L, h]
        # Row j pins chain[:j]: exclusive cumulative sum.
        added = torch.cumsum(step, dim=1) - step
        h = h0.unsqueeze(1) + added  # [C, L, h]
        body = self._body(h.reshape(c * length, -1))
        return self._gathered_head(body, chain.reshape(c * length, 1)).reshape(c, length, q)


class MaskedTransformer(nn.Module):
    """Masked transformer: one token per coordinate -> logits [B, n, q].

    Parameters
    ----------
    n, q : int
        Coordinates and values.
    hidden_dim, num_layers, num_heads : int
        Width, encoder layers and attention heads.

    Examples
    --------
    >>> import torch
    >>> net = MaskedTransformer(n=4, q=2, hidden_dim=8, num_layers=1, num_heads=2)
    >>> values, mask = torch.ones(3, 4, dtype=torch.long), torch.rand(3, 4) < 0.5
    >>> net(values, mask, torch.zeros(1, 4, 2)).shape
    torch.Size([3, 4, 2])
    """

    def __init__(self, n: int, q: int, hidden_dim: int, num_layers: int, num_heads: int):
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(
                f"hidden_dim ({hidden_dim}) must be a multiple of num_heads ({num_heads})"
            )
        self.n, self.q = n, q
        self.value_embedding = nn.Embedding(q + 1, hidden_dim)  # index q is the MASK token
        self.position_embedding = nn.Parameter(torch.randn(n, hidden_dim) * 0.1)
        self.context = nn.Linear(q, hidden_dim, bias=False)
        nn.init.zeros_(self.context.weight)
        layer = nn.TransformerEncoderLayer(
            hidden_dim,
            num_heads,
            dim_feedforward=2 * hidden_dim,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.LayerNorm(hidden_dim), nn.Linear(hidden_dim, q))

    def _encode(self, values, mask, unary):
        tokens = torch.where(mask, values.clamp(0, self.q - 1), torch.full_like(values, self.q))
        context = self.context(unary_features(unary).to(self.position_embedding.dtype))
        return self.encoder(self.value_embedding(tokens) + self.position_embedding + context)

    def forward(self, values, mask, unary):
        return self.out(self._encode(values, mask, unary))

    def forward_at(self, values, mask, unary, targets):
        """Logits of the ``targets`` [B, k] only: [B, k, q] (the head on those tokens)."""
        h = self._encode(values, mask, unary)
        picked = h.gather(1, targets.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        return self.out(picked)


class _Tables:
    """Neighbour tables of a graph: shared by all rows (``[N, D]``) or one per row (``[R, N, D]``).

    ``neighbours`` holds node indices, ``N`` (one past the last node) on padding slots;
    ``reverse[i, s]`` is the flat slot ``j * D + s'`` where ``i`` sits in the list of its
    ``s``-th neighbour ``j``.
    """

    def __init__(self, neighbours: torch.Tensor, valid: torch.Tensor, reverse: torch.Tensor):
        self.neighbours, self.valid, self.reverse = neighbours, valid, reverse
        self.per_row = neighbours.dim() == 3

    def nodes(self, x: torch.Tensor) -> torch.Tensor:
        """Per-node ``x[R, N, ...]`` -> per-slot ``[R, N, D, ...]`` (the neighbour's entry)."""
        pad = x.new_zeros((x.shape[0], 1) + x.shape[2:])
        ext = torch.cat([x, pad], dim=1)
        if not self.per_row:
            return ext[:, self.neighbours]
        r, num, d = self.neighbours.shape
        index = self.neighbours.reshape(r, num * d)
        index = index.reshape(index.shape + (1,) * (x.dim() - 2)).expand((r, num * d) + x.shape[2:])
        return ext.gather(1, index).reshape((r, num, d) + x.shape[2:])

    def reversed(self, m: torch.Tensor) -> torch.Tensor:
        """Per-slot ``m[R, N, D, ...]`` -> the message on each slot's reverse edge."""
        r, num, d = m.shape[:3]
        flat = m.reshape((r, num * d) + m.shape[3:])
        if not self.per_row:
            return flat[:, self.reverse]
        index = self.reverse.reshape(r, num * d)
        index = index.reshape(index.shape + (1,) * (m.dim() - 3)).expand(flat.shape)
        return flat.gather(1, index).reshape(m.shape)


class _Beliefs(NamedTuple):
    """What :class:`GraphNet`'s belief propagation gives its learned correction: two logits
    per node, ``[R, N, q]`` each (``[0, log-odds]`` when ``q = 2`` on the binary path).

    Attributes
    ----------
    field : Tensor[R, N, q]
        The unary potentials plus the terms of the pinned neighbours (no messages).
    belief : Tensor[R, N, q]
        The field plus the messages of the unpinned neighbours after the sweeps.
    """

    field: torch.Tensor
    belief: torch.Tensor


class GraphNet(nn.Module):
    """Belief propagation on the model's pairwise expansion plus a learned graph correction.

    The context of a data set is the pairwise expansion of its log joint (see
    :class:`~pyro_autospec.guides.structure.ModelStructure`):
    ``log p(x, data) = const + sum_i unary[i, x_i] + sum_{(i, j) in edges} pairwise[e, x_i, x_j]``
    (exact for models whose factors involve at most two coordinates).

    A query pins ``x_S``. The pinned neighbours of an unpinned coordinate ``i`` enter its field
    exactly, ``h_i = unary_i + sum_{j in S} pairwise_ij(., x_j)``; ``bp_iterations`` sweeps of
    loopy belief propagation (log domain, from uniform messages; log-odds when ``q = 2``) on
    the unpinned subgraph give beliefs ``b_i``. ``num_layers`` rounds of learned message
    passing over the same graph (edge features: the potentials and the pins; node features:
    beliefs, fields, the pin, and the histogram of all pinned values, which carries global
    quantities such as the magnetisation) add a correction to ``b_i``; its output layer
    starts at zero, so an untrained guide is belief propagation.

    Everything is local: a coordinate's output depends only on the nodes within
    ``bp_iterations + num_layers + 1`` hops (and the pinned histogram), so a query for a few
    targets (:meth:`forward_at`) runs on the balls around them instead of the whole graph.

    Parameters
    ----------
    n, q : int
        Coordinates and values.
    edges : LongTensor[E, 2]
        Interacting pairs ``(i, j)``, ``i < j``.
    hidden_dim, num_layers : int
        Width and rounds of the learned correction (``num_layers = 0``: belief propagation
        alone).
    bp_iterations : int
        Sweeps of belief propagation (``0``: pinned neighbours only).

    Examples
    --------
    Untrained, it is belief propagation: on a chain (a tree) its rows are the exact
    conditionals. A 3-site Ising chain, coupling 1, nothing pinned:

    >>> import torch
    >>> edges = torch.tensor([[0, 1], [1, 2]])
    >>> net = GraphNet(n=3, q=2, edges=edges, hidden_dim=8, num_layers=1, bp_iterations=3)
    >>> unary = torch.tensor([[[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]])  # evidence x_0 = 1
    >>> pairwise = torch.tensor([[1.0, -1.0], [-1.0, 1.0]]).expand(1, 2, 2, 2)
    >>> values, mask = torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.bool)
    >>> probs = net(values, mask, unary, net.slot_potentials(pairwise)).softmax(-1)
    >>> probs[0, :, 1]  # the exact P(x_i = 1): the evidence decays along the chain
    tensor([0.7311, 0.6760, 0.6340], grad_fn=<SelectBackward0>)
    """

    def __init__(
        self,
        n: int,
        q: int,
        edges: torch.Tensor,
        hidden_dim: int,
        num_layers: int,
        bp_iterations: int,
    ):
        super().__init__()
        self.n, self.q = n, q
        self.bp_iterations = int(bp_iterations)
        self.binary_fast_path = True  # q = 2: log-odds messages (False: the general path)
        edges = torch.as_tensor(edges, dtype=torch.long).reshape(-1, 2)
        num_edges = edges.shape[0]
        degree = torch.bincount(edges.reshape(-1), minlength=n)
        d = max(1, int(degree.max()) if num_edges else 1)
        neighbours = torch.full((n, d), n, dtype=torch.long)  # n: a padding node
        slot_of = torch.zeros(num_edges, 2, dtype=torch.long)  # slot of j in i's list, i in j's
        fill = [0] * n
        for e, (i, j) in enumerate(edges.tolist()):
            neighbours[i, fill[i]] = j
            slot_of[e, 0] = fill[i]
            fill[i] += 1
            neighbours[j, fill[j]] = i
            slot_of[e, 1] = fill[j]
            fill[j] += 1
        reverse = torch.zeros(n, d, dtype=torch.long)  # flat slot (j * d + s) of the reverse
        if num_edges:
            i, j = edges[:, 0], edges[:, 1]
            reverse[i, slot_of[:, 0]] = j * d + slot_of[:, 1]
            reverse[j, slot_of[:, 1]] = i * d + slot_of[:, 0]
        self.max_degree = d
        self.register_buffer("neighbours", neighbours, persistent=False)
        self.register_buffer("valid", neighbours < n, persistent=False)
        self.register_buffer("reverse", reverse, persistent=False)
        self.register_buffer("edge_slots", slot_of, persistent=False)
        self.register_buffer("edges", edges, persistent=False)
        self._balls: dict[tuple[int, bool], tuple[torch.Tensor, ...] | None] = {}
        #: "auto": ball queries when a ball is under 3/4 of the graph and the targets' balls are
        #: smaller than it; "always" / "never" force the choice (for tests and timing).
        self.ball_queries = "auto"
        self.num_layers = int(num_layers)
        # Learned message scales, one per sweep: 2 sigmoid(0) = 1 is plain belief propagation;
        # below 1 they temper the overcounting of evidence around loops (as fractional and
        # tree-reweighted belief propagation do with fixed weights).
        self.message_logit = nn.Parameter(torch.zeros(max(1, self.bp_iterations)))
        channels = _MESSAGE_CHANNELS
        self.inp = nn.Linear(4 * q + 2, hidden_dim)
        self.message = nn.ModuleList(nn.Linear(hidden_dim, channels) for _ in range(num_layers))
        self.update = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(hidden_dim + 3 * channels),
                nn.Linear(hidden_dim + 3 * channels, hidden_dim),
                nn.GELU(),
                nn.Linear(hidden_dim, hidden_dim),
            )
            for _ in range(num_layers)
        )
        self.head = nn.Sequential(
            nn.LayerNorm(hidden_dim), nn.Linear(hidden_dim, hidden_dim), nn.GELU()
        )
        self.out = nn.Linear(hidden_dim, q)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _scale(self, sweep: int) -> torch.Tensor:
        logit = self.message_logit[min(sweep, self.message_logit.shape[0] - 1)]
        return 2.0 * torch.sigmoid(logit)

    @property
    def radius(self) -> int:
        """Hops within which the inputs reach a coordinate's output."""
        return self.bp_iterations + self.num_layers + 1

    def slot_potentials(self, pairwise: torch.Tensor) -> torch.Tensor:
        """Edge potentials ``[K, E, q, q]`` -> per-slot ``[K, n, D, q, q]``: ``out[k, i, s, v, w]``
        couples ``x_i = v`` with ``x_{neighbours[i, s]} = w`` (zero on padding slots)."""
        k = pairwise.shape[0]
        out = pairwise.new_zeros(k, self.n, self.max_degree, self.q, self.q)
        if self.edges.shape[0]:
            i, j = self.edges[:, 0], self.edges[:, 1]
            out[:, i, self.edge_slots[:, 0]] = pairwise
            out[:, j, self.edge_slots[:, 1]] = pairwise.transpose(-1, -2)
        return out

    # ------------------------------------------------------------------------------ entry points
    def forward(self, values, mask, unary, slots):
        """``values`` [B, n], ``mask`` [B, n], ``unary`` [B|1, n, q], ``slots`` [B|1, n, D, q, q]
        -> logits [B, n, q]."""
        tables = _Tables(self.neighbours, self.valid, self.reverse)
        values = values.clamp(0, self.q - 1)
        return self._core(values, mask, unary, slots, tables, self._pinned_histogram(values, mask))

    def forward_at(self, values, mask, unary, slots, targets):
        """Logits of ``targets`` [B, k] only: [B, k, q]. On the ball around each target when
        that is smaller than the graph (same result as :meth:`forward`, up to rounding)."""
        b, k = targets.shape
        balls = None
        if self.ball_queries != "never":
            balls = self._ball_tables(self.radius, force=self.ball_queries == "always")
        if balls is None or (self.ball_queries == "auto" and k * balls[0].shape[1] >= self.n):
            logits = self.forward(values, mask, unary, slots)
            return logits.gather(1, targets.unsqueeze(-1).expand(-1, -1, self.q))
        nodes, neighbours, reverse = balls
        values = values.clamp(0, self.q - 1)
        histogram = self._pinned_histogram(values, mask).repeat_interleave(k, 0)
        centres = targets.reshape(-1)
        rows = torch.arange(b, device=values.device).repeat_interleave(k)
        ball = nodes[centres]  # [R, M], padded with n
        size = ball.shape[1]
        pad = torch.zeros(b, 1, dtype=values.dtype, device=values.device)
        local_values = torch.cat([values, pad], 1)[rows[:, None], ball]
        local_mask = torch.cat([mask, pad.bool()], 1)[rows[:, None], ball]
        unary_ext = torch.cat([unary, unary.new_zeros(unary.shape[0], 1, self.q)], 1)
        slots_ext = torch.cat([slots, slots.new_zeros((slots.shape[0], 1) + slots.shape[2:])], 1)
        if unary.shape[0] == 1:
            local_unary, local_slots = unary_ext[0][ball], slots_ext[0][ball]
        else:
            local_unary = unary_ext[rows[:, None], ball]
            local_slots = slots_ext[rows[:, None], ball]
        local_neighbours = neighbours[centres]  # [R, M, D], local indices, M on padding
        tables = _Tables(local_neighbours, local_neighbours < size, reverse[centres])
        logits = self._core(
            local_values, local_mask, local_unary, local_slots, tables, histogram, centre_only=True
        )
        return logits.reshape(b, k, self.q)  # the centre is the first node of its ball

    # ------------------------------------------------------------------------------ internals
    def _ball_tables(self, radius: int, force: bool = False):
        """Balls of ``radius`` hops around every node, with local neighbour tables; ``None``
        when a ball covers more than 3/4 of the graph (then local queries do not pay) unless
        ``force``."""
        key = (radius, force)
        if key in self._balls:
            return self._balls[key]
        n, d = self.n, self.max_degree
        adjacency = [[j for j in row if j < n] for row in self.neighbours.tolist()]
        balls = []
        for centre in range(n):
            seen = {centre: 0}
            frontier = [centre]
            order = [centre]
            for _ in range(radius):
                nxt = []
                for i in frontier:
                    for j in adjacency[i]:
                        if j not in seen:
                            seen[j] = len(order)
                            order.append(j)
                            nxt.append(j)
                frontier = nxt
            balls.append(order)
            if 4 * len(order) > 3 * n and not force:
                self._balls[key] = None
                return None
        size = max(len(b) for b in balls)
        device = self.neighbours.device
        nodes = torch.full((n, size), n, dtype=torch.long)
        local = torch.full((n, size, d), size, dtype=torch.long)
        reverse = torch.zeros(n, size, d, dtype=torch.long)
        global_neighbours = self.neighbours.tolist()
        for centre, order in enumerate(balls):
            where = {node: m for m, node in enumerate(order)}
            nodes[centre, : len(order)] = torch.tensor(order)
            for m, node in enumerate(order):
                for s, j in enumerate(global_neighbours[node]):
                    if j < n and j in where:
                        local[centre, m, s] = where[j]
                        back = global_neighbours[j].index(node)
                        reverse[centre, m, s] = where[j] * d + back
        tables = (nodes.to(device), local.to(device), reverse.to(device))
        self._balls[key] = tables
        return tables

    def _pinned_histogram(self, values, mask) -> torch.Tensor:
        """[B, q + 1]: the fraction of coordinates pinned, and of the pinned ones, each value."""
        dtype = torch.get_default_dtype()
        pinned = mask.to(dtype)
        count = pinned.sum(1, keepdim=True)
        onehot = nn.functional.one_hot(values, self.q).to(dtype) * pinned.unsqueeze(-1)
        histogram = onehot.sum(1) / count.clamp_min(1.0)
        return torch.cat([count / self.n, histogram], dim=-1)

    def _core(self, values, mask, unary, slots, tables, histogram, centre_only=False):
        b = values.shape[0]
        nb_values = tables.nodes(values.unsqueeze(-1)).squeeze(-1)  # [R, N, D]
        nb_pinned = tables.nodes(mask.unsqueeze(-1)).squeeze(-1) & tables.valid
        live = tables.valid & ~nb_pinned & ~mask.unsqueeze(-1)  # messages between unpinned nodes
        if self.q == 2 and self.binary_fast_path:
            beliefs = self._binary_bp(unary, slots, nb_values, nb_pinned, live, tables, b)
        else:
            beliefs = self._bp(unary, slots, nb_values, nb_pinned, live, tables, b)
        correction = self._correction(
            values, mask, beliefs, slots, live, tables, histogram, centre_only
        )
        if centre_only:
            return beliefs.belief[:, :1] + correction
        return beliefs.belief + correction

    def _bp(self, unary, slots, nb_values, nb_pinned, live, tables, b) -> _Beliefs:
        """Log-domain loopy belief propagation: (field, belief), each [R, N, q]."""
        q = self.q
        num, d = nb_values.shape[1], nb_values.shape[2]
        dtype = unary.dtype
        slots = slots.expand(b, -1, -1, -1, -1)
        pinned_term = slots.gather(-1, nb_values[..., None, None].expand(-1, -1, -1, q, 1))
        pinned_term = pinned_term.squeeze(-1) * nb_pinned.unsqueeze(-1).to(dtype)  # [R, N, D, q]
        field = unary.clamp_min(-1e4) + pinned_term.sum(2)  # [R, N, q]
        live_f = live.unsqueeze(-1).to(dtype)
        messages = field.new_zeros(b, num, d, q)
        for sweep in range(self.bp_iterations):
            total = field + messages.sum(2)  # [R, N, q]
            cavity = tables.nodes(total) - tables.reversed(messages)  # over the neighbour's value
            new = torch.logsumexp(slots + cavity.unsqueeze(-2), dim=-1)  # [R, N, D, q]
            new = new - torch.logsumexp(new, dim=-1, keepdim=True)
            messages = new * live_f * self._scale(sweep)
        return _Beliefs(field, field + messages.sum(2))

    def _binary_bp(self, unary, slots, nb_values, nb_pinned, live, tables, b) -> _Beliefs:
        """:meth:`_bp` for ``q = 2`` in log-odds (one number per message): the same beliefs,
        returned as logits ``[0, log-odds]``."""
        num, d = nb_values.shape[1], nb_values.shape[2]
        dtype = unary.dtype
        p00, p01 = slots[..., 0, 0], slots[..., 0, 1]
        p10, p11 = slots[..., 1, 0], slots[..., 1, 1]
        # A pinned neighbour with value w adds p1w - p0w to the log-odds.
        shift0, shift1 = p10 - p00, p11 - p01  # [K, N, D]
        w = nb_values.to(dtype)
        pinned = nb_pinned.to(dtype)
        unary = unary.clamp_min(-1e4)
        field = (unary[..., 1] - unary[..., 0]) + (pinned * (shift0 + w * (shift1 - shift0))).sum(2)
        # A message from an unpinned neighbour with cavity log-odds l:
        # log(e^p10 + e^(p11 + l)) - log(e^p00 + e^(p01 + l)).
        alpha, beta, gamma = p10 - p00, p11 - p10, p01 - p00
        live_f = live.to(dtype)
        messages = field.new_zeros(b, num, d)
        for sweep in range(self.bp_iterations):
            total = field + messages.sum(2)  # [R, N]
            cavity = tables.nodes(total.unsqueeze(-1)).squeeze(-1) - tables.reversed(messages)
            new = (
                alpha
                + nn.functional.softplus(beta + cavity)
                - nn.functional.softplus(gamma + cavity)
            )
            messages = new * live_f * self._scale(sweep)
        belief = field + messages.sum(2)
        zeros = torch.zeros_like(belief)
        return _Beliefs(torch.stack([zeros, field], -1), torch.stack([zeros, belief], -1))

    def _coupling(self, slots: torch.Tensor) -> torch.Tensor:
        """One number per slot: the interaction strength of its potential ``[..., q, q]``
        (``q = 2``: the signed log odds ratio ``p11 - p10 - p01 + p00``; else the norm of the
        double-centred potential)."""
        if self.q == 2:
            k = slots[..., 1, 1] - slots[..., 1, 0] - slots[..., 0, 1] + slots[..., 0, 0]
        else:
            centred = slots - slots.mean(-1, keepdim=True) - slots.mean(-2, keepdim=True)
            centred = centred + slots.mean((-1, -2), keepdim=True)
            k = centred.pow(2).sum((-1, -2)).sqrt()
        return k.clamp(-_FEATURE_CLIP, _FEATURE_CLIP)

    def _correction(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        beliefs: _Beliefs,
        slots: torch.Tensor,
        live: torch.Tensor,
        tables: _Tables,
        histogram: torch.Tensor,
        centre_only: bool,
    ) -> torch.Tensor:
        """The learned part: narrow message passing (``_MESSAGE_CHANNELS`` numbers per edge,
        weighted by the edge's coupling and by whether it joins unpinned nodes) between wide
        node updates, then a node-wise head. No ``[rows, nodes, degree, hidden]`` tensor is
        formed, so its cost stays near that of belief propagation. With ``centre_only`` (a
        ball query) the last round and the head run for node 0 alone.

        Parameters
        ----------
        values : LongTensor[R, N]
            The queries' values (read where ``mask`` is True).
        mask : BoolTensor[R, N]
            The pinned nodes.
        beliefs : _Beliefs
            Belief propagation's field and belief, ``[R, N, q]`` each.
        slots : Tensor[R|1, N, D, q, q]
            Pairwise potentials per neighbour slot.
        live : BoolTensor[R, N, D]
            The slots that join two unpinned nodes.
        tables : _Tables
            The neighbour tables of the graph (``N`` nodes, ``D`` slots each).
        histogram : Tensor[R, q + 1]
            The pinned histogram of each row's whole query (:meth:`_pinned_histogram`).
        centre_only : bool
            A ball query: the output of node 0 alone.

        Returns
        -------
        Tensor[R, N, q] or Tensor[R, 1, q]
            The correction added to the belief (``[R, 1, q]`` with ``centre_only``).
        """
        num, q = values.shape[1], self.q
        field, belief = beliefs.field, beliefs.belief
        dtype = field.dtype
        if centre_only and self.num_layers == 0:
            values, mask, field, belief = values[:, :1], mask[:, :1], field[:, :1], belief[:, :1]
            num = 1
        pinned = mask.unsqueeze(-1).to(dtype)
        onehot = nn.functional.one_hot(values, q).to(dtype) * pinned
        node = torch.cat(
            [
                torch.log_softmax(belief, -1).clamp_min(-_FEATURE_CLIP),
                torch.log_softmax(field, -1).clamp_min(-_FEATURE_CLIP),
                pinned,
                onehot,
                histogram.to(dtype).unsqueeze(1).expand(-1, num, -1),
            ],
            dim=-1,
        )
        h = self.inp(node)
        if self.num_layers:
            valid = tables.valid.to(dtype).unsqueeze(-1)
            coupling = (self._coupling(slots) * tables.valid.to(dtype)).unsqueeze(-1)
            live_f = live.to(dtype).unsqueeze(-1)
            weights = torch.cat(
                [valid.expand(live_f.shape), coupling.expand(live_f.shape), live_f], -1
            )  # [R, N, D, 3]
            last = self.num_layers - 1
            for layer, (message, update) in enumerate(zip(self.message, self.update, strict=True)):
                sent = message(h)  # [R, N, c]
                if centre_only and layer == last:
                    h = h[:, :1]
                    nodes = _Tables(
                        tables.neighbours[:, :1], tables.valid[:, :1], tables.reverse[:, :1]
                    ).nodes(sent)  # [R, 1, D, c]: the centre's neighbours
                    w = weights[:, :1]
                else:
                    nodes = tables.nodes(sent)  # [R, N, D, c]
                    w = weights
                agg = torch.einsum("rndc,rndk->rnkc", nodes, w.expand(nodes.shape[:3] + (3,)))
                agg = agg.reshape(agg.shape[0], agg.shape[1], -1)
                h = h + update(torch.cat([h, agg], dim=-1))
        elif centre_only:
            h = h[:, :1]
        return self.out(self.head(h))
