"""Sampling over several processes: throughput of ``distributed=True``, latency of ``ShardedOracle``.

Two uses of a ``torch.distributed`` group, each against the plain single-process call measured in
the same run (the baseline, in this launcher process):

* **throughput**: ``sample_any_order(oracle, N, distributed=True)`` on K ranks, each sampling
  N / K of the draws (Markov chain, ``--n`` coordinates, ``--num-samples`` draws): draws per
  second, and the scaling efficiency (speed-up over the baseline / K);
* **latency**: ``sample_any_order(ShardedOracle(oracle), 1)`` on K ranks, every round's rows
  shared out: one draw's wall time, for two oracles (``--latency-oracle``):

  - ``dpp``: a full-rank DPP, ``--latency-n`` points. Cheap rows (well under a millisecond
    each, about 60 per round): the case where sharding cannot pay for its gathers;
  - ``network``: the library's any-order MLP guide (``AnyOrderGuide`` with
    ``architecture="mlp"``, no model) over ``--network-n`` binary coordinates, width
    ``--network-width``, ``--network-depth`` residual blocks, float64, weights from PyTorch's
    default initialisation under ``--seed`` (untrained: the draw's cost, not its law, is what
    is measured). Every row is a forward pass of a wide network, several times a DPP row's
    cost, and a round has about a hundred rows: the case sharding is for. The baseline's
    milliseconds per row and rows per round are printed under each latency table.

Every K is a fresh ``torchrun --standalone --nproc-per-node K`` launch of this script (so the
launch path is exercised too); each rank uses one torch thread. Every run checks that its draws
equal the baseline's. Wall times are medians of ``--repeats`` timed calls after a warm-up call,
the slowest rank's. ``--parts`` picks the throughput part, the latency part or both.

Usage::

    python benchmarks/distributed.py                                  # CPU, K = 1, 2, 4
    python benchmarks/distributed.py --procs 1 2 --parts latency --latency-oracle network
    python benchmarks/distributed.py --device cuda --procs 1 2 4 8    # GPUs (see below)
    python benchmarks/distributed.py --smoke                          # seconds, K = 2

With ``--device cuda``, K ranks use NCCL and one GPU each when at least K GPUs are visible;
otherwise the ranks share the GPUs (gloo, ``LOCAL_RANK`` modulo the GPU count): several
processes on one GPU against one process. benchmarks/README.md has the measured table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rounds import FAMILIES  # noqa: E402

from pyro_autospec.engine import sample_any_order  # noqa: E402

PARTS = ("throughput", "latency")
LATENCY_ORACLES = ("dpp", "network")
#: What the launcher passes to every rank (in a file: torchrun's own parser would take --n).
SETTINGS = (
    "device",
    "parts",
    "latency_oracle",
    "n",
    "num_samples",
    "latency_n",
    "network_n",
    "network_width",
    "network_depth",
    "repeats",
    "seed",
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, K = 2, one repeat")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument(
        "--latency-oracle",
        nargs="+",
        default=list(LATENCY_ORACLES),
        choices=LATENCY_ORACLES,
        help="the oracles of the latency part (default: both)",
    )
    parser.add_argument("--n", type=int, default=1024, help="Markov chain length (throughput)")
    parser.add_argument("--num-samples", type=int, default=32, help="draws (throughput)")
    parser.add_argument("--latency-n", type=int, default=256, help="DPP size (latency, dpp)")
    parser.add_argument(
        "--network-n", type=int, default=512, help="coordinates of the guide network (latency)"
    )
    parser.add_argument(
        "--network-width", type=int, default=2048, help="hidden width of the guide network"
    )
    parser.add_argument(
        "--network-depth", type=int, default=3, help="residual blocks of the guide network"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a rank: its settings (JSON)
    args = parser.parse_args(argv)
    if args.smoke:
        args.procs, args.n, args.num_samples, args.latency_n, args.repeats = [2], 64, 4, 32, 1
        args.network_n, args.network_width, args.network_depth = 32, 64, 1
    args.parts = [p for p in PARTS if p in args.parts]
    args.latency_oracle = [o for o in LATENCY_ORACLES if o in args.latency_oracle]
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()[:16]


def guide_network(n: int, width: int, depth: int, seed: int, device) -> torch.nn.Module:
    """The library's any-order MLP guide on ``[2]^n``, untrained, float64, on ``device``.

    ``AnyOrderGuide`` without a model is a bare oracle (``log_marginals``,
    ``log_marginals_at``, ``log_marginals_chain``); its weights are PyTorch's default
    initialisation, drawn on the CPU under ``seed`` so that every rank builds the same replica.
    A row's answer depends on how many rows share its batch in its last bits only (the matrix
    products block differently); in float64 that is about 1e-15, so a sharded draw differs
    from the baseline's only if an acceptance test falls that close to its threshold (the run
    checks that none did).
    """
    from pyro_autospec.guides import AnyOrderGuide

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        guide = AnyOrderGuide(
            None,
            num_coords=n,
            num_values=2,
            architecture="mlp",
            hidden_dim=width,
            num_layers=depth,
        )
    return guide.double().to(device)


def workloads(args, device) -> dict:
    """The oracles of the parts asked for, built on ``device``, by table key."""
    out = {}
    if "throughput" in args.parts:
        out["throughput"] = FAMILIES["markov"][0](args.n, args.seed, device=str(device))
    if "latency" in args.parts:
        if "dpp" in args.latency_oracle:
            out["latency-dpp"] = FAMILIES["dpp"][0](args.latency_n, args.seed, device=str(device))
        if "network" in args.latency_oracle:
            out["latency-network"] = guide_network(
                args.network_n, args.network_width, args.network_depth, args.seed, device
            )
    return out


def draw(key: str, oracle, args, **kwargs):
    """The timed call of a workload: many draws (throughput) or one (latency)."""
    if key == "throughput":
        return sample_any_order(oracle, args.num_samples, seed=args.seed, **kwargs)
    return sample_any_order(oracle, 1, seed=args.seed)


def timed(call, device, repeats: int, barrier=None):
    """Warm up, then the median wall time of ``repeats`` calls (and the last result)."""
    call()
    walls = []
    for _ in range(repeats):
        if barrier:
            barrier()
        _sync(device)
        start = time.perf_counter()
        result = call()
        _sync(device)
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), result


def record(wall: float, result) -> dict:
    return {
        "wall": wall,
        "rounds": result.rounds,
        "rows": result.oracle_rows,
        "digest": _digest(result.samples),
        "per_rank": getattr(result, "per_rank", None),
    }


# ------------------------------------------------------------------------ one rank
def worker(args) -> None:
    import torch.distributed as dist

    from pyro_autospec.parallel import ShardedOracle, setup_process_group

    torch.set_num_threads(1)
    shared_gpu = args.device == "cuda" and torch.cuda.device_count() < int(os.environ["WORLD_SIZE"])
    backend = "gloo" if args.device == "cpu" or shared_gpu else "nccl"
    device = setup_process_group(backend, timeout=600)
    if args.device == "cpu":
        device = torch.device("cpu")
    out = {"backend": backend, "device": str(device)}
    for key, oracle in workloads(args, device).items():
        if key == "throughput":  # different draws on each rank

            def call(oracle=oracle):
                return draw("throughput", oracle, args, distributed=True)
        else:  # the same draw on every rank, each round's rows shared out
            sharded = ShardedOracle(oracle)

            def call(sharded=sharded, key=key):
                return draw(key, sharded, args)

        out[key] = record(*timed(call, device, args.repeats, dist.barrier))
    walls = [None] * dist.get_world_size()
    keys = [k for k in out if isinstance(out[k], dict)]
    dist.all_gather_object(walls, [out[k]["wall"] for k in keys])
    for i, key in enumerate(keys):
        out[key]["wall"] = max(w[i] for w in walls)  # the slowest rank's
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(out))
    dist.destroy_process_group()


# ------------------------------------------------------------------------ the launcher
def launch(args, procs: int, path: Path) -> dict:
    settings = {k: getattr(args, k) for k in SETTINGS}
    settings["out"] = str(path)
    config = path.with_suffix(".args.json")
    config.write_text(json.dumps(settings))
    # The settings travel in a file: torchrun's own parser would take options such as --n.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={procs}",
        str(Path(__file__).resolve()),
        f"--worker={config}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(
            f"torchrun with {procs} processes failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    out = json.loads(path.read_text())
    out["launch"] = time.perf_counter() - start
    return out


def titles(args) -> dict:
    """Each table's key, heading and number of draws per call."""
    return {
        "throughput": (
            f"Throughput: Markov chain n = {args.n}, {args.num_samples} draws, autospec, "
            "distributed=True (draws spread over the ranks)",
            args.num_samples,
        ),
        "latency-dpp": (
            f"Latency: full-rank DPP n = {args.latency_n}, one draw, autospec, ShardedOracle "
            "(every round's rows spread over the ranks)",
            1,
        ),
        "latency-network": (
            f"Latency: any-order MLP guide network n = {args.network_n}, q = 2, width "
            f"{args.network_width}, {args.network_depth} residual blocks, float64, untrained; "
            "one draw, autospec, ShardedOracle (every round's rows spread over the ranks)",
            1,
        ),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        settings = json.loads(Path(args.worker).read_text())
        worker(argparse.Namespace(**settings))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU is visible here")
        return 1
    torch.set_num_threads(1)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    load = os.getloadavg()
    print(
        f"# Distributed benchmark: {args.device}, {os.cpu_count()} CPU cores, load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min) at the start; one torch "
        f"thread per process; median of {args.repeats} timed calls after a warm-up"
    )
    base = {}
    for key, oracle in workloads(args, device).items():
        base[key] = record(
            *timed(lambda key=key, oracle=oracle: draw(key, oracle, args), device, args.repeats)
        )
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for procs in args.procs:
            runs[procs] = launch(args, procs, Path(tmp) / f"{procs}.json")
    ok = True
    for key, (title, draws) in titles(args).items():
        if key not in base:
            continue
        print(f"\n{title}\n")
        print(
            "| processes | backend | rounds | rows | wall (s) | draws/s | speed-up | efficiency | same draws |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        b = base[key]
        print(
            f"| 1 (baseline, no group) | - | {b['rounds']} | {b['rows']} | {b['wall']:.3f} | "
            f"{draws / b['wall']:.2f} | 1.00 | 1.00 | - |"
        )
        for procs, run in runs.items():
            r = run[key]
            same = r["digest"] == b["digest"]
            ok &= same
            speedup = b["wall"] / r["wall"]
            print(
                f"| {procs} | {run['backend']} | {r['rounds']} | {r['rows']} | {r['wall']:.3f} | "
                f"{draws / r['wall']:.2f} | {speedup:.2f} | {speedup / procs:.2f} | {same} |"
            )
        if key == "throughput":
            for procs, run in runs.items():
                per = run[key]["per_rank"]
                print(
                    f"\n{procs} processes, per rank: draws {per['num_draws']}, rounds "
                    f"{per['rounds']}, rows {per['oracle_rows']}, engine seconds "
                    f"{[round(w, 3) for w in per['wall_time']]}",
                    end="",
                )
            print()
        else:
            print(
                f"\nBaseline: {b['rows'] / b['rounds']:.1f} rows per round (call), "
                f"{1000 * b['wall'] / b['rows']:.3f} ms of wall time per row"
            )
    load = os.getloadavg()
    launches = ", ".join(f"K = {k}: {run['launch']:.1f} s" for k, run in runs.items())
    print(
        f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; whole torchrun "
        f"launches (start-up included): {launches}"
    )
    print(f"same draws as the baseline in every run: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
