"""``AnyOrderGuide``: a learned any-order oracle over a Pyro model's discrete latent sites.

A *guide network* is an any-order autoregressive network ``q(x_i | x_S)``: for every subset
``S`` of pinned coordinates it returns the conditional marginals of every coordinate. It is a
:class:`~pyro_autospec.engine.protocols.MarginalOracle`, so autospeculation samples it exactly
(with respect to its own sequential law in a uniformly random order, even though a network
need not be consistent across orders; see :doc:`/guides`), and every draw comes with
``log q_sigma(x)``, so ``log p(x, data) - log q_sigma(x)`` is a valid log importance weight.

The guide sees the model. When it is built from a Pyro model it reads the pairwise expansion
of the model's log joint (:mod:`pyro_autospec.guides.structure`): which coordinates share a
factor, and the potentials of the data set. Three architectures
(:mod:`pyro_autospec.guides.networks`), all one forward pass per query row:

* ``"graph"`` (the default for a model): belief propagation on that factor graph plus a
  learned message-passing correction. Untrained, it is loopy belief propagation; its weights
  are shared across coordinates and see the data only through the potentials, so one trained
  guide serves any data set of the model (amortised, :meth:`AnyOrderGuide.oracle`).
* ``"mlp"`` (the default without a model): the order-agnostic NADE of Uria, Murray and
  Larochelle [1]_, with the unary potentials as extra inputs. Answers a chain query
  (``log_marginals_chain``) in one pass.
* ``"transformer"``: a masked transformer encoder, one token per coordinate.

The default was picked by measurement (``python benchmarks/guides.py --parts training``: at
equal training time on a 16x16 Ising posterior, ``"graph"`` reached a KL of about 0 against 49
for the MLP and 160 for the transformer; :doc:`/benchmarks`).

References
----------
.. [1] B. Uria, I. Murray, H. Larochelle. A Deep and Tractable Density Estimator. ICML 2014.
.. [2] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
.. [3] V. Garcia Satorras, M. Welling. Neural Enhanced Belief Propagation on Factor Graphs.
   AISTATS 2021.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pyro.nn import PyroModule

from pyro_autospec.engine.protocols import chain_rows
from pyro_autospec.guides._files import load_plain, plain
from pyro_autospec.guides.networks import GraphNet, MaskedTransformer, ResidualMLP
from pyro_autospec.guides.structure import (
    factor_sites,
    probe_potentials,
    probe_structure,
    simulate_discrete,
)
from pyro_autospec.guides.training import fit_posterior, fit_posterior_datasets, train
from pyro_autospec.model import SiteLayout, discover_sites

__all__ = ["AnyOrderGuide", "ConditionedGuide", "GuideContext", "ARCHITECTURES"]

ARCHITECTURES = ("graph", "mlp", "transformer")
_DEFAULT_HIDDEN = {"graph": 32, "mlp": 128, "transformer": 64}
_DEFAULT_LAYERS = {"graph": 0, "mlp": 2, "transformer": 2}


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


class AnyOrderGuide(PyroModule):
    """A learned any-order oracle ``q(x_i | x_S)`` over a model's discrete latent sites.

    The guide covers the same coordinates as :class:`~pyro_autospec.infer.AutoSpec` (sites in
    trace order, each flattened in C order, values as support indices; see
    :mod:`pyro_autospec.model`), so ``AutoSpec(model, guide=guide)`` samples it.

    Parameters
    ----------
    model : callable or SiteLayout, optional
        The Pyro model whose discrete latent sites the guide covers (traced with
        ``model_args``), or a :class:`~pyro_autospec.model.SiteLayout` (no structure is
        read then). ``None`` builds a bare oracle on ``[num_values]^num_coords``.
    model_args : tuple
        Positional arguments of ``model``: the data set the guide answers for by default
        (:meth:`oracle` answers for others).
    model_kwargs : dict, optional
        Keyword arguments of ``model``.
    architecture : {"auto", "graph", "mlp", "transformer"}
        See the module docstring; ``"auto"`` is ``"graph"`` for a model, ``"mlp"`` otherwise.
    hidden_dim : int, optional
        Width of the network (default 32 for ``"graph"``, 128 for ``"mlp"``, 64 for
        ``"transformer"``).
    num_layers : int, optional
        Rounds of learned message passing (``"graph"``, default 0: belief propagation with
        learned message scales and a learned node-wise head), residual blocks (``"mlp"``,
        default 2) or encoder layers (``"transformer"``, default 2).
    num_heads : int
        Attention heads (``"transformer"`` only).
    bp_iterations : int
        Sweeps of belief propagation per query (``"graph"`` only).
    edges : LongTensor[E, 2], optional
        The coordinate pairs that share a factor, if known (``"graph"``); otherwise every
        pair is probed once (see :func:`~pyro_autospec.guides.structure.probe_structure`).
    max_probes : int
        Largest number of log-joint evaluations spent on finding the edges.
    num_coords, num_values : int, optional
        ``n`` and ``q`` when ``model`` is ``None``.
    max_plate_nesting : int, optional
        Passed to :func:`~pyro_autospec.model.discover_sites`.
    chunk_size : int
        Largest number of rows per forward pass inside the oracle methods (bounds memory).

    Attributes
    ----------
    layout : SiteLayout or None
        The coordinate mapping (``None`` for a bare oracle).
    structure : ModelStructure or None
        The model's pairwise expansion for ``model_args`` (``None`` without a model).
    num_coords, num_values : int
        ``n`` and ``q`` (the :class:`~pyro_autospec.engine.protocols.MarginalOracle` protocol).
    context : GuideContext
        The potentials of the guide's own data set.
    loss_history : list of float
        Training losses, one per step, appended by every ``fit_*`` call.

    Notes
    -----
    The output is a deterministic function of ``(values where mask, mask)`` and the data
    set's potentials: values at unpinned positions never reach the network. Values outside a
    coordinate's support get ``-inf``. The network is only *approximately* consistent across
    orders; autospeculation is exact for its sequential law in the random order used,
    ``(x, sigma) ~ Uniform(sigma) q_sigma(x)``, and the draws' ``log q_sigma(x)`` make
    importance weights against the model (:class:`~pyro_autospec.infer.AutoSpec` with
    ``correction=``; :func:`~pyro_autospec.diagnostics.weights.weight_diagnostics` says whether
    to trust them).

    **Saving and loading.** :meth:`save` writes the configuration, the weights, the edges and
    the loss history; :meth:`load` rebuilds the guide for a model with sites of the same
    shapes, without probing every pair again. A ``state_dict`` alone also loads into a guide
    built with the same model, data shapes and arguments.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec import sample_any_order
    >>> def model(data):
    ...     with pyro.plate("pixels", len(data)):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...     s = 2.0 * z - 1.0
    ...     pyro.factor("coupling", 0.5 * (s[..., 1:] * s[..., :-1]).sum(-1, keepdim=True))
    ...     with pyro.plate("obs", len(data)):
    ...         pyro.sample("y", dist.Normal(s, 1.0), obs=data)
    >>> data = torch.tensor([1.0, -1.0, 0.5])
    >>> guide = AnyOrderGuide(model, (data,))
    >>> guide.architecture, guide.num_coords, guide.num_values, guide.structure.num_edges
    ('graph', 3, 2, 2)
    >>> empty = torch.zeros(2, 3, dtype=torch.long)
    >>> guide.log_marginals(empty, empty.bool()).shape
    torch.Size([2, 3, 2])
    >>> sample_any_order(guide, 4, seed=0).samples.shape
    torch.Size([4, 3])
    """

    def __init__(
        self,
        model: Callable | Any = None,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        *,
        architecture: str = "auto",
        hidden_dim: int | None = None,
        num_layers: int | None = None,
        num_heads: int = 4,
        bp_iterations: int = 5,
        edges: torch.Tensor | None = None,
        max_probes: int = 2**21,
        num_coords: int | None = None,
        num_values: int | None = None,
        max_plate_nesting: int | None = None,
        chunk_size: int = 4096,
    ):
        super().__init__()

        if architecture not in ARCHITECTURES + ("auto",):
            raise ValueError(
                f"architecture must be 'auto' or one of {ARCHITECTURES}; got {architecture!r}"
            )
        self.model = None if isinstance(model, SiteLayout) else model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        if model is None:
            if num_coords is None or num_values is None:
                raise ValueError(
                    "AnyOrderGuide needs a Pyro model (or a SiteLayout), or else both num_coords "
                    "and num_values"
                )
            self.layout = None
            n, q = int(num_coords), int(num_values)
            sizes = torch.full((n,), q, dtype=torch.long)
        else:
            if isinstance(model, SiteLayout):
                layout = model
            elif callable(model):
                layout = discover_sites(
                    model, self.model_args, self.model_kwargs, max_plate_nesting=max_plate_nesting
                )
            else:
                raise TypeError(
                    f"model must be a Pyro model (callable), a SiteLayout or None; got "
                    f"{type(model).__name__}"
                )
            self.layout = layout
            n, q = layout.num_coords, layout.num_values
            sizes = layout.support_sizes
            if num_coords is not None and int(num_coords) != n:
                raise ValueError(f"num_coords={num_coords} but the model has {n} coordinates")
        if n < 1 or q < 2:
            raise ValueError(f"need num_coords >= 1 and num_values >= 2; got n={n}, q={q}")
        if architecture == "auto":
            architecture = "graph" if self.model is not None else "mlp"
        if architecture == "graph" and self.model is None:
            raise ValueError(
                "architecture='graph' reads the factor graph from a Pyro model; pass the model "
                "(or use architecture='mlp' or 'transformer')"
            )
        hidden_dim = _DEFAULT_HIDDEN[architecture] if hidden_dim is None else hidden_dim
        num_layers = _DEFAULT_LAYERS[architecture] if num_layers is None else num_layers
        for name, value, least in (
            ("hidden_dim", hidden_dim, 1),
            ("num_layers", num_layers, 0),
            ("bp_iterations", bp_iterations, 0),
        ):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}; got {value!r}")
        self.num_coords, self.num_values = n, q
        self.architecture = architecture
        self.config = {
            "architecture": architecture,
            "hidden_dim": hidden_dim,
            "num_layers": num_layers,
            "num_heads": num_heads,
            "bp_iterations": bp_iterations,
            "max_plate_nesting": None if self.layout is None else self.layout.max_plate_nesting,
            "num_coords": n,
            "num_values": q,
            "chunk_size": chunk_size,
        }
        self.chunk_size = int(chunk_size)
        outside = torch.arange(q)[None, :] >= sizes[:, None]
        self.register_buffer("outside_support", outside, persistent=False)
        self.structure = None
        if self.model is not None:
            if architecture != "graph":
                edges = torch.zeros(0, 2, dtype=torch.long)  # unary potentials only
            self.structure = probe_structure(
                self.model,
                self.model_args,
                self.model_kwargs,
                self.layout,
                edges=edges,
                max_probes=max_probes,
            )
            unary = self.structure.unary.float()
        else:
            unary = torch.zeros(n, q).masked_fill(outside, -math.inf)
        if architecture == "graph":
            self.net = GraphNet(n, q, self.structure.edges, hidden_dim, num_layers, bp_iterations)
        elif architecture == "mlp":
            self.net = ResidualMLP(n, q, hidden_dim, num_layers)
        else:
            self.net = MaskedTransformer(n, q, hidden_dim, num_layers, num_heads)
        self.register_buffer("context_unary", unary[None].clone())
        if architecture == "graph":
            slots = self.net.slot_potentials(self.structure.pairwise.float()[None])
            self.register_buffer("context_slots", slots)
        else:
            self.context_slots = None
        self.loss_history: list[float] = []
        self.eval()  # an oracle by default; the fit_* methods switch to train mode and back

    # ------------------------------------------------------------------------------ basics
    @property
    def device(self) -> torch.device:
        """The device of the guide's parameters (where the engine builds its queries)."""
        return self.context_unary.device

    @property
    def context(self) -> GuideContext:
        """The potentials of the guide's own data set (``model_args``)."""
        return GuideContext(self.context_unary, self.context_slots)

    @property
    def edges(self) -> torch.Tensor:
        """LongTensor[E, 2]: the pairs the ``"graph"`` architecture passes messages along."""
        if self.structure is None:
            return torch.zeros(0, 2, dtype=torch.long)
        return self.structure.edges

    def extra_repr(self) -> str:
        edges = f", edges={self.edges.shape[0]}" if self.architecture == "graph" else ""
        return (
            f"num_coords={self.num_coords}, num_values={self.num_values}, "
            f"architecture={self.architecture!r}{edges}"
        )

    def _check_query(self, values: torch.Tensor, mask: torch.Tensor) -> None:
        n = self.num_coords
        if values.dim() != 2 or values.shape[1] != n:
            raise ValueError(
                f"values must be a LongTensor[B, {n}]; got shape {tuple(values.shape)}"
            )
        if mask.shape != values.shape or mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a BoolTensor of the same shape as values {tuple(values.shape)}; "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )

    # ------------------------------------------------------------------------------ network
    def _logits(self, values, mask, context: GuideContext, index, targets=None):
        unary, slots = context.rows(index)
        if self.architecture == "graph":
            if targets is not None:
                return self.net.forward_at(values, mask, unary, slots, targets)
            return self.net(values, mask, unary, slots)
        if targets is not None:
            return self.net.forward_at(values, mask, unary, targets)
        return self.net(values, mask, unary)

    def log_rows(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        *,
        context: GuideContext | None = None,
        index: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Differentiable log conditional marginals (one forward pass per row).

        Parameters
        ----------
        values : LongTensor[B, n]
            Support indices; only the entries where ``mask`` is True are read.
        mask : BoolTensor[B, n]
            True where pinned.
        context : GuideContext, optional
            The data sets (default: the guide's own).
        index : LongTensor[B], optional
            The data set of each row (needed when ``context`` has several).
        targets : LongTensor[B, k], optional
            Return only these coordinates.

        Returns
        -------
        Tensor[B, n, q] (or [B, k, q] with ``targets``)
            ``log q(X_i = v | X_S = values_S)``, normalised per ``(b, i)`` by ``log_softmax``,
            ``-inf`` outside each coordinate's support.
        """
        self._check_query(values, mask)
        device = self.device
        values, mask = values.to(device).long(), mask.to(device)
        context = self.context if context is None else context
        index = None if index is None else torch.as_tensor(index, device=device).long()
        if targets is not None:
            targets = torch.as_tensor(targets).to(device).long()
        logits = self._logits(values, mask, context, index, targets)
        outside = self.outside_support if targets is None else self.outside_support[targets]
        logits = logits.masked_fill(outside, -math.inf)
        return torch.log_softmax(logits, dim=-1)

    def forward(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """:meth:`log_rows` for the guide's own data set (differentiable): Tensor[B, n, q]."""
        return self.log_rows(values, mask)

    # ------------------------------------------------------------------------------ oracle
    def _chunked(self, fn, num_rows: int, rows_per_chunk: int, width: int):
        with torch.no_grad():
            parts = [fn(slice(i, i + rows_per_chunk)) for i in range(0, num_rows, rows_per_chunk)]
        if not parts:
            return torch.empty(0, width, self.num_values, device=self.device)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _answer(self, values, mask, context, index):
        self._check_query(values, mask)

        def run(sl):
            sub = None if index is None else index[sl]
            return self.log_rows(values[sl], mask[sl], context=context, index=sub)

        return self._chunked(run, values.shape[0], self.chunk_size, self.num_coords)

    def _answer_at(self, values, mask, targets, context, index):
        self._check_query(values, mask)
        targets = torch.as_tensor(targets)
        if targets.dim() != 2 or targets.shape[0] != values.shape[0]:
            raise ValueError(
                f"targets must be a LongTensor[B, k] with B = {values.shape[0]}; got shape "
                f"{tuple(targets.shape)}"
            )
        # Bound the gathered output weights ([rows, k, q, h] for the MLP) like the chunk size.
        k = max(1, targets.shape[1])
        step = max(1, min(self.chunk_size, (self.chunk_size * 16) // k))

        def run(sl):
            sub = None if index is None else index[sl]
            return self.log_rows(
                values[sl], mask[sl], context=context, index=sub, targets=targets[sl]
            )

        return self._chunked(run, values.shape[0], step, targets.shape[1])

    def _answer_chain(self, values, mask, chain, context, index):
        self._check_query(values, mask)
        chain = torch.as_tensor(chain).to(self.device).long()
        if chain.dim() != 2 or chain.shape[0] != values.shape[0]:
            raise ValueError(
                f"chain must be a LongTensor[C, L] with C = {values.shape[0]}; got shape "
                f"{tuple(chain.shape)}"
            )
        c, length = chain.shape
        values = values.to(self.device).long()
        mask = mask.to(self.device)
        index = None if index is None else torch.as_tensor(index, device=self.device).long()
        if self.architecture == "mlp":
            step = max(1, self.chunk_size // max(1, length))

            def run(sl):
                sub = None if index is None else index[sl]
                unary, _ = context.rows(sub)
                logits = self.net.forward_chain(values[sl], mask[sl], unary, chain[sl])
                logits = logits.masked_fill(self.outside_support[chain[sl]], -math.inf)
                return torch.log_softmax(logits, dim=-1)

            return self._chunked(run, c, step, length)
        # Other architectures: the L nested prefixes as L rows of one batched call.
        rows_values, rows_mask, targets = chain_rows(values, mask, chain)
        rows_index = None if index is None else index.repeat_interleave(length)
        out = self._answer_at(rows_values, rows_mask, targets, context, rows_index)
        return out.reshape(c, length, self.num_values)

    def log_marginals(
        self, values: torch.Tensor, mask: torch.Tensor, draws: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The :class:`~pyro_autospec.engine.protocols.MarginalOracle` query (no gradients).

        Parameters
        ----------
        values : LongTensor[B, n]
        mask : BoolTensor[B, n]
        draws : LongTensor[B], optional
            Ignored (the guide's own data set is one target).

        Returns
        -------
        Tensor[B, n, q]
            As :meth:`log_rows`, in chunks of ``chunk_size`` rows under ``torch.no_grad()``.

        Examples
        --------
        >>> guide = AnyOrderGuide(num_coords=4, num_values=3, hidden_dim=8)
        >>> values = torch.tensor([[2, 0, 1, 1]]); mask = torch.tensor([[True, False, False, True]])
        >>> out = guide.log_marginals(values, mask)
        >>> out.shape, bool(torch.allclose(out.exp().sum(-1), torch.ones(1, 4)))
        (torch.Size([1, 4, 3]), True)
        """
        return self._answer(values, mask, self.context, None)

    def log_marginals_at(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        targets: torch.Tensor,
        draws: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows of just the ``targets`` (no gradients): the engine's targeted query.

        ``"mlp"`` evaluates its output layer for the targets alone and ``"transformer"`` its
        head on their tokens; ``"graph"`` runs on the ball of ``bp_iterations + num_layers +
        1`` hops around each target when that is smaller than the graph (a coordinate's output
        depends on nothing farther), else on the whole graph.

        Parameters
        ----------
        values : LongTensor[B, n]
        mask : BoolTensor[B, n]
        targets : LongTensor[B, k]
            Coordinate indices (repeats allowed).
        draws : LongTensor[B], optional
            Ignored.

        Returns
        -------
        Tensor[B, k, q]
            Equal to ``log_marginals(values, mask)`` gathered at ``targets`` (up to float
            rounding).

        Examples
        --------
        >>> guide = AnyOrderGuide(num_coords=4, num_values=3, hidden_dim=8)
        >>> values = torch.tensor([[2, 0, 1, 1]]); mask = torch.tensor([[True, False, False, True]])
        >>> at = guide.log_marginals_at(values, mask, torch.tensor([[1, 2]]))
        >>> full = guide.log_marginals(values, mask)[:, [1, 2]]
        >>> at.shape, bool(torch.allclose(at, full, atol=1e-6))
        (torch.Size([1, 2, 3]), True)
        """
        return self._answer_at(values, mask, targets, self.context, None)

    def log_marginals_chain(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        chain: torch.Tensor,
        draws: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Chain query: each chain coordinate given the prefix and the chain before it.

        ``out[c, j] = log q(X_{chain[c, j]} = . | X_S = values_S)`` with
        ``S = mask[c] + chain[c, :j]`` (the verification of a drafted block). ``"mlp"`` answers
        it in one pass: its first layer is linear in the pinned values, so the ``L`` nested
        prefixes are a cumulative sum and only the residual blocks run per row. The other
        architectures run the ``L`` rows in one batched call (no saving over ``L`` rows).

        Parameters
        ----------
        values : LongTensor[C, n]
        mask : BoolTensor[C, n]
            The pinned prefix; ``chain`` coordinates must not be in it.
        chain : LongTensor[C, L]
        draws : LongTensor[C], optional
            Ignored.

        Returns
        -------
        Tensor[C, L, q]

        Examples
        --------
        >>> guide = AnyOrderGuide(num_coords=4, num_values=2, hidden_dim=8)
        >>> values = torch.tensor([[1, 0, 1, 1]])
        >>> mask = torch.tensor([[True, False, False, False]])
        >>> out = guide.log_marginals_chain(values, mask, torch.tensor([[2, 3]]))
        >>> pinned = mask | (torch.arange(4) == 2)
        >>> second = guide.log_marginals_at(values, pinned, torch.tensor([[3]]))
        >>> out.shape, bool(torch.allclose(out[:, 1:], second, atol=1e-5))
        (torch.Size([1, 2, 2]), True)
        """
        return self._answer_chain(values, mask, chain, self.context, None)

    # ------------------------------------------------------------------------------ data sets
    def context_for(
        self, observed: Mapping[str, torch.Tensor] | None = None, *args: Any, **kwargs: Any
    ) -> GuideContext:
        """The potentials of other data sets, for the same network.

        Parameters
        ----------
        observed : dict, optional
            ``name -> Tensor[K, *value_shape]``: values of the observed sites of ``K`` data
            sets (the model's other arguments come from ``args``/``kwargs``, default the
            guide's). ``None``: the one data set in ``args``/``kwargs``.
        *args, **kwargs
            The model's arguments.

        Returns
        -------
        GuideContext
        """
        self._require_model("context_for")
        if not args and not kwargs:
            args, kwargs = self.model_args, self.model_kwargs
        self._check_same_sites(args, kwargs)
        unary, pairwise = probe_potentials(
            self.model, args, kwargs, self.layout, self.structure, observed
        )
        unary = unary.float().to(self.device)
        slots = None
        if self.architecture == "graph":
            slots = self.net.slot_potentials(pairwise.float().to(self.device))
        return GuideContext(unary, slots)

    def conditioned(self, context: GuideContext, repeats: int = 1) -> ConditionedGuide:
        """The guide as an oracle for the data sets of ``context`` (:class:`ConditionedGuide`)."""
        return ConditionedGuide(self, context, repeats)

    def oracle(self, *args: Any, **kwargs: Any) -> ConditionedGuide:
        """The guide as a ``MarginalOracle`` for the data in ``args`` (no retraining).

        An amortised guide (one trained by :meth:`fit_simulation`, or any ``"graph"`` guide)
        answers for a new data set through that data set's potentials. Pass the result to
        ``AutoSpec(model, guide=...)`` or ``sample_any_order``.

        Parameters
        ----------
        *args, **kwargs
            The model's arguments (same site shapes as the guide's); default the guide's own.

        Returns
        -------
        ConditionedGuide

        Examples
        --------
        >>> import torch, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     with pyro.plate("p", 3):
        ...         z = pyro.sample("z", dist.Bernoulli(0.5))
        ...         pyro.sample("y", dist.Normal(z, 0.5), obs=y)
        >>> guide = AnyOrderGuide(model, (torch.zeros(3),))
        >>> oracle = guide.oracle(torch.ones(3))
        >>> empty = torch.zeros(1, 3, dtype=torch.long)
        >>> bool((oracle.log_marginals(empty, empty.bool())[0, :, 1].exp() > 0.5).all())
        True
        """
        if not args and not kwargs:
            return ConditionedGuide(self, self.context)
        return ConditionedGuide(self, self.context_for(None, *args, **kwargs))

    def _require_model(self, what: str) -> None:
        if self.model is None or self.structure is None:
            raise ValueError(
                f"{what} needs a guide built from a Pyro model: AnyOrderGuide(model, model_args)"
            )

    def _check_same_sites(self, args: tuple, kwargs: dict) -> None:
        layout = discover_sites(
            self.model, args, kwargs, max_plate_nesting=self.layout.max_plate_nesting
        )
        if (
            layout.num_coords != self.num_coords
            or layout.num_values != self.num_values
            or [s.name for s in layout.sites] != [s.name for s in self.layout.sites]
        ):
            raise ValueError(
                f"the model with these arguments has {layout.num_coords} coordinates and "
                f"{layout.num_values} values in sites {layout.names}; the guide was built for "
                f"{self.num_coords} and {self.num_values} in {self.layout.names}"
            )

    # ------------------------------------------------------------------------------ losses
    def sequential_log_prob(
        self,
        values: torch.Tensor,
        orders: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        context: GuideContext | None = None,
        index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Chain-rule terms ``log q(x_{sigma_t} | x_{sigma_1..t-1})`` (differentiable).

        Parameters
        ----------
        values : LongTensor[N, n]
            Assignments (support indices).
        orders : LongTensor[N, n]
            ``orders[k, t]`` is the coordinate visited ``t``-th for assignment ``k``.
        positions : LongTensor[N, k], optional
            The positions ``t`` (0-based) to evaluate; default all ``n``.
        context, index : optional
            Data sets (default the guide's own) and the data set of each assignment.

        Returns
        -------
        Tensor[N, k]
            The chain-rule terms at those positions; with all positions, ``.sum(-1)`` is
            ``log q_sigma(x)``, the ``log_prob`` the engine returns for a draw in that order.

        Examples
        --------
        >>> guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
        >>> x = torch.tensor([[0, 1, 1]]); order = torch.tensor([[2, 0, 1]])
        >>> guide.sequential_log_prob(x, order).shape
        torch.Size([1, 3])
        """
        values = values.to(self.device).long()
        orders = orders.to(self.device).long()
        num, n = values.shape
        if orders.shape != values.shape:
            raise ValueError(
                f"orders must have the shape of values {tuple(values.shape)}; got "
                f"{tuple(orders.shape)}"
            )
        if positions is None:
            positions = torch.arange(n, device=self.device).expand(num, n)
        positions = positions.to(self.device).long()
        k = positions.shape[1]
        ranks = torch.empty_like(orders)
        ranks.scatter_(1, orders, torch.arange(n, device=self.device).expand(num, n))
        mask = ranks.unsqueeze(1) < positions.unsqueeze(-1)  # [N, k, n]
        target = orders.gather(1, positions)  # [N, k]
        rows = self.log_rows(
            values.unsqueeze(1).expand(num, k, n).reshape(-1, n),
            mask.reshape(-1, n),
            context=context,
            index=None if index is None else torch.as_tensor(index).repeat_interleave(k),
            targets=target.reshape(-1, 1),
        ).reshape(num, k, -1)
        return rows.gather(2, values.gather(1, target).unsqueeze(-1)).squeeze(-1)

    def any_order_loss(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        *,
        context: GuideContext | None = None,
        index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The any-order negative log likelihood, one random order and cut per draw
        (the order-agnostic NADE objective of Uria, Murray and Larochelle, ICML 2014).

        For each draw a uniformly random order ``sigma`` and a cut ``t`` give the pinned set
        ``S = sigma_{1..t}``; the estimate ``-(n / (n - t)) sum_{i not in S} log q(x_i | x_S)``
        (every unpinned coordinate scored in the same pass, with the masked-diffusion weight
        ``n / (n - t)``) is unbiased for ``E_sigma[-log q_sigma(x)]``. The cuts of a batch are
        stratified: draw ``k`` of ``N`` gets ``t`` uniform in the ``k``-th of ``N`` equal
        slices of ``{0, ..., n - 1}`` (in a random assignment), which keeps the estimate
        unbiased and lowers its variance.

        Parameters
        ----------
        values : LongTensor[N, n]
        weights : Tensor[N], optional
            Per-draw weights (e.g. self-normalised importance weights); default ``1 / N``.
        generator : torch.Generator, optional
            For the orders and cuts.
        context, index : optional
            Data sets (default the guide's own) and the data set of each draw.

        Returns
        -------
        Tensor[]
            The weighted loss (differentiable).
        """
        values = values.to(self.device).long()
        num, n = values.shape
        ranks = torch.rand(num, n, generator=generator).argsort(-1).to(self.device)
        slot = torch.randperm(num, generator=generator).double()
        u = torch.rand(num, generator=generator, dtype=torch.float64)
        cut = ((slot + u) * n / num).floor().clamp(0, n - 1).long().unsqueeze(1).to(self.device)
        mask = ranks < cut
        log_rows = self.log_rows(values, mask, context=context, index=index)
        picked = log_rows.gather(-1, values.unsqueeze(-1)).squeeze(-1)
        picked = picked.masked_fill(mask, 0.0)
        per_draw = -(n / (n - cut.squeeze(1)).to(picked.dtype)) * picked.sum(-1)
        if weights is None:
            return per_draw.mean()
        return (weights.to(per_draw) * per_draw).sum()

    # ------------------------------------------------------------------------------ training
    def _coords(self, samples: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        if isinstance(samples, Mapping):
            if self.layout is None:
                raise ValueError("a dict of site values needs a guide built from a model")
            missing = [s for s in self.layout.names if s not in samples]
            if missing:
                raise ValueError(f"samples lacks the discrete site(s) {missing}")
            samples = self.layout.to_coords(samples)
        samples = torch.as_tensor(samples)
        if samples.dim() != 2 or samples.shape[1] != self.num_coords:
            raise ValueError(
                f"samples must be LongTensor[N, {self.num_coords}] (engine coordinates) or a dict "
                f"of site values; got shape {tuple(samples.shape)}"
            )
        if samples.is_floating_point():
            samples = samples.round().long()
        if bool((samples < 0).any()) or bool((samples >= self.num_values).any()):
            raise ValueError(f"sample values must lie in 0..{self.num_values - 1}")
        return samples.long()

    def fit_to_samples(
        self,
        samples: torch.Tensor | Mapping[str, torch.Tensor],
        *,
        num_steps: int = 1000,
        batch_size: int = 128,
        lr: float = 1e-3,
        lr_decay: float = 1.0,
        weights: torch.Tensor | None = None,
        seed: int | None = None,
        disable_progbar: bool = False,
    ) -> list[float]:
        """Maximum likelihood in uniformly random orders, for draws you already have.

        Minimises :meth:`any_order_loss` (one network pass per draw) with the shared Adam
        loop (:func:`~pyro_autospec.guides.training.train`) on minibatches drawn from
        ``samples``, for the guide's own data set.

        Parameters
        ----------
        samples : LongTensor[N, n] or dict
            Engine coordinates, or ``{site: Tensor[N, *shape]}`` as ``AutoSpec.get_samples``
            or ``MCMC.get_samples`` return (mapped with ``layout.to_coords``).
        num_steps : int
            Adam steps.
        batch_size : int
            Draws per step (sampled with replacement, proportional to ``weights``).
        lr : float
            Adam learning rate.
        lr_decay : float
            Cosine decay of the rate to ``lr * lr_decay`` (``1.0``: constant).
        weights : Tensor[N], optional
            Non-negative weights of the draws (default uniform).
        seed : int, optional
            Seeds the minibatches, orders and cuts.
        disable_progbar : bool
            Hide the ``tqdm`` bar.

        Returns
        -------
        list of float
            The loss of every step (also appended to :attr:`loss_history`).

        Examples
        --------
        >>> guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=16)
        >>> data = torch.tensor([[0, 0, 0], [1, 1, 1]]).repeat(50, 1)
        >>> losses = guide.fit_to_samples(
        ...     data, num_steps=200, lr=1e-2, seed=0, disable_progbar=True
        ... )
        >>> losses[-1] < losses[0]
        True
        """
        samples = self._coords(samples).to(self.device)
        num = samples.shape[0]
        if weights is None:
            probs = torch.full((num,), 1.0 / num)
        else:
            probs = torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
            if probs.shape[0] != num or bool((probs < 0).any()) or not probs.sum() > 0:
                raise ValueError("weights must be non-negative, one per draw, not all zero")
            probs = probs / probs.sum()
        gen = torch.Generator().manual_seed(seed) if seed is not None else None

        def step_loss(step: int):
            idx = torch.multinomial(probs, batch_size, replacement=True, generator=gen)
            loss = self.any_order_loss(samples[idx.to(samples.device)], generator=gen)
            return loss, loss.item()

        return train(
            self,
            step_loss,
            num_steps=int(num_steps),
            lr=lr,
            lr_decay=lr_decay,
            desc="fit_to_samples",
            disable_progbar=disable_progbar,
        )

    def fit_posterior(self, *args: Any, **kwargs: Any) -> list[float]:
        """Fit the guide to the model's posterior given the data; see
        :func:`pyro_autospec.guides.training.fit_posterior` for the options."""
        return fit_posterior(self, *args, **kwargs)

    def fit_simulation(
        self,
        num_simulations: int,
        *args: Any,
        objective: str = "auto",
        num_steps: int = 1000,
        batch_size: int = 128,
        lr: float = 1e-3,
        lr_decay: float = 0.1,
        num_particles: int = 64,
        datasets_per_step: int = 8,
        posterior_objective: str = "both",
        num_positions: int = 32,
        method: str = "sequential",
        max_seconds: float | None = None,
        seed: int | None = None,
        disable_progbar: bool = False,
        **kwargs: Any,
    ) -> list[float]:
        """Amortised training: ``q(x | data)`` for every data set of the model's shapes.

        ``num_simulations`` pairs ``(x, data)`` are drawn once from the model's prior
        predictive (the model run forward, observed sites sampled). A new data set then gets
        its draws from :meth:`oracle` with no retraining, corrected by ``AutoSpec(...,
        correction=...)``.

        Parameters
        ----------
        num_simulations : int
            Simulated data sets (a fixed training set).
        *args, **kwargs
            The model's arguments (default: those the guide was built with); observed values
            are ignored, sizes and covariates used. Keywords named here are options.
        objective : {"auto", "likelihood", "posterior"}
            ``"likelihood"``: the any-order likelihood of the simulated ``x`` given their data
            (:meth:`any_order_loss`, one pass per pair; the amortised forward KL
            ``E_data KL(p(x | data) || q(x | data))``). Valid only when forward simulation
            draws the model's joint, i.e. the model has no ``pyro.factor``. ``"posterior"``:
            only the simulated *data* are used; each step fits ``q(. | data_k)`` to the
            posterior of ``datasets_per_step`` of them with :func:`fit_posterior`'s
            estimator (valid for any model). ``"auto"``: ``"likelihood"`` unless the model
            has ``pyro.factor`` sites.
        num_steps, lr, lr_decay, max_seconds, seed, disable_progbar
            As in :func:`~pyro_autospec.guides.training.train`.
        batch_size : int
            Pairs per step (``"likelihood"``).
        num_particles, datasets_per_step, posterior_objective, num_positions, method
            Per step of ``"posterior"``: guide draws in all, data sets they are spread over,
            and :func:`fit_posterior`'s ``objective``, ``num_positions`` and ``method``.

        Returns
        -------
        list of float
            The loss of every step (also appended to :attr:`loss_history`).

        Examples
        --------
        >>> import torch, pyro, pyro.distributions as dist
        >>> def model(y):
        ...     with pyro.plate("p", 4):
        ...         z = pyro.sample("z", dist.Bernoulli(0.5))
        ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=y)
        >>> guide = AnyOrderGuide(model, (torch.zeros(4),), architecture="mlp", hidden_dim=16)
        >>> losses = guide.fit_simulation(256, num_steps=20, seed=0, disable_progbar=True)
        >>> len(losses)
        20
        """
        self._require_model("fit_simulation")
        if objective not in ("auto", "likelihood", "posterior"):
            raise ValueError(
                f"objective must be 'auto', 'likelihood' or 'posterior'; got {objective!r}"
            )
        if not args and not kwargs:
            args, kwargs = self.model_args, self.model_kwargs
        self._check_same_sites(args, kwargs)
        factors = factor_sites(self.model, args, kwargs)
        if objective == "auto":
            objective = "posterior" if factors else "likelihood"
        if objective == "likelihood" and factors:
            raise ValueError(
                f"objective='likelihood' needs draws of the model's joint, but forward "
                f"simulation ignores the pyro.factor site(s) {factors}; use "
                f"objective='posterior' (fits the posterior of each simulated data set)"
            )
        if not self.layout.observed:
            raise ValueError("the model has no observed sites: there is nothing to amortise over")
        coords, observed = simulate_discrete(
            self.model, args, kwargs, self.layout, int(num_simulations), seed=seed
        )
        if objective == "posterior":
            return fit_posterior_datasets(
                self,
                observed,
                num_steps=num_steps,
                num_particles=num_particles,
                datasets_per_step=datasets_per_step,
                num_positions=num_positions,
                objective=posterior_objective,
                lr=lr,
                lr_decay=lr_decay,
                method=method,
                max_seconds=max_seconds,
                seed=seed,
                disable_progbar=disable_progbar,
                model_args=args,
                model_kwargs=kwargs,
            )
        bank = self.context_for(observed, *args, **kwargs)
        coords = coords.to(self.device)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None

        def step_loss(step: int):
            idx = torch.randint(0, coords.shape[0], (batch_size,), generator=gen)
            idx = idx.to(self.device)
            loss = self.any_order_loss(coords[idx], generator=gen, context=bank, index=idx)
            return loss, loss.item()

        return train(
            self,
            step_loss,
            num_steps=int(num_steps),
            lr=lr,
            lr_decay=lr_decay,
            max_seconds=max_seconds,
            desc="fit_simulation",
            disable_progbar=disable_progbar,
        )

    # ------------------------------------------------------------------------------ save/load
    def save(self, path: Any) -> None:
        """Save the configuration, the weights, the edges and the loss history to ``path``.

        Examples
        --------
        >>> import io
        >>> guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
        >>> buffer = io.BytesIO(); guide.save(buffer); _ = buffer.seek(0)
        >>> copy = AnyOrderGuide.load(buffer)
        >>> values = torch.zeros(1, 3, dtype=torch.long); mask = torch.zeros(1, 3, dtype=torch.bool)
        >>> torch.equal(copy.log_marginals(values, mask), guide.log_marginals(values, mask))
        True
        """
        torch.save(
            {
                "config": plain(self.config),
                "edges": self.edges.cpu(),
                "state_dict": self.state_dict(),
                "loss": plain(list(self.loss_history)),
            },
            path,
        )

    @classmethod
    def load(
        cls,
        path: Any,
        model: Callable | None = None,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        map_location: Any = None,
    ) -> AnyOrderGuide:
        """Rebuild a guide saved by :meth:`save` for ``model`` (sites of the same shapes).

        Parameters
        ----------
        path : str or file
        model : callable, optional
            The model (``None`` for a guide saved without one).
        model_args, model_kwargs
            Its arguments: the data set the loaded guide answers for by default.
        map_location : optional
            Passed to ``torch.load``.

        Returns
        -------
        AnyOrderGuide

        Raises
        ------
        pickle.UnpicklingError
            When the file holds anything but tensors and plain data: it is loaded with
            ``torch.load(weights_only=True)``, so a file someone sent cannot run code.
        """
        saved = load_plain(path, map_location, "AnyOrderGuide")
        config = dict(saved["config"])
        n, q = config.pop("num_coords"), config.pop("num_values")
        if model is None:
            guide = cls(num_coords=n, num_values=q, **config)
        else:
            edges = saved["edges"] if config["architecture"] == "graph" else None
            guide = cls(model, model_args, model_kwargs, edges=edges, **config)
            if guide.num_coords != n or guide.num_values != q:
                raise ValueError(
                    f"the guide was saved for n={n}, q={q}; this model has "
                    f"n={guide.num_coords}, q={guide.num_values}"
                )
        # The context buffers belong to the data set: keep the ones just computed.
        state = {k: v for k, v in saved["state_dict"].items() if not k.startswith("context_")}
        missing, unexpected = guide.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.startswith("context_")]
        if missing or unexpected:
            raise RuntimeError(
                f"the saved guide does not fit this configuration: missing {missing}, "
                f"unexpected {unexpected}"
            )
        guide.loss_history = list(saved.get("loss", []))
        guide.eval()
        return guide


class ConditionedGuide:
    """An :class:`AnyOrderGuide` answering for other data sets: a ``MarginalOracle``.

    Built by :meth:`AnyOrderGuide.oracle` (one data set) or :meth:`AnyOrderGuide.conditioned`.
    With ``K`` data sets and ``repeats`` draws of each, it is a *family of targets*
    (``num_draws = K * repeats``; draw ``d`` conditions on data set ``d // repeats``), which
    ``sample_any_order`` samples in one run.

    Parameters
    ----------
    guide : AnyOrderGuide
    context : GuideContext
    repeats : int
        Draws per data set (families only).

    Attributes
    ----------
    num_coords, num_values : int
    num_draws : int
        Only for a family (``K * repeats > 1`` with ``K > 1``).
    device : torch.device

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec import sample_any_order
    >>> def model(y):
    ...     with pyro.plate("p", 3):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(z, 0.5), obs=y)
    >>> guide = AnyOrderGuide(model, (torch.zeros(3),))
    >>> context = guide.context_for({"y": torch.stack([torch.zeros(3), torch.ones(3)])})
    >>> family = guide.conditioned(context, repeats=50)
    >>> draws = sample_any_order(family, family.num_draws, seed=0).samples.double()
    >>> bool(draws[:50].mean() < 0.5 < draws[50:].mean())
    True
    """

    def __init__(self, guide: AnyOrderGuide, context: GuideContext, repeats: int = 1):
        if not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats must be a positive int; got {repeats!r}")
        self.guide = guide
        self.context = context
        self.repeats = repeats
        self.num_coords, self.num_values = guide.num_coords, guide.num_values
        if context.num_sets > 1:
            self.num_draws = context.num_sets * repeats

    @property
    def device(self) -> torch.device:
        return self.guide.device

    def _index(self, draws: torch.Tensor | None) -> torch.Tensor | None:
        if self.context.num_sets == 1:
            return None
        if draws is None:
            raise ValueError(
                f"this oracle is a family of {self.context.num_sets} data sets: every call "
                f"needs draws= (sample it with sample_any_order, num_samples = num_draws)"
            )
        return torch.as_tensor(draws, device=self.device).long() // self.repeats

    def log_marginals(self, values, mask, draws=None):
        """As :meth:`AnyOrderGuide.log_marginals`, for this oracle's data sets."""
        return self.guide._answer(values, mask, self.context, self._index(draws))

    def log_marginals_at(self, values, mask, targets, draws=None):
        """As :meth:`AnyOrderGuide.log_marginals_at`, for this oracle's data sets."""
        return self.guide._answer_at(values, mask, targets, self.context, self._index(draws))

    def log_marginals_chain(self, values, mask, chain, draws=None):
        """As :meth:`AnyOrderGuide.log_marginals_chain`, for this oracle's data sets."""
        return self.guide._answer_chain(values, mask, chain, self.context, self._index(draws))
