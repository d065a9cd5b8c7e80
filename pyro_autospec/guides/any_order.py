"""``AnyOrderGuide``: a learned any-order oracle over a Pyro model's discrete latent sites.

A *guide network* is an any-order autoregressive network ``q(x_i | x_S)``: for every subset
``S`` of pinned coordinates it returns the conditional marginals of every coordinate. It is a
:class:`~pyro_autospec.oracles.base.MarginalOracle`, so autospeculation samples it exactly
(with respect to its own sequential law in a uniformly random order, even though a network
need not be consistent across orders; see :doc:`/algorithm`), and every draw comes with
``log q_sigma(x)``, so ``log p(x, data) - log q_sigma(x)`` is a valid log importance weight.

Two architectures, both one forward pass per query row:

* ``"mlp"`` (default): the order-agnostic NADE of Uria, Murray and Larochelle [1]_: the
  one-hot values of the pinned coordinates and the mask go into a residual MLP that returns
  the logits of every coordinate. Cheap (``O(n q h + h^2)`` per row); the architecture to
  use on CPU.
* ``"transformer"``: a masked transformer encoder: each coordinate is a token, its embedding
  the value embedding (a learned ``MASK`` token where unpinned) plus a learned position
  embedding. ``O(n^2 h)`` per row; worth it on a GPU or for long-range structure.

References
----------
.. [1] B. Uria, I. Murray, H. Larochelle. A Deep and Tractable Density Estimator. ICML 2014.
.. [2] N. Anari, C. Baronio, CJ Chen, A. Haqi, F. Koehler, A. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro.nn import PyroModule
from torch import nn

__all__ = ["AnyOrderGuide"]

_ARCHITECTURES = ("mlp", "transformer")


class _ResidualMLP(nn.Module):
    """Order-agnostic NADE body: [one-hot pinned values, mask] -> logits [B, n, q]."""

    def __init__(self, n: int, q: int, hidden_dim: int, num_layers: int):
        super().__init__()
        self.n, self.q = n, q
        self.inp = nn.Linear(n * (q + 1), hidden_dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim))
            for _ in range(num_layers)
        )
        self.out = nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, n * q))

    def _hidden(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b = values.shape[0]
        dtype = self.inp.weight.dtype
        onehot = nn.functional.one_hot(values.clamp(0, self.q - 1), self.q).to(dtype)
        onehot = onehot * mask.unsqueeze(-1).to(dtype)
        h = self.inp(torch.cat([onehot.reshape(b, -1), mask.to(dtype)], dim=-1))
        for block in self.blocks:
            h = h + block(h)
        return self.out[:-1](h)  # [B, h], before the last linear layer

    def forward(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out[-1](self._hidden(values, mask)).reshape(values.shape[0], self.n, self.q)

    def forward_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Logits of the ``targets`` [B, k] only: [B, k, q] (the last layer's rows of them)."""
        h = self._hidden(values, mask)
        last = self.out[-1]
        weight = last.weight.reshape(self.n, self.q, -1)[targets]  # [B, k, q, h]
        bias = last.bias.reshape(self.n, self.q)[targets]  # [B, k, q]
        return torch.einsum("bh,bkqh->bkq", h, weight) + bias


