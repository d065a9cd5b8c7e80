"""Exact conditional-mean oracles (denoisers) for stochastic localization.

For ``Y ~ mu`` on ``R^d`` and a standard Brownian motion ``B``, stochastic localization observes
``X_t = t Y + B_t``. Given ``X_t = x`` the likelihood of ``Y = y`` is proportional to
``exp(<x, y> - t |y|^2 / 2)``, so the posterior mean ``f(t, x) = E[Y | X_t = x]`` has a closed
form for three families of targets (see :doc:`/diffusion`):

* :class:`GaussianDenoiser`: ``Y ~ N(m, C)``, ``f(t, x) = m + C (t C + I)^{-1} (x - t m)``;
* :class:`GaussianMixtureDenoiser`: responsibilities times the per-component Gaussian formula;
* :class:`FiniteSupportDenoiser`: ``Y`` uniform (or weighted) on a point cloud ``{y_j}``,
  ``f(t, x) = sum_j w_j(t, x) y_j`` with ``w_j`` proportional to
  ``pi_j exp(<x, y_j> - t |y_j|^2 / 2)``.

All three satisfy the :class:`~pyro_autospec.engine.protocols.MeanOracle` protocol: ``dim``, and
``__call__(t: Tensor[B], x: Tensor[B, d]) -> Tensor[B, d]``. They are batched, work in log space
(``logsumexp``), are exact at ``t = 0`` and for singular covariances, default to float64, and
live on any device: ``.to(device, dtype)`` returns a copy. Every one also has
``sample(num_samples, seed)``, exact draws of ``Y`` for comparisons. This module does not
import Pyro.

References
----------
1. N. Anari et al. "Parallel Sampling via Autospeculation." arXiv:2511.07869 (STOC 2026).
2. A. Montanari. "Sampling, diffusions, and stochastic localization." arXiv:2305.10690 (2023).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ._util import numpy_generator

__all__ = ["GaussianDenoiser", "GaussianMixtureDenoiser", "FiniteSupportDenoiser"]


def _as_float_tensor(value, name: str, dtype: torch.dtype | None, device) -> torch.Tensor:
    tensor = torch.as_tensor(value)
    dtype = torch.float64 if dtype is None else dtype
    tensor = tensor.to(device=device if device is not None else tensor.device, dtype=dtype)
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} contains NaN or inf; pass finite values")
    return tensor


def _check_weights(weights, size: int, name: str, dtype, device) -> torch.Tensor:
    if weights is None:
        return torch.full((size,), 1.0 / size, dtype=dtype, device=device)
    weights = _as_float_tensor(weights, name, dtype, device)
    if weights.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {tuple(weights.shape)}")
    if (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"{name} must be non-negative with a positive sum")
    return weights / weights.sum()


def _check_inputs(t: torch.Tensor, x: torch.Tensor, dim: int, like: torch.Tensor):
    if x.dim() != 2 or x.shape[-1] != dim:
        raise ValueError(f"x must have shape [B, {dim}], got {tuple(x.shape)}")
    if t.dim() == 0:
        t = t.expand(x.shape[0])
    if t.shape != (x.shape[0],):
        raise ValueError(f"t must have shape [B] = [{x.shape[0]}], got {tuple(t.shape)}")
    return t.to(like), x.to(like)


class _Denoiser:
    """Shared plumbing: ``dim``, ``device``, ``dtype``, ``to``; inference-safe (pure
    functions of their parameters, see :class:`~pyro_autospec.engine.protocols.MeanOracle`)."""

    dim: int
    inference_safe = True

    def _tensors(self) -> dict[str, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """The device of the parameters (and of the outputs)."""
        return next(iter(self._tensors().values())).device

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype of the parameters (and of the outputs)."""
        return next(iter(self._tensors().values())).dtype

    def to(self, device=None, dtype: torch.dtype | None = None):
        """Return a copy with every parameter moved to ``device`` / cast to ``dtype``."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name, tensor in self._tensors().items():
            setattr(new, name, tensor.to(device=device, dtype=dtype))
        return new


class GaussianMixtureDenoiser(_Denoiser):
    r"""Exact posterior mean for a Gaussian mixture ``Y ~ sum_k pi_k N(m_k, C_k)``.

    Parameters
    ----------
    weights : Tensor[K]
        Non-negative mixture weights (normalised here).
    means : Tensor[K, d]
        Component means ``m_k``.
    covs : Tensor[K, d, d]
        Symmetric positive semi-definite component covariances ``C_k`` (singular is fine).
    dtype : torch.dtype, optional
        Dtype of the parameters and outputs; default float64 (exact tests need it; pass
        ``torch.float32`` for speed on accelerators).
    device : torch.device or str, optional
        Device of the parameters; default: that of ``means``.

    Notes
    -----
    With ``C_k = U_k diag(lambda_k) U_k^T`` and ``w = U_k^T (x - t m_k)``, integrating the
    likelihood ``exp(<x, y> - t |y|^2 / 2)`` against ``N(m_k, C_k)`` gives

    ``log L_k(t, x) = <x, m_k> - t |m_k|^2 / 2 - 1/2 sum_i log(1 + t lambda_i)
    + 1/2 sum_i w_i^2 lambda_i / (1 + t lambda_i)``

    and the component posterior mean ``m_k + U_k diag(lambda_k / (1 + t lambda_k)) w``. The
    responsibilities are ``softmax_k(log pi_k + log L_k)``. Everything stays finite at ``t = 0``
    (``f(0, x) = E[Y]``) and for zero eigenvalues.

    Examples
    --------
    >>> import torch
    >>> oracle = GaussianMixtureDenoiser(
    ...     torch.tensor([0.5, 0.5]),
    ...     torch.tensor([[-2.0, 0.0], [2.0, 0.0]]),
    ...     0.1 * torch.eye(2).expand(2, 2, 2),
    ... )
    >>> oracle(torch.zeros(1), torch.zeros(1, 2))  # at t = 0: the mean of Y
    tensor([[0., 0.]], dtype=torch.float64)
    >>> oracle(torch.tensor([50.0]), torch.tensor([[100.0, 0.0]])).round()
    tensor([[2., 0.]], dtype=torch.float64)
    """

    def __init__(self, weights, means, covs, *, dtype: torch.dtype | None = None, device=None):
        means = _as_float_tensor(means, "means", dtype, device)
        if means.dim() != 2:
            raise ValueError(f"means must have shape [K, d], got {tuple(means.shape)}")
        num_components, dim = means.shape
        covs = _as_float_tensor(covs, "covs", means.dtype, means.device)
        if covs.shape != (num_components, dim, dim):
            raise ValueError(
                f"covs must have shape [K, d, d] = [{num_components}, {dim}, {dim}], "
                f"got {tuple(covs.shape)}"
            )
        scale = covs.abs().amax().clamp_min(1.0)
        if not torch.allclose(covs, covs.transpose(-1, -2), atol=1e-10 * float(scale)):
            raise ValueError("covs must be symmetric; pass (C + C.T) / 2")
        eigenvalues, eigenvectors = torch.linalg.eigh(covs)
        if (eigenvalues < -1e-10 * scale).any():
            raise ValueError(
                "covs must be positive semi-definite; got an eigenvalue "
                f"{eigenvalues.min().item():.3g}"
            )
        self.dim = int(dim)
        self.num_components = int(num_components)
        self.weights = _check_weights(weights, num_components, "weights", means.dtype, means.device)
        self.means = means
        self.covs = covs
        self.eigenvalues = eigenvalues.clamp_min(0.0)
        self.eigenvectors = eigenvectors

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {
            "means": self.means,
            "weights": self.weights,
            "covs": self.covs,
            "eigenvalues": self.eigenvalues,
            "eigenvectors": self.eigenvectors,
        }

    def _components(self, t: torch.Tensor, x: torch.Tensor):
        """Per-component log likelihoods Tensor[B, K] and posterior means Tensor[B, K, d]."""
        t = t[:, None]  # [B, 1]
        m, lam, U = self.means, self.eigenvalues, self.eigenvectors  # [K,d], [K,d], [K,d,d]
        centred = x[:, None, :] - t[..., None] * m  # [B, K, d]
        w = torch.einsum("kij,bki->bkj", U, centred)  # U^T (x - t m)  [B, K, d]
        one_plus = 1.0 + t[..., None] * lam  # [B, K, d]
        shrink = lam / one_plus
        log_lik = (
            x @ m.T
            - 0.5 * t * (m * m).sum(-1)
            - 0.5 * torch.log(one_plus).sum(-1)
            + 0.5 * (w * w * shrink).sum(-1)
        )
        post = m + torch.einsum("kij,bkj->bki", U, shrink * w)
        return log_lik, post

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``E[Y | t Y + B_t = x]``: ``t`` Tensor[B], ``x`` Tensor[B, d] -> Tensor[B, d]."""
        t, x = _check_inputs(t, x, self.dim, self.means)
        log_lik, post = self._components(t, x)
        resp = torch.softmax(torch.log(self.weights) + log_lik, dim=-1)  # [B, K]
        return torch.einsum("bk,bkd->bd", resp, post)

    def sample(self, num_samples: int, seed=None) -> torch.Tensor:
        """Exact draws of ``Y``: Tensor[num_samples, d] (float64 NumPy randomness)."""
        rng = numpy_generator(seed)
        weights = self.weights.detach().cpu().double().numpy()
        comps = rng.choice(self.num_components, size=num_samples, p=weights / weights.sum())
        z = torch.from_numpy(rng.standard_normal((num_samples, self.dim))).to(self.means)
        lam = self.eigenvalues[comps].sqrt()
        return self.means[comps] + torch.einsum("bij,bj->bi", self.eigenvectors[comps], lam * z)


