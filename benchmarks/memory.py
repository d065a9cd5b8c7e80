"""Peak resident memory of a discrete run: what a run holds against what it has in flight.

Each configuration runs in a fresh subprocess (``ru_maxrss`` is a process's high-water mark),
which imports torch and the library, builds the binary Markov chain of ``rounds.py`` and draws
``--draws`` samples at ``n`` coordinates with ``max_concurrent_draws`` (``--concurrency
default``: the library's default). With ``--q`` above 2 the oracle is instead ``n``
independent uniform coordinates over ``q`` values (every draft passes), to see what a large
alphabet costs. It prints the peak
resident set size after the imports (``baseline``) and after the run (``peak``), their
difference (what sampling added), the wall time, and the size of the output samples
(``N * n * 8`` bytes, which any run must hold). On a GPU it also prints the peak of torch's
GPU allocator.

Usage::

    python benchmarks/memory.py                          # 100k draws, n = 1024, 256 in flight
    python benchmarks/memory.py --draws 20000 --methods autospec sequential
    python benchmarks/memory.py --root /tmp/base         # the library of another checkout
    python benchmarks/memory.py --device cuda
    python benchmarks/memory.py --q 4096 --n 16 --draws 1000 --concurrency default \
        --methods sequential autospec speculative agr24   # a large alphabet (uniform oracle)
    python benchmarks/memory.py --smoke                  # seconds, for CI
    python benchmarks/memory.py --pyro --draws 200000 --steps 40 --methods ffbs autospec

``--pyro`` measures a whole ``AutoSpec`` run instead: a ``--steps``-step HMM with three
states and Gaussian observations, drawn by forward filtering, backward sampling (``ffbs``) or
by the engine's method (``autospec``), then evaluated and self-checked. Its outputs (the
engine's coordinates ``[N, n]``, the site values and the pointwise log likelihood, which any
such run returns) are printed beside what the run added.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


class Uniform:
    """``n`` independent uniform coordinates over ``q`` values: whole and targeted rows."""

    consistent_queries = True

    def __init__(self, n: int, q: int, device: str):
        self.num_coords, self.num_values, self.device = n, q, device

    def log_marginals_at(self, values, mask, targets):
        import torch

        return torch.full(
            (*targets.shape, self.num_values), -math.log(self.num_values), device=self.device
        )

    def log_marginals(self, values, mask):
        import torch

        return torch.full(
            (*values.shape, self.num_values), -math.log(self.num_values), device=self.device
        )


def child(
    draws: int, n: int, concurrency: int | None, method: str, device: str, root, q: int = 2
) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(root))
    import torch

    torch.set_num_threads(1)
    from pyro_autospec.engine import Schedule, sample_any_order
    from pyro_autospec.oracles.markov import MarkovChainOracle

    if q > 2:
        chain = Uniform(n, q, device)
    else:
        chain = MarkovChainOracle(
            torch.tensor([0.5, 0.5]), torch.tensor([[0.73, 0.27], [0.27, 0.73]]), n, device=device
        )
    sample_any_order(chain, 2, method=method, seed=1)  # warm up the code paths
    baseline = _peak_mib()
    gpu = device.startswith("cuda")
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = sample_any_order(
        chain, draws, method=method, seed=0, schedule=Schedule(max_concurrent_draws=concurrency)
    )
    seconds = time.perf_counter() - start
    peak = _peak_mib()
    return {
        "library": str(Path(sys.modules["pyro_autospec"].__file__).parents[1]),
        "device": device,
        "gpu_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20) if gpu else None,
        "method": method,
        "draws": draws,
        "n": n,
        "q": q,
        "max_concurrent_draws": concurrency,
        "seconds": round(seconds, 1),
        "baseline_mib": round(baseline),
        "peak_mib": round(peak),
        "added_mib": round(peak - baseline),
        "samples_mib": round(result.samples.numel() * result.samples.element_size() / 2**20),
        "rounds": result.rounds,
        "rows_per_draw": round(result.oracle_rows / draws, 1),
    }


def pyro_child(draws: int, steps: int, sampler: str, root) -> dict:
    """One ``AutoSpec`` run of the HMM of ``--pyro``, in this (fresh) process."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(root))
    import pyro
    import pyro.distributions as dist
    import torch

    torch.set_num_threads(1)
    from pyro_autospec import AutoSpec

    trans = torch.tensor([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]])
    locs = torch.tensor([-1.0, 0.0, 1.0])

    def hmm(data):
        z = 0
        for t in pyro.markov(range(len(data))):
            z = pyro.sample(f"z_{t}", dist.Categorical(trans[z]))
            pyro.sample(f"y_{t}", dist.Normal(locs[z], 1.0), obs=data[t])

    data = torch.randn(steps, generator=torch.Generator().manual_seed(0))
    options = {"sampler": "ffbs"} if sampler == "ffbs" else {"sampler": "engine", "method": sampler}
    AutoSpec(hmm, num_samples=2, seed=1, disable_progbar=True, **options).run(data)  # warm up
    baseline = _peak_mib()
    start = time.perf_counter()
    fit = AutoSpec(hmm, num_samples=draws, seed=0, disable_progbar=True, **options).run(data)
    seconds = time.perf_counter() - start
    peak = _peak_mib()

    def mib(tensors) -> float:
        return sum(t.numel() * t.element_size() for t in tensors) / 2**20

    values = mib(fit.get_samples().values())
    pointwise = mib(fit._run.pointwise[name] for name in fit._run.pointwise)
    coords = mib(r.samples for r in fit.results)
    return {
        "library": str(Path(sys.modules["pyro_autospec"].__file__).parents[1]),
        "sampler": sampler,
        "draws": draws,
        "steps": steps,
        "seconds": round(seconds, 1),
        "baseline_mib": round(baseline),
        "peak_mib": round(peak),
        "added_mib": round(peak - baseline),
        "outputs_mib": round(values + pointwise + coords),
    }


