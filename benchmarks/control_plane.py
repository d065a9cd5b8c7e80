"""Where a round of the host control plane spends its time, and what compiled code would save.

Two parts, one table each:

* ``rounds``: the default ``autospec`` on the oracles users bring (16 draws, n = 1024 unless
  said): wall time per round, the time inside the oracle's methods, and the time outside it
  (the control plane: building inputs, checking rows, the verification, the drafts, the keyed
  numbers), with the share of the verification and the drafts measured by timing the
  engine's own ``TokenSampler._verify`` and ``TokenSampler._draft``.
* ``kernel``: the arithmetic of one verification (acceptance tests in float64 log space, the
  first rejected token's residual redraw, the keyed uniforms and Gumbels) as the engine writes
  it in NumPy, against the same arithmetic compiled with numba (when numba is installed:
  ``pip install "pyro-autospec[compiled]"``; the engine compiles only the lock step below):
  microseconds per call at 16 and 256 draws, the first call's compilation, and whether the
  two agree.
* ``lockstep``: sequential sampling's lock step (16 draws, n = 4096): microseconds per row
  outside the oracle with the NumPy step and with the compiled step
  (:mod:`pyro_autospec.engine.compiled`, numba), whether the two give the same bits, and
  numba's start in a fresh process (with an empty cache and with its cache on disk). The
  oracles: ``free`` (costs nothing, borrows its inputs), the hand-written chain borrowing its
  inputs or not, and the shipped Markov chain.
* ``firstrun``: what a process's first run costs, as a script that samples once sees it: the
  default ``autospec`` (on a CPU, with 16 draws or more and an oracle without chain queries,
  sequential sampling's lock step) beside the hand-written chain with ``log_marginals_at``
  only, in a fresh process for each setting of ``PYRO_AUTOSPEC_NUMBA`` (unset: numba starts
  once the process's lock-step steps reach ``START_AFTER_STEPS``; ``1``: at the first step;
  ``0``: never), and token-level ``agr24`` for scale. The first and the second run of each
  process, and whether numba was imported.

Usage::

    python benchmarks/control_plane.py            # the rounds and kernel parts
    python benchmarks/control_plane.py --parts lockstep
    python benchmarks/control_plane.py --parts firstrun
    python benchmarks/control_plane.py --smoke    # seconds: tiny sizes
    python benchmarks/control_plane.py --smoke --parts lockstep
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from user_oracles import build_oracle  # noqa: E402

from pyro_autospec.engine import compiled, keys, sample_any_order  # noqa: E402
from pyro_autospec.engine.host_plane import TokenSampler  # noqa: E402

ORACLES = ["markov", "hmm", "mixture:K=8", "nade:scale=0.1", "nade:scale=2", "user_chain:n=4096"]


# ------------------------------------------------------------------------------ rounds
class _Timed:
    """Accumulates the seconds spent in ``TokenSampler._verify`` and ``_draft``."""

    def __init__(self):
        self.seconds = {"_verify": 0.0, "_draft": 0.0}
        self.saved = {name: getattr(TokenSampler, name) for name in self.seconds}

    def __enter__(self):
        for name, method in self.saved.items():
            setattr(TokenSampler, name, self._wrap(name, method))
        return self

    def _wrap(self, name, method):
        seconds = self.seconds

        def timed(sampler, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(sampler, *args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start

        return timed

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(TokenSampler, name, method)


def rounds_part(oracles: list[str], n: int, draws: int, repeats: int) -> None:
    print(f"## A round of the default autospec, {draws} draws (best of {repeats} runs)\n")
    print(
        "| oracle | rounds | wall / round (ms) | inside the oracle (ms) | outside (ms) | "
        "outside / wall | verification + drafts (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for spec in oracles:
        oracle = build_oracle(spec, n, "cpu")
        sample_any_order(oracle, min(draws, 2), seed=1)  # warm-up
        best = None
        for _ in range(repeats):
            with _Timed() as timer:
                start = time.perf_counter()
                result = sample_any_order(oracle, draws, seed=0)
                wall = time.perf_counter() - start
            if best is None or wall < best[0]:
                best = (wall, result, dict(timer.seconds))
        wall, result, seconds = best
        r = result.rounds
        inside = result.timing["oracle"]
        ms = 1e3 / r
        print(
            f"| {spec} | {r} | {wall * ms:.3f} | {inside * ms:.3f} | {(wall - inside) * ms:.3f} "
            f"| {(wall - inside) / wall:.2f} | {(seconds['_verify'] + seconds['_draft']) * ms:.3f} |",
            flush=True,
        )
    print()


# ------------------------------------------------------------------------------ lockstep
_START = """
import time
import numpy as np
from pyro_autospec.engine.compiled import compiled_lock_step
start = time.perf_counter()
step = compiled_lock_step()  # imports numba
out = np.log(np.full((4, 1, 2), 0.5))
step(out, np.zeros((4, 1, 2)), 0, np.zeros((4, 3), np.uint8), np.zeros((4, 0), bool),
     np.zeros(4, np.int64), np.zeros(4), 1e-5)
