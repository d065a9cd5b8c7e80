"""The engine's time per row beside an oracle written by a user, timed from outside the oracle.

An oracle is wrapped in a proxy that times its methods (what a user would do), so the
engine's time is everything else in the run: building the oracle's inputs, the mode switches
around its calls, checking and normalising its rows, the draws. Reported per row, as CPU time
of the process (``time.process_time``: on this shared machine other processes' load does not
count) and as wall time, the median of ``--repeats`` runs, for the default method
(``autospec``; on a CPU with 16 draws or more and an oracle without chain queries, that is
sequential sampling's lock step). The proxy declares ``consistent_queries`` so that the
consistency check made once per run is not timed (``benchmarks/user_oracles.py`` lists its
time); every other capability is forwarded.

The script imports ``pyro_autospec`` from wherever Python finds it first, so an older commit
is measured with the same script: ``PYTHONPATH=/path/to/worktree python
benchmarks/engine_per_row.py``. Each table starts with the time of a fixed Python loop
(``sum(range(10**6))``), to compare machines and days.

Usage::

    python benchmarks/engine_per_row.py                  # n = 1024 and 4096, 16 draws; 256 at 1024
    python benchmarks/engine_per_row.py --smoke          # seconds
    PYRO_AUTOSPEC_NUMBA=0 python benchmarks/engine_per_row.py   # the lock step in NumPy
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit

os.environ.setdefault("OMP_NUM_THREADS", "1")
# after PYTHONPATH: an older checkout named there is the one measured
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import pyro_autospec  # noqa: E402
from pyro_autospec.engine import sample_any_order  # noqa: E402
from tests.catalogue.user_oracles import HandChain  # noqa: E402

#: Capabilities a proxy forwards from the oracle it times.
FORWARDED = ("borrows_inputs", "inference_safe")


class TimedOracle:
    """``oracle`` with the time inside its methods counted (``inside``, process and wall)."""

    consistent_queries = True  # the per-run check is not part of the engine's time per row

    def __init__(self, oracle, borrows: bool):
        self.oracle = oracle
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values
        self.borrows_inputs = borrows
        for name in FORWARDED[1:]:
            if hasattr(oracle, name):
                setattr(self, name, getattr(oracle, name))
        self.cpu = self.wall = 0.0

    def _timed(self, method, *args, **kwargs):
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return getattr(self.oracle, method)(*args, **kwargs)
        finally:
            self.cpu += time.process_time() - cpu
            self.wall += time.perf_counter() - wall

    def log_marginals(self, values, mask, **kwargs):
        return self._timed("log_marginals", values, mask, **kwargs)

    def log_marginals_at(self, values, mask, targets, **kwargs):
        return self._timed("log_marginals_at", values, mask, targets, **kwargs)


def measure(n: int, draws: int, borrows: bool, repeats: int) -> tuple[float, float]:
    """Median (CPU, wall) microseconds per row outside the oracle's methods."""
    oracle = TimedOracle(HandChain(n), borrows)
    sample_any_order(oracle, draws, seed=0)  # warm-up: first calls, numba's start
    cpu, wall = [], []
    for rep in range(repeats):
        oracle.cpu = oracle.wall = 0.0
        start_cpu, start_wall = time.process_time(), time.perf_counter()
        result = sample_any_order(oracle, draws, seed=rep + 1)
        rows = result.oracle_rows
        cpu.append(1e6 * (time.process_time() - start_cpu - oracle.cpu) / rows)
        wall.append(1e6 * (time.perf_counter() - start_wall - oracle.wall) / rows)
    return statistics.median(cpu), statistics.median(wall)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["1024:16", "4096:16", "1024:256"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.cases, args.repeats = ["64:16"], 2
    torch.set_num_threads(1)
    loop = min(timeit.repeat("sum(range(10**6))", number=1, repeat=5))
    where = os.path.dirname(pyro_autospec.__file__)
    numba = os.environ.get("PYRO_AUTOSPEC_NUMBA", "auto")
    print(f"# The engine's time per row, timed outside the oracle ({where})")
    print(f"`python {' '.join(sys.argv)}`; torch {torch.__version__}, 1 thread, ", end="")
    print(f"PYRO_AUTOSPEC_NUMBA={numba}; sum(range(10**6)) takes {1e3 * loop:.1f} ms here\n")
    print("| oracle | n | draws | engine CPU / row (us) | engine wall / row (us) |")
    print("|---|---:|---:|---:|---:|")
    for case in args.cases:
        n, draws = (int(x) for x in case.split(":"))
        for borrows in (False, True):
            cpu, wall = measure(n, draws, borrows, args.repeats)
            name = "hand-written chain" + (", borrows its inputs" if borrows else "")
            print(f"| {name} | {n} | {draws} | {cpu:.2f} | {wall:.2f} |", flush=True)


if __name__ == "__main__":
    main()
