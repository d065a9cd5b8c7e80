"""Spreading a run's draws over the processes (ranks) of a ``torch.distributed`` group.

Randomness is keyed by (seed, draw, block, thread) (:mod:`pyro_autospec.engine.keys`), so a draw
is a function of the run's seed and its global number only. ``sample_any_order``,
``sample_diffusion`` and ``sample_sde`` with ``distributed=True`` therefore split the global
draw numbers ``0 .. N - 1`` into contiguous shares, one per rank (rank ``r`` of ``W`` takes
``N // W`` draws, plus one if ``r < N % W``), run each share on the rank's own device, and
all-gather the results: every rank returns the full result, identical draw for draw to a
single-process run with the same seed, whatever the world size (:doc:`/benchmarks`).

The contract. Every rank of the group makes the same call with the same arguments (oracle,
``num_samples``, method, schedule, seed). The seed:

* an int or a generator in the same state on every rank: each rank derives the run's key and
  the ranks check, in one small collective, that they agree (a clear error otherwise);
* ``None``: rank 0 draws a key from its torch global generator and the other ranks use it
  (documented, so that ``seed=None`` does not silently give each rank a different run).

Counts. ``rounds`` of the gathered result is the largest number of rounds of any rank (ranks
run at the same time, so that is the run's latency in rounds; without ``max_rows_per_round``
or ``max_concurrent_draws`` it equals the single-process run's); ``oracle_rows`` is the sum
over ranks (all work, the single-process run's).
``result.per_rank`` is a dict of lists indexed by rank: ``num_draws``, ``first_draw``,
``rounds``, ``oracle_rows`` and ``wall_time`` (each rank's own engine time). ``wall_time`` of
the gathered result is this rank's time for the whole call, the gathering included.

With ``progress=True`` every rank shows a bar over its own share. The process-group helpers
(setting a group up, this rank's device) are :mod:`pyro_autospec.parallel.groups`. One large
oracle split over the ranks (every round's rows shared out) is
:class:`pyro_autospec.parallel.sharded.ShardedOracle`, a different use of the same group. This
module does not import Pyro.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable

import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.methods import Schedule
from pyro_autospec.engine.result import SampleResult
from pyro_autospec.engine.rows import VisitOrders
from pyro_autospec.parallel.groups import (
    all_gather,
    broadcast_object,
    communication_device,
    draw_shares,
    local_device,
    require_process_group,
)

__all__ = ["spread_draws"]

#: Fields of a :class:`SampleResult` with one entry per draw (gathered along dim 0).
_PER_DRAW = ("samples", "log_prob", "sample_rounds", "orders", "paths", "error")

RunShare = Callable[[torch.Tensor, int, torch.device], SampleResult]


def _canonical(value):
    """A description of ``value`` that is the same in every process (no memory addresses)."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(value)
    if callable(value):
        return getattr(value, "__qualname__", type(value).__name__)
    return type(value).__name__


def _agreed_seed(seed, num_draws: int, signature, rank: int, world: int) -> int:
    """The run's int seed (:func:`~pyro_autospec.engine.keys.seed_value`), checked (or, for
    ``seed=None``, taken from rank 0) across ranks."""
    fresh = seed is None
    value = keys.seed_value(seed)
    check = zlib.crc32(repr(_canonical(signature)).encode())
    mine = torch.tensor([int(fresh), keys.signed(value), int(num_draws), check], dtype=torch.long)
    table = torch.stack([t.cpu() for t in all_gather(mine, communication_device())])  # [W, 4]
    first = table[0]
    problems = []
    if not bool((table[:, 0] == first[0]).all()):
        problems.append("some ranks passed seed=None and others a seed")
    elif not fresh and not bool((table[:, 1] == first[1]).all()):
        problems.append("the seeds differ (pass the same int seed on every rank)")
    if not bool((table[:, 2] == first[2]).all()):
        problems.append(f"num_samples differs: {table[:, 2].tolist()}")
    if not bool((table[:, 3] == first[3]).all()):
        problems.append("the other arguments differ (oracle size, method, engine or schedule)")
    if problems:
        raise ValueError(
            f"distributed=True: rank {rank} of {world} found that the ranks did not make the "
            f"same call: {'; '.join(problems)}. Every rank must run the same sampling call "
            "with the same arguments and seed; each then samples its share of the draws."
        )
    return int(first[1]) & ((1 << 64) - 1)  # rank 0's seed, as the int it was


