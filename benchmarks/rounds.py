"""Rounds, rows and wall time per sample: autospec against the baselines, same oracle, one run.

Every family is sampled at several sizes ``n`` by every method in the same run, with the
same oracle and the same counting (one round = one batched oracle call; one row = one
conditioning). Prints a markdown table, the fitted exponent of mean rounds per sample against
``n`` (least squares on log-log over ``n >= 256``, with its standard error from the spread of
the draws), writes a CSV and a log-log plot, and checks the engine issue's targets on the Markov
chain and issue 3's exponent targets.

Rounds and rows do not depend on the device or on ``--jobs`` (the engine's randomness is drawn
on the host); wall times do, and with ``--jobs`` every cell runs beside others.

Usage::

    # the README's run: 255 s on one H100 with 16 CPU cores
    python benchmarks/rounds.py --device cuda --jobs 15 --num-samples 16 \
        --family-samples markov=64 hmm=64 dpp=64
    python benchmarks/rounds.py --jobs 2          # on a 2-core CPU (8 draws per cell and the
                                                  # code of 4c415ee took 74 minutes, 1 job)
    python benchmarks/rounds.py --smoke           # seconds, for CI
    python benchmarks/rounds.py --families markov --sizes 64 256 1024 4096
    python benchmarks/rounds.py --sweep           # schedule knobs on the Markov chain
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyro_autospec.engine import (
    Schedule,
    sample_any_order,  # noqa: E402
)
from pyro_autospec.engine.methods import DISCRETE, method_names  # noqa: E402

HERE = Path(__file__).resolve().parent
# The methods a user can choose (the front end's: not "gumbel_sequential", which exists to
# test agr24), from the registry; sequential last, the baseline the others are compared with.
METHODS = [m for m in method_names(DISCRETE, front_end=True) if m != "sequential"]
METHODS.append("sequential")


# ----------------------------------------------------------------------------- families
def markov(n: int, seed: int = 0, device: str = "cpu"):
    """Binary Markov chain, uniform start, stay probability 0.73."""
    from pyro_autospec.oracles.markov import MarkovChainOracle

    return MarkovChainOracle(
        torch.tensor([0.5, 0.5]), torch.tensor([[0.73, 0.27], [0.27, 0.73]]), n, device=device
    )


def hmm(n: int, seed: int = 0, device: str = "cpu"):
    """Three-state sticky HMM posterior given Gaussian observations of a simulated path."""
    from pyro_autospec.oracles.hmm import HMMOracle

    g = torch.Generator().manual_seed(seed)
    q = 3
    T = torch.full((q, q), 0.1 / (q - 1)) + torch.eye(q) * (0.9 - 0.1 / (q - 1))
    states = [0]
    u = torch.rand(n, generator=g)
    for i in range(1, n):
        cum = T[states[-1]].cumsum(0)
        states.append(int((cum < u[i]).sum().clamp(max=q - 1)))
    means = torch.tensor([-1.0, 0.0, 1.0])
    obs = means[torch.tensor(states)] + torch.randn(n, generator=g)
    emission = -0.5 * (obs[:, None] - means[None, :]) ** 2
    return HMMOracle(torch.full((q,), 1.0 / q), T, emission, device=device)


def dpp(n: int, seed: int = 0, device: str = "cpu"):
    """A DPP with a Gaussian-similarity L-ensemble of ``n`` random points in the unit square."""
    from pyro_autospec.oracles.dpp import DPPOracle

    g = torch.Generator().manual_seed(seed)
    pts = torch.rand(n, 2, generator=g, dtype=torch.float64)
    bandwidth = 1.0 / math.sqrt(n)
    L = 4.0 * torch.exp(-(torch.cdist(pts, pts) ** 2) / (2 * bandwidth**2))
    return DPPOracle(L=L, device=device)


def dpp_lowrank(n: int, seed: int = 0, device: str = "cpu"):
    """A low-rank (dual) DPP: ``L = Phi Phi^T`` with ``d = 2 ceil(sqrt(n))`` random Fourier
    features of a Gaussian similarity (bandwidth ``h = 1 / sqrt(n)``, as in ``dpp``) of ``n``
    random points in the unit square.

    ``Phi_ij = sqrt(2 / d) cos(<w_j, x_i> + b_j)``, ``w_j ~ N(0, I / h^2)``,
    ``b_j ~ U[0, 2 pi)``, so ``L_ik ~ exp(-|x_i - x_k|^2 / (2 h^2))``. The rank is ``d``, so
    ``|X| <= d``, and the expected set size ``sum_j s_j^2 / (1 + s_j^2)`` (``s_j`` the singular
    values of ``Phi``) grows with ``n``: about 10, 26, 59, 87 and 123 at n = 64, 256, 1024,
    2048 and 4096 (seed 0). The oracle costs ``O(n d^2)`` per row, not ``O(n^3)``.
    """
    from pyro_autospec.oracles.dpp import DPPOracle

    g = torch.Generator().manual_seed(seed)
    d = 2 * math.ceil(math.sqrt(n))
    pts = torch.rand(n, 2, generator=g, dtype=torch.float64)
    freqs = torch.randn(2, d, generator=g, dtype=torch.float64) * math.sqrt(n)
    phase = 2 * math.pi * torch.rand(d, generator=g, dtype=torch.float64)
    features = math.sqrt(2.0 / d) * torch.cos(pts @ freqs + phase)
    return DPPOracle(features=features, device=device)


def tree_potts(n: int, seed: int = 0, device: str = "cpu"):
    """Ising model on a random recursive tree, coupling 0.5, small random fields."""
    from pyro_autospec.oracles.tree_potts import TreePottsOracle

    g = torch.Generator().manual_seed(seed)
    parents = [int(torch.randint(0, i, (), generator=g)) for i in range(1, n)]
    edges = torch.tensor([[p, i + 1] for i, p in enumerate(parents)], dtype=torch.long)
    couplings = torch.full((n - 1,), 0.5, dtype=torch.float64)
    fields = 0.1 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    return TreePottsOracle(edges, couplings, fields, num_values=2, device=device)


def spanning_tree(n: int, seed: int = 0, device: str = "cpu"):
    """Uniform spanning trees of a grid graph with about ``n`` edges."""
    from pyro_autospec.oracles.spanning_tree import SpanningTreeOracle

    side = max(2, int(round((1 + math.sqrt(1 + 2 * n)) / 2)))  # 2 side (side - 1) ~ n edges
    edges = []
    for r in range(side):
        for c in range(side):
            v = r * side + c
            if c + 1 < side:
                edges.append((v, v + 1))
            if r + 1 < side:
                edges.append((v, v + side))
    return SpanningTreeOracle(side * side, torch.tensor(edges), device=device)


def curie_weiss(n: int, seed: int = 0, device: str = "cpu"):
    """Mean-field Ising at its critical point beta = 1."""
    from pyro_autospec.oracles.curie_weiss import CurieWeissOracle

    return CurieWeissOracle(n, beta=1.0, device=device)


FAMILIES = {
    "markov": (markov, [64, 256, 1024, 4096]),
    "hmm": (hmm, [64, 256, 1024, 4096]),
    "tree_potts": (tree_potts, [64, 256, 1024]),  # BP per row: n = 4096 takes tens of minutes
    "curie_weiss": (curie_weiss, [64, 256, 1024]),  # n = 4096: >12 min for 8 draws (see README)
    "dpp": (dpp, [64, 128, 256, 512, 1024]),
    "dpp_lowrank": (dpp_lowrank, [64, 256, 1024, 2048, 4096]),
    "spanning_tree": (spanning_tree, [64, 128, 256, 512]),
}
SMOKE_SIZES = [16, 64]


# ----------------------------------------------------------------------------- running
def run_one(
    family: str, n: int, method: str, num_samples: int, seed: int, device: str = "cpu"
) -> dict:
    oracle = FAMILIES[family][0](n, seed, device=device)
    n_actual = oracle.num_coords
    if torch.device(device).type != "cpu":  # warm-up: context, kernels, allocator
        free = torch.zeros(2, n_actual, dtype=torch.bool, device=device)
        oracle.log_marginals(free.long(), free)
        _synchronize(device)
    start = time.perf_counter()
    result = sample_any_order(oracle, num_samples, method=method, seed=seed)
    _synchronize(device)
    wall = time.perf_counter() - start
    rounds = result.sample_rounds.double()
    return {
        "family": family,
        "n": n_actual,
        "method": method,
        "num_samples": num_samples,
        "rounds_per_sample": rounds.mean().item(),
        "rounds_p90": rounds.quantile(0.9).item(),
        "rounds_sem": (rounds.std() / math.sqrt(num_samples)).item() if num_samples > 1 else 0.0,
        "run_rounds": result.rounds,
        "rows_per_sample": result.oracle_rows / num_samples,
        "rows_over_nlog2n": result.oracle_rows
        / num_samples
        / (n_actual * max(1.0, math.log2(n_actual))),
        "wall_per_sample": wall / num_samples,
        "sequential_over_rounds": n_actual / rounds.mean().item(),
    }


def _as_completed(futures: dict):
    """Keys of ``futures`` in the order their results arrive."""
    from concurrent.futures import as_completed

    index = {future: key for key, future in futures.items()}
    for future in as_completed(index):
        yield index[future]


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_cell(family: str, n: int, method: str, num_samples: int, args: dict) -> dict:
    """One (family, n, method) cell; prints its line as soon as it is done."""
    torch.set_num_threads(args["threads"])
    if torch.device(args["device"]).type == "cuda" and args.get("jobs", 1) > 1:
        # Cells share one GPU: cap each process's share (its allocator frees cached blocks
        # and retries at the cap), so that one cell's cache cannot starve the others. With
        # --jobs 15 and no cap, an H100 ran out of memory (80 GB held by 15 processes).
        torch.cuda.set_per_process_memory_fraction(min(1.0, 2.0 / args["jobs"]))
    row = run_one(family, n, method, num_samples, args["seed"], args["device"])
    print(
        f"{family:>13} n={row['n']:>5} {method:>11}: {row['rounds_per_sample']:8.1f} "
        f"rounds/sample, {row['rows_over_nlog2n']:.2f} n log2 n rows, "
        f"{row['wall_per_sample']:.3f} s/sample"
        + (
            f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
            if torch.device(args["device"]).type == "cuda"
            else ""
        ),
        flush=True,
    )
    return row


def exponent_with_error(
    rows: list[dict], family: str, method: str, min_n: int = 256
) -> tuple[float, float]:
    """The fitted exponent and its standard error from the draws' spread.

    The slope is ``sum_i w_i log(mean_i)`` with ``w_i = (x_i - mean(x)) / S_xx``, ``x_i = log n_i``;
    each ``log(mean_i)`` has variance about ``(sem_i / mean_i)^2`` (delta method, ``sem_i`` the
    standard error of the mean rounds over the cell's draws), so the slope's standard error is
    ``sqrt(sum_i w_i^2 (sem_i / mean_i)^2)``. NaN where the CSV has no ``rounds_sem``.
    """
    pts = [
        (r["n"], r["rounds_per_sample"], r.get("rounds_sem", float("nan")))
        for r in rows
        if r["family"] == family and r["method"] == method and r["n"] >= min_n
    ]
    if len(pts) < 2:
        return float("nan"), float("nan")
    x = np.log([p[0] for p in pts])
    y = np.log([p[1] for p in pts])
    rel = np.array([p[2] / p[1] for p in pts], dtype=float)
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum()
    return float((w * y).sum()), float(np.sqrt((w**2 * rel**2).sum()))


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| family | n | method | rounds/sample | p90 | rows/sample | rows/(n log2 n) | wall/sample (s) | n / rounds |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['n']} | {r['method']} | {r['rounds_per_sample']:.1f} | {r['rounds_p90']:.0f} | "
            f"{r['rows_per_sample']:.0f} | {r['rows_over_nlog2n']:.2f} | {r['wall_per_sample']:.3f} | "
            f"{r['sequential_over_rounds']:.1f} |"
        )
    return "\n".join(lines)


def exponent_table(rows: list[dict], families: list[str], methods: list[str]) -> str:
    """Fitted exponents per family and method: over n >= 256, and over every n measured."""
    lines = [
        "| family | n range | " + " | ".join(methods) + " |",
        "|---|---|" + "---:|" * len(methods),
    ]
    for f in families:
        sizes = sorted({r["n"] for r in rows if r["family"] == f})
        if not sizes:
            continue
        for label, min_n in ((f">= 256 ({sum(n >= 256 for n in sizes)} sizes)", 256), ("all", 0)):
            cells = [_pm(*exponent_with_error(rows, f, m, min_n)) for m in methods]
            lines.append(f"| {f} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pm(value: float, error: float) -> str:
    return f"{value:.2f}" if not np.isfinite(error) else f"{value:.2f} ± {error:.2f}"


def plot(rows: list[dict], families: list[str], methods: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cols = min(3, len(families))
    nrows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, family in zip(axes.flat, families):
        for method in methods:
            pts = sorted(
                (r["n"], r["rounds_per_sample"])
                for r in rows
                if r["family"] == family and r["method"] == method
            )
            if pts:
                ax.loglog(*zip(*pts), marker="o", label=method)
        sizes = sorted({r["n"] for r in rows if r["family"] == family})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(family)
        ax.set_xlabel("n (coordinates)")
        ax.set_ylabel("rounds per sample")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(families) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_targets(rows: list[dict]) -> list[str]:
    """The engine issue's targets on the Markov chain at n = 4096."""
    out = []
    mk = {(r["n"], r["method"]): r for r in rows if r["family"] == "markov"}
    if (4096, "autospec") in mk:
        r = mk[(4096, "autospec")]
        out.append(
            f"markov n=4096 mean sample_rounds {r['rounds_per_sample']:.1f} <= 300: {r['rounds_per_sample'] <= 300}"
        )
        out.append(
            f"markov n=4096 rows per sample / (n log2 n) {r['rows_over_nlog2n']:.2f} <= 2: {r['rows_over_nlog2n'] <= 2}"
        )
        e, se = exponent_with_error(rows, "markov", "autospec")
        out.append(
            f"markov fitted rounds exponent (n = 256..4096) {e:.3f} (standard error {se:.3f}) "
            f"<= 0.6: {e <= 0.6}"
        )
    # Issue 3: the autospec rounds exponent over n >= 256 on the Markov, HMM and DPP families.
    for family in ("hmm", "dpp", "dpp_lowrank"):
        sizes = sorted({r["n"] for r in rows if r["family"] == family and r["n"] >= 256})
        if len(sizes) >= 2 and any(r["method"] == "autospec" for r in rows):
            e, se = exponent_with_error(rows, family, "autospec")
            out.append(
                f"{family} fitted rounds exponent (n = {sizes[0]}..{sizes[-1]}, {len(sizes)} "
                f"sizes) {e:.3f} (standard error {se:.3f}) <= 0.6: {e <= 0.6}"
            )
    return out


def sweep(num_samples: int, sizes: list[int], seed: int) -> None:
    """Schedule knobs on the Markov chain: rounds against rows (the law never changes)."""
    from pyro_autospec.engine.any_order import default_schedule

    print("| n | rho | max_block | rounds/sample | p90 | rows/(n log2 n) | wall/sample (s) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        base = default_schedule(n)
        blocks = sorted({max(2, round(c * math.sqrt(n))) for c in (1, 2, 4)} | {base["max_block"]})
        for rho in (1.0, 2.0, 3.0, 4.0):
            for max_block in blocks:
                result = sample_any_order(
                    markov(n),
                    num_samples,
                    seed=seed,
                    schedule=Schedule(rho=rho, max_block=max_block),
                )
                rounds = result.sample_rounds.double()
                default = (
                    " (default)" if (rho, max_block) == (base["rho"], base["max_block"]) else ""
                )
                print(
                    f"| {n} | {rho}{default} | {max_block} | {rounds.mean():.1f} | {rounds.quantile(0.9):.0f} | "
                    f"{result.oracle_rows / num_samples / (n * math.log2(n)):.2f} | "
                    f"{result.wall_time / num_samples:.2f} |",
                    flush=True,
                )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (CI)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--sizes", nargs="+", type=int, help="override every family's sizes")
    parser.add_argument("--num-samples", type=int, default=8, help="draws per (family, n, method)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=HERE / "results", help="folder for CSV and PNG")
    parser.add_argument("--sweep", action="store_true", help="schedule sweep on the Markov chain")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--device", default="cpu", help="where the oracles run (cpu, cuda)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes, one (family, n, method) cell each (default 1: every cell in turn)",
    )
    parser.add_argument(
        "--family-samples",
        nargs="*",
        default=[],
        metavar="FAMILY=N",
        help="draws per cell for some families (heavy-tailed ones need more), e.g. dpp=32",
    )
    parser.add_argument(
        "--report", type=Path, help="print the tables of an earlier run's CSV (no sampling)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.family_samples = _parse_family_samples(parser, args.family_samples)

    if args.sweep:
        sizes = [64] if args.smoke else (args.sizes or [256, 1024, 4096])
        sweep(4 if args.smoke else args.num_samples, sizes, args.seed)
        return
    if args.report is not None:
        report(args.report)
        return
    cells = []
    for family in args.families:
        sizes = SMOKE_SIZES if args.smoke else (args.sizes or FAMILIES[family][1])
        for n in sizes:
            for method in args.methods:
                num = args.family_samples.get(family, args.num_samples)
                if args.smoke:
                    num = 2
                elif method == "sequential" and n > 1024:
                    num = max(2, num // 4)  # n rounds regardless; fewer draws suffice
                cells.append((family, n, method, num))
    shared = {"threads": args.threads, "seed": args.seed, "device": args.device, "jobs": args.jobs}
    start = time.perf_counter()
    if args.jobs > 1:
        import multiprocessing as mp
        import os
        from concurrent.futures import ProcessPoolExecutor

        # Workers inherit it: blocks of varying sizes (chunks of rows) fragment less.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

        # Largest n first (autospec first within a size), so the long cells start at once.
        order = sorted(range(len(cells)), key=lambda i: (-cells[i][1], cells[i][2] != "autospec"))
        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {i: pool.submit(run_cell, *cells[i], shared) for i in order}
            rows = [None] * len(cells)
            for done, i in enumerate(_as_completed(futures), 1):
                rows[i] = futures[i].result()
                print(
                    f"[{done}/{len(cells)} cells, {time.perf_counter() - start:.0f} s]", flush=True
                )
    else:
        rows = [run_cell(*cell, shared) for cell in cells]
    print(f"\nwhole run: {time.perf_counter() - start:.0f} s on {args.device}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "rounds_smoke" if args.smoke else "rounds"
    with open(args.out / f"{name}.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.families, args.methods, args.out / f"{name}.png")
    print_tables(rows, args.families, args.methods)
    print(f"\nCSV and plot written to {args.out}/{name}.csv and {name}.png")


def _parse_family_samples(parser, items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        family, _, value = item.partition("=")
        if family not in FAMILIES or not value.isdigit() or int(value) < 1:
            parser.error(
                f"--family-samples takes FAMILY=N with FAMILY in {list(FAMILIES)}; got {item!r}"
            )
        out[family] = int(value)
    return out


def print_tables(rows: list[dict], families: list[str], methods: list[str]) -> None:
    print("\n" + markdown_table(rows))
    print("\nFitted exponent of rounds per sample against n:\n")
    print(exponent_table(rows, families, methods))
    checks = check_targets(rows)
    if checks:
        print("\nTargets:\n" + "\n".join("- " + c for c in checks))


def report(path: Path) -> None:
    """Tables of an earlier run, read back from its CSV, and its plot redrawn beside it."""
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for key, value in r.items():
            if key not in ("family", "method"):
                r[key] = float(value) if "." in value or "e" in value else int(value)
    families = list(dict.fromkeys(r["family"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    print_tables(rows, families, methods)
    plot(rows, families, methods, path.with_suffix(".png"))
    print(f"\nplot redrawn: {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
