"""The exact oracle of a determinantal point process (DPP) on a finite ground set."""

from __future__ import annotations

from typing import Any

import torch

from ._util import ExactOracle, as_float64, point_mass

__all__ = ["DPPOracle"]

# Largest number of entries of one batch of [rows, n, n] systems (float64: 64 MiB).
_MAX_WORK_ENTRIES = 1 << 23
# Tolerance on symmetry and on the spectrum of a kernel, relative to its scale.
_TOLERANCE = 1e-9
# Conditional probabilities closer than this to 0 or 1 are set to 0 or 1.
_SNAP = 1e-12


def _check_symmetric(matrix: torch.Tensor, name: str) -> torch.Tensor:
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 1:
        raise ValueError(f"{name} must be a square [n, n] matrix; got shape {tuple(matrix.shape)}")
    scale = max(1.0, float(matrix.abs().max()))
    if (matrix - matrix.T).abs().max() > _TOLERANCE * scale:
        raise ValueError(
            f"{name} must be symmetric; symmetrise it with ({name} + {name}.T) / 2 if the "
            f"asymmetry is rounding"
        )
    return (matrix + matrix.T) / 2


class DPPOracle(ExactOracle):
    """Exact conditional marginals of a determinantal point process.

    The ground set ``{0, ..., n-1}`` is the set of coordinates; coordinate ``i`` takes value 1
    when item ``i`` is in the random set ``X`` and 0 when it is not.

    Parameters
    ----------
    kernel : Tensor or array [n, n], optional
        The marginal kernel ``K`` (symmetric, eigenvalues in ``[0, 1]``):
        ``P(A subset of X) = det(K_A)``. Projection kernels (eigenvalues 0 or 1) are allowed.
    L : Tensor or array [n, n], optional
        An L-ensemble kernel (symmetric positive semi-definite): ``P(X = A) ∝ det(L_A)``. It is
        turned into ``K = L (I + L)^-1``. Pass exactly one of ``kernel`` and ``L``.
    device : str or torch.device, optional
        Where to keep the kernel.

    Attributes
    ----------
    num_coords : int
        ``n``.
    num_values : int
        2.
    kernel : DoubleTensor[n, n]
        The marginal kernel ``K``.

    Notes
    -----
    Conditioning on ``A`` in and ``B`` out (``S = A ∪ B``) is the chain of Schur updates
    ``K <- K - K[:, i] K[i, :] / K_ii`` (pin in) and ``K <- K + K[:, i] K[i, :] / (1 - K_ii)``
    (pin out). Both are Schur complements of ``K - diag(1_B)``, so together

    ``P(i in X | pins) = K_ii - K_iS (K - diag(1_B))_SS^{-1} K_Si``.

    A row solves one ``[n, n]`` system that is ``(K - diag(1_B))_SS`` on the pinned block and
    the identity elsewhere, batched over rows (``O(n^3)`` per row, in float64). The pinned
    block is singular exactly when the pins have probability 0 (``|det|`` is that
    probability); such rows are NaN. Against rounding, probabilities are clipped to
    ``[0, 1]`` and those within ``1e-12`` of 0 or 1 are set to 0 or 1, so that the support is
    exact (a projection DPP never draws more items than its rank); the law moves by at most
    ``1e-12`` per coordinate.

    Examples
    --------
    >>> import torch
    >>> oracle = DPPOracle(L=torch.tensor([[1.0, 0.5], [0.5, 1.0]]))
    >>> values = torch.tensor([[1, 0]])
    >>> mask = torch.tensor([[True, False]])
    >>> oracle.log_marginals(values, mask)[0, 1].exp()  # P(1 in X | 0 in X)
    tensor([0.5714, 0.4286], dtype=torch.float64)
    """

    def __init__(
        self,
        kernel: Any = None,
        L: Any = None,
        device: str | torch.device | None = None,
    ) -> None:
        if (kernel is None) == (L is None):
            raise ValueError(
                "pass exactly one of kernel (the marginal kernel K) and L (an L-ensemble)"
            )
        if kernel is not None:
            k = _check_symmetric(as_float64(kernel, "kernel", device), "kernel")
            eig = torch.linalg.eigvalsh(k)
            if eig.min() < -_TOLERANCE or eig.max() > 1 + _TOLERANCE:
                raise ValueError(
                    f"kernel must have eigenvalues in [0, 1] (a marginal kernel); got "
                    f"[{float(eig.min()):.3g}, {float(eig.max()):.3g}]. For an unnormalised "
                    f"kernel pass it as L= instead"
                )
        else:
            ell = _check_symmetric(as_float64(L, "L", device), "L")
            eig, vectors = torch.linalg.eigh(ell)
            if eig.min() < -_TOLERANCE * max(1.0, float(eig.abs().max())):
                raise ValueError(
                    f"L must be positive semi-definite; its smallest eigenvalue is "
                    f"{float(eig.min()):.3g}"
                )
            eig = eig.clamp(min=0)
            k = (vectors * (eig / (1 + eig))) @ vectors.T
            k = (k + k.T) / 2
        self.kernel = k
        self.num_coords = k.shape[0]
        self.num_values = 2

    def _in_probability(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """``P(targets in X | pins)``: DoubleTensor[B, k] (NaN on impossible rows)."""
        kernel = self.kernel
        pinned = mask.double()  # [B, n]
        out_pins = (mask & (values == 0)).double()
        # (K - diag(1_B)) on the pinned block, identity elsewhere
        system = pinned.unsqueeze(-1) * (kernel - torch.diag_embed(out_pins)) * pinned.unsqueeze(
            -2
        ) + torch.diag_embed(1 - pinned)
        columns = kernel[:, targets].permute(1, 0, 2)  # [B, n, k]: K[:, t]
        rhs = pinned.unsqueeze(-1) * columns  # K_S t
        # Rows conditioned on an impossible pin set have a singular system: factor every row,
        # swap singular ones for the identity (so the batched solve cannot fail) and mark them.
        info = torch.linalg.lu_factor_ex(system).info
        if (info != 0).any():
            eye = torch.eye(system.shape[-1], dtype=system.dtype, device=system.device)
            system = torch.where((info != 0)[:, None, None], eye, system)
        try:
            solution = torch.linalg.solve(system, rhs)  # [B, n, k]
        except RuntimeError:
            # Some multi-threaded LAPACK builds reject batched LU on nearly singular blocks
            # (seen with MKL and 2 threads); solve row by row and mark the failures.
            solution = torch.empty_like(rhs)
            for b in range(system.shape[0]):
                try:
                    solution[b] = torch.linalg.solve(system[b], rhs[b])
                except RuntimeError:
                    solution[b] = float("nan")
                    info[b] = 1
        correction = (rhs * solution).sum(1)  # K_tS (...)^-1 K_St
        diagonal = kernel.diagonal()[targets]  # [B, k]
        prob = (diagonal - correction).clamp(0.0, 1.0)
        # rounding of the Schur complement is ~1e-15: keep exact zeros and ones exact
        prob = torch.where(prob < _SNAP, 0.0, torch.where(prob > 1 - _SNAP, 1.0, prob))
        singular = info != 0
        if singular.any():
            prob = torch.where(singular.unsqueeze(-1), float("nan"), prob)
        return prob

    def _log_marginals_at(
        self, values: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        n, k = self.num_coords, targets.shape[1]
        step = max(1, _MAX_WORK_ENTRIES // (n * max(n, k)))
        prob = torch.cat(
            [
                self._in_probability(
                    values[s : s + step], mask[s : s + step], targets[s : s + step]
                )
                for s in range(0, values.shape[0], step)
            ]
            or [torch.empty(0, k, dtype=torch.float64, device=values.device)],
            0,
        )
        out = torch.stack([torch.log1p(-prob), torch.log(prob)], -1)
        return point_mass(out, mask.gather(1, targets), values.gather(1, targets).clamp(0, 1))
