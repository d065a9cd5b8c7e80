"""The user's seed turned into per-chain engine seeds: the one seed normaliser of the front end.

Every entry point of :mod:`pyro_autospec.infer` (``AutoSpec``'s runs and ``AutoSpecKernel``)
takes its engine seeds from here, so a seed means the same draws everywhere.
"""

from __future__ import annotations

import numpy as np
import torch

from pyro_autospec.engine.keys import check_seed
from pyro_autospec.parallel.groups import broadcast_seeds

__all__ = ["chain_seeds"]


def chain_seeds(
    seed: int | torch.Generator | np.random.Generator | None,
    num: int,
    *,
    distributed: bool = False,
) -> list[int]:
    """``num`` engine seeds from ``seed``; ``None`` draws them from torch's global RNG.

    ``seed`` is checked by :func:`~pyro_autospec.engine.keys.check_seed` (the check of every
    entry point): an int in ``[0, 2**64)``, a torch or NumPy generator, or ``None``.

    With ``seed=None`` the draws follow ``pyro.set_rng_seed`` like every Pyro sampler. With
    ``distributed=True`` every rank of the ``torch.distributed`` group gets rank 0's seeds
    (:func:`~pyro_autospec.parallel.groups.broadcast_seeds`), so that ``seed=None`` does not
    give each rank a different run.

    Examples
    --------
    >>> chain_seeds(0, 2) == chain_seeds(0, 2)
    True
    """
    seed = check_seed(seed)
    if isinstance(seed, np.random.Generator):
        seeds = [int(s) for s in seed.integers(0, 2**62, size=num)]
    else:
        gen = torch.Generator().manual_seed(seed) if isinstance(seed, int) else seed
        draws = torch.randint(0, 2**62, (num,), generator=gen, device=gen.device if gen else "cpu")
        seeds = [int(s) for s in draws.tolist()]
    if distributed:
        seeds = broadcast_seeds(seeds)
    return seeds
