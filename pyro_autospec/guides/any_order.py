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

``"graph"`` is the default because it reached the lowest KL at equal training time
(``python benchmarks/guides.py --parts training``; the figures are in :doc:`/benchmarks`).

This module holds the guide's construction, its network and its oracle queries; its losses
and trainers are :mod:`pyro_autospec.guides.any_order_training`, its ``save`` and ``load``
:mod:`pyro_autospec.guides.any_order_checkpoint` (both methods of :class:`AnyOrderGuide`).

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
from typing import Any

import torch
from pyro.nn import PyroModule

from pyro_autospec.engine.protocols import chain_rows
from pyro_autospec.guides.any_order_checkpoint import GuideCheckpoint
from pyro_autospec.guides.any_order_training import GuideTraining
from pyro_autospec.guides.networks import GraphNet, GuideContext, MaskedTransformer, ResidualMLP
from pyro_autospec.guides.structure import (
    probe_potentials,
    probe_structure,
)
from pyro_autospec.model import SiteLayout, discover_sites

__all__ = ["AnyOrderGuide", "ConditionedGuide", "GuideContext", "ARCHITECTURES"]

ARCHITECTURES = ("graph", "mlp", "transformer")
_DEFAULT_HIDDEN = {"graph": 32, "mlp": 128, "transformer": 64}
_DEFAULT_LAYERS = {"graph": 0, "mlp": 2, "transformer": 2}


class AnyOrderGuide(GuideTraining, GuideCheckpoint, PyroModule):
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

    **Saving and loading.** :meth:`save` writes the configuration, the weights, the edges,
    the names of the model's sample sites, the loss history and a SHA-256 checksum of them
    all; :meth:`load` rebuilds the guide for a model with the same sites (names and shapes),
    without probing every pair again, in the saved dtypes, and refuses a file that does not
    match its checksum or was saved for a model with other sites. The checksum detects a
    damaged file, not a deliberate change; a file without one is refused too. A guide built
    from a model
    must be loaded with one (without it the network would read no data). A ``state_dict``
    alone also loads into a guide built with the same model, data shapes and arguments.

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

    #: Its row, targeted and chain queries are one network's answers, checked to agree by
    #: tests/oracles/test_conformance.py: the engine skips its consistency check.
    consistent_queries = True
    #: It reads its inputs only during a call: the engine may reuse them.
    borrows_inputs = True

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
            ("chunk_size", chunk_size, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
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

    #: Its queries are the guide network's, checked to agree by the guide tests: the engine
    #: skips its consistency check (a training step samples through one).
    consistent_queries = True
    #: It reads its inputs only during a call: the engine may reuse them.
    borrows_inputs = True

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