class GaussianDenoiser(GaussianMixtureDenoiser):
    r"""Exact posterior mean for a Gaussian target ``Y ~ N(m, C)``.

    Parameters
    ----------
    mean : Tensor[d]
        ``m``.
    cov : Tensor[d, d]
        Symmetric positive semi-definite ``C``.
    dtype, device : optional
        As for :class:`GaussianMixtureDenoiser`.

    Notes
    -----
    ``f(t, x) = m + C (t C + I)^{-1} (x - t m)``, computed through the eigendecomposition of
    ``C``. The Euler-Maruyama chain of stochastic localization is then linear-Gaussian, which
    makes the exact law of the discretized chain available by a mean/covariance recursion: the
    exactness test of the diffusion sampler.

    Examples
    --------
    >>> import torch
    >>> oracle = GaussianDenoiser(torch.tensor([1.0, -1.0]), torch.eye(2))
    >>> oracle(torch.tensor([1.0]), torch.tensor([[3.0, 1.0]]))  # m + (x - t m) / 2
    tensor([[2., 0.]], dtype=torch.float64)
    """

    def __init__(self, mean, cov, *, dtype: torch.dtype | None = None, device=None):
        mean = _as_float_tensor(mean, "mean", dtype, device)
        if mean.dim() != 1:
            raise ValueError(f"mean must have shape [d], got {tuple(mean.shape)}")
        cov = _as_float_tensor(cov, "cov", mean.dtype, mean.device)
        d = mean.shape[0]
        if cov.shape != (d, d):
            raise ValueError(f"cov must have shape [d, d] = [{d}, {d}], got {tuple(cov.shape)}")
        super().__init__(torch.ones(1, dtype=mean.dtype, device=mean.device), mean[None], cov[None])

    @property
    def mean(self) -> torch.Tensor:
        """``m``: Tensor[d]."""
        return self.means[0]

    @property
    def cov(self) -> torch.Tensor:
        """``C``: Tensor[d, d]."""
        return self.covs[0]

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``m + C (t C + I)^{-1} (x - t m)``: ``t`` Tensor[B], ``x`` Tensor[B, d] -> [B, d]."""
        t, x = _check_inputs(t, x, self.dim, self.means)
        _, post = self._components(t, x)
        return post[:, 0]


class FiniteSupportDenoiser(_Denoiser):
    r"""Exact posterior mean for ``Y`` on a finite point cloud ``{y_j}`` with weights ``pi_j``.

    Parameters
    ----------
    points : Tensor[M, d]
        The support points ``y_j`` (an empirical data set).
    weights : Tensor[M], optional
        Non-negative weights ``pi_j`` (normalised here); uniform by default.
    dtype, device : optional
        As for :class:`GaussianMixtureDenoiser`.

    Notes
    -----
    ``f(t, x) = sum_j softmax_j(log pi_j + <x, y_j> - t |y_j|^2 / 2) y_j``. The target has
    bounded support, ``sup |Y - E Y|^2 <= R^2``: the setting in which the paper bounds the
    rounds of autospeculation by the variance budget ``R^2``.

    Examples
    --------
    >>> import torch
    >>> oracle = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    >>> oracle(torch.zeros(2), torch.zeros(2, 2))
    tensor([[0., 0.],
            [0., 0.]], dtype=torch.float64)
    >>> oracle(torch.tensor([100.0]), torch.tensor([[100.0, 0.0]]))
    tensor([[1., 0.]], dtype=torch.float64)
    """

    def __init__(self, points, weights=None, *, dtype: torch.dtype | None = None, device=None):
        points = _as_float_tensor(points, "points", dtype, device)
        if points.dim() != 2 or points.shape[0] < 1:
            raise ValueError(
                f"points must have shape [M, d] with M >= 1, got {tuple(points.shape)}"
            )
        self.dim = int(points.shape[1])
        self.num_points = int(points.shape[0])
        self.points = points
        self.weights = _check_weights(
            weights, self.num_points, "weights", points.dtype, points.device
        )

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {"points": self.points, "weights": self.weights}

    def __call__(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``E[Y | t Y + B_t = x]``: ``t`` Tensor[B], ``x`` Tensor[B, d] -> Tensor[B, d]."""
        t, x = _check_inputs(t, x, self.dim, self.points)
        y = self.points
        logits = torch.log(self.weights) + x @ y.T - 0.5 * t[:, None] * (y * y).sum(-1)
        return torch.softmax(logits, dim=-1) @ y

    def sample(self, num_samples: int, seed=None) -> torch.Tensor:
        """Exact draws of ``Y``: Tensor[num_samples, d]."""
        rng = numpy_generator(seed)
        weights = self.weights.detach().cpu().double().numpy()
        index = rng.choice(self.num_points, size=num_samples, p=weights / weights.sum())
        return self.points[torch.from_numpy(index).to(self.points.device)]

    @classmethod
    def unit_sphere(
        cls, num_points: int, dim: int, seed=0, *, dtype: torch.dtype = torch.float64, device=None
    ) -> FiniteSupportDenoiser:
        """``num_points`` uniform random points on the unit sphere of ``R^dim``, equal weights.

        Examples
        --------
        >>> oracle = FiniteSupportDenoiser.unit_sphere(8, 3, seed=0)
        >>> oracle.points.norm(dim=-1).allclose(torch.ones(8, dtype=torch.float64))
        True
        """
        rng = numpy_generator(seed)
        if dim == 2:  # spread the angles, jittered, so that no two points nearly coincide
            angles = (
                2 * math.pi * (np.arange(num_points) + rng.random(num_points) * 0.5) / num_points
            )
            points = np.stack([np.cos(angles), np.sin(angles)], axis=-1)
        else:
            points = rng.standard_normal((num_points, dim))
            points /= np.linalg.norm(points, axis=-1, keepdims=True)
        return cls(torch.from_numpy(points), dtype=dtype, device=device)
