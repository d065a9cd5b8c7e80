"""Sampling over several processes: throughput of ``distributed=True``, latency of ``ShardedOracle``.

Two uses of a ``torch.distributed`` group, each against the plain single-process call measured in
the same run (the baseline, in this launcher process):

* **throughput**: ``sample_any_order(oracle, N, distributed=True)`` on K ranks, each sampling
  N / K of the draws (Markov chain, ``--n`` coordinates, ``--num-samples`` draws): draws per
  second, and the scaling efficiency (speed-up over the baseline / K);
* **latency**: ``sample_any_order(ShardedOracle(oracle), 1)`` on K ranks, every round's rows
  shared out (full-rank DPP, ``--latency-n`` points, one draw): one draw's wall time.

Every K is a fresh ``torchrun --standalone --nproc-per-node K`` launch of this script (so the
launch path is exercised too); each rank uses one torch thread. Every run checks that its draws
equal the baseline's. Wall times are medians of ``--repeats`` timed calls after a warm-up call,
the slowest rank's.

Usage::

    python benchmarks/distributed.py                                  # CPU, K = 1, 2, 4
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


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, K = 2, one repeat")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--n", type=int, default=1024, help="Markov chain length (throughput)")
    parser.add_argument("--num-samples", type=int, default=32, help="draws (throughput)")
    parser.add_argument("--latency-n", type=int, default=256, help="DPP size (latency)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a rank: its settings (JSON)
    args = parser.parse_args(argv)
    if args.smoke:
        args.procs, args.n, args.num_samples, args.latency_n, args.repeats = [2], 64, 4, 32, 1
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.cpu().numpy().tobytes()).hexdigest()[:16]


def workloads(args, device) -> dict:
    """The two oracles, built on ``device``."""
    return {
        "throughput": FAMILIES["markov"][0](args.n, args.seed, device=str(device)),
        "latency": FAMILIES["dpp"][0](args.latency_n, args.seed, device=str(device)),
    }


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

    from pyro_autospec.engine.distributed import setup_process_group
    from pyro_autospec.oracles import ShardedOracle

    torch.set_num_threads(1)
    shared_gpu = args.device == "cuda" and torch.cuda.device_count() < int(os.environ["WORLD_SIZE"])
    backend = "gloo" if args.device == "cpu" or shared_gpu else "nccl"
    device = setup_process_group(backend, timeout=600)
    if args.device == "cpu":
        device = torch.device("cpu")
    oracles = workloads(args, device)
    wall, result = timed(
        lambda: sample_any_order(
            oracles["throughput"], args.num_samples, seed=args.seed, distributed=True
        ),
        device,
        args.repeats,
        dist.barrier,
    )
    out = {"throughput": record(wall, result), "backend": backend, "device": str(device)}
    sharded = ShardedOracle(oracles["latency"])
    wall, result = timed(
        lambda: sample_any_order(sharded, 1, seed=args.seed), device, args.repeats, dist.barrier
    )
    out["latency"] = record(wall, result)
    walls = [None] * dist.get_world_size()
    dist.all_gather_object(walls, (out["throughput"]["wall"], out["latency"]["wall"]))
    out["throughput"]["wall"] = max(w[0] for w in walls)  # the slowest rank's
    out["latency"]["wall"] = max(w[1] for w in walls)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(out))
    dist.destroy_process_group()


# ------------------------------------------------------------------------ the launcher
def launch(args, procs: int, path: Path) -> dict:
    settings = {
        k: getattr(args, k) for k in ("device", "n", "num_samples", "latency_n", "repeats", "seed")
    }
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
    oracles = workloads(args, device)
    base = {
        "throughput": record(
            *timed(
                lambda: sample_any_order(oracles["throughput"], args.num_samples, seed=args.seed),
                device,
                args.repeats,
            )
        ),
        "latency": record(
            *timed(
                lambda: sample_any_order(oracles["latency"], 1, seed=args.seed),
                device,
                args.repeats,
            )
        ),
    }
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for procs in args.procs:
            runs[procs] = launch(args, procs, Path(tmp) / f"{procs}.json")
    ok = True
    tables = [
        (
            "throughput",
            f"Throughput: Markov chain n = {args.n}, {args.num_samples} draws, autospec, "
            "distributed=True (draws spread over the ranks)",
            args.num_samples,
        ),
        (
            "latency",
            f"Latency: full-rank DPP n = {args.latency_n}, one draw, autospec, ShardedOracle "
            "(every round's rows spread over the ranks)",
            1,
        ),
    ]
    for key, title, draws in tables:
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
