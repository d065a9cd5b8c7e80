"""``DiffusionGuide``: a learned denoiser over a Pyro model's continuous latent sites.

A *diffusion guide* is a network ``f_theta(t, x; data)`` that approximates the posterior mean
``f(t, x) = E[Y | t Y + B_t = x, data]`` of stochastic localization, where ``Y`` is the
model's latent vector (continuous sites, flattened, in unconstrained space; see
:mod:`pyro_autospec.infer.continuous`) drawn from the posterior given ``data``. For given data,
``guide.oracle(*args)`` is a :class:`~pyro_autospec.engine.protocols.MeanOracle`, so
:func:`~pyro_autospec.engine.diffusion.sample_diffusion` draws from the guide's discretized
chain EXACTLY as its sequential Euler-Maruyama sampler would, in far fewer rounds [1]_.

Training is denoising regression (the "simulation-based" route of neural posterior
estimation): from pairs ``(y_i, data_i)``, a time ``t`` and ``x = t y + sqrt(t) eps``,
minimise ``w(t) |f_theta(t, x; data) - y|^2``. The minimiser at every ``t`` is the true
denoiser, whatever the weight. Pairs come from the model's prior predictive
(:meth:`DiffusionGuide.fit_simulation`, amortised over data sets) or from posterior draws at
hand (:meth:`DiffusionGuide.fit_to_samples`, e.g. NUTS draws, for one data set).

References
----------
.. [1] N. Anari, R. Baronio, X. Chen, A. Haqi, F. Koehler, Y. Li, T.-D. Vuong. Parallel
   Sampling via Autospeculation. STOC 2026, arXiv:2511.07869.
.. [2] T. Karras, M. Aittala, T. Aila, S. Laine. Elucidating the Design Space of
   Diffusion-Based Generative Models. NeurIPS 2022 (the preconditioning used here).
.. [3] J. Benton, V. De Bortoli, A. Doucet, G. Deligiannidis. Nearly d-linear convergence
   bounds for diffusion models via stochastic localization. ICLR 2024.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from pyro.nn import PyroModule
from torch import nn

from pyro_autospec.engine import keys
from pyro_autospec.engine.diffusion_schedule import diffusion_times
from pyro_autospec.guides._files import load_plain, match_dtypes, plain, save_plain
from pyro_autospec.guides.training import seeded_generator, train
from pyro_autospec.model import (
    ContinuousLayout,
    check_layout,
    discover_continuous_sites,
    observed_data,
    simulate,
)

__all__ = ["DiffusionGuide", "ConditionedDenoiser", "WEIGHTINGS"]

WEIGHTINGS = ("girsanov", "uniform")
_NUM_FREQUENCIES = 4
#: The keys of a saved ``DiffusionGuide.config`` (every file holds them all).
_CONFIG_KEYS = (
    "hidden_dim",
    "num_layers",
    "context_dim",
    "num_steps",
    "delta",
    "max_plate_nesting",
)


class _MLP(nn.Module):
    """Residual MLP: ``in_dim -> hidden -> ... -> out_dim``."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden_dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim))
            for _ in range(num_layers)
        )
        self.out = nn.Sequential(
            nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, out_dim)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.inp(h)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def _time_features(t: torch.Tensor) -> torch.Tensor:
    """Tensor[B] -> Tensor[B, 1 + 2 * F]: ``log t`` and its Fourier features."""
    s = 0.25 * torch.log(t + 1e-3)
    freqs = torch.arange(1, _NUM_FREQUENCIES + 1, device=t.device, dtype=t.dtype)
    angles = s[:, None] * freqs
    return torch.cat([s[:, None], torch.sin(angles), torch.cos(angles)], dim=-1)


