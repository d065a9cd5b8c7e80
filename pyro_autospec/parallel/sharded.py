"""One large oracle across the ranks of a ``torch.distributed`` group: every call's rows shared out.

:class:`ShardedOracle` wraps an oracle (a
:class:`~pyro_autospec.engine.protocols.MarginalOracle` or a
:class:`~pyro_autospec.engine.protocols.MeanOracle`) of which every rank holds a replica. Each call
(``log_marginals``, ``log_marginals_at``, ``log_marginals_chain`` or the mean oracle's
``__call__``) is split by rows: with ``B`` rows and ``W`` ranks, rank ``r`` evaluates rows
``r * ceil(B / W)`` onwards (``ceil(B / W)`` of them, the last rank's share padded by repeating
the last row), and the answers are all-gathered, so every rank sees the full answer. A chain
query is split by its ``C x L`` conditionings rather than by chains, so one long chain (a single
draw's verification) is shared out too: a rank's part of a chain becomes a shorter chain with
the skipped coordinates pinned. One
round's rows then cost about ``1 / W`` of the oracle work per rank: a draw's latency falls with
ranks once a round's rows are more than one device evaluates at once (:doc:`/benchmarks`).

The contract: **all ranks call in lockstep.** Every rank runs the same sampling call with the
same seed, the same draws and ``distributed=False`` (a ShardedOracle with ``distributed=True``
is refused: that spreads different draws over the ranks). The engine is deterministic given
the seed and the oracle's answers, and every rank receives the same answers, so the ranks'
sequences of oracle calls match and every rank returns the same result. Before each gather the
ranks exchange a small header (the call's number, method, row count and a checksum of the
inputs, and whether the local evaluation succeeded): a rank out of lockstep, or an exception on
one rank, then raises a clear error on every rank instead of a hang.

Exactness and the draws are unchanged: each row's answer is the replica's answer for that row.
The draws equal the unsharded oracle's bit for bit when a row's answer does not depend on
which other rows share its batch (as for the exact oracles of this package in float64);
a network whose last bits change with the batch size changes a draw only where an acceptance
test falls within rounding error of its threshold, and never the law.

This module does not import Pyro.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from pyro_autospec.parallel.groups import communication_device, require_process_group

__all__ = ["ShardedOracle"]

_METHODS = ("log_marginals", "log_marginals_at", "log_marginals_chain")
# Query methods that are not sharded: the wrapper hides them, so the engine asks for what they
# answer through the sharded ones.
_HIDDEN = ("log_marginals_chain_then",)
_CODES = {"log_marginals": 1, "log_marginals_at": 2, "log_marginals_chain": 3, "__call__": 4}
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_HEADER = 10  # call number, method, ok, rows, checksum bits, output ndim, 3 dims, dtype


class ShardedOracle:
    """An oracle whose every call is shared out by rows over the ranks of a process group.

    Parameters
    ----------
    oracle : MarginalOracle or MeanOracle
        This rank's replica, usually on this rank's device
        (:func:`~pyro_autospec.parallel.groups.local_device`). Every rank wraps a replica of
        the same oracle.
    group : ProcessGroup, optional
        The ranks that share the rows (default: the whole world).
    check_lockstep : bool
        Compare the ranks' inputs (row counts and a checksum) before each gather and raise if
        they differ. The header is exchanged anyway (it carries errors); the check is cheap.

    Attributes
    ----------
    oracle : object
        The wrapped replica. Its attributes (``num_coords``, ``num_values``, ``num_draws``,
        ``dim``, ``device``, ...) are read through the wrapper; of the query methods, only those
        the replica has are offered.
    calls : int
        Oracle calls made so far (the same on every rank).
    shards_rows : bool
        Always True: ``sample_any_order(..., distributed=True)`` refuses sharded oracles.

    Raises
    ------
    RuntimeError
        Without an initialised process group; during a call, if the ranks are out of lockstep
        or the replica raised on some rank (the rank that raised re-raises its own error).

    Examples
    --------
    Launched with ``torchrun --nproc-per-node K script.py``, every rank runs::

        device = setup_process_group()
        oracle = ShardedOracle(MarkovChainOracle(init, stay, 4096, device=device))
        result = sample_any_order(oracle, 1, seed=0)   # the same draw on every rank

    In one process (a group of one rank) it changes nothing:

    >>> import torch, torch.distributed as dist
    >>> from pyro_autospec import sample_any_order
    >>> from pyro_autospec.oracles import MarkovChainOracle
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> stay = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    >>> chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 32)
    >>> sharded = ShardedOracle(chain)
    >>> sharded.num_coords, sharded.num_values
    (32, 2)
    >>> a = sample_any_order(sharded, 2, seed=0)
    >>> b = sample_any_order(chain, 2, seed=0)
    >>> torch.equal(a.samples, b.samples), a.rounds == b.rounds
    (True, True)
    >>> dist.destroy_process_group()
    """

    shards_rows = True

    def __init__(self, oracle, *, group=None, check_lockstep: bool = True):
        if isinstance(oracle, ShardedOracle):
            raise ValueError("oracle is already a ShardedOracle; wrap the plain oracle once")
        require_process_group("ShardedOracle", group)
        self.oracle = oracle
        self.group = group
        self.check_lockstep = bool(check_lockstep)
        self.calls = 0
        for name in _METHODS:
            if callable(getattr(oracle, name, None)):
                setattr(self, name, self._sharded(name))
        params = None
        if isinstance(oracle, torch.nn.Module):
            params = next(iter(oracle.parameters()), None)
        self._param_device = None if params is None else params.device
        self._param_dtype = None if params is None else params.dtype

    def __getattr__(self, name: str):
        # Only called for attributes not found on the wrapper: read them from the replica,
        # except the query methods the replica lacks (the engine tests for them).
        if name in _METHODS or name in _HIDDEN or name.startswith("__") or name == "oracle":
            raise AttributeError(name)
        try:
            return getattr(self.oracle, name)
        except AttributeError:
            if name == "device" and self._param_device is not None:
                return self._param_device
            if name == "dtype" and self._param_dtype is not None:
                return self._param_dtype
            raise

    def __repr__(self) -> str:
        return f"ShardedOracle({self.oracle!r})"

    def __call__(self, t: torch.Tensor, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """The mean oracle's (or drift's) ``f(t[B], x[B, d]) -> [B, d]``, rows shared out."""
        if not callable(self.oracle):
            raise TypeError(
                f"the wrapped oracle {type(self.oracle).__name__} is not callable; only a "
                "MeanOracle (or a drift) can be called as f(t, x)"
            )
        return self._call("__call__", self.oracle, (t, x), kwargs)

    # ------------------------------------------------------------------------ sharding
    def _sharded(self, name: str):
        method = getattr(self.oracle, name)

        def call(*args, **kwargs):
            return self._call(name, method, args, kwargs)

        call.__name__ = name
        call.__doc__ = f"``{name}`` of the replica, rows shared out over the ranks."
        return call

    def _call(self, name: str, method, args: tuple, kwargs: dict) -> torch.Tensor:
        """Evaluate this rank's share of the rows of ``method(*args, **kwargs)``; gather all."""
        self.calls += 1
        rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        rows = int(args[0].shape[0])
        if world == 1 or rows == 0:
            with torch.no_grad():
                return method(*args, **kwargs)
        by_conditionings = name == "log_marginals_chain" and len(args) == 3
        if by_conditionings:
            share, evaluate = _chain_share(method, args, kwargs, rank, world)
        else:
            share = -(-rows // world)
            index = torch.arange(rank * share, (rank + 1) * share).clamp_(max=rows - 1)

            def part(value):
                if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == rows:
                    return value.index_select(0, index.to(value.device))
                return value

            def evaluate():
                return method(*(part(a) for a in args), **{k: part(v) for k, v in kwargs.items()})

        out, error = None, None
        try:
            with torch.no_grad():
                out = evaluate()
            if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != share:
                raise TypeError(
                    f"oracle.{name} returned {_describe(out)} for {share} rows; expected a "
                    f"tensor with {share} rows"
                )
            if out.dtype not in _DTYPES or out.dim() > 4:
                raise TypeError(
                    f"oracle.{name} returned a {out.dim()}-d {out.dtype} tensor; expected a "
                    "floating point tensor of at most 4 dimensions"
                )
        except Exception as exc:  # reported to every rank through the header, then re-raised
            error = exc
        comm = communication_device(self.group)
        header = self._header(name, rows, args, kwargs, out if error is None else None)
        headers = self._gather(header, comm)
        self._check_headers(name, headers, rank, error)
        parts = self._gather(out.detach().contiguous(), comm)
        if by_conditionings:
            num, length = args[2].shape
            flat = torch.cat(parts)[: num * length]
            return flat.reshape(num, length, *flat.shape[1:]).to(out.device)
        return torch.cat(parts)[:rows].to(out.device)

    def _header(self, name, rows, args, kwargs, out) -> torch.Tensor:
        checksum = torch.zeros((), dtype=torch.float64)
        if self.check_lockstep:
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor):
                    checksum = checksum + value.detach().double().sum().cpu()
        header = torch.zeros(_HEADER, dtype=torch.long)
        header[0], header[1], header[3] = self.calls, _CODES[name], rows
        header[4] = checksum.view(torch.long)
        if out is not None:
            header[2] = 1
            header[5] = out.dim()
            for i, size in enumerate(out.shape[1:]):
                header[6 + i] = size
            header[9] = _DTYPES.index(out.dtype)
        return header

    def _gather(self, tensor: torch.Tensor, comm: torch.device) -> list[torch.Tensor]:
        tensor = tensor.to(comm)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, tensor, group=self.group)
        return parts

    def _check_headers(self, name, headers, rank, error) -> None:
        table = torch.stack([h.cpu() for h in headers])  # [W, _HEADER]
        failed = [r for r in range(table.shape[0]) if int(table[r, 2]) == 0]
        if error is not None:
            raise RuntimeError(
                f"ShardedOracle: rank {rank}'s replica failed on its share of oracle.{name} "
                f"(call {self.calls}): {error}"
            ) from error
        lockstep = (0, 1, 3, 4) if self.check_lockstep else (0, 1, 3)
        differ = [c for c in lockstep if not bool((table[:, c] == table[0, c]).all())]
        if differ:
            calls = ", ".join(
                f"rank {r}: call {int(table[r, 0])} of method {int(table[r, 1])} "
                f"with {int(table[r, 3])} rows"
                for r in range(table.shape[0])
            )
            raise RuntimeError(
                f"ShardedOracle: the ranks called the oracle out of lockstep ({calls}; inputs "
                f"{'differ' if 4 in differ else 'agree'}). Every rank must run the same sampling "
                "call with the same seed and the same draws, and distributed=False."
            )
        if failed:
            raise RuntimeError(
                f"ShardedOracle: the replica raised on rank(s) {failed} while evaluating their "
                f"share of oracle.{name} (call {self.calls}); see the error on those ranks"
            )
        if not bool((table[:, 5:] == table[0, 5:]).all()):
            raise RuntimeError(
                f"ShardedOracle: the ranks' replicas returned different shapes or dtypes for "
                f"oracle.{name}: {table[:, 5:].tolist()}; every rank must hold the same oracle"
            )


