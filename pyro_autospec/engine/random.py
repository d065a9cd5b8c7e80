"""Explicit randomness: every public entry point takes ``seed`` and derives one generator."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["make_rng"]


def make_rng(seed: int | None | np.random.Generator | torch.Generator) -> np.random.Generator:
    """Return a NumPy generator from an int, ``None``, a NumPy or a torch generator.

    The engine draws its uniforms and categorical draws in float64 from this generator, so the
    same seed gives the same samples on every device.

    Examples
    --------
    >>> make_rng(0).random() == make_rng(0).random()
    True
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
