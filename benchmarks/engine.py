"""The engine's own cost, and wall time against the baselines on a CPU, side by side in one run.

Five parts (``--parts``), each printing a markdown table:

* ``overhead``: engine overhead per row with an oracle that implements only
  ``log_marginals_at`` (a Markov chain wrapped so that the engine sees no chain queries), at
  each ``--sizes`` n, for the fast engine and (at the smallest n) the generator reference.
  ``wall - oracle`` is everything outside the oracle's methods; the protocol's dense inputs
  (``values`` and ``mask``, ``O(n)`` per row) are reported apart from the engine's own
  bookkeeping, since an oracle that answers chain queries natively needs them once per chain.
* ``race``: wall time of ``autospec``, ``speculative``, ``agr24`` and ``sequential`` on the
  Markov chain, the HMM posterior and the tree Potts model of ``benchmarks/rounds.py``, with
  the oracles as shipped (native chain queries where they have them), at ``--race-n``; also
  autospec with each ``--max-blocks`` (smaller blocks: fewer rows for more rounds, the
  trade that decides the race on a CPU).
* ``ops``: torch operations per round of the race's methods (not sequential), the engine's
  and the oracle's apart. A count, free of timing noise: at these sizes a CPU pays each
  operation's fixed dispatch price, so this is what a round costs beyond the rows' own work.
* ``draws``: the same race at ``--race-n`` for ``--draws`` draws at a time (1 to 64 by
  default), Markov chain and HMM: where autospeculation wins and loses on a CPU as the batch
  grows (rounds stay about the same, rows add up, and a CPU pays for every row).
* ``profile`` (only when named): the ``overhead`` setting at the largest n under cProfile,
  the engine's own time by function, and the floor of the dense inputs (the same bytes
  written by NumPy alone).
* ``batching``: continuous batching (``max_concurrent_draws``) on many draws of the noisy
  Ising grid of ``benchmarks/pyro_models.py`` (AutoSpec with exact enumeration): whole-run
  rounds and rows at several concurrencies against all draws at once and sequential sampling.

``--device cuda`` runs the oracles and the engine on a GPU (one small untimed run per method
first). Timings come from a shared machine: read the ratios within a table, not the absolute
seconds. ``--repeats K`` runs the race K times, interleaved, and keeps each method's fastest
wall time (other work only ever slows a run down). ``uptime``'s load is printed with each
part.

Usage::

    python benchmarks/engine.py                 # all parts (minutes on 2 CPU cores)
    python benchmarks/engine.py --smoke         # seconds, for CI
    python benchmarks/engine.py --parts race --race-n 4096 --num-samples 16 --repeats 3
    python benchmarks/engine.py --parts draws --draws 1 4 16 64
    python benchmarks/engine.py --device cuda --parts overhead race --max-blocks 16  # on a GPU
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# rounds.py's families, and its METHODS for the race: the front end's discrete methods, read
# from the registry (pyro_autospec.engine.methods), sequential last
from rounds import METHODS, hmm, markov, tree_potts  # noqa: E402

from pyro_autospec.engine import compiled, sample_any_order  # noqa: E402

FAMILIES = {"markov": markov, "hmm": hmm, "tree_potts": tree_potts}


class RowsOnly:
    """A third-party oracle: the protocol's ``log_marginals_at`` and nothing else."""

    def __init__(self, oracle):
        self.inner = oracle
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values
        self.device = oracle.device

    def log_marginals_at(self, values, mask, targets):
        return self.inner.log_marginals_at(values, mask, targets)


def load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on every platform
        return "load average unknown"


def lock_step_note() -> str:
    """Which lock step (NumPy or numba-compiled) this process runs: wall times of the
    sequential methods depend on it, their draws do not."""
    setting = compiled.setting()
    if not compiled.wanted():
        return "Sequential sampling's lock step runs in NumPy (numba absent or turned off)."
    if setting == "on":
        return "Sequential sampling's lock step runs compiled (PYRO_AUTOSPEC_NUMBA=1)."
    return (
        "Sequential sampling's lock step runs in NumPy until this process's lock steps reach "
        f"{compiled.START_AFTER_STEPS:,} steps, then compiled (the default; "
        "PYRO_AUTOSPEC_NUMBA=1 compiles from the first step)."
    )


def warm_up(oracle, methods, args) -> None:
    """On a GPU, one small untimed run per method first (context, kernels, allocator)."""
    if torch.device(args.device).type != "cpu":
        for m in methods:
            sample_any_order(oracle, 2, seed=args.seed + 1, method=m)


