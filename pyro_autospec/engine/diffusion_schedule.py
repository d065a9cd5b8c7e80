"""Time grids for stochastic localization, and their validation.

The default grid follows Benton, De Bortoli, Doucet and Deligiannidis (2023): steps of equal
size ``kappa`` up to ``t = t_switch`` (1 by default), then geometric steps
``t_{k+1} = (1 + kappa') t_k`` up to ``T = 1 / delta``. At ``T`` the rescaled state
``X_T / T`` is distributed (up to the discretization error) as ``mu * N(0, delta I)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pyro_autospec.engine.methods import is_count, is_real

__all__ = ["diffusion_times", "check_times"]


def check_times(times, name: str = "times") -> np.ndarray:
    """Validate a time grid and return it as a float64 NumPy array of shape [N + 1].

    Raises
    ------
    ValueError
        If ``times`` is not one-dimensional, has fewer than two entries, is not finite or is
        not strictly increasing. The message names the first offending index.
    """
    if isinstance(times, torch.Tensor):
        array = times.detach().to("cpu", torch.float64).numpy()
    else:
        try:
            array = np.asarray(times, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{name} must be a 1-D tensor of floats, got {type(times).__name__}"
            ) from error
    if array.ndim != 1 or array.shape[0] < 2:
        raise ValueError(
            f"{name} must be a 1-D tensor with at least two entries t_0 < t_1 < ... < t_N, "
            f"got shape {tuple(array.shape)}"
        )
    if not np.isfinite(array).all():
        index = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"{name} must be finite; {name}[{index}] = {array[index]}")
    steps = np.diff(array)
    if (steps <= 0).any():
        k = int(np.flatnonzero(steps <= 0)[0])
        raise ValueError(
            f"{name} must be strictly increasing; {name}[{k + 1}] = {array[k + 1]:.6g} <= "
            f"{name}[{k}] = {array[k]:.6g}. Sort the grid and remove repeats "
            f"(e.g. torch.linspace(0, 1, 101) or diffusion_times(num_steps, delta))"
        )
    return array.copy()


def diffusion_times(
    num_steps: int = 256,
    delta: float = 1e-3,
    *,
    t_switch: float = 1.0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The default time grid of stochastic localization: uniform, then geometric.

    Parameters
    ----------
    num_steps : int
        ``N``, the number of Euler-Maruyama steps (the grid has ``N + 1`` times).
    delta : float
        Final noise level: the grid ends at ``T = 1 / delta`` and ``X_T / T`` approximates
        ``mu * N(0, delta I)``.
    t_switch : float
        End of the uniform part (1 by default, as in BDDD23 after the change of time).
    device : torch.device or str, optional
        Device of the returned tensor.

    Returns
    -------
    DoubleTensor[num_steps + 1]
        ``0 = t_0 < t_1 < ... < t_N = 1 / delta``.

    Notes
    -----
    BDDD23 (Benton, De Bortoli, Doucet, Deligiannidis, "Nearly d-linear convergence bounds for
    diffusion models via stochastic localization", ICLR 2024) use step sizes
    ``gamma_k <= kappa min(1, T - t_{k+1})`` in Ornstein-Uhlenbeck time. In stochastic
    localization time this is a uniform step ``kappa t_switch`` up to ``t_switch`` and a
    geometric ratio ``1 + kappa`` after it, so ``N ~ (1 + log(T / t_switch)) / kappa``. Here
    ``kappa`` is solved for from ``num_steps``; the uniform part gets
    ``N_1 = max(1, round(1 / kappa))`` steps and the geometric part the remaining ``N - N_1``
    with ratio ``(T / t_switch)^(1 / (N - N_1))``. If ``T <= t_switch`` the grid is uniform.

    Examples
    --------
    >>> times = diffusion_times(64, delta=1e-3)
    >>> times.shape, times[0].item(), round(times[-1].item(), 6)
    (torch.Size([65]), 0.0, 1000.0)
    >>> bool((times.diff() > 0).all())
    True
    """
    if not is_count(num_steps):
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    if not (is_real(delta) and 0 < delta and math.isfinite(delta)):
        raise ValueError(
            f"delta must be a positive float (final time T = 1 / delta), got {delta!r}"
        )
    if not (t_switch > 0 and math.isfinite(t_switch)):
        raise ValueError(f"t_switch must be positive, got {t_switch!r}")
    horizon = 1.0 / delta
    if horizon <= t_switch:
        grid = np.linspace(0.0, horizon, num_steps + 1)
    else:
        if num_steps < 2:
            raise ValueError(
                f"num_steps must be >= 2 when T = 1 / delta = {horizon:.6g} exceeds "
                f"t_switch = {t_switch:.6g} (one uniform and one geometric step at least)"
            )
        log_ratio = math.log(horizon / t_switch)

        def count(kappa: float) -> float:
            return 1.0 / kappa + log_ratio / math.log1p(kappa)

        low, high = 1e-9, 1e9  # count is decreasing in kappa
        for _ in range(200):
            mid = math.sqrt(low * high)
            if count(mid) > num_steps:
                low = mid
            else:
                high = mid
        uniform = int(min(max(1, round(1.0 / high)), num_steps - 1))
        geometric = num_steps - uniform
        head = np.linspace(0.0, t_switch, uniform + 1)
        tail = t_switch * np.exp(np.arange(1, geometric + 1) * (log_ratio / geometric))
        tail[-1] = horizon
        grid = np.concatenate([head, tail])
    return torch.as_tensor(grid, dtype=torch.float64, device=device)
