"""The user's seed turned into per-chain engine seeds: the one seed normaliser of the front end.

Every entry point of :mod:`pyro_autospec.infer` takes its engine seeds from
:class:`ChainSeeds` (``chain_seeds`` is its one-shot form): ``AutoSpec``'s runs (one seed per
chain; a second stream for the discrete engine run of a model with continuous sites, beside
the NUTS chains' seeds) and ``AutoSpecKernel`` (a seed per engine run, from one stream that
the chains of one process continue). So a seed means the same thing everywhere:

* an int in ``[0, 2**64)`` seeds a ``torch.Generator`` (``stream`` first derives an
  independent int from it, :func:`~pyro_autospec.engine.keys.derive_seed`);
* a torch or NumPy generator is drawn from, continuing its own stream (``stream`` is ignored);
* ``None`` draws from torch's global generator, so the draws follow ``pyro.set_rng_seed``.

Each engine seed lies in ``[0, 2**62)``. A guide's correction draws its uniforms from a stream
of each chain's seed of its own (:func:`correction_rng`).
"""

from __future__ import annotations

import numpy as np
import torch

from pyro_autospec.engine.keys import check_seed, derive_seed
from pyro_autospec.parallel.groups import broadcast_seeds

__all__ = ["ChainSeeds", "chain_seeds", "correction_rng"]


class ChainSeeds:
    """The user's seed as a stream of engine seeds (see the module's notes).

    Parameters
    ----------
    seed : int, torch.Generator, numpy.random.Generator or None
        Checked by :func:`~pyro_autospec.engine.keys.check_seed` (the check of every entry
        point).
    stream : int, optional
        For an int ``seed``: draw from ``derive_seed(seed, stream)`` instead, a stream beside
        the seed's own (another stage of the run, a worker process).
    distributed : bool
        Every rank of the ``torch.distributed`` group gets rank 0's seeds
        (:func:`~pyro_autospec.parallel.groups.broadcast_seeds`), so that ``seed=None`` does not
        give each rank a different run.

    Examples
    --------
    >>> seeds = ChainSeeds(0)
    >>> first, second = seeds(2), seeds(2)  # one stream: the next call continues it
    >>> first == ChainSeeds(0)(2) and first != second
    True
    """

    def __init__(
        self,
        seed: int | torch.Generator | np.random.Generator | None,
        *,
        stream: int | None = None,
        distributed: bool = False,
    ):
        seed = check_seed(seed)
        if isinstance(seed, int):
            if stream is not None:
                seed = derive_seed(seed, stream)
            seed = torch.Generator().manual_seed(seed)
        self.source: torch.Generator | np.random.Generator | None = seed
        self.distributed = distributed

    def __call__(self, num: int) -> list[int]:
        """The next ``num`` engine seeds, ints in ``[0, 2**62)``."""
        source = self.source
        if isinstance(source, np.random.Generator):
            seeds = [int(s) for s in source.integers(0, 2**62, size=num)]
        else:
            device = source.device if source is not None else "cpu"
            draws = torch.randint(0, 2**62, (num,), generator=source, device=device)
            seeds = [int(s) for s in draws.tolist()]
        if self.distributed:
            seeds = broadcast_seeds(seeds)
        return seeds


def chain_seeds(
    seed: int | torch.Generator | np.random.Generator | None,
    num: int,
    *,
    stream: int | None = None,
    distributed: bool = False,
) -> list[int]:
    """``num`` engine seeds from ``seed``: ``ChainSeeds(seed, ...)(num)`` (:class:`ChainSeeds`).

    Examples
    --------
    >>> chain_seeds(0, 2) == chain_seeds(0, 2) != chain_seeds(0, 2, stream=1)
    True
    """
    return ChainSeeds(seed, stream=stream, distributed=distributed)(num)


def correction_rng(chain_seed: int) -> np.random.Generator:
    """The NumPy stream of a chain's correction (importance resampling, IMH): apart from the
    engine's keyed random numbers, which depend on the same seed through
    :mod:`pyro_autospec.engine.keys`."""
    return np.random.default_rng([chain_seed, 1])