print(time.perf_counter() - start)
"""


def numba_start() -> tuple[float, float]:
    """Seconds from a fresh process's first use of the compiled step to its first answer:
    with an empty numba cache (it compiles), then with that cache (it loads)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYRO_AUTOSPEC_NUMBA": "1"}
        times = []
        for _ in range(2):
            run = subprocess.run(
                [sys.executable, "-c", _START], env=env, capture_output=True, text=True, check=True
            )
            times.append(float(run.stdout.strip().splitlines()[-1]))
    return times[0], times[1]


def _outside_per_row(oracle, draws: int, repeats: int, use_numba: bool):
    """Best of ``repeats`` sequential runs: (us per row outside the oracle, the result)."""
    os.environ["PYRO_AUTOSPEC_NUMBA"] = "1" if use_numba else "0"
    sample_any_order(oracle, draws, seed=1, method="sequential")  # warm-up (and compilation)
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = sample_any_order(oracle, draws, seed=0, method="sequential")
        wall = time.perf_counter() - start
        if best is None or wall < best[0]:
            best = (wall, result)
    wall, result = best
    return (wall - result.timing["oracle"]) / result.oracle_rows * 1e6, result


def lockstep_part(oracles: list[str], n: int, draws: int, repeats: int) -> None:
    print(f"## Sequential sampling's lock step, {draws} draws, n = {n} (best of {repeats} runs)\n")
    available = compiled.compiled_lock_step() is not None  # numba installed, imports, not off
    if not available:
        print(
            "No compiled step here (numba is not installed, does not import, or "
            "PYRO_AUTOSPEC_NUMBA turns it off): the NumPy step only.\n"
        )
    print(
        "| oracle | NumPy step: outside the oracle (us / row) | compiled step (us / row) "
        "| compiled / NumPy | same draws and log probabilities |"
    )
    print("|---|---:|---:|---:|---|")
    saved = os.environ.get("PYRO_AUTOSPEC_NUMBA")
    try:
        for spec in oracles:
            oracle = build_oracle(spec, n, "cpu")
            numpy_us, ours = _outside_per_row(oracle, draws, repeats, use_numba=False)
            if not available:
                print(f"| {spec} | {numpy_us:.2f} | - | - | - |", flush=True)
                continue
            compiled_us, theirs = _outside_per_row(oracle, draws, repeats, use_numba=True)
            same = torch.equal(ours.samples, theirs.samples) and torch.equal(
                ours.log_prob, theirs.log_prob
            )
            print(
                f"| {spec} | {numpy_us:.2f} | {compiled_us:.2f} | {compiled_us / numpy_us:.2f} "
                f"| {same} |",
                flush=True,
            )
    finally:
        if saved is None:
            os.environ.pop("PYRO_AUTOSPEC_NUMBA", None)
        else:
            os.environ["PYRO_AUTOSPEC_NUMBA"] = saved
    if available:
        first, cached = numba_start()
        print(
            f"\nnumba's start in a fresh process (import, then the first step): {first:.2f} s "
            f"with an empty cache (it compiles), {cached:.2f} s with its cache on disk.\n"
        )
    print()


# ------------------------------------------------------------------------------ firstrun
_FIRST = """
import sys, time
sys.path[:0] = {paths!r}
import torch
torch.set_num_threads(1)
from user_oracles import build_oracle
from pyro_autospec.engine import sample_any_order
oracle = build_oracle({spec!r}, {n}, "cpu")
times = []
for _ in range(2):
    start = time.perf_counter()
    result = sample_any_order(oracle, {draws}, seed=0, method={method!r})
    times.append(time.perf_counter() - start)
print(times[0], times[1], result.rounds, "numba" in sys.modules)
"""


