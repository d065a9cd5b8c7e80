"""Shared helpers of the exact structured oracles: validation, devices, chain bookkeeping.

The base class is :class:`~pyro_autospec.oracles.exact.ExactOracle`; the log-space algebra is
:mod:`pyro_autospec.engine.logspace`. Nothing here is public API. Every oracle in this package

* stores its parameters as float64 tensors on one device,
* validates constructor arguments with a :class:`ValueError` that names the argument and the fix,
* answers queries on the device of the ``values`` it is given (moving, and caching, a copy of
  its parameters there when needed), and
* returns float64 log probabilities in which a pinned coordinate is a point mass at its pinned
  value (the engine ignores those rows; the convention makes them well defined).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "numpy_generator",
    "as_float64",
    "chain_repeats",
    "check_query",
    "check_targets",
    "point_mass",
    "work_entries",
]


# -- randomness of the oracles' own helpers ----------------------------------------------------
def numpy_generator(seed) -> np.random.Generator:
    """A NumPy generator from an int, ``None``, a NumPy or a torch generator.

    Only for the oracles' own exact samplers and random targets (``sample``, ``unit_sphere``);
    the engine's randomness is keyed (:mod:`pyro_autospec.engine.keys`).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, torch.Generator):
        return np.random.default_rng(
            int(torch.randint(0, 2**62, (), generator=seed, device=seed.device).item())
        )
    if seed is None or isinstance(seed, (int, np.integer)):
        return np.random.default_rng(None if seed is None else int(seed))
    raise TypeError(
        f"seed must be an int, None, or a numpy/torch Generator; got {type(seed).__name__}"
    )


# -- memory budgets ---------------------------------------------------------------------------
# On a GPU, a chunk of rows is a handful of kernel launches: chunks sized for a CPU cache leave
# it idle, while on a CPU large chunks leave the cache. Hence a larger budget on a GPU;
# `python benchmarks/oracle_chunks.py` measures the trade-off (benchmarks/README.md).
_GPU_WORK_ENTRIES = 1 << 27  # float64 entries: 1 GiB
_GPU_MEMORY_FRACTION = 16  # and at most 1/16 of the GPU's memory


def work_entries(device: torch.device, cpu_entries: int) -> int:
    """Largest number of float64 entries in the temporaries of one chunk of rows.

    Parameters
    ----------
    device : torch.device
        Where the chunk is computed.
    cpu_entries : int
        The oracle's budget on a CPU (sized for caches and modest memory).

    Returns
    -------
    int
        ``cpu_entries`` on a CPU; on a CUDA device the larger of ``cpu_entries`` and
        ``min(2^27, memory / 8 / 16)`` (1 GiB, or a sixteenth of a small GPU's memory).
    """
    if device.type != "cuda":
        return cpu_entries
    memory = torch.cuda.get_device_properties(device).total_memory
    return max(cpu_entries, min(_GPU_WORK_ENTRIES, memory // 8 // _GPU_MEMORY_FRACTION))


# -- validation --------------------------------------------------------------------------------
def as_float64(
    x: Any,
    name: str,
    device: str | torch.device | None = None,
    allow_neg_inf: bool = False,
) -> torch.Tensor:
    """``x`` as a float64 tensor (copied), rejecting NaN and ``+inf`` (and ``-inf`` unless
    ``allow_neg_inf``) with a message naming ``name``."""
    try:
        if isinstance(x, torch.Tensor):
            t = x.detach().to(dtype=torch.float64, copy=True)
        else:
            t = torch.as_tensor(x, dtype=torch.float64).clone()
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"{name} must be a tensor or array of real numbers; could not convert "
            f"{type(x).__name__}: {error}"
        ) from error
    if device is not None:
        t = t.to(device)
    if torch.isnan(t).any():
        raise ValueError(f"{name} contains NaN; pass finite numbers")
    if (t == float("inf")).any():
        raise ValueError(f"{name} contains +inf; pass finite numbers")
    if not allow_neg_inf and (t == float("-inf")).any():
        raise ValueError(f"{name} contains -inf; pass finite numbers")
    return t


def check_query(
    values: torch.Tensor, mask: torch.Tensor, num_coords: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the shapes of a query; return ``values`` (long) and ``mask`` (bool).

    Entries of ``values`` where ``mask`` is False are left as they are (possibly out of
    range): oracles must only read pinned values, or clamp what they gather.
    """
    if not isinstance(values, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise ValueError("values and mask must be torch tensors of shape [B, num_coords]")
    if values.dim() != 2 or values.shape[1] != num_coords:
        raise ValueError(
            f"values must have shape [B, {num_coords}] (one row per conditioning); "
            f"got {tuple(values.shape)}"
        )
    if mask.shape != values.shape:
        raise ValueError(
            f"mask must have the shape of values {tuple(values.shape)}; got {tuple(mask.shape)}"
        )
    return values.long(), mask.to(device=values.device, dtype=torch.bool)


def check_targets(
    targets: torch.Tensor, batch: int, num_coords: int, name: str = "targets"
) -> torch.Tensor:
    """Check ``targets`` (LongTensor[B, k] of coordinate indices); ``name`` for messages."""
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2 or targets.shape[0] != batch:
        shape = tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets)
        width = "L" if name == "chain" else "k"
        raise ValueError(
            f"{name} must be a LongTensor of shape [{batch}, {width}] (one row per row of "
            f"values); got {shape}"
        )
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer coordinate indices; got {targets.dtype}")
    targets = targets.long()
    if targets.numel() and (targets.min() < 0 or targets.max() >= num_coords):
        raise ValueError(f"{name} must hold coordinate indices in [0, {num_coords})")
    return targets


def chain_repeats(chain: torch.Tensor) -> torch.Tensor:
    """BoolTensor[C, L]: whether ``chain[c, j]`` occurs in ``chain[c, :j]`` (padding).

    ``O(L log L)`` per chain: a stable sort puts equal coordinates next to each other in the
    order of the chain, so every one but the first of a run is a repeat.
    """
    repeated = torch.zeros(chain.shape, dtype=torch.bool, device=chain.device)
    if chain.shape[1] > 1:
        ordered, perm = chain.sort(dim=1, stable=True)
        repeated.scatter_(1, perm[:, 1:], ordered[:, 1:] == ordered[:, :-1])
    return repeated


def pinned_with_chain(mask: torch.Tensor, chain: torch.Tensor) -> torch.Tensor:
    """BoolTensor[C, n]: ``mask`` with every coordinate of ``chain`` [C, L] pinned (what the
    row after a chain conditions on)."""
    return mask.clone().scatter_(1, chain, True)


def point_mass(
    out: torch.Tensor, pinned: torch.Tensor, pinned_values: torch.Tensor
) -> torch.Tensor:
    """Replace ``out[..., :]`` by a log point mass at ``pinned_values`` where ``pinned``.

    ``out``: Tensor[..., q]; ``pinned``: BoolTensor[...]; ``pinned_values``: LongTensor[...].
    """
    q = out.shape[-1]
    onehot = torch.arange(q, device=out.device) == pinned_values.unsqueeze(-1)
    delta = torch.where(onehot, 0.0, float("-inf")).to(out.dtype)
    return torch.where(pinned.unsqueeze(-1), delta, out)
