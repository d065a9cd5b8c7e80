"""Rounds, rows and wall time of diffusion sampling: autospec (its default step-by-step rule and
``rule="block"``) against sequential and picard.

Target: a finite-support distribution (``--num-points`` random points on the unit sphere, equal
weights) in d = 2 and d = 16, sampled by stochastic localization on the default grid
(``diffusion_times(N, delta)``: uniform to t = 1, then geometric to T = 1 / delta) for
N in {64, 256, 1024, 4096}. Prints one markdown table and the issue's done criteria:

* median autospec rounds per sample at N = 1024 <= N / 10, in both dimensions;
* mean autospec rows per sample <= 4 N log2 N at every N.

"rounds (run)" counts the whole run's rounds (its batched calls), which its slowest draw sets.
"In the drift" is the time inside the denoiser's calls; "outside the drift / row" is the rest
of the wall time (the engine) per drift row. Picard's wall time and drift time include the
sequential pass that measures its error.

``--sweep 32 64 128 256 512`` instead sweeps the default rule's ``max_block`` (rounds against
rows and wall time, the fastest of ``--repeats`` runs) at N in {1024, 4096}. Every table is
timed after one short untimed draw per setting.

Run ``python benchmarks/diffusion.py`` or ``--smoke`` (seconds). The ``rule=block`` rows run
on the reference engine and take most of a full run (over ten minutes for d = 16 at
N = 4096 on 2 CPU cores); ``--no-block`` skips them. Rounds and rows do not depend on the machine; wall times do (single-threaded torch
unless ``--threads``). The run ends with the same comparison for a trained diffusion guide on
the model of ``tutorials/05_diffusion_guides.ipynb`` (``benchmarks/diffusion_guides.py``;
``--no-guide`` skips it).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch

from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, runs in seconds")
    parser.add_argument("--num-samples", type=int, default=None, help="samples per setting")
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="values of N")
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--num-points", type=int, default=32, help="support size of the target")
    parser.add_argument("--delta", type=float, default=1e-3, help="grid ends at T = 1 / delta")
    parser.add_argument(
        "--rho", default="1.0", help="rule=block's thread growth: a float or 'adaptive'"
    )
    parser.add_argument("--window", type=int, default=16, help="picard window")
    parser.add_argument("--tolerance", type=float, default=0.1, help="picard tolerance")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="torch device of the oracle")
    parser.add_argument(
        "--engine",
        choices=["fast", "reference"],
        default="fast",
        help="engine of the autospec and sequential rows (same draws; reference is slow)",
    )
    parser.add_argument(
        "--no-guide", action="store_true", help="skip the trained diffusion guide row"
    )
    parser.add_argument(
        "--no-block",
        action="store_true",
        help="skip the rule=block rows (the reference engine: minutes at N = 4096)",
    )
    parser.add_argument(
        "--sweep",
        type=int,
        nargs="+",
        default=None,
        metavar="MAX_BLOCK",
        help="only sweep the default rule's max_block over these values (rounds against rows)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="--sweep: wall time is the fastest of this many"
    )
    return parser.parse_args(argv)


def _warm_up(oracle, settings) -> None:
    """One short untimed draw per setting (``(method, options, knobs)``), so that no timed row
    pays for the first kernel launches, caches or lazy imports (seconds on a GPU's first call)."""
    for method, options, knobs in settings:
        sample_diffusion(
            oracle, 2, num_steps=16, delta=0.01, method=method, seed=0, schedule=knobs, **options
        )


def _timed(oracle, num_samples: int, n: int, args, repeats: int = 1, **kwargs):
    """``(result, wall)``: one setting's draws and the fastest of ``repeats`` wall times (the
    same draws each time)."""
    wall = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        result = sample_diffusion(
            oracle, num_samples, num_steps=n, delta=args.delta, seed=args.seed + 1, **kwargs
        )
        wall = min(wall, time.perf_counter() - start)
    return result, wall


def sweep(args: argparse.Namespace) -> bool:
    """The default rule's rounds against rows and wall time as its largest window grows."""
    torch.set_num_threads(args.threads)
    steps = args.steps or [1024, 4096]
    num_samples = args.num_samples or 32
    print(
        f"# max_block sweep of the default rule: finite support ({args.num_points} points on "
        f"the unit sphere), delta = {args.delta}, {num_samples} samples per setting\n"
    )
    print(
        "| d | N | max_block | rounds/sample median | rounds (run) | rows/sample / N | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for d in args.dims:
        oracle = FiniteSupportDenoiser.unit_sphere(args.num_points, d, seed=args.seed)
        if args.device is not None:
            oracle = oracle.to(args.device)
        _warm_up(oracle, [("autospec", {}, {"max_block": m}) for m in args.sweep])
        for n in steps:
            for max_block in args.sweep:
                result, wall = _timed(
                    oracle,
                    num_samples,
                    n,
                    args,
                    repeats=args.repeats,
                    schedule={"max_block": max_block},
                )
                median = float(result.sample_rounds.double().median())
                rows = result.oracle_rows / num_samples / n
                print(
                    f"| {d} | {n} | {max_block} | {median:.0f} | {result.rounds} | {rows:.2f} "
                    f"| {wall:.2f} |",
                    flush=True,
                )
    return True


def run(args: argparse.Namespace) -> bool:
    if args.sweep:
        return sweep(args)
    torch.set_num_threads(args.threads)
    steps = args.steps or ([16, 64] if args.smoke else [64, 256, 1024, 4096])
    num_samples = args.num_samples or (4 if args.smoke else 32)
    rho = args.rho if args.rho == "adaptive" else float(args.rho)
    print(
        f"# Diffusion benchmark: finite support ({args.num_points} points on the unit sphere), "
        f"delta = {args.delta}, {num_samples} samples per setting, rho = {rho} (rule=block), "
        f"picard window = {args.window}, tolerance = {args.tolerance}, engine = {args.engine}\n"
    )
    header = (
        "| d | N | method | rounds/sample median | rounds/sample p90 | rounds (run) "
        "| rows/sample (mean) | rows / (N log2 N) | wall time (s) | in the drift (s) "
        "| outside the drift / row (us) | picard error (median / max) |"
    )
    print(header)
    print("|" + "---|" * 12)
    medians: dict[tuple[int, int], float] = {}
    rows_ok: list[tuple[int, int, float, float]] = []
    for d in args.dims:
        oracle = FiniteSupportDenoiser.unit_sphere(args.num_points, d, seed=args.seed)
        if args.device is not None:
            oracle = oracle.to(args.device)
        engine = {"engine": args.engine}
        settings = (  # (label, method, options, schedule knobs)
            ("autospec", "autospec", engine, {}),
            ("autospec, rule=block", "autospec", engine, {"rule": "block"}),
            ("sequential", "sequential", engine, {}),
            ("picard", "picard", {}, {"window": args.window, "tolerance": args.tolerance}),
        )
        if args.no_block:
            settings = tuple(s for s in settings if s[3].get("rule") != "block")
        _warm_up(oracle, [(method, options, knobs) for _, method, options, knobs in settings])
        for n in steps:
            for label, method, options, knobs in settings:
                if knobs.get("rule") == "block":
                    knobs = {**knobs, "rho": rho}
                result, wall = _timed(
                    oracle, num_samples, n, args, method=method, schedule=knobs, **options
                )
                rounds = result.sample_rounds.double().numpy()
                median, p90 = float(np.median(rounds)), float(np.quantile(rounds, 0.9))
                rows = result.oracle_rows / num_samples
                error = ""
                if result.error is not None:
                    error = f"{result.error.median().item():.2e} / {result.error.max().item():.2e}"
                inside = result.timing["oracle"]
                outside = (wall - inside) / result.oracle_rows * 1e6
                print(
                    f"| {d} | {n} | {label} | {median:.0f} | {p90:.0f} | {result.rounds} | "
                    f"{rows:.0f} | {rows / (n * math.log2(n)):.2f} | {wall:.2f} | "
                    f"{inside:.2f} | {outside:.1f} | {error} |",
                    flush=True,
                )
                if label == "autospec":
                    medians[(d, n)] = median
                    rows_ok.append((d, n, rows, 4 * n * math.log2(n)))
    print("\n## Done criteria")
    ok = True
    if 1024 not in steps:
        print("- (skipped) median autospec rounds at N = 1024 <= N / 10: N = 1024 not in this run")
    for d in args.dims if 1024 in steps else []:
        median = medians[(d, 1024)]
        passed = median <= 1024 / 10
        ok &= passed
        print(
            f"- [{'x' if passed else ' '}] d = {d}: median autospec rounds at N = 1024 = "
            f"{median:.0f} <= N / 10 = 102.4"
        )
    for d, n, rows, bound in rows_ok:
        passed = rows <= bound
        ok &= passed
        print(
            f"- [{'x' if passed else ' '}] d = {d}, N = {n}: mean rows per sample {rows:.0f} "
            f"<= 4 N log2 N = {bound:.0f}"
        )
    print(f"\nall criteria met: {ok}")
    if not args.no_guide:
        # The same comparison for a trained guide (benchmarks/diffusion_guides.py).
        import diffusion_guides

        print("\n## A trained diffusion guide (tutorials/05 model)\n")
        guide_args = ["--smoke"] if args.smoke else []
        diffusion_guides.run(
            diffusion_guides.parse_args(guide_args + ["--threads", str(args.threads)])
        )
    return ok


if __name__ == "__main__":
    sys.exit(0 if run(parse_args()) else 1)