def first_run_part(sizes: list[tuple[int, int]]) -> None:
    """The first and second run of a fresh process, per setting of ``PYRO_AUTOSPEC_NUMBA``."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [here, os.path.dirname(here)]
    print(
        "## A process's first run: the default autospec (lock step) per setting of "
        "PYRO_AUTOSPEC_NUMBA, and agr24\n"
    )
    print(
        f"numba's start is paid by default once the lock-step steps reach "
        f"{compiled.START_AFTER_STEPS:,} in a process. Hand-written chain, "
        "`log_marginals_at` only; each line a fresh process.\n"
    )
    print("| n | draws | variant | first run (s) | second run (s) | rounds | numba imported |")
    print("|---:|---:|---|---:|---:|---:|---|")
    variants = [
        ("autospec, default (auto)", "autospec", None),
        ("autospec, PYRO_AUTOSPEC_NUMBA=1", "autospec", "1"),
        ("autospec, PYRO_AUTOSPEC_NUMBA=0", "autospec", "0"),
        ("agr24", "agr24", None),
    ]
    for n, draws in sizes:
        for label, method, flag in variants:
            env = {k: v for k, v in os.environ.items() if k != "PYRO_AUTOSPEC_NUMBA"}
            if flag is not None:
                env["PYRO_AUTOSPEC_NUMBA"] = flag
            code = _FIRST.format(
                paths=paths, spec=f"user_chain:n={n}", n=n, draws=draws, method=method
            )
            run = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            first, second, rounds, imported = run.stdout.split()[-4:]
            print(
                f"| {n} | {draws} | {label} | {float(first):.3f} | {float(second):.3f} | "
                f"{rounds} | {imported} |",
                flush=True,
            )
    print()


# ------------------------------------------------------------------------------ kernel
def _pick(table, index):
    return np.take_along_axis(table, index[..., None], -1)[..., 0]


def verify_numpy(data, target, x, k, key):
    """The verification of ``TokenSampler._verify`` (speculative rule), NumPy: ``(stop,
    log_mu, redrawn value or -1)`` per draw."""
    num, width, q = data.shape
    j = np.arange(1, width)[None, :]
    in_window = j < k[:, None]
    xt = x[:, 1:]
    target_x = _pick(target, xt)
    draft_x = _pick(data[:, 1:], xt)
    log_u = keys.host_log_uniform(key[:, None], keys.Tag.ACCEPT, j)
    with np.errstate(invalid="ignore"):
        keep = (log_u < target_x - draft_x) & in_window
    stop = np.where(~keep & in_window, j, k[:, None]).min(1)
    log_mu = _pick(data[:, 0], x[:, 0]) + np.where(j < stop[:, None], target_x, 0.0).sum(1)
    rejected = stop < k
    redrawn = np.full(num, -1)
    if rejected.any():
        js = stop[rejected]
        rows_j = target[rejected, js - 1]
        residual = np.clip(np.exp(rows_j) - np.exp(data[rejected, js]), 0.0, None)
        with np.errstate(divide="ignore"):
            log_residual = np.log(residual / residual.sum(1, keepdims=True))
        g = keys.host_gumbel(key[rejected][:, None], keys.Tag.RESAMPLE, np.arange(q))
        y = np.argmax(log_residual + g, axis=-1)
        redrawn[rejected] = y
        log_mu[rejected] += _pick(rows_j, y)
    return stop, log_mu, redrawn


def _numba_verify():
    """The same arithmetic compiled with numba (``None`` without numba)."""
    try:
        import numba
    except ImportError:
        return None
    m1, m2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    gamma = np.uint64(0x9E3779B97F4A7C15)
    accept, resample = np.uint64(keys.Tag.ACCEPT), np.uint64(keys.Tag.RESAMPLE)

    @numba.njit
    def uniform(key, tag, counter):
        z = (key ^ tag) + (np.uint64(counter) + np.uint64(1)) * gamma
        z = (z ^ (z >> np.uint64(30))) * m1
        z = (z ^ (z >> np.uint64(27))) * m2
        z = z ^ (z >> np.uint64(31))
        return (np.float64(z >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)

    @numba.njit
    def verify(data, target, x, k, key):
        num, _, q = data.shape
        stop = np.empty(num, np.int64)
        log_mu = np.empty(num)
        redrawn = np.full(num, -1)
        residual = np.empty(q)
        for d in range(num):
            kd, kk = k[d], np.uint64(key[d])
            total = data[d, 0, x[d, 0]]
            s = kd
            for j in range(1, kd):
                t = target[d, j - 1, x[d, j]]
                if np.log(uniform(kk, accept, j)) < t - data[d, j, x[d, j]]:
                    total += t
                else:
                    s = j
                    break
            stop[d] = s
            if s < kd:
                mass = 0.0
                for v in range(q):
                    r = np.exp(target[d, s - 1, v]) - np.exp(data[d, s, v])
                    residual[v] = r if r > 0.0 else 0.0
                    mass += residual[v]
                best, arg = -np.inf, 0
                for v in range(q):
                    value = np.log(residual[v] / mass) - np.log(-np.log(uniform(kk, resample, v)))
                    if value > best:
                        best, arg = value, v
                redrawn[d] = arg
                total += target[d, s - 1, arg]
            log_mu[d] = total
        return stop, log_mu, redrawn

    return verify


def kernel_part(shapes, calls: int) -> None:
    compiled = _numba_verify()
    print("## One verification: NumPy (the engine's arithmetic) against numba\n")
    if compiled is None:
        print("numba is not installed (`pip install numba`): NumPy only.\n")
    print(
        "| draws | window | q | NumPy (us / call) | numba (us / call) | numba's first call (s) "
        "| same stops and redraws |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    rng = np.random.default_rng(0)
    for num, width, q in shapes:
        data = np.log(rng.dirichlet(np.ones(q), (num, width)))
        target = np.log(rng.dirichlet(np.full(q, 5.0), (num, width - 1)))
        x = rng.integers(0, q, (num, width))
        k = rng.integers(2, width + 1, num)
        key = rng.integers(-(2**62), 2**62, num)
        args = (data, target, x, k, key)

        def per_call(f, args=args):
            f(*args)
            start = time.perf_counter()
            for _ in range(calls):
                f(*args)
            return (time.perf_counter() - start) / calls * 1e6

        numpy_us = per_call(verify_numpy)
        if compiled is None:
            print(f"| {num} | {width} | {q} | {numpy_us:.1f} | - | - | - |")
            continue
        start = time.perf_counter()
        theirs = compiled(*args)
        first = time.perf_counter() - start
        ours = verify_numpy(*args)
        same = np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[2], theirs[2])
        numba_us = per_call(compiled)
        print(
            f"| {num} | {width} | {q} | {numpy_us:.1f} | {numba_us:.1f} | {first:.2f} | {same} |",
            flush=True,
        )
    print()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=["rounds", "kernel"])
    parser.add_argument("--oracles", nargs="+", default=ORACLES)
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n, draws, repeats, calls = 1024, args.draws, args.repeats, 300
    oracles = args.oracles
    shapes = [(16, 32, 4), (256, 32, 4), (16, 8, 64)]
    if args.smoke:
        n, draws, repeats, calls = 64, 2, 1, 3
        oracles = ["markov", "mixture:K=8"]
        shapes = [(4, 8, 4)]
    print(f"# The host control plane's round (torch {torch.__version__}, 1 thread, cpu)\n")
    print(f"`python benchmarks/control_plane.py {' '.join(sys.argv[1:])}`\n".replace(" `", "`"))
    start = time.perf_counter()
    if "rounds" in args.parts:
        rounds_part(oracles, n, draws, repeats)
    if "kernel" in args.parts:
        kernel_part(shapes, calls)
    if "lockstep" in args.parts:
        lockstep_n = 128 if args.smoke else 4096
        lock = [
            f"free:n={lockstep_n},borrows=true",
            f"user_chain:n={lockstep_n},borrows=true",
            f"user_chain:n={lockstep_n}",
            f"markov:n={lockstep_n}",
        ]
        lockstep_part(lock, lockstep_n, 2 if args.smoke else 16, repeats)
    if "firstrun" in args.parts:
        sizes = [(32, 16)] if args.smoke else [(100, 16), (1024, 16), (256, 256)]
        first_run_part(sizes)
    print(f"(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
