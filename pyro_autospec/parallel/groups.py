"""Process groups of ``torch.distributed``: set one up, find this rank's device, share seeds.

The helpers that both uses of a process group build on: spreading a run's draws over the ranks
(``distributed=True``, :mod:`pyro_autospec.engine.spread`) and sharing one oracle's rows out
(:class:`~pyro_autospec.parallel.sharded.ShardedOracle`). This module imports nothing of this
library and not Pyro.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "all_gather",
    "broadcast_object",
    "broadcast_seeds",
    "communication_device",
    "draw_shares",
    "local_device",
    "require_process_group",
    "setup_process_group",
]


def require_process_group(what: str = "distributed=True", group=None) -> tuple[int, int]:
    """This process's rank and the world size of ``group``, or a clear error without a group.

    Parameters
    ----------
    what : str
        What needs the group, for the message (e.g. ``"sample_any_order(distributed=True)"``).
    group : ProcessGroup, optional
        Default: the whole world.

    Returns
    -------
    rank, world_size : int

    Raises
    ------
    RuntimeError
        If ``torch.distributed`` is not available in this PyTorch build, or no process group is
        initialised in this process.

    Examples
    --------
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> require_process_group()
    (0, 1)
    >>> dist.destroy_process_group()
    """
    if not dist.is_available():
        raise RuntimeError(
            f"{what} needs torch.distributed, which this PyTorch build does not have; "
            "install a build with distributed support, or leave distributed=False"
        )
    if not dist.is_initialized():
        raise RuntimeError(
            f"{what} needs an initialised torch.distributed process group, and this process "
            "has none. Launch the script with `torchrun --nproc-per-node K script.py` and call "
            "pyro_autospec.parallel.setup_process_group() (or "
            "torch.distributed.init_process_group) before sampling; in a single process, "
            "leave distributed=False."
        )
    return dist.get_rank(group), dist.get_world_size(group)


def setup_process_group(
    backend: str | None = None, *, timeout: float | None = None
) -> torch.device:
    """Initialise the default process group from ``torchrun``'s environment; return the device.

    With CUDA, rank ``LOCAL_RANK`` uses GPU ``LOCAL_RANK % device_count`` (set as the current
    device) and the default backend is NCCL; without CUDA the backend is gloo and the device the
    CPU. Several processes sharing one GPU need ``backend="gloo"`` (NCCL refuses two ranks on
    one device). Does nothing to the group if one is already initialised.

    Parameters
    ----------
    backend : {"nccl", "gloo"}, optional
        Default: ``"nccl"`` with CUDA, else ``"gloo"``.
    timeout : float, optional
        Seconds a collective may wait before failing (default: PyTorch's).

    Returns
    -------
    torch.device
        Where this rank should build its oracle (:func:`local_device`).

    Examples
    --------
    Under ``torchrun`` it reads ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``
    from the environment. Here a one-process group already exists, so only the device is
    returned (on a machine without CUDA):

    >>> import torch, torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> setup_process_group() == (torch.device("cuda", 0) if torch.cuda.is_available() else
    ...                           torch.device("cpu"))
    True
    >>> dist.destroy_process_group()
    """
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = local_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        options = {} if timeout is None else {"timeout": timedelta(seconds=float(timeout))}
        dist.init_process_group(backend, **options)
    return device


def local_device(device: str | torch.device | None = None) -> torch.device:
    """This rank's device: ``cuda`` without an index becomes ``cuda:LOCAL_RANK``.

    ``LOCAL_RANK`` (set by ``torchrun``) is taken modulo the number of visible GPUs, so several
    processes per GPU share them round-robin; without it, the current CUDA device. A CPU, or a
    CUDA device with an explicit index, is returned unchanged.

    Parameters
    ----------
    device : str or torch.device, optional
        Default: ``"cuda"`` when CUDA is available, else ``"cpu"``.

    Returns
    -------
    torch.device

    Examples
    --------
    >>> local_device("cpu")
    device(type='cpu')
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda" or device.index is not None:
        return device
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", int(local) % max(torch.cuda.device_count(), 1))


def communication_device(group=None) -> torch.device:
    """Where tensors must be for collectives of ``group``: this rank's GPU for NCCL, else CPU.

    This rank's GPU is :func:`local_device`'s (``LOCAL_RANK``, else the current device).

    Examples
    --------
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> communication_device()
    device(type='cpu')
    >>> dist.destroy_process_group()
    """
    if dist.get_backend(group) == "nccl":
        return local_device("cuda")
    return torch.device("cpu")


def draw_shares(num_draws: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous shares ``[(first, stop), ...]`` of ``num_draws`` draws, one per rank.

    Rank ``r`` takes ``num_draws // world_size`` draws, plus one if ``r < num_draws %
    world_size``; rank 0's share is never empty. Ranks past ``num_draws`` get empty shares.

    Examples
    --------
    >>> draw_shares(7, 3)
    [(0, 3), (3, 5), (5, 7)]
    >>> draw_shares(1, 2)
    [(0, 1), (1, 1)]
    """
    base, extra = divmod(int(num_draws), int(world_size))
    bounds = [r * base + min(r, extra) for r in range(world_size + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def broadcast_seeds(seeds: Sequence[int], group=None) -> list[int]:
    """Rank 0's list of int seeds, on every rank (for front ends that draw seeds themselves).

    A front end that turns ``seed=None`` into seeds from torch's global generator gets a
    different list on every rank; broadcasting rank 0's makes the ranks run the same draws.

    Parameters
    ----------
    seeds : sequence of int
        This rank's seeds (same length on every rank).
    group : ProcessGroup, optional

    Returns
    -------
    list of int

    Examples
    --------
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> broadcast_seeds([3, 4])
    [3, 4]
    >>> dist.destroy_process_group()
    """
    require_process_group("broadcast_seeds", group)
    values = torch.tensor([int(s) for s in seeds], dtype=torch.long)
    values = values.to(communication_device(group))
    dist.broadcast(values, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    return [int(v) for v in values.cpu().tolist()]


def broadcast_object(value, group=None):
    """Rank 0's ``value`` (any picklable object), on every rank of ``group``.

    Examples
    --------
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> broadcast_object({"fields": ["samples"]})
    {'fields': ['samples']}
    >>> dist.destroy_process_group()
    """
    box = [value]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    return box[0]


def all_gather(tensor: torch.Tensor, comm: torch.device) -> list[torch.Tensor]:
    """``tensor`` (same shape on every rank) of every rank, in rank order."""
    tensor = tensor.to(comm).contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return parts
