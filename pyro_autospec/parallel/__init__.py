"""Several processes: ``torch.distributed`` process groups and one oracle sharded over them.

* :mod:`~pyro_autospec.parallel.groups`: set up a process group from ``torchrun``'s
  environment (:func:`setup_process_group`), this rank's device (:func:`local_device`), the
  checks and collectives that the two uses below share.
* :class:`ShardedOracle`: one large oracle whose every call's rows are shared out over the
  ranks (a draw's latency).

Spreading a run's *draws* over the ranks is the engine's ``distributed=True``
(:mod:`pyro_autospec.engine.spread`, built on :mod:`.groups`). This package imports nothing of
this library but itself, and not Pyro: the engine and the oracles build on it.
"""

from pyro_autospec.parallel.groups import (
    broadcast_seeds,
    communication_device,
    draw_shares,
    local_device,
    require_process_group,
    setup_process_group,
)
from pyro_autospec.parallel.sharded import ShardedOracle

__all__ = [
    "ShardedOracle",
    "broadcast_seeds",
    "communication_device",
    "draw_shares",
    "local_device",
    "require_process_group",
    "setup_process_group",
]
