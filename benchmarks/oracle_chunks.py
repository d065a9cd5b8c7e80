"""Wall time of the DPP oracle against its chunk budget, on one device, same seed, one run.

The DPP oracle (and the spanning-tree oracle built on it) solves one linear system per row and
batches rows into chunks whose temporaries hold at most ``max_work_entries`` float64 entries.
The budget changes only the wall time: this script samples the same oracle with the same seed
at several budgets and checks that the samples, rounds and rows are identical, so the ratios
are of the same work.

Usage::

    python benchmarks/oracle_chunks.py --device cuda --n 1024 --num-samples 8   # a GPU
    python benchmarks/oracle_chunks.py --n 256 --num-samples 4                  # a CPU
    python benchmarks/oracle_chunks.py --smoke                                  # seconds

The default budget (``max_work_entries=None``) is ``2^23`` entries on a CPU and ``2^27`` on a
GPU; benchmarks/README.md has the measured table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rounds import FAMILIES, _synchronize  # noqa: E402

from pyro_autospec.engine import sample_any_order  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="n = 64, 2 draws: seconds")
    parser.add_argument("--family", choices=["dpp", "spanning_tree"], default="dpp")
    parser.add_argument("--n", type=int, default=1024, help="ground set size (dpp)")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--method", default="autospec")
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        default=[23, 25, 27],
        help="log2 of max_work_entries to time (the first is the baseline of the ratios)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.num_samples, args.budgets = 64, 2, [12, 23]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    oracle = FAMILIES[args.family][0](args.n, args.seed, device=args.device)
    dpp = getattr(oracle, "_dpp", oracle)
    n = oracle.num_coords
    warm = torch.zeros(2, n, dtype=torch.bool, device=args.device)
    oracle.log_marginals(warm.long(), warm)  # context, kernels, allocator
    _synchronize(args.device)
    print(
        f"{args.family} n={n}, {args.method}, {args.num_samples} draws, seed {args.seed}, "
        f"device {args.device}"
    )
    print(
        "| max_work_entries | rounds/sample | rows/sample | wall/sample (s) | speed-up | same samples |"
    )
    print("|---|---:|---:|---:|---:|---|")
    first = None
    for budget in args.budgets:
        dpp.max_work_entries = 1 << budget
        start = time.perf_counter()
        result = sample_any_order(oracle, args.num_samples, method=args.method, seed=args.seed)
        _synchronize(args.device)
        wall = (time.perf_counter() - start) / args.num_samples
        if first is None:
            first = (wall, result)
        same = bool(torch.equal(result.samples.cpu(), first[1].samples.cpu()))
        same = same and result.rounds == first[1].rounds
        same = same and result.oracle_rows == first[1].oracle_rows
        print(
            f"| 2^{budget} | {result.sample_rounds.double().mean():.1f} | "
            f"{result.oracle_rows / args.num_samples:.0f} | {wall:.3f} | "
            f"{first[0] / wall:.2f}x | {'yes' if same else 'NO'} |",
            flush=True,
        )
        if not same:
            print("the budget changed the samples: a bug (the budget must only cut work)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