def spread_draws(
    num_draws: int,
    seed,
    run_share: RunShare,
    *,
    device: str | torch.device,
    signature=(),
    oracle=None,
) -> SampleResult:
    """Run a share of a run's draws on this rank and all-gather the full result on every rank.

    The front ends call this for ``distributed=True``; it needs an initialised process group.

    Parameters
    ----------
    num_draws : int
        ``N``, the run's number of draws (global numbers ``0 .. N - 1``).
    seed : int, generator or None
        The run's seed (see the module docstring for ``None``).
    run_share : callable
        ``run_share(draw_ids: LongTensor[D], root_key: int, device) -> SampleResult``: runs the
        draws ``draw_ids`` (global numbers) of the run with root key ``root_key`` on ``device``
        (for example :func:`~pyro_autospec.engine.any_order.run_any_order`).
    device : str or torch.device
        Where the single-process run would run; ``cuda`` without an index becomes this rank's
        GPU (:func:`local_device`).
    signature : tuple, optional
        The call's other arguments (numbers, strings, dicts of knobs); the ranks check that
        theirs agree (callables compare by name, tensors by shape and dtype).
    oracle : optional
        The oracle, to refuse a :class:`~pyro_autospec.parallel.sharded.ShardedOracle` (whose
        ranks must all run the same draws).

    Returns
    -------
    SampleResult
        The whole run's result, the same on every rank, with ``per_rank`` (module docstring).

    Raises
    ------
    RuntimeError
        Without an initialised process group.
    ValueError
        If the ranks' calls differ (seed, ``num_samples`` or ``signature``), or for a sharded
        oracle.

    Examples
    --------
    >>> import torch, torch.distributed as dist
    >>> from pyro_autospec.engine.any_order import AnyOrderRun, run_any_order
    >>> from pyro_autospec.oracles import MarkovChainOracle
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> stay = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    >>> chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 16)
    >>> knobs = {"max_elements": 2**20, "max_rows_per_round": None, "max_concurrent_draws": None}
    >>> run = AnyOrderRun(chain, "sequential", knobs)
    >>> def run_share(draw_ids, root_key, device):
    ...     return run_any_order(run, draw_ids, root_key, device)
    >>> result = spread_draws(4, 0, run_share, device="cpu")
    >>> result.samples.shape, result.per_rank["num_draws"]
    (torch.Size([4, 16]), [4])
    >>> dist.destroy_process_group()
    """
    start = time.perf_counter()
    rank, world = require_process_group("distributed=True")
    if getattr(oracle, "shards_rows", False):
        raise ValueError(
            "distributed=True spreads the draws over the ranks, but the oracle is a "
            "ShardedOracle, which needs every rank to run the same draws. Use one or the "
            "other: distributed=True with the plain oracle (many draws), or the ShardedOracle "
            "with distributed=False (one large oracle, e.g. for one draw's latency)."
        )
    where = local_device(device)
    run_seed = _agreed_seed(seed, num_draws, signature, rank, world)
    root = keys.seed_key(run_seed)
    shares = draw_shares(num_draws, world)
    first, stop = shares[rank]
    local = None
    if stop > first:
        local = run_share(torch.arange(first, stop), root, where)
    schema = _schema(local)
    if num_draws < world:  # some ranks ran nothing: they learn the fields from rank 0
        schema = broadcast_object(schema)
    comm = communication_device()
    counts = torch.zeros(4, dtype=torch.float64)
    if local is not None:
        counts = torch.tensor(
            [stop - first, local.rounds, local.oracle_rows, local.wall_time], dtype=torch.float64
        )
    table = torch.stack(all_gather(counts, comm))  # [W, 4]
    sizes = [b - a for a, b in shares]
    largest = max(sizes)
    fields = {}
    if schema["orders_from_keys"] is not None:  # every rank computes them when read
        order, n = schema["orders_from_keys"]
        fields["orders"] = VisitOrders(order, keys.draw_keys(root, torch.arange(num_draws)), n)
    for name, (dtype, tail, on_cpu) in schema["fields"].items():
        home = torch.device("cpu") if on_cpu else where
        if local is None:
            mine = torch.zeros((largest, *tail), dtype=dtype, device=comm)
        else:
            mine = getattr(local, name).to(comm)
            if mine.shape[0] < largest:
                pad = torch.zeros((largest - mine.shape[0], *tail), dtype=dtype, device=comm)
                mine = torch.cat([mine, pad])
        parts = all_gather(mine, comm)
        fields[name] = torch.cat([p[:s] for p, s in zip(parts, sizes)]).to(home)
    times = schema["times"]
    if times is not None:
        times = times.to(torch.device("cpu") if schema["times_on_cpu"] else where)
    result = SampleResult(
        rounds=int(table[:, 1].max()),
        oracle_rows=int(table[:, 2].sum()),
        method=schema["method"],
        wall_time=time.perf_counter() - start,
        engine=schema["engine"],
        schedule=Schedule.of(schema["schedule"]),
        seed=run_seed,
        times=times,
        **{name: fields.get(name) for name in _PER_DRAW},
    )
    result.per_rank = {
        "num_draws": [int(v) for v in table[:, 0].tolist()],
        "first_draw": [a for a, _ in shares],
        "rounds": [int(v) for v in table[:, 1].tolist()],
        "oracle_rows": [int(v) for v in table[:, 2].tolist()],
        "wall_time": [float(v) for v in table[:, 3].tolist()],
    }
    return result


def _schema(local: SampleResult | None) -> dict | None:
    """What a rank needs to receive a result it did not compute: dtypes, shapes, places."""
    if local is None:
        return None
    fields = {}
    # orders a function of the draw keys (VisitOrders) are not gathered: each rank can
    # compute them from the run's key, and only when they are read
    source = local.__dict__.get("_orders")
    from_keys = isinstance(source, VisitOrders) and source.table is None
    for name in _PER_DRAW:
        if name == "orders" and from_keys:
            continue
        value = getattr(local, name)
        if value is not None:
            fields[name] = (value.dtype, tuple(value.shape[1:]), value.device.type == "cpu")
    times = local.times
    return {
        "orders_from_keys": (source.order, source.n) if from_keys else None,
        "fields": fields,
        "times": None if times is None else times.cpu(),
        "times_on_cpu": times is None or times.device.type == "cpu",
        "method": local.method,
        "engine": local.engine,
        "schedule": dict(local.schedule),
    }
