"""Helpers of the distributed tests: spawning gloo ranks on the CPU, scenario bookkeeping,
comparisons with the single-process run, and the small targets they share.

``run_ranks(worker, tmp_path)`` runs ``worker(rank, *args)`` in ``WORLD`` spawned processes of
one gloo group and returns their values; ``attempt`` records one scenario's value or error;
``as_dict`` and ``assert_same`` compare a SampleResult with the single-process one.
"""

from __future__ import annotations

import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
STAY = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
INIT = torch.tensor([0.4, 0.6])
POINTS = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
SDE_TIMES = torch.linspace(0.0, 1.0, 17)


# ------------------------------------------------------------------------ spawning ranks
def _entry(rank, world_size, store, out_dir, worker, args):
    """One rank: a gloo group over a file store (no ports to race for), then ``worker``."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        torch.save(worker(rank, *args), Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(worker, tmp_path: Path, *args, world_size: int = WORLD, timeout: float = 180.0):
    """``worker(rank, *args)`` in ``world_size`` spawned gloo processes; their return values.

    Collectives time out after 60 s; the processes are killed after ``timeout`` seconds, and
    none is left behind whatever happens.
    """
    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    context = mp.start_processes(
        _entry,
        args=(world_size, str(tmp_path / "store"), str(out_dir), worker, args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the {world_size} ranks did not finish in {timeout} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join()
    return [torch.load(out_dir / f"{r}.pt", weights_only=False) for r in range(world_size)]


def attempt(scenarios: dict, name: str, fn) -> None:
    """Store ``fn()``, or the error it raised (as text), under ``name``: one scenario failing
    must not hide the others."""
    try:
        scenarios[name] = fn()
    except Exception as exc:  # compared in the test process
        scenarios[name] = {"raised": type(exc).__name__, "message": str(exc), "tb": _tb()}


def _tb() -> str:
    return traceback.format_exc()


def as_dict(result) -> dict:
    """The comparable fields of a SampleResult (CPU tensors and numbers)."""
    out = {}
    for name in ("samples", "log_prob", "orders", "sample_rounds", "paths", "error", "times"):
        value = getattr(result, name)
        out[name] = None if value is None else value.detach().cpu()
    out.update(
        rounds=result.rounds,
        oracle_rows=result.oracle_rows,
        method=result.method,
        engine=result.engine,
        seed=result.seed,
        per_rank=getattr(result, "per_rank", None),
    )
    return out


def assert_same(got: dict, want: dict) -> None:
    assert "raised" not in got, got["tb"]
    for name in ("samples", "log_prob", "orders", "sample_rounds", "paths", "error", "times"):
        a, b = got[name], want[name]
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, name
            assert torch.equal(a, b), f"{name} differs from the single-process run"
    assert got["method"] == want["method"] and got["engine"] == want["engine"]
    assert got["seed"] == want["seed"]


class FamilyOracle:
    """One independent target per draw: draw ``s`` puts mass ``sigmoid(s - 2)`` on value 1."""

    num_coords, num_values, num_draws = 5, 2, 6

    def log_marginals(self, values, mask, draws):
        logit = draws.double() - 2.0
        row = torch.stack(
            [torch.nn.functional.logsigmoid(-logit), torch.nn.functional.logsigmoid(logit)], -1
        )
        return row[:, None, :].expand(values.shape[0], self.num_coords, 2).clone()


@contextmanager
def one_rank_group():
    """A gloo process group of this process alone (in memory, no ports), destroyed on exit."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
