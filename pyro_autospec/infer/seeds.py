"""The user's seed turned into per-chain engine seeds: the one seed normaliser of the front end.

Every entry point of :mod:`pyro_autospec.infer` takes its engine seeds from
:class:`ChainSeeds` (``chain_seeds`` is its one-shot form): ``AutoSpec``'s runs (one seed per
chain; a second stream for the discrete engine run of a model with continuous sites, beside
the NUTS chains' seeds) and ``AutoSpecKernel`` (a seed per engine run, from one stream that
the chains of one process continue). So a seed means the same thing everywhere:

* an int in ``[0, 2**64)`` is the root of a stream of keyed numbers
  (:mod:`pyro_autospec.engine.keys`, the engine's own randomness): engine seed ``i`` is the
  ``i``-th output of the SplitMix64 stream of ``seed_key(seed)`` (``stream`` first derives an
  independent int from ``seed``, :func:`~pyro_autospec.engine.keys.derive_seed`);
* a torch or NumPy generator is drawn from, continuing its own stream (``stream`` is ignored);
* ``None`` draws from torch's global generator, so the draws follow ``pyro.set_rng_seed``.

Each engine seed lies in ``[0, 2**62)``. A guide's correction draws its keyed uniforms from a
seed of its own beside each chain's (:func:`correction_seed`), and forward filtering, backward
sampling keys its uniforms by the chain's seed too: an int seed reaches every random number
of a run through the one keyed generator (NUTS, for continuous sites, is Pyro's and draws from
torch's global generator, seeded from the chain's seed).
"""

from __future__ import annotations

import numpy as np
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.keys import check_seed, derive_seed
from pyro_autospec.parallel.groups import broadcast_seeds

__all__ = ["ChainSeeds", "chain_seeds", "check_draws_seed", "correction_seed", "run_seed"]

#: The stream of a chain's seed that its correction reads (:func:`correction_seed`).
CORRECTION_STREAM = 1
#: The stream of the first chain's seed that a short run's check draws read
#: (:func:`check_draws_seed`).
CHECK_STREAM = 2


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
        self.key: int | None = None  # an int seed's root key
        self.drawn = 0  # engine seeds drawn from it so far
        if isinstance(seed, int):
            self.key = keys.seed_key(seed if stream is None else derive_seed(seed, stream))
            seed = None
        self.source: torch.Generator | np.random.Generator | None = seed
        self.distributed = distributed

    def __call__(self, num: int) -> list[int]:
        """The next ``num`` engine seeds, ints in ``[0, 2**62)``."""
        source = self.source
        if self.key is not None:
            counters = np.arange(self.drawn, self.drawn + num, dtype=np.int64)
            self.drawn += num
            bits = keys.host_bits(np.int64(self.key), counters)
            seeds = [int(b) & ((1 << 62) - 1) for b in bits.tolist()]
        elif isinstance(source, np.random.Generator):
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


def correction_seed(chain_seed: int) -> int:
    """The seed of a chain's correction (importance resampling, IMH): a stream of the chain's
    seed beside the engine's (:func:`~pyro_autospec.engine.keys.derive_seed`).

    Examples
    --------
    >>> correction_seed(5) == correction_seed(5) != correction_seed(6)
    True
    """
    return derive_seed(int(chain_seed), CORRECTION_STREAM)


def check_draws_seed(chain_seed: int) -> int:
    """The seed of the extra draws a short run makes for its self-check only (never returned):
    a stream of the first chain's seed beside the engine's and the correction's.

    Examples
    --------
    >>> check_draws_seed(5) == check_draws_seed(5) != correction_seed(5)
    True
    """
    return derive_seed(int(chain_seed), CHECK_STREAM)


def run_seed(
    seed: int | torch.Generator | np.random.Generator | None, *, distributed: bool = False
) -> int:
    """The int seed a run uses: ``seed`` itself, or one drawn from it (a generator) or from
    torch's global generator (``None``), so that the run can record it and be repeated with
    ``seed=`` that int.

    With ``distributed=True`` every rank gets rank 0's
    (:func:`~pyro_autospec.parallel.groups.broadcast_seeds`).

    Examples
    --------
    >>> run_seed(5)
    5
    >>> run_seed(torch.Generator().manual_seed(0)) == run_seed(torch.Generator().manual_seed(0))
    True
    """
    value = keys.seed_value(seed)
    if isinstance(seed, (int, np.integer)):
        return value
    return broadcast_seeds([value])[0] if distributed else value