class ConditionedDenoiser:
    """A :class:`DiffusionGuide` with its data fixed: a ``MeanOracle`` over ``S`` data sets.

    For ``S = 1`` (what :meth:`DiffusionGuide.oracle` returns) ``dim = d``. For ``S > 1``
    (simulation-based calibration) ``dim = S * d``: block ``s`` of ``x`` is denoised given
    data set ``s``. The blocks do not interact, so one Euler-Maruyama path of dimension
    ``S d`` is ``S`` independent paths, one per data set.

    Attributes
    ----------
    dim : int
        ``S * d``.
    device, dtype :
        Those of the guide's parameters (the engine calls the oracle with them).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     loc = pyro.sample("loc", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    ...     pyro.sample("y", dist.Normal(loc, 1.0).to_event(1), obs=y)
    >>> guide = DiffusionGuide(model, (torch.zeros(2),), hidden_dim=8)
    >>> oracle = guide.oracle(torch.ones(2))
    >>> oracle.dim, oracle(torch.zeros(3), torch.zeros(3, 2)).shape
    (2, torch.Size([3, 2]))
    """

    def __init__(self, guide: DiffusionGuide, data: torch.Tensor):
        self.guide = guide
        self.num_datasets = int(data.shape[0])
        self.dim = self.num_datasets * guide.dim
        param = next(iter(guide.parameters()))
        self.device, self.dtype = param.device, param.dtype
        with torch.no_grad():
            self.context = guide.encode(data.to(self.device, self.dtype))  # [S, H]

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``t`` Tensor[B], ``x`` Tensor[B, S d] -> Tensor[B, S d]."""
        rows, num = x.shape[0], self.num_datasets
        x = x.to(self.device, self.dtype).reshape(rows * num, self.guide.dim)
        t = t.to(self.device, self.dtype).repeat_interleave(num)
        context = self.context.repeat(rows, 1)
        with torch.no_grad():
            out = self.guide.denoise(t, x, context)
        return out.reshape(rows, self.dim)


class DiffusionGuide(PyroModule):
    r"""A learned denoiser ``f_theta(t, x; data)`` over a model's continuous latent sites.

    Parameters
    ----------
    model : callable
        A Pyro model whose latent sites are all continuous; its data enter through ``obs=``.
    model_args : tuple
        Positional arguments of ``model`` (they fix the shapes of sites and data).
    model_kwargs : dict, optional
        Keyword arguments of ``model``.
    hidden_dim : int
        Width of the denoiser and of the data encoder.
    num_layers : int
        Residual blocks of the denoiser (the encoder has one).
    context_dim : int, optional
        Size of the data embedding (default ``hidden_dim``).
    num_steps : int
        Euler-Maruyama steps of the sampling grid ``diffusion_times(num_steps, delta)``; the
        network is trained at exactly these times.
    delta : float
        The grid ends at ``T = 1 / delta``; draws are ``X_T / T``, about the posterior
        convolved with ``N(0, delta I)`` in unconstrained space.
    max_plate_nesting : int, optional
        Found from the model when ``None``.

    Attributes
    ----------
    layout : ContinuousLayout
        Latent sites (unconstrained, flattened: ``dim`` coordinates) and data sites.
    dim : int
        ``d``, the number of unconstrained latent coordinates.
    times : DoubleTensor[num_steps + 1]
        The sampling grid.
    loss_history : list of float
        Training losses, one per iteration, appended by every ``fit_*`` call.

    Notes
    -----
    Preconditioning (after Karras et al., NeurIPS 2022, in stochastic-localization time): with
    ``m`` and ``s^2`` the per-coordinate mean and variance of the training latents,

    ``f_theta(t, x) = m + s^2 (x - t m) / (1 + t s^2)
    + s / sqrt(1 + t s^2) * F_theta(c_in (x - t m), t, e(data))``

    with ``c_in = 1 / sqrt(t (1 + t s^2))``. The first two terms are the exact denoiser of
    ``N(m, diag s^2)``; the output layer of ``F_theta`` starts at zero, so an untrained guide
    is that Gaussian. ``e`` is a small MLP encoder of the standardised, flattened data. All
    terms are finite at ``t = 0`` (``X_0 = 0``).

    Examples
    --------
    >>> import torch, pyro, pyro.distributions as dist
    >>> def model(y):
    ...     loc = pyro.sample("loc", dist.Normal(0.0, 1.0))
    ...     with pyro.plate("data", 4):
    ...         pyro.sample("y", dist.Normal(loc, 0.5), obs=y)
    >>> guide = DiffusionGuide(model, (torch.zeros(4),), hidden_dim=16, num_steps=32)
    >>> losses = guide.fit_simulation(256, num_iterations=20, seed=0, disable_progbar=True)
    >>> len(losses), guide.dim
    (20, 1)
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        *,
        hidden_dim: int = 64,
        num_layers: int = 2,
        context_dim: int | None = None,
        num_steps: int = 128,
        delta: float = 1e-3,
        max_plate_nesting: int | None = None,
    ):
        super().__init__()
        if not callable(model):
            raise TypeError(f"model must be callable; got {type(model).__name__}")
        for name, value in (("hidden_dim", hidden_dim), ("num_layers", num_layers)):
            if not isinstance(value, int) or value < (1 if name == "hidden_dim" else 0):
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        self.model = model
        self.model_args = tuple(model_args)
        self.model_kwargs = dict(model_kwargs or {})
        self.layout: ContinuousLayout = discover_continuous_sites(
            model, self.model_args, self.model_kwargs, max_plate_nesting=max_plate_nesting
        )
        self.config = {
            "hidden_dim": hidden_dim,
            "num_layers": num_layers,
            "context_dim": context_dim,
            "num_steps": num_steps,
            "delta": delta,
            "max_plate_nesting": self.layout.max_plate_nesting,
        }
        self.times = diffusion_times(num_steps, delta)
        d, data_dim = self.layout.dim, self.layout.data_dim
        context_dim = hidden_dim if context_dim is None else int(context_dim)
        self.encoder = _MLP(max(data_dim, 1), hidden_dim, context_dim, 1)
        self.network = _MLP(d + 1 + 2 * _NUM_FREQUENCIES + context_dim, hidden_dim, d, num_layers)
        nn.init.zeros_(self.network.out[-1].weight)
        nn.init.zeros_(self.network.out[-1].bias)
        self.register_buffer("latent_loc", torch.zeros(d))
        self.register_buffer("latent_scale", torch.ones(d))
        self.register_buffer("data_loc", torch.zeros(max(data_dim, 1)))
        self.register_buffer("data_scale", torch.ones(max(data_dim, 1)))
        self.register_buffer("standardized", torch.zeros((), dtype=torch.bool))
        self.loss_history: list[float] = []

    # ------------------------------------------------------------------------------ network
    @property
    def dim(self) -> int:
        """``d``: unconstrained latent coordinates."""
        return self.layout.dim

    def extra_repr(self) -> str:
        return (
            f"sites={self.layout.names}, dim={self.dim}, data_dim={self.layout.data_dim}, "
            f"num_steps={self.config['num_steps']}, delta={self.config['delta']}"
        )

    def encode(self, data: torch.Tensor) -> torch.Tensor:
        """Data embedding: Tensor[S, D] -> Tensor[S, context_dim]."""
        if self.layout.data_dim == 0:
            data = torch.zeros(data.shape[0], 1, device=data.device, dtype=data.dtype)
        return self.encoder((data - self.data_loc) / self.data_scale)

    def denoise(self, t: torch.Tensor, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``f_theta(t, x; data)``: Tensor[B], Tensor[B, d], Tensor[B, H] -> Tensor[B, d]."""
        tt = t.clamp_min(0.0)[:, None]
        loc, scale = self.latent_loc, self.latent_scale
        var = scale * scale
        centred = x - tt * loc
        one_plus = 1.0 + tt * var
        gaussian = loc + var * centred / one_plus
        scaled = centred / torch.sqrt(tt.clamp_min(1e-12) * one_plus)
        features = torch.cat([scaled, _time_features(t), context], dim=-1)
        return gaussian + scale / torch.sqrt(one_plus) * self.network(features)

    def forward(self, t: torch.Tensor, x: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
        """``f_theta(t, x; data)`` with per-row data: Tensor[B], [B, d], [B, D] -> [B, d]."""
        return self.denoise(t, x, self.encode(data))

    # ------------------------------------------------------------------------------ oracle
    def _data_for(self, args: tuple, kwargs: dict) -> torch.Tensor:
        if not args and not kwargs:
            args, kwargs = self.model_args, self.model_kwargs
        layout = discover_continuous_sites(
            self.model, args, kwargs, max_plate_nesting=self.layout.max_plate_nesting
        )
        check_layout(self.layout, layout)
        return observed_data(self.model, args, kwargs, self.layout)

    def oracle(self, *args: Any, **kwargs: Any) -> ConditionedDenoiser:
        """The ``MeanOracle`` for the data in ``args`` (default: the guide's own arguments).

        Returns
        -------
        ConditionedDenoiser
            ``dim = d``; ``oracle(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``.
        """
        return ConditionedDenoiser(self, self._data_for(args, kwargs))

    def oracle_for_data(self, data: torch.Tensor) -> ConditionedDenoiser:
        """The ``MeanOracle`` over ``S`` flattened data sets Tensor[S, D] (``dim = S d``)."""
        data = torch.as_tensor(data)
        if data.dim() != 2 or data.shape[-1] != self.layout.data_dim:
            raise ValueError(
                f"data must have shape [S, {self.layout.data_dim}], got {tuple(data.shape)}"
            )
        return ConditionedDenoiser(self, data)

    # ------------------------------------------------------------------------------ training
    def _standardize(self, y: torch.Tensor, data: torch.Tensor) -> None:
        if bool(self.standardized):
            return
        with torch.no_grad():
            self.latent_loc.copy_(y.mean(0))
            self.latent_scale.copy_(y.std(0).nan_to_num(1.0).clamp_min(1e-3))
            if self.layout.data_dim:
                self.data_loc.copy_(data.mean(0))
                self.data_scale.copy_(data.std(0).nan_to_num(1.0).clamp_min(1e-3))
            self.standardized.fill_(True)

    def _step_weights(self, weighting: str) -> tuple[torch.Tensor, torch.Tensor]:
        times = self.times[:-1]
        h = self.times.diff()
        if weighting == "girsanov":
            weights = h / h.mean()
        else:
            weights = torch.ones_like(h)
        return times, weights

    def fit(
        self,
        y: torch.Tensor,
        data: torch.Tensor,
        *,
        num_iterations: int = 2000,
        batch_size: int = 256,
        lr: float = 3e-3,
        lr_decay: float = 0.0,
        weighting: str = "girsanov",
        seed: int | None = None,
        disable_progbar: bool = False,
    ) -> list[float]:
        r"""Denoising regression on pairs ``(y_i, data_i)``: Tensor[M, d], Tensor[M, D].

        Each iteration draws ``batch_size`` pairs, a grid index ``k`` uniform over the
        ``num_steps`` times at which the sampler queries the oracle (``t_0 = 0, ...,
        t_{N-1}``), and ``x = t_k y + sqrt(t_k) eps``; the loss is

        ``mean w_k sum_j ((f_theta(t_k, x; data) - y)_j / s_j)^2``

        with ``s`` the latents' scale. ``weighting="girsanov"`` (default) sets ``w_k``
        proportional to the step ``h_k``: then the expected loss is, up to a constant and the
        scaling ``s``, twice the KL divergence between the exact chain and the guide's chain
        (Girsanov: ``sum_k h_k E|f - f_theta|^2 / 2``). ``"uniform"`` sets ``w_k = 1``. On the
        first call the latents' and data's means and scales are stored (buffers). The shared
        Adam loop (:func:`~pyro_autospec.guides.training.train`) runs ``num_iterations``
        steps; the rate falls along a cosine from ``lr`` to ``lr * lr_decay``.

        Returns
        -------
        list of float
            The loss of every iteration (also appended to ``loss_history``).
        """
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}; got {weighting!r}")
        if not isinstance(num_iterations, int) or num_iterations < 1:
            raise ValueError(f"num_iterations must be a positive int; got {num_iterations!r}")
        param = next(iter(self.parameters()))
        y = torch.as_tensor(y).to(param.device, param.dtype)
        data = torch.as_tensor(data).to(param.device, param.dtype)
        if y.dim() != 2 or y.shape[-1] != self.dim or data.shape != (y.shape[0], data.shape[-1]):
            raise ValueError(
                f"expected y: Tensor[M, {self.dim}] and data: Tensor[M, {self.layout.data_dim}]; "
                f"got {tuple(y.shape)} and {tuple(data.shape)}"
            )
        if not (torch.isfinite(y).all() and torch.isfinite(data).all()):
            raise ValueError("training latents or data contain NaN or inf")
        self._standardize(y, data)
        times, weights = self._step_weights(weighting)
        times = times.to(param.device, param.dtype)
        weights = weights.to(param.device, param.dtype)
        if seed is None:  # a generator on the device all the same, seeded from torch's stream
            seed = keys.seed_value(None)
        gen = seeded_generator(seed, param.device)
        num = y.shape[0]

        def step_loss(step: int):
            index = torch.randint(0, num, (batch_size,), generator=gen, device=param.device)
            k = torch.randint(0, times.shape[0], (batch_size,), generator=gen, device=param.device)
            t, yb = times[k], y[index]
            eps = torch.randn(yb.shape, generator=gen, device=param.device, dtype=param.dtype)
            x = t[:, None] * yb + torch.sqrt(t)[:, None] * eps
            pred = self(t, x, data[index])
            resid = (pred - yb) / self.latent_scale
            loss = (weights[k] * (resid * resid).sum(-1)).mean()
            return loss, float(loss.detach())

        return train(
            self,
            step_loss,
            num_steps=num_iterations,
            lr=lr,
            lr_decay=lr_decay,
            desc="fit",
            disable_progbar=disable_progbar,
        )

    def fit_simulation(
        self,
        num_simulations: int,
        *args: Any,
        num_iterations: int = 2000,
        batch_size: int = 256,
        lr: float = 3e-3,
        lr_decay: float = 0.0,
        weighting: str = "girsanov",
        seed: int | None = None,
        disable_progbar: bool = False,
        vectorize: bool = True,
        **kwargs: Any,
    ) -> list[float]:
        """Train on ``num_simulations`` prior predictive pairs ``(latent, data)`` (amortised).

        Parameters
        ----------
        num_simulations : int
            Pairs drawn once from the model's prior predictive (a fixed training set).
        *args, **kwargs
            The model's arguments (default: those the guide was built with); the observed
            values are ignored, covariates and sizes are used.
        num_iterations, batch_size, lr, lr_decay, weighting, seed, disable_progbar :
            As in :meth:`fit`.
        vectorize : bool
            Simulate in one vectorised trace (see :func:`~pyro_autospec.model.continuous.simulate`).

        Returns
        -------
        list of float
            The loss of every iteration.
        """
        if not args and not kwargs:
            args, kwargs = self.model_args, self.model_kwargs
        y, data = simulate(
            self.model, args, kwargs, self.layout, num_simulations, seed=seed, vectorize=vectorize
        )
        return self.fit(
            y,
            data,
            num_iterations=num_iterations,
            batch_size=batch_size,
            lr=lr,
            lr_decay=lr_decay,
            weighting=weighting,
            seed=seed,
            disable_progbar=disable_progbar,
        )

    def fit_to_samples(
        self,
        samples: Mapping[str, torch.Tensor],
        *args: Any,
        num_iterations: int = 2000,
        batch_size: int = 256,
        lr: float = 3e-3,
        lr_decay: float = 0.0,
        weighting: str = "girsanov",
        seed: int | None = None,
        disable_progbar: bool = False,
        **kwargs: Any,
    ) -> list[float]:
        """Train on posterior draws at hand (e.g. ``MCMC(NUTS(model)).get_samples()``).

        Parameters
        ----------
        samples : dict
            ``name -> Tensor[M, *site.shape]`` (constrained values) for every latent site.
        *args, **kwargs
            The model's arguments whose data the draws are conditioned on (default: the
            guide's own).
        num_iterations, batch_size, lr, lr_decay, weighting, seed, disable_progbar :
            As in :meth:`fit`.

        Returns
        -------
        list of float
            The loss of every iteration.
        """
        data = self._data_for(args, kwargs)
        y = self.layout.to_unconstrained(samples).to(torch.get_default_dtype())
        return self.fit(
            y,
            data.expand(y.shape[0], -1),
            num_iterations=num_iterations,
            batch_size=batch_size,
            lr=lr,
            lr_decay=lr_decay,
            weighting=weighting,
            seed=seed,
            disable_progbar=disable_progbar,
        )

    # ------------------------------------------------------------------------------ save/load
    def save(self, path: str) -> None:
        """Save the configuration, the ``state_dict`` and the loss history to ``path``.

        The file also holds a SHA-256 checksum of all of them, which :meth:`load` checks.
        """
        save_plain(
            {
                "config": plain(self.config),
                "state_dict": self.state_dict(),
                "loss": plain(list(self.loss_history)),
            },
            path,
        )

    @classmethod
    def load(
        cls,
        path: str,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        map_location: Any = None,
    ) -> DiffusionGuide:
        """Rebuild a guide saved by :meth:`save` for ``model`` (same site and data shapes).

        The file is read with ``torch.load(weights_only=True)``: a file that holds anything but
        tensors and plain data is refused (``pickle.UnpicklingError``) and runs no code. The
        loaded guide has the saved weights, in the saved dtypes (a guide saved in float64 loads
        in float64), on torch's default device (the CPU unless set): ``map_location`` only
        says where ``torch.load`` reads the tensors; move the guide with ``.to(device)``.

        Parameters
        ----------
        path : str or file
        model : callable
            The model the guide was built for.
        model_args, model_kwargs
            Its arguments: the data set the loaded guide answers for by default.
        map_location : optional
            Passed to ``torch.load``.

        Returns
        -------
        DiffusionGuide

        Raises
        ------
        pickle.UnpicklingError
            When the file holds anything but tensors and plain data.
        ValueError
            When the file is damaged (its checksum does not match, it is truncated) or not a
            guide file (its config lacks one of the keys :meth:`save` writes, for one).
        """
        saved = load_plain(path, map_location, "DiffusionGuide", _CONFIG_KEYS, _CONFIG_KEYS)
        guide = cls(model, model_args, model_kwargs, **saved["config"])
        match_dtypes(guide, saved["state_dict"], "DiffusionGuide", path)
        guide.load_state_dict(saved["state_dict"])
        guide.loss_history = list(saved.get("loss", []))
        guide.eval()
        return guide