def _chain_share(method, args: tuple, kwargs: dict, rank: int, world: int):
    """This rank's share of a chain query, split by conditionings, not by chains.

    The ``C x L`` conditionings of ``log_marginals_chain(values, mask, chain)`` are cut into
    ``W`` contiguous ranges in row-major order, so a single long chain (one draw's
    verification) is shared out too. A range starting at position ``j0`` of chain ``c`` is the
    sub-chain ``chain[c, j0:]`` with ``chain[c, :j0]`` added to the pins: position ``j`` still
    conditions on the prefix and ``chain[c, :j]``. Sub-chains are padded by repeating their last
    coordinate (a point mass, which the protocol allows).

    Returns
    -------
    share : int
        Conditionings per rank (the last rank's range padded by repeating the last one).
    evaluate : callable
        Runs the replica on this rank's sub-chains; returns their answers ``[share, q]`` in
        row-major order of the original ``[C, L]`` conditionings.
    """
    values, mask, chain = args
    num, length = chain.shape
    total = num * length
    share = -(-total // world)
    device = chain.device
    flat = torch.arange(rank * share, (rank + 1) * share, device=device).clamp_(max=total - 1)
    which, position = flat // length, flat % length
    first = int(which[0])
    chains = torch.arange(first, int(which[-1]) + 1, device=device)
    start = torch.zeros(len(chains), dtype=torch.long, device=device)
    start[0] = position[0]
    stop = torch.full_like(start, length)
    stop[-1] = position[-1] + 1
    width = int((stop - start).max())
    steps = torch.arange(width, device=device)
    columns = torch.minimum(start[:, None] + steps, stop[:, None] - 1)
    full = chain.index_select(0, chains)
    sub_chain = full.gather(1, columns)
    before = (torch.arange(length, device=device) < start[:, None]).long()
    pins = torch.zeros(len(chains), mask.shape[1], dtype=torch.long, device=device)
    pins.scatter_add_(1, full, before)
    sub_mask = mask.index_select(0, chains) | (pins > 0)
    sub_values = values.index_select(0, chains)
    sub_kwargs = {
        k: v.index_select(0, chains.to(v.device))
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == num
        else v
        for k, v in kwargs.items()
    }
    local = which - first
    offset = position - start[local]

    def evaluate():
        out = method(sub_values, sub_mask, sub_chain, **sub_kwargs)
        if not isinstance(out, torch.Tensor) or tuple(out.shape[:2]) != (len(chains), width):
            return out  # reported as a wrong shape by the caller
        return out[local, offset]

    return share, evaluate


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
