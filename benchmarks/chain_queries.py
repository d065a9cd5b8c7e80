"""Chain queries against rows: the time per chain row of ``log_marginals_chain`` and of the
same rows through ``log_marginals_at``, on every exact oracle family, in one run.

A chain query is the verification of a drafted block: one values vector, one prefix (the mask)
and a chain of ``L`` coordinates; row ``j`` conditions on the prefix and the chain's first
``j`` coordinates. The queries imitate autospeculation with a random order: every chain cuts
its own random order of the ``n`` coordinates after a prefix of uniform length, its length is
uniform in ``1..sqrt(n)`` (padded to the longest by repeating its last coordinate), and a few
hundred chains go in one call. Values are drawn coordinate-wise (uniform, or a DPP item with
its marginal probability), so some rows are conditioned on impossible assignments, as in the
engine; for spanning trees they are random spanning trees (Kruskal on a random edge order), as
pinning a cycle in is impossible and its rows would be garbage both ways.

For each family and size the script times, on the same chains, (a) the native chain query,
all chains in one call, and (b) the same rows (padding excluded) in one ``log_marginals_at``
call, with their values and masks built beforehand (the build is timed apart: it is work that
an engine asking for rows does and one asking for chains does not). Where the slower of the
two would take more than ``--budget`` seconds, one-chain and one-row probes cut the chains to
the first ``K`` (at least 2). The answers are compared (``max |dp|``: the largest difference
of a probability over rows conditioned on possible assignments).

A second table times the same rows through ``log_marginals_at`` of the Markov and HMM oracles
with their nearest-pin search done two ways: two levels of 64-bit words (the default for ``n``
a multiple of 8) and a running count of pins (the fallback, and the only way before).

Usage::

    python benchmarks/chain_queries.py                       # n = 1024 and 4096, every family
    python benchmarks/chain_queries.py --families markov hmm --sizes 4096
    python benchmarks/chain_queries.py --smoke               # seconds, for CI
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rounds import FAMILIES, _synchronize  # noqa: E402

import pyro_autospec.oracles.markov as markov_module  # noqa: E402
from pyro_autospec.oracles._util import chain_repeats  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="n = 64, tiny budget: seconds")
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--num-chains", type=int, default=256, help="chains per call")
    parser.add_argument(
        "--budget", type=float, default=10.0, help="seconds per timed call (cuts the chains)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="best of, for cheap calls")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.families is None:
        args.families = list(FAMILIES)
    if args.smoke:
        args.sizes, args.num_chains, args.budget, args.repeats = [64], 16, 0.5, 1
    return args


# ----------------------------------------------------------------------------- queries
def random_spanning_trees(oracle, count: int, gen: torch.Generator) -> torch.Tensor:
    """LongTensor[count, m]: spanning trees of the oracle's graph by Kruskal's algorithm on
    random edge orders (not uniform, but every one is possible: so is every prefix)."""
    edges = oracle.edges.cpu().tolist()
    trees = torch.zeros(count, len(edges), dtype=torch.long)

    def find(parent: list[int], a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for c in range(count):
        parent = list(range(oracle.num_nodes))
        for k in torch.randperm(len(edges), generator=gen).tolist():
            u, v = find(parent, edges[k][0]), find(parent, edges[k][1])
            if u != v:
                parent[u] = v
                trees[c, k] = 1
    return trees


def item_probabilities(oracle) -> torch.Tensor | None:
    """DoubleTensor[n]: each item's marginal probability for the DPP-like families."""
    if hasattr(oracle, "factor"):  # DPPOracle: K = V V^T
        return (oracle.factor**2).sum(1).cpu()
    if hasattr(oracle, "kernel"):  # SpanningTreeOracle
        return oracle.kernel.diagonal().cpu()
    return None