def overhead(args) -> None:
    print(f"\n## Engine overhead per row ({args.num_samples} draws, one torch thread; {load()})\n")
    print(
        "| n | engine | rounds | rows/draw | wall (s) | oracle (s) | dense inputs (s) "
        "| (wall - oracle) / row (us) | bookkeeping / row (us) |"
    )
    print("|" + "---|" * 9)
    for k, n in enumerate(args.sizes):
        oracle = RowsOnly(markov(n, device=args.device))
        warm_up(oracle, ["autospec"], args)
        engines = ["fast", "reference"] if k == 0 and not args.no_reference else ["fast"]
        for engine in engines:
            r = sample_any_order(oracle, args.num_samples, seed=args.seed, engine=engine)
            outside = r.wall_time - r.timing["oracle"]
            own = outside - r.timing["inputs"]
            print(
                f"| {n} | {engine} | {r.rounds} | {r.oracle_rows / r.num_samples:.0f} | "
                f"{r.wall_time:.2f} | {r.timing['oracle']:.2f} | {r.timing['inputs']:.2f} | "
                f"{1e6 * outside / r.oracle_rows:.2f} | {1e6 * own / r.oracle_rows:.2f} |",
                flush=True,
            )


def _runs(methods, args) -> list[tuple[str, str, dict]]:
    """``(label, method, knobs)``: each method, then autospec at each ``--max-blocks``."""
    return [(m, m, {}) for m in methods] + [
        (f"autospec, max_block={k}", "autospec", {"max_block": k}) for k in args.max_blocks
    ]


def race(args) -> None:
    n = args.race_n
    print(
        f"\n## Wall time against the baselines, n = {n}, {args.num_samples} draws, one torch "
        f"thread, fastest of {args.repeats} interleaved run(s) per method ({load()})\n"
    )
    print(
        "| family | method | rounds (whole run) | rounds/draw | rows/draw | wall (s) "
        "| wall / draw (s) | sequential / this | this / fastest baseline |"
    )
    print("|" + "---|" * 9)
    runs = _runs(METHODS, args)
    for family in args.families:
        oracle = FAMILIES[family](n, device=args.device)
        warm_up(oracle, METHODS, args)
        results, wall = {}, {}
        for _ in range(args.repeats):  # interleaved, so that a slow spell hits every method
            for label, m, knobs in runs:
                r = sample_any_order(
                    oracle, args.num_samples, seed=args.seed, method=m, schedule=knobs
                )
                results[label] = r  # the same draws, rounds and rows every time
                wall[label] = min(wall.get(label, math.inf), r.wall_time)
        fastest = min(wall[m] for m in METHODS if m != "autospec")
        for label, _, _ in runs:
            r = results[label]
            print(
                f"| {family} | {label} | {r.rounds} | {r.sample_rounds.double().mean():.1f} | "
                f"{r.oracle_rows / r.num_samples:.0f} | {wall[label]:.2f} | "
                f"{wall[label] / r.num_samples:.3f} | "
                f"{wall['sequential'] / wall[label]:.1f} | "
                f"{wall[label] / fastest:.2f} |",
                flush=True,
            )


_PACKAGE = os.sep + "pyro_autospec" + os.sep


#: Torch calls that make the host wait for the device on a GPU: their result (a Python
#: number, or a shape that depends on the data) is needed before the next call can be issued.
_SYNCING = {
    "nonzero",
    "item",
    "tolist",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "repeat_interleave",
    "unique",
    "_unique2",
    "unique_consecutive",
    "masked_select",
    "argwhere",
    "cpu",  # a copy to the host (the host control plane's one read per oracle output)
}


def _waits(func, args, kwargs=None) -> bool:
    """Whether ``func`` is indexing with a boolean mask (a data-dependent shape), or a ``to``
    that copies to the host."""
    name = getattr(func, "__name__", "")
    if name == "to":
        target = [*args[1:], *(kwargs or {}).values()]
        return any(str(x) == "cpu" for x in target)
    if name not in ("__getitem__", "__setitem__") or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