def pyro_main(args) -> None:
    print(f"library: {args.root}; AutoSpec on a {args.steps}-step HMM, {args.draws} draws")
    print(
        "| sampler | wall (s) | baseline RSS (MiB) | peak RSS (MiB) | added (MiB) | outputs (MiB) |"
    )
    print("|---|---|---|---|---|---|")
    for sampler in args.methods:
        command = [sys.executable, str(Path(__file__).resolve()), "--pyro", "--child"]
        command += ["--draws", str(args.draws), "--steps", str(args.steps)]
        command += ["--methods", sampler, "--root", args.root]
        out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            raise SystemExit(f"{sampler}: the run failed (exit status {out.returncode})")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if Path(r["library"]).resolve() != Path(args.root).resolve():
            raise SystemExit(f"measured the library in {r['library']}, not in {args.root}")
        print(
            f"| {r['sampler']} | {r['seconds']} | {r['baseline_mib']} | {r['peak_mib']} "
            f"| {r['added_mib']} | {r['outputs_mib']} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument(
        "--concurrency", default="256", help="max_concurrent_draws ('default': not given)"
    )
    parser.add_argument("--q", type=int, default=2, help="values per coordinate")
    parser.add_argument("--methods", nargs="+", default=["autospec"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--root", default=str(ROOT), help="checkout whose library is measured")
    parser.add_argument("--smoke", action="store_true", help="2000 draws at n = 64")
    parser.add_argument("--pyro", action="store_true", help="a whole AutoSpec run of an HMM")
    parser.add_argument("--steps", type=int, default=40, help="the HMM's steps (--pyro)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.draws, args.n, args.concurrency = 2000, 64, "64"
    if args.pyro:
        if args.child:
            print(json.dumps(pyro_child(args.draws, args.steps, args.methods[0], args.root)))
        else:
            pyro_main(args)
        return
    concurrency = None if args.concurrency == "default" else int(args.concurrency)
    if args.child:
        result = child(
            args.draws, args.n, concurrency, args.methods[0], args.device, args.root, args.q
        )
        print(json.dumps(result))
        return
    print(f"library: {args.root}, device: {args.device}")
    print(
        "| method | draws | n | q | max_concurrent_draws | rounds | rows/draw | wall (s) "
        "| baseline RSS (MiB) | peak RSS (MiB) | added (MiB) | samples (MiB) | GPU peak (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for method in args.methods:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "--draws",
            str(args.draws),
            "--n",
            str(args.n),
            "--concurrency",
            str(args.concurrency),
            "--q",
            str(args.q),
            "--methods",
            method,
            "--device",
            args.device,
            "--root",
            args.root,
        ]
        out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            raise SystemExit(f"{method}: the run failed (exit status {out.returncode})")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        if Path(r["library"]).resolve() != Path(args.root).resolve():
            raise SystemExit(f"measured the library in {r['library']}, not in {args.root}")
        print(
            f"| {r['method']} | {r['draws']} | {r['n']} | {r['q']} "
            f"| {r['max_concurrent_draws'] or 'default'} | {r['rounds']} | {r['rows_per_draw']} "
            f"| {r['seconds']} | {r['baseline_mib']} | {r['peak_mib']} | {r['added_mib']} "
            f"| {r['samples_mib']} | {r['gpu_peak_mib'] or '-'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