def make_queries(oracle, num_chains: int, seed: int, device: str):
    """``(values, mask, chain, lengths)`` of ``num_chains`` chains (see the module docstring)."""
    n, q = oracle.num_coords, oracle.num_values
    gen = torch.Generator().manual_seed(seed)
    longest = max(1, math.isqrt(n))
    lengths = torch.randint(1, longest + 1, (num_chains,), generator=gen)
    orders = torch.rand(num_chains, n, generator=gen).argsort(1)  # a random order per chain
    cuts = (torch.rand(num_chains, generator=gen) * (n - lengths + 1)).long()  # prefix sizes
    rank = orders.argsort(1)  # each coordinate's place in its chain's order
    mask = rank < cuts.unsqueeze(1)
    steps = torch.minimum(torch.arange(longest), (lengths - 1).unsqueeze(1))
    chain = orders.gather(1, cuts.unsqueeze(1) + steps)
    probabilities = item_probabilities(oracle)
    if hasattr(oracle, "num_nodes"):  # spanning trees: random values would hold cycles
        values = random_spanning_trees(oracle, num_chains, gen)
    elif probabilities is None:
        values = torch.randint(0, q, (num_chains, n), generator=gen)
    else:
        values = (torch.rand(num_chains, n, generator=gen) < probabilities).long()
    return values.to(device), mask.to(device), chain.to(device), lengths


def rows_of(values, mask, chain, lengths):
    """The chain rows (padding excluded) as ``(values, mask, targets)`` of
    ``log_marginals_at``: [R, n], [R, n], [R, 1]."""
    repeated = chain_repeats(chain)
    live_chain, live_step = (~repeated).nonzero(as_tuple=True)
    row_values = values.index_select(0, live_chain)
    row_mask = mask.index_select(0, live_chain)
    coords = chain.index_select(0, live_chain)
    before = torch.arange(chain.shape[1], device=chain.device) < live_step.unsqueeze(1)
    rows = torch.arange(len(live_chain), device=chain.device).unsqueeze(1)
    row_mask.view(-1).index_fill_(0, (rows * mask.shape[1] + coords)[before], True)
    targets = coords.gather(1, live_step.unsqueeze(1))
    return row_values, row_mask, targets, (live_chain, live_step)


# ----------------------------------------------------------------------------- timing
def timed(call, device: str, repeats: int) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        out = call()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best, out


def time_cell(oracle, args) -> dict:
    """Time both ways on the same chains: the first ``K`` of them, ``K`` as large as the
    budget allows for the slower way (at least 2, at most ``--num-chains``)."""
    device = args.device
    values, mask, chain, lengths = make_queries(oracle, args.num_chains, args.seed, device)
    start = time.perf_counter()
    row_values, row_mask, targets, (live_chain, live_step) = rows_of(values, mask, chain, lengths)
    _synchronize(device)
    build = (time.perf_counter() - start) / len(targets)
    # warm-up of both code paths, then one-chain and one-row probes
    oracle.log_marginals_chain(values[:1], mask[:1], chain[:1])
    oracle.log_marginals_at(row_values[:1], row_mask[:1], targets[:1])
    chain_probe, _ = timed(
        lambda: oracle.log_marginals_chain(values[1:2], mask[1:2], chain[1:2]), device, 1
    )
    row_probe, _ = timed(
        lambda: oracle.log_marginals_at(row_values[1:2], row_mask[1:2], targets[1:2]), device, 1
    )
    per_chain = max(chain_probe, row_probe * float(lengths.double().mean()), 1e-9)
    count = int(min(args.num_chains, max(2, args.budget / per_chain)))
    num_rows = int(lengths[:count].sum())
    cheap = per_chain * count * args.repeats < args.budget
    repeats = args.repeats if cheap else 1
    native_time, native = timed(
        lambda: oracle.log_marginals_chain(values[:count], mask[:count], chain[:count]),
        device,
        repeats,
    )
    rows_time, by_rows = timed(
        lambda: oracle.log_marginals_at(
            row_values[:num_rows], row_mask[:num_rows], targets[:num_rows]
        ),
        device,
        repeats,
    )
    # agreement, on the rows conditioned on possible assignments
    expected = by_rows[:, 0]
    got = native[live_chain[:num_rows], live_step[:num_rows]]
    possible = ~torch.isnan(expected).any(-1)
    gap = (
        (got[possible].exp() - expected[possible].exp()).abs().max().item()
        if possible.any()
        else float("nan")
    )
    return {
        "chains": count,
        "rows": num_rows,
        "native_us": native_time / num_rows * 1e6,
        "rows_us": rows_time / num_rows * 1e6,
        "build_us": build * 1e6,
        "gap": gap,
        "possible": float(possible.double().mean()),
    }