class _CountOps(TorchFunctionMode):
    """Counts the torch functions and tensor methods called, by the subpackage (``engine``,
    ``oracles``, ...) of the innermost frame of the package that called them, and among them
    the calls that would wait for a GPU (:data:`_SYNCING`, boolean-mask indexing)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}
        self.syncs = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and _PACKAGE not in frame.f_code.co_filename:
            frame = frame.f_back
        part = "other"
        if frame is not None:
            part = frame.f_code.co_filename.rsplit(_PACKAGE, 1)[1].split(os.sep)[0]
            if getattr(func, "__name__", "") in _SYNCING or _waits(func, args, kwargs):
                self.syncs += 1
        self.counts[part] = self.counts.get(part, 0) + 1
        return func(*args, **(kwargs or {}))


def ops(args) -> None:
    """Torch operations per round and per run, engine and oracle apart, and the calls that
    would wait for a GPU: counts, so free of timing noise."""
    n = args.race_n
    print(
        f"\n## Torch operations per round, n = {n}, {args.num_samples} draws\n\n"
        "Every torch function or tensor method the run calls (arithmetic, indexing, reductions, "
        "shape queries), by the part of the package that called it. On a CPU at these sizes "
        "each costs mostly its fixed dispatch price, a few microseconds. Where a call's price "
        "does not depend on its batch (kernel launches on a GPU), a run costs about its calls "
        "per run; syncs are the calls that would make the host wait for a GPU (`nonzero`, "
        "`.item()`, `bool()`, boolean-mask indexing, ...). Counted on this machine: a proxy "
        "for a GPU, not a GPU measurement.\n"
    )
    print(
        "| family | method | rounds | rows/draw | engine ops / round | oracle ops / round "
        "| calls per run (thousands) | syncs / round | syncs per run (thousands) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    runs = _runs(list(METHODS), args)
    for family in args.families:
        oracle = FAMILIES[family](n, device=args.device)
        for label, m, knobs in runs:
            with _CountOps() as counter:
                r = sample_any_order(
                    oracle, args.num_samples, seed=args.seed, method=m, schedule=knobs
                )
            per_round = {k: v / r.rounds for k, v in counter.counts.items()}
            total = sum(counter.counts.values())
            print(
                f"| {family} | {label} | {r.rounds} | {r.oracle_rows / r.num_samples:.0f} | "
                f"{per_round.get('engine', 0):.0f} | {per_round.get('oracles', 0):.0f} | "
                f"{total / 1000:.0f} | {counter.syncs / r.rounds:.0f} | "
                f"{counter.syncs / 1000:.1f} |",
                flush=True,
            )


def draws(args) -> None:
    """Wall time per draw against the number of draws sampled at once."""
    n = args.race_n
    print(
        f"\n## Draws at a time, n = {n}, one torch thread ({load()})\n\n"
        "Each line is one `sample_any_order` call with that many draws; the last column is "
        "this method's wall time over the fastest baseline's (speculative, AGR24, sequential) "
        "for the same draws.\n"
    )
    print(
        "| family | draws | method | rounds (whole run) | rows/draw | wall (s) "
        "| wall / draw (s) | this / fastest baseline |"
    )
    print("|" + "---|" * 8)
    for family in [f for f in args.families if f != "tree_potts"]:
        oracle = FAMILIES[family](n, device=args.device)
        warm_up(oracle, METHODS, args)
        for count in args.draws:
            results = {
                m: sample_any_order(oracle, count, seed=args.seed, method=m) for m in METHODS
            }
            fastest = min(results[m].wall_time for m in METHODS if m != "autospec")
            for m in METHODS:
                r = results[m]
                print(
                    f"| {family} | {count} | {m} | {r.rounds} | {r.oracle_rows / count:.0f} | "
                    f"{r.wall_time:.2f} | {r.wall_time / count:.3f} | "
                    f"{r.wall_time / fastest:.2f} |",
                    flush=True,
                )


def batching(args) -> None:
    """Whole-run rounds of many draws of the noisy Ising grid of ``pyro_models.py``."""
    from pyro_models import ising, ising_data

    from pyro_autospec.infer import AutoSpec

    rows, cols = args.grid
    draws = args.batching_draws
    y = ising_data(rows, cols)
    print(
        f"\n## Continuous batching: {draws} draws of the noisy {rows}x{cols} Ising grid "
        f"(AutoSpec, exact enumeration; {load()})\n"
    )
    print(
        "| method | max_concurrent_draws | rounds (whole run) | mean rounds/draw "
        "| rows/draw | wall (s) |"
    )
    print("|---|---|---|---|---|---|")
    runs = [("autospec", None)] + [("autospec", c) for c in args.concurrency]
    runs.append(("sequential", None))
    for method, concurrency in runs:
        knobs = {} if concurrency is None else {"max_concurrent_draws": concurrency}
        fit = AutoSpec(
            ising,
            num_samples=draws,
            method=method,
            seed=args.seed,
            disable_progbar=True,
            device=args.device,
            schedule=knobs,
        )
        start = time.perf_counter()
        fit.run(y)
        wall = time.perf_counter() - start
        r = fit.results[0]
        print(
            f"| {method} | {concurrency or 'all'} | {r.rounds} | "
            f"{r.sample_rounds.double().mean():.2f} | {r.oracle_rows / draws:.0f} | {wall:.2f} |",
            flush=True,
        )


def profile(args) -> None:
    """Where the engine's time goes outside the oracle, by function (cProfile), for the
    ``overhead`` setting at the largest ``--sizes`` n; and the floor of the dense inputs: the
    time to fill a ``[rows, n]`` int64 ``values`` and bool ``mask`` with NumPy alone."""
    import cProfile
    import pstats

    import numpy as np

    n = max(args.sizes)
    oracle = RowsOnly(markov(n, device=args.device))
    warm_up(oracle, ["autospec"], args)
    profiler = cProfile.Profile()
    profiler.enable()
    r = sample_any_order(oracle, args.num_samples, seed=args.seed)
    profiler.disable()
    rows = r.oracle_rows
    stats = pstats.Stats(profiler).stats
    engine_root = str(Path(__file__).resolve().parents[1] / "pyro_autospec" / "engine")
    own: dict[str, float] = {}
    for (filename, _, name), (_, _, tottime, _, _) in stats.items():
        if filename.startswith(engine_root):
            key = f"{Path(filename).name}:{name}"
            own[key] = own.get(key, 0.0) + tottime
    outside = r.wall_time - r.timing["oracle"]
    print(
        f"\n## Where the engine's time goes (n = {n}, {args.num_samples} draws, an oracle with "
        f"`log_marginals_at` only, under cProfile; {load()})\n"
    )
    print(
        f"{rows} rows in {r.rounds} rounds; wall {r.wall_time:.2f} s, in the oracle "
        f"{r.timing['oracle']:.2f} s, outside it {1e6 * outside / rows:.2f} us per row, of "
        f"which the dense inputs {1e6 * r.timing['inputs'] / rows:.2f} us.\n"
    )
    print("| engine function (own time) | seconds | us per row |")
    print("|---|---|---|")
    for key, seconds in sorted(own.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| `{key}` | {seconds:.3f} | {1e6 * seconds / rows:.2f} |")
    # the floor: the same bytes written by NumPy alone, in calls of the engine's size
    per_call = max(1, 2**20 // n)
    frame = np.zeros(n, dtype=np.int64)
    ranks = np.arange(n, dtype=np.int16 if n < 2**15 else np.int32)
    values = np.empty((per_call, n), dtype=np.int64)
    mask = np.empty((per_call, n), dtype=bool)
    cuts = np.arange(per_call)[:, None]
    start = time.perf_counter()
    for _ in range(max(1, rows // per_call)):
        values[...] = frame
        np.less(ranks, cuts, out=mask)
    floor = (time.perf_counter() - start) / (max(1, rows // per_call) * per_call)
    print(
        f"\nFloor of the dense inputs: {1e6 * floor:.2f} us per row (a `[{per_call}, {n}]` "
        "int64 `values` filled from one frame and a bool `mask` from ranks, NumPy alone)."
    )


PARTS = {
    "overhead": overhead,
    "race": race,
    "ops": ops,
    "draws": draws,
    "batching": batching,
    "profile": profile,
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (CI)")
    parser.add_argument(
        "--parts", nargs="+", default=["overhead", "race", "ops", "draws", "batching"]
    )
    parser.add_argument("--sizes", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--race-n", type=int, default=4096)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument(
        "--max-blocks",
        nargs="*",
        type=int,
        default=[16],
        help="race: also autospec with these max_block (fewer rows, more rounds)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="race: run every method this many times, interleaved, and keep its fastest wall "
        "time (this machine's noise is one-sided: other work only slows a run down)",
    )
    parser.add_argument("--grid", nargs=2, type=int, default=[4, 5], help="Ising grid rows cols")
    parser.add_argument("--draws", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--batching-draws", type=int, default=1000)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[400, 250, 100])
    parser.add_argument("--no-reference", action="store_true", help="skip the reference engine")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="where the oracles run (cpu, cuda)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.num_samples, args.race_n = [32], 2, 32
        args.grid, args.batching_draws, args.concurrency = [2, 3], 40, [10]
        args.draws, args.max_blocks = [1, 4], [4]
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    where = args.device
    if torch.device(where).type == "cuda":
        where += f" ({torch.cuda.get_device_name(torch.device(where))})"
    print(f"# Engine benchmark (torch {torch.__version__}, {args.threads} thread(s), {where})")
    print(f"\n{lock_step_note()}")
    for part in args.parts:
        PARTS[part](args)
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