class _MaskedTransformer(nn.Module):
    """Masked transformer body: one token per coordinate -> logits [B, n, q]."""

    def __init__(self, n: int, q: int, hidden_dim: int, num_layers: int, num_heads: int):
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(
                f"hidden_dim ({hidden_dim}) must be a multiple of num_heads ({num_heads})"
            )
        self.n, self.q = n, q
        self.value_embedding = nn.Embedding(q + 1, hidden_dim)  # index q is the MASK token
        self.position_embedding = nn.Parameter(torch.randn(n, hidden_dim) * 0.1)
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

    def _encode(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tokens = torch.where(mask, values.clamp(0, self.q - 1), torch.full_like(values, self.q))
        return self.encoder(self.value_embedding(tokens) + self.position_embedding)

    def forward(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.out(self._encode(values, mask))

    def forward_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Logits of the ``targets`` [B, k] only: [B, k, q] (the head on those tokens)."""
        h = self._encode(values, mask)
        picked = h.gather(1, targets.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        return self.out(picked)


class AnyOrderGuide(PyroModule):
    """A learned any-order oracle ``q(x_i | x_S)`` over a model's discrete latent sites.

    The guide covers the same coordinates as :class:`~pyro_autospec.infer.AutoSpec` (sites in
    trace order, each flattened in C order, values as support indices; see
    :mod:`pyro_autospec.infer.sites`), so ``AutoSpec(model, guide=guide)`` samples it.

    Parameters
    ----------
    model : callable or SiteLayout, optional
        The Pyro model whose discrete latent sites the guide covers (traced once with
        ``model_args``), or a :class:`~pyro_autospec.infer.sites.SiteLayout`. ``None``
        builds a bare oracle on ``[num_values]^num_coords`` (for tests and non-Pyro use).
    model_args : tuple
        Positional arguments of ``model`` (the data fix the sites' shapes).
    model_kwargs : dict, optional
        Keyword arguments of ``model``.
    architecture : {"mlp", "transformer"}
        See the module docstring.
    hidden_dim : int
        Width of the network.
    num_layers : int
        Residual blocks (``"mlp"``) or encoder layers (``"transformer"``).
    num_heads : int
        Attention heads (``"transformer"`` only).
    num_coords, num_values : int, optional
        ``n`` and ``q`` when ``model`` is ``None``.
    max_plate_nesting : int, optional
        Passed to :func:`~pyro_autospec.infer.sites.discover_sites`.
    chunk_size : int
        Largest number of rows per forward pass inside :meth:`log_marginals` (bounds memory).

    Attributes
    ----------
    layout : SiteLayout or None
        The coordinate mapping (``None`` for a bare oracle).
    num_coords, num_values : int
        ``n`` and ``q`` (the :class:`~pyro_autospec.oracles.base.MarginalOracle` protocol).
    loss_history : list of float
        Training losses, one per step, appended by every ``fit_*`` call.

    Notes
    -----
    The output is a deterministic function of ``(values where mask, mask)``: values at
    unpinned positions never reach the network (the MLP zeroes their one-hot codes, the
    transformer replaces them by a ``MASK`` token). Values outside a coordinate's support get
    ``-inf``. The network is only *approximately* consistent across orders; autospeculation is
    exact for its sequential law in the random order used, ``(x, sigma) ~ Uniform(sigma)
    q_sigma(x)``, and the draws' ``log q_sigma(x)`` make importance weights against the model
    (see :doc:`/algorithm`; :class:`~pyro_autospec.infer.AutoSpec` with ``correction=``).

    **Saving and loading.** The guide is an ``nn.Module``: save ``guide.state_dict()`` with
    ``torch.save`` and load it into a guide built with the same model, data shapes and
    architecture arguments (``load_state_dict`` checks every tensor's shape). The loss history
    is not part of the state dict.

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> from pyro_autospec import sample_any_order
    >>> def model(data):
    ...     with pyro.plate("pixels", len(data)):
    ...         z = pyro.sample("z", dist.Bernoulli(0.5))
    ...         pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=data)
    >>> data = torch.tensor([1.0, -1.0, 0.5])
    >>> guide = AnyOrderGuide(model, (data,), hidden_dim=16)
    >>> guide.num_coords, guide.num_values
    (3, 2)
    >>> empty = torch.zeros(2, 3, dtype=torch.long)
    >>> rows = guide.log_marginals(empty, empty.bool())
    >>> rows.shape
    torch.Size([2, 3, 2])
    >>> sample_any_order(guide, 4, seed=0).samples.shape
    torch.Size([4, 3])
    >>> import io
    >>> buffer = io.BytesIO(); torch.save(guide.state_dict(), buffer); _ = buffer.seek(0)
    >>> copy = AnyOrderGuide(model, (data,), hidden_dim=16)
    >>> copy.load_state_dict(torch.load(buffer))
    <All keys matched successfully>
    """

    def __init__(
        self,
        model: Callable | Any = None,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        *,
        architecture: str = "mlp",
        hidden_dim: int = 128,
        num_layers: int = 2,
        num_heads: int = 4,
        num_coords: int | None = None,
        num_values: int | None = None,
        max_plate_nesting: int | None = None,
        chunk_size: int = 4096,
    ):
        super().__init__()
        from pyro_autospec.infer.sites import SiteLayout, discover_sites

        if architecture not in _ARCHITECTURES:
            raise ValueError(f"architecture must be one of {_ARCHITECTURES}; got {architecture!r}")
        for name, value in (("hidden_dim", hidden_dim), ("num_layers", num_layers)):
            if not isinstance(value, int) or value < (1 if name == "hidden_dim" else 0):
                raise ValueError(f"{name} must be a positive int; got {value!r}")
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
        self.num_coords, self.num_values = n, q
        self.architecture = architecture
        self.config = {
            "architecture": architecture,
            "hidden_dim": hidden_dim,
            "num_layers": num_layers,
            "num_heads": num_heads,
        }
        self.chunk_size = int(chunk_size)
        outside = torch.arange(q)[None, :] >= sizes[:, None]
        self.register_buffer("outside_support", outside, persistent=False)
        if architecture == "mlp":
            self.net = _ResidualMLP(n, q, hidden_dim, num_layers)
        else:
            self.net = _MaskedTransformer(n, q, hidden_dim, num_layers, num_heads)
        self.loss_history: list[float] = []
        self.eval()  # an oracle by default; the fit_* methods switch to train mode and back

    @property
    def device(self) -> torch.device:
        """The device of the guide's parameters (where the engine builds its queries)."""
        return next(self.parameters()).device

    def extra_repr(self) -> str:
        return (
            f"num_coords={self.num_coords}, num_values={self.num_values}, "
            f"architecture={self.architecture!r}"
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

    def forward(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Differentiable log conditional marginals (one forward pass per row).

        Parameters
        ----------
        values : LongTensor[B, n]
            Support indices; only the entries where ``mask`` is True are read.
        mask : BoolTensor[B, n]
            True where pinned.

        Returns
        -------
        Tensor[B, n, q]
            ``log q(X_i = v | X_S = values_S)``, normalised per ``(b, i)`` by ``log_softmax``,
            ``-inf`` outside each coordinate's support.
        """
        self._check_query(values, mask)
        device = self.device
        values, mask = values.to(device).long(), mask.to(device)
        logits = self.net(values, mask)
        logits = logits.masked_fill(self.outside_support, -math.inf)
        return torch.log_softmax(logits, dim=-1)

    def log_marginals(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The :class:`~pyro_autospec.oracles.base.MarginalOracle` query (no gradients).

        Parameters
        ----------
        values : LongTensor[B, n]
        mask : BoolTensor[B, n]

        Returns
        -------
        Tensor[B, n, q]
            As :meth:`forward`, computed in chunks of ``chunk_size`` rows under
            ``torch.no_grad()``.

        Examples
        --------
        >>> guide = AnyOrderGuide(num_coords=4, num_values=3, hidden_dim=8)
        >>> values = torch.tensor([[2, 0, 1, 1]]); mask = torch.tensor([[True, False, False, True]])
        >>> out = guide.log_marginals(values, mask)
        >>> out.shape, bool(torch.allclose(out.exp().sum(-1), torch.ones(1, 4)))
        (torch.Size([1, 4, 3]), True)
        """
        self._check_query(values, mask)
        with torch.no_grad():
            parts = [
                self.forward(values[i : i + self.chunk_size], mask[i : i + self.chunk_size])
                for i in range(0, values.shape[0], self.chunk_size)
            ]
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """Rows of just the ``targets`` (no gradients): the engine's targeted query.

        The network's body runs once per row as in :meth:`log_marginals`; only the output
        layer (``"mlp"``) or head (``"transformer"``) is evaluated, for the targets alone
        (the sequential sampler asks for one target per row, autospeculation for a block).

        Parameters
        ----------
        values : LongTensor[B, n]
        mask : BoolTensor[B, n]
        targets : LongTensor[B, k]
            Coordinate indices (repeats allowed).

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
        self._check_query(values, mask)
        targets = torch.as_tensor(targets)
        if targets.dim() != 2 or targets.shape[0] != values.shape[0]:
            raise ValueError(
                f"targets must be a LongTensor[B, k] with B = {values.shape[0]}; got shape "
                f"{tuple(targets.shape)}"
            )
        device = self.device
        values, mask = values.to(device).long(), mask.to(device)
        targets = targets.to(device).long()
        # Bound the gathered output weights ([rows, k, q, h] for the MLP) like the chunk size.
        k = max(1, targets.shape[1])
        step = max(1, min(self.chunk_size, (self.chunk_size * 16) // k))
        parts = []
        with torch.no_grad():
            for i in range(0, values.shape[0], step):
                sl = slice(i, i + step)
                logits = self.net.forward_at(values[sl], mask[sl], targets[sl])
                logits = logits.masked_fill(self.outside_support[targets[sl]], -math.inf)
                parts.append(torch.log_softmax(logits, dim=-1))
        if not parts:
            return torch.empty(0, targets.shape[1], self.num_values, device=device)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def sequential_log_prob(
        self,
        values: torch.Tensor,
        orders: torch.Tensor,
        positions: torch.Tensor | None = None,
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
        rows = self.forward(
            values.unsqueeze(1).expand(num, k, n).reshape(-1, n), mask.reshape(-1, n)
        ).reshape(num, k, n, -1)
        picked = rows.gather(2, target[:, :, None, None].expand(num, k, 1, rows.shape[-1]))
        picked = picked.squeeze(2)  # [N, k, q]
        return picked.gather(2, values.gather(1, target).unsqueeze(-1)).squeeze(-1)

    def any_order_loss(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The any-order negative log likelihood, one random order and cut per draw
        (the order-agnostic NADE objective of Uria, Murray and Larochelle, ICML 2014).

        For each draw a uniformly random order ``sigma`` and cut ``t ~ Uniform{0..n-1}`` give
        the pinned set ``S = sigma_{1..t}``; the estimate ``-(n / (n - t)) sum_{i not in S}
        log q(x_i | x_S)`` is unbiased for ``E_sigma[-log q_sigma(x)]``.

        Parameters
        ----------
        values : LongTensor[N, n]
        weights : Tensor[N], optional
            Per-draw weights (e.g. self-normalised importance weights); default ``1 / N``.
        generator : torch.Generator, optional
            For the orders and cuts.

        Returns
        -------
        Tensor[]
            The weighted loss (differentiable).
        """
        values = values.to(self.device).long()
        num, n = values.shape
        ranks = torch.rand(num, n, generator=generator).argsort(-1).to(self.device)
        cut = torch.randint(0, n, (num, 1), generator=generator).to(self.device)
        mask = ranks < cut
        log_rows = self.forward(values, mask)
        picked = log_rows.gather(-1, values.unsqueeze(-1)).squeeze(-1)
        picked = picked.masked_fill(mask, 0.0)
        per_draw = -(n / (n - cut.squeeze(1)).to(picked.dtype)) * picked.sum(-1)
        if weights is None:
            return per_draw.mean()
        return (weights.to(per_draw) * per_draw).sum()

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
        weights: torch.Tensor | None = None,
        seed: int | None = None,
        disable_progbar: bool = False,
    ) -> list[float]:
        """Maximum likelihood in uniformly random orders, for draws you already have.

        Minimises :meth:`any_order_loss` with Adam on minibatches drawn from ``samples``.

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
        from tqdm.auto import tqdm

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
        optim = torch.optim.Adam(self.parameters(), lr=lr)
        losses: list[float] = []
        self.train()
        bar = tqdm(range(int(num_steps)), desc="fit_to_samples", disable=disable_progbar)
        for _ in bar:
            idx = torch.multinomial(probs, batch_size, replacement=True, generator=gen)
            loss = self.any_order_loss(samples[idx.to(samples.device)], generator=gen)
            optim.zero_grad()
            loss.backward()
            optim.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        self.eval()
        self.loss_history.extend(losses)
        return losses

    def fit_posterior(self, *args: Any, **kwargs: Any) -> list[float]:
        """Fit the guide to the model's posterior given the data; see
        :func:`pyro_autospec.guides.training.fit_posterior` for the options."""
        from pyro_autospec.guides.training import fit_posterior

        return fit_posterior(self, *args, **kwargs)