def time_row_search(family: str, args, size: int) -> dict:
    """Rows with one target (as an engine without chain queries asks for them): the nearest
    pins of the Markov and HMM oracles by two levels of 64-bit words (now) and by a running
    count of pins (before), alone and inside ``log_marginals_at``, same rows, same run."""
    oracle = FAMILIES[family][0](size, args.seed, device=args.device)
    values, mask, chain, lengths = make_queries(oracle, args.num_chains, args.seed, args.device)
    row_values, row_mask, targets, _ = rows_of(values, mask, chain, lengths)
    searches = {"count": markov_module._nearest_pins_by_count}
    if size % 8 == 0:
        searches["words"] = markov_module._nearest_pins_by_words
    out = {"rows": len(targets)}
    original = markov_module.nearest_pins_at
    try:
        for name, search in searches.items():
            seconds, pins = timed(lambda s=search: s(row_mask, targets), args.device, args.repeats)
            out[f"{name}_search_us"] = seconds / len(targets) * 1e6
            markov_module.nearest_pins_at = search
            seconds, _ = timed(
                lambda: oracle.log_marginals_at(row_values, row_mask, targets),
                args.device,
                args.repeats,
            )
            out[f"{name}_at_us"] = seconds / len(targets) * 1e6
            out[f"{name}_pins"] = pins
    finally:
        markov_module.nearest_pins_at = original
    if "words" in searches:
        same = all(torch.equal(a, b) for a, b in zip(out["count_pins"], out["words_pins"]))
        out["same"] = same
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(
        f"# chain queries: torch {torch.__version__}, {args.threads} thread(s), device "
        f"{args.device}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{args.num_chains} chains per call, budget {args.budget} s per call"
    )
    header = (
        "| family | n | chains | rows | native us/row | rows us/row | rows: build us/row "
        "| rows / native | max abs dp | possible rows |"
    )
    print(header)
    print("|" + "---|" * 10)
    failures = []
    for family in args.families:
        for size in args.sizes:
            start = time.perf_counter()
            oracle = FAMILIES[family][0](size, args.seed, device=args.device)
            n = oracle.num_coords
            cell = time_cell(oracle, args)
            ratio = cell["rows_us"] / cell["native_us"]
            print(
                f"| {family} | {n} | {cell['chains']} | {cell['rows']} | {cell['native_us']:.3g} "
                f"| {cell['rows_us']:.3g} | {cell['build_us']:.3g} | {ratio:.3g} "
                f"| {cell['gap']:.1e} | {cell['possible']:.0%} |",
                flush=True,
            )
            print(
                f"#   ({family}, n = {n}: {time.perf_counter() - start:.1f} s with the "
                f"oracle's construction)",
                flush=True,
            )
            if not cell["gap"] <= 1e-9 and cell["possible"] > 0:
                failures.append(f"{family} n = {n}: native and rows differ by {cell['gap']:.2e}")
    searched = [f for f in ("markov", "hmm") if f in args.families]
    if searched:
        print()
        print(
            "| family | n | rows | nearest pins: count us/row | nearest pins: words us/row "
            "| log_marginals_at with count us/row | with words us/row |"
        )
        print("|" + "---|" * 7)
    for family in searched:
        for size in args.sizes:
            row = time_row_search(family, args, size)
            words = (
                f"{row['words_search_us']:.3g}" if "words_search_us" in row else "n % 8 != 0",
                f"{row['words_at_us']:.3g}" if "words_at_us" in row else "",
            )
            print(
                f"| {family} | {size} | {row['rows']} | {row['count_search_us']:.3g} "
                f"| {words[0]} | {row['count_at_us']:.3g} | {words[1]} |",
                flush=True,
            )
            if not row.get("same", True):
                failures.append(f"{family} n = {size}: the two searches disagree")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
