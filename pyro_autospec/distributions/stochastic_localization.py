"""``StochasticLocalization``: samples of a target through its denoiser, as a Pyro distribution."""

from __future__ import annotations

import math

import torch
from pyro.distributions import TorchDistribution, constraints

from pyro_autospec.engine import keys
from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.engine.diffusion_schedule import check_times, diffusion_times
from pyro_autospec.engine.methods import fold_keyword_knobs
from pyro_autospec.engine.result import SampleResult

__all__ = ["StochasticLocalization"]


class StochasticLocalization(TorchDistribution):
    r"""The law of ``X_T / T`` for the discretized stochastic-localization chain of a denoiser.

    ``sample()`` runs :func:`~pyro_autospec.sample_diffusion` (exact parallel simulation of the
    Euler-Maruyama chain ``dX_t = f(t, X_t) dt + dB_t``, ``X_0 = 0``) and returns ``X_T / T``,
    which approximates ``mu * N(0, I / T)`` for the target ``mu`` of the denoiser. User guide:
    :doc:`/diffusion`.

    Parameters
    ----------
    denoiser : MeanOracle
        ``dim`` = d and ``denoiser(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]`` with
        ``f(t, x) = E[Y | t Y + B_t = x]``.
    times : Tensor[N + 1], optional
        Strictly increasing grid starting at 0; default :func:`~pyro_autospec.diffusion_times`
        (``num_steps`` = 256, ``delta`` = 1e-3).
    num_steps, delta : optional
        Options of the default grid (not with ``times``).
    method : str
        ``"autospec"`` (default), ``"sequential"`` or ``"picard"``.
    validate_args : bool, optional
        Passed to :class:`torch.distributions.Distribution`.
    **sampler_options
        Further keyword arguments of :func:`~pyro_autospec.sample_diffusion` (``device``,
        ``dtype``, ``schedule=Schedule(...)``, ...).

    Attributes
    ----------
    last_result : SampleResult or None
        What the latest ``sample()`` cost (rounds, rows, ...).

    Notes
    -----
    ``log_prob`` raises :class:`NotImplementedError`: the density of ``X_T / T`` integrates the
    chain over every path and has no closed form. Use the distribution to draw (for example in
    ``pyro.infer.Predictive`` or as an observed-free site under ``poutine.trace``), or score
    whole paths with :class:`~pyro_autospec.distributions.EulerMaruyamaPath`. Randomness comes
    from torch's global generator (``pyro.set_rng_seed``).

    Examples
    --------
    >>> import torch, pyro
    >>> from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser
    >>> denoiser = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    >>> pyro.set_rng_seed(0)
    >>> StochasticLocalization(denoiser, num_steps=64).sample((10,)).shape
    torch.Size([10, 2])
    """

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = False

    def __init__(
        self,
        denoiser,
        times=None,
        *,
        num_steps: int | None = None,
        delta: float | None = None,
        method: str = "autospec",
        validate_args: bool | None = None,
        **sampler_options,
    ):
        dim = getattr(denoiser, "dim", None)
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(
                f"denoiser must have an integer attribute `dim` (the MeanOracle protocol), "
                f"got {dim!r}"
            )
        if times is None:
            times = diffusion_times(
                256 if num_steps is None else num_steps, 1e-3 if delta is None else delta
            )
        elif num_steps is not None or delta is not None:
            raise ValueError("pass either `times` or (num_steps, delta), not both")
        grid = check_times(times)
        if grid[0] != 0.0:
            raise ValueError(f"times[0] must be 0 for stochastic localization, got {grid[0]:.6g}")
        self.denoiser = denoiser
        self.times = torch.as_tensor(grid, dtype=torch.float64)
        self.method = method
        self.sampler_options = fold_keyword_knobs(sampler_options)
        self.last_result: SampleResult | None = None
        super().__init__(torch.Size(), torch.Size((dim,)), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(StochasticLocalization, _instance)
        new.denoiser = self.denoiser
        new.times = self.times
        new.method = self.method
        new.sampler_options = self.sampler_options
        new.last_result = None
        super(StochasticLocalization, new).__init__(
            torch.Size(batch_shape), self.event_shape, validate_args=False
        )
        new._validate_args = self._validate_args
        return new

    def sample(self, sample_shape=()) -> torch.Tensor:
        """Draws of ``X_T / T``: Tensor[sample_shape + batch_shape + (d,)]."""
        shape = torch.Size(sample_shape) + self.batch_shape
        num = math.prod(shape)
        if num == 0:
            return torch.zeros(shape + self.event_shape, dtype=torch.float64)
        result = sample_diffusion(
            self.denoiser,
            num,
            times=self.times,
            method=self.method,
            seed=keys.seed_value(None),  # torch's global stream: pyro.set_rng_seed fixes it
            **self.sampler_options,
        )
        self.last_result = result
        return result.samples.reshape(shape + self.event_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Not available: raises :class:`NotImplementedError` (the density is intractable)."""
        raise NotImplementedError(
            "StochasticLocalization.log_prob is intractable: the law of X_T / T integrates the "
            "Euler-Maruyama chain over all paths. Use it to draw samples (sample(), "
            "pyro.infer.Predictive), or score whole paths with EulerMaruyamaPath.log_prob."
        )
