"""``EulerMaruyamaPath``: the law of a discretized SDE path as a Pyro distribution."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pyro.distributions import TorchDistribution, constraints

from pyro_autospec._shapes import broadcast_shape
from pyro_autospec.engine import keys
from pyro_autospec.engine.diffusion import (
    SampleResult,
    euler_maruyama_log_prob,
    sample_sde,
)
from pyro_autospec.engine.diffusion_schedule import check_times
from pyro_autospec.engine.methods import fold_keyword_knobs

__all__ = ["EulerMaruyamaPath"]


class EulerMaruyamaPath(TorchDistribution):
    r"""Euler-Maruyama paths of ``dX = b(t, X) dt + scale dB`` on a time grid.

    ``sample()`` runs the exact parallel sampler (:func:`~pyro_autospec.sample_sde`);
    ``log_prob(path)`` is the exact sum of the Gaussian transition log densities, differentiable
    in the path and in the drift's parameters, so the distribution can be observed or scored
    inside a Pyro model. User guide: :doc:`/diffusion`.

    Parameters
    ----------
    drift : callable
        ``b(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``, batched over rows.
    times : Tensor[N + 1]
        Strictly increasing grid ``t_0 < ... < t_N``.
    x0 : Tensor[..., d]
        Initial state; leading dimensions are the batch shape.
    scale : float
        Noise level ``s`` (step variance ``s^2 h_k``).
    method : str
        Sampler used by ``sample()``: ``"autospec"`` (default, exact in law),
        ``"sequential"`` or ``"picard"`` (approximate).
    validate_args : bool, optional
        Check that scored paths start at ``x0``.
    **sampler_options
        Further keyword arguments of :func:`~pyro_autospec.sample_sde` (``device``,
        ``dtype``, ``schedule=Schedule(rule=..., max_block=...)``, ...).

    Attributes
    ----------
    last_result : SampleResult or None
        What the latest ``sample()`` cost (rounds, rows, ...).

    Notes
    -----
    The event is the whole path, ``event_shape = (N + 1, d)``, first state included::

        log p(path) = sum_{k < N} log N(X_{k+1}; X_k + b(t_k, X_k) h_k, s^2 h_k I).

    The first state is conditioned on, not scored: it must equal ``x0`` (checked when
    ``validate_args`` is on). Randomness comes from torch's global generator, so
    ``pyro.set_rng_seed`` makes ``sample()`` reproducible. Not reparameterized: the sampler
    accepts and rejects, so there is no ``rsample``.

    Examples
    --------
    >>> import torch, pyro
    >>> times = torch.linspace(0.0, 1.0, 17)
    >>> path_dist = EulerMaruyamaPath(lambda t, x: -x, times, torch.zeros(2))
    >>> pyro.set_rng_seed(0)
    >>> paths = path_dist.sample((5,))
    >>> paths.shape
    torch.Size([5, 17, 2])
    >>> path_dist.log_prob(paths).shape
    torch.Size([5])
    """

    arg_constraints: dict = {}
    has_rsample = False

    def __init__(
        self,
        drift: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        times,
        x0,
        scale: float = 1.0,
        *,
        method: str = "autospec",
        validate_args: bool | None = None,
        **sampler_options,
    ):
        if not callable(drift):
            raise ValueError(f"drift must be callable b(t, x), got {type(drift).__name__}")
        grid = check_times(times)
        x0 = torch.as_tensor(x0)
        if not x0.is_floating_point():
            x0 = x0.to(torch.get_default_dtype())
        if x0.dim() < 1:
            raise ValueError(f"x0 must have shape [..., d], got a scalar {x0}")
        if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a positive float, got {scale!r}")
        drift_dim = getattr(drift, "dim", None)
        if drift_dim is not None and drift_dim != x0.shape[-1]:
            raise ValueError(
                f"dimension mismatch: the drift has dim = {drift_dim} but x0 has d = {x0.shape[-1]}"
            )
        self.drift = drift
        self.times = torch.as_tensor(grid, dtype=torch.float64)
        self.x0 = x0
        self.scale = float(scale)
        self.method = method
        self.sampler_options = fold_keyword_knobs(sampler_options)
        self.last_result: SampleResult | None = None
        batch_shape = x0.shape[:-1]
        event_shape = torch.Size((grid.shape[0], x0.shape[-1]))
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=2)
    def support(self):
        return constraints.independent(constraints.real, 2)

    @property
    def num_steps(self) -> int:
        """``N``, the number of steps."""
        return int(self.times.shape[0]) - 1

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = self._get_checked_instance(EulerMaruyamaPath, _instance)
        new.drift = self.drift
        new.times = self.times
        new.x0 = self.x0.expand(batch_shape + self.x0.shape[-1:])
        new.scale = self.scale
        new.method = self.method
        new.sampler_options = self.sampler_options
        new.last_result = None
        super(EulerMaruyamaPath, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def sample(self, sample_shape=()) -> torch.Tensor:
        """Exact draws, Tensor[sample_shape + batch_shape + (N + 1, d)]."""
        shape = torch.Size(sample_shape) + self.batch_shape
        num = math.prod(shape)
        dim = self.x0.shape[-1]
        if num == 0:
            return self.x0.new_zeros(shape + self.event_shape)
        starts = self.x0.expand(shape + (dim,)).reshape(num, dim)
        result = sample_sde(
            self.drift,
            self.times,
            starts,
            num,
            scale=self.scale,
            method=self.method,
            seed=keys.seed_value(None),  # torch's global stream: pyro.set_rng_seed fixes it
            return_paths=True,
            **self.sampler_options,
        )
        self.last_result = result
        return result.paths.reshape(shape + self.event_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of transition log densities: Tensor[sample_shape + batch_shape] (float64)."""
        value = torch.as_tensor(value)
        if self._validate_args:
            self._validate_sample(value)
            start = value[..., 0, :]
            if not torch.allclose(
                start.double(), self.x0.to(start.device).double().expand_as(start)
            ):
                raise ValueError(
                    "EulerMaruyamaPath.log_prob: path[..., 0, :] must equal x0 (the first state "
                    "is conditioned on, not scored)"
                )
        options = {
            k: self.sampler_options[k] for k in ("device", "dtype") if k in self.sampler_options
        }
        shape = broadcast_shape(value.shape[:-2], self.batch_shape)
        value = value.expand(shape + value.shape[-2:])
        return euler_maruyama_log_prob(self.drift, self.times, value, scale=self.scale, **options)
