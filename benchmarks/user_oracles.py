"""The oracles users bring: autospec and every baseline, same oracle, same draws, one run.

Oracles (``--oracles``, each ``name`` or ``name:key=value,key=value``):

* ``nade``: an imperfect learned network, a one-hidden-layer order-agnostic NADE with random
  weights (:class:`tests.catalogue.user_oracles.RandomNADE`, ``q = 4``): its conditionals are
  not the marginals of one joint. Chain queries in one pass. Keys ``scale`` (smaller is
  smoother), ``hidden``, ``chains`` (``false``: rows only), ``seed``, ``n``.
* ``guide``: :class:`~pyro_autospec.guides.AnyOrderGuide` (``"mlp"``, ``q = 4``) used as the
  oracle, its weights drawn at random like an untrained network's (``steps=0``), or then
  trained ``steps`` Adam steps on exact draws of ``mixture:K=8`` (partly trained). Keys
  ``steps``, ``hidden``, ``layers``, ``scale``, ``n``.
* ``mixture``: a consistent dense oracle, a mixture of ``K`` product distributions on
  ``[4]^n``, exact conditionals by Bayes (:class:`tests.catalogue.user_oracles.ProductMixture`).
  Keys ``K``, ``sharpness``, ``n``.
* ``user_chain``: a binary Markov chain written by hand with ``log_marginals_at`` only, no
  chain queries (:class:`tests.catalogue.user_oracles.HandChain`). Keys ``stay``, ``n``.
* ``free``: independent coordinates whose rows cost nothing (one fixed row, a view of it):
  the engine's own cost per round. Keys ``n``, ``q``.
* ``markov``, ``hmm``, ``tree_potts``: the shipped families as ``benchmarks/rounds.py`` builds
  them. Key ``n``.
* Any of them with ``full=true``: seen through ``log_marginals`` alone (whole rows, the one
  method the protocol requires), e.g. ``mixture:K=8,full=true``.
* Any of them with ``borrows=true`` or ``borrows=false``: declaring ``borrows_inputs`` as
  asked (:class:`tests.catalogue.oracles.DeclaredBorrowing`; the shipped families and guides
  declare it, ``borrows=false`` measures what it saves them; ``user_chain:borrows=true``
  what it would save the hand-written chain), e.g. ``markov:n=4096,borrows=false``.

Method variants (``--variants``): ``method`` or ``method:key=value,...``, each run as
``sample_any_order(oracle, draws, method=method, seed=seed, **knobs)``; values are read as
int, float, ``true``/``false``, ``none`` or else a string. New schedule knobs are measured
without a change here, e.g. ``--variants autospec autospec:max_block=8 agr24 sequential``.

For every oracle, draw count (``--draws``) and variant the table shows the rounds per draw
(``sample_rounds``, mean) and of the whole run, rows per draw (also over ``n``), wall time per
draw, the engine's time per row (the run's own wall time, ``SampleResult.wall_time``, which
starts after the consistency check, less the time inside the oracle's methods: the copies of
its inputs and the mode switches around its calls are the engine's), and, from a second run
of the same draws
under a :class:`~torch.overrides.TorchFunctionMode`, the torch calls per round made OUTSIDE the
oracle (the engine's: every torch function and tensor method, each a kernel launch or a
dispatch) and the host reads among them (calls that make the host wait for a GPU: ``nonzero``,
``.item()``, ``bool()``, boolean-mask indexing, ...; ``benchmarks/engine.py`` lists them). The
oracle is wrapped for that run in a proxy that flags its own methods' calls, so an oracle's
work never counts as the engine's; the calls of the consistency check that starts every run
(:func:`~pyro_autospec.engine.consistency.check_consistency`, once per run, not per round)
are counted apart and left out, and its time is listed under the table. On a GPU the time inside the oracle is host time (kernels
are not waited for), so "engine / row" is only meaningful on a CPU. "In the kernel" is the share of the
process's CPU time the operating system spent for it during the timed run, and "page faults /
row" its minor page faults per row (``getrusage``; a platform without them shows NaN and 0):
on Linux with glibc's default allocator, oracle calls whose temporaries take megabytes fault
their pages in anew each call, and that can be most of a run's time (``benchmarks/README.md``,
"Page faults"). The last column is wall time over the fastest variant whose method is not
``autospec``. On a CPU, before the
variants of a draw count are timed, the first one runs once untimed (``--no-warmup`` skips it):
a process's first oracle calls of a new size fault in fresh memory, which made whichever
variant came first up to three times slower on the hand-written chain. On a GPU every variant
runs once with 2 draws first (the CUDA context, kernels and caching allocator).

Usage::

    python benchmarks/user_oracles.py                       # every oracle, 1 / 16 / 256 draws
    python benchmarks/user_oracles.py --draws 1 16          # the README's "before" run
    python benchmarks/user_oracles.py --oracles nade:scale=0.25 mixture:K=64 \\
        --variants autospec autospec:max_block=8 agr24 sequential --draws 1 8
    python benchmarks/user_oracles.py --draws 1 --repeats 3 # median of 3 runs in turn
    python benchmarks/user_oracles.py --device cuda         # on a GPU
    python benchmarks/user_oracles.py --smoke               # seconds, for CI
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import _SYNCING, _waits, lock_step_note  # noqa: E402
from rounds import hmm, markov, tree_potts  # noqa: E402

from pyro_autospec.engine import sample_any_order  # noqa: E402
from pyro_autospec.engine.consistency import check_consistency  # noqa: E402
from pyro_autospec.engine.protocols import declares_consistent_queries  # noqa: E402
from tests.catalogue.oracles import DeclaredBorrowing  # noqa: E402
from tests.catalogue.user_oracles import HandChain, ProductMixture, RandomNADE  # noqa: E402

DEFAULT_ORACLES = [
    "nade:scale=2",
    "nade:scale=0.5",
    "nade:scale=0.1",
    "nade:scale=2,chains=false",
    "guide:steps=0",
    "guide:steps=300",
    "mixture:K=8",
    "mixture:K=64",
    "user_chain:n=4096",
    "markov",
    "hmm",
    "tree_potts",
]
# --smoke: one oracle of each kind the default list builds (a random NADE with chain queries,
# a partly trained guide, a mixture, the hand-written chain with its own n, a shipped family)
SMOKE_ORACLES = ["nade:scale=2", "guide:steps=300", "mixture:K=8", "user_chain:n=4096", "markov"]
DEFAULT_VARIANTS = ["autospec", "autospec:token_below=0", "agr24", "speculative", "sequential"]
ORACLE_METHODS = (
    "log_marginals",
    "log_marginals_at",
    "log_marginals_chain",
    "log_marginals_chain_then",
)


# ----------------------------------------------------------------------------- specs
def parse_value(text: str):
    """``"8"`` -> 8, ``"0.5"`` -> 0.5, ``"true"`` -> True, ``"none"`` -> None, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _rest(kw: dict) -> str:
    """The keys of a spec again, as ``:key=value,...`` (empty without keys)."""
    return (":" + ",".join(f"{k}={v}" for k, v in kw.items())) if kw else ""


def parse_spec(spec: str) -> tuple[str, dict]:
    """``"name:k=v,k2=v2"`` -> ``("name", {"k": v, "k2": v2})``."""
    name, _, rest = spec.partition(":")
    knobs = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"bad spec {spec!r}: expected name:key=value,key=value")
        knobs[key.strip()] = parse_value(value)
    return name.strip(), knobs


# ----------------------------------------------------------------------------- oracles
class FreeRows:
    """One fixed row for every coordinate, whatever is pinned (independent coordinates), at
    no cost: ``log_marginals_at`` returns a view of one ``[q]`` row. What a round costs the
    engine alone, beside an oracle that costs nothing."""

    inference_safe = True
    consistent_queries = True

    def __init__(self, n: int, q: int = 2):
        self.num_coords, self.num_values = int(n), int(q)
        self.row = torch.log_softmax(torch.linspace(0.0, 1.0, self.num_values).double(), 0)

    def log_marginals(self, values, mask):
        return self.row.expand(values.shape[0], self.num_coords, self.num_values)

    def log_marginals_at(self, values, mask, targets):
        return self.row.expand(*targets.shape, self.num_values)


def _guide(n: int, device: str, steps: int = 0, hidden: int = 64, layers: int = 1, scale=1.5):
    """An ``"mlp"`` AnyOrderGuide with random weights N(0, scale^2 / fan_in) (an untrained
    network's rows: far from any target, inconsistent across orders), then ``steps`` Adam
    steps on exact draws of ``mixture:K=8`` (a partly trained one)."""
    from pyro_autospec.guides import AnyOrderGuide

    torch.manual_seed(0)
    guide = AnyOrderGuide(
        num_coords=n, num_values=4, architecture="mlp", hidden_dim=hidden, num_layers=layers
    )
    with torch.no_grad():
        for param in guide.parameters():
            if param.dim() > 1:
                param.normal_(0.0, scale / param.shape[-1] ** 0.5)
    if steps:
        mix = ProductMixture(n, 4, components=8, seed=0)
        data = mix.sample(4096, seed=1)
        guide.train()
        guide.fit_to_samples(data, num_steps=steps, lr=3e-3, seed=0, disable_progbar=True)
    return guide.eval().to(device)


class FullRowsOnly:
    """The oracle seen through ``log_marginals`` alone: whole rows ``[B, n, q]``, the one
    method the protocol requires (what a user writes first)."""

    def __init__(self, inner):
        self.inner = inner
        self.num_coords, self.num_values = inner.num_coords, inner.num_values
        for attr in ("device", "inference_safe"):
            if getattr(inner, attr, None) is not None:
                setattr(self, attr, getattr(inner, attr))

    def log_marginals(self, values, mask):
        return self.inner.log_marginals(values, mask)


def build_oracle(spec: str, n_default: int, device: str):
    name, kw = parse_spec(spec)
    if "borrows" in kw:
        borrows = kw.pop("borrows")
        return DeclaredBorrowing(build_oracle(name + _rest(kw), n_default, device), borrows)
    if kw.pop("full", False):
        return FullRowsOnly(build_oracle(name + _rest(kw), n_default, device))
    n = int(kw.pop("n", n_default))
    if name == "nade":
        return RandomNADE(n, 4, device=device, **kw)
    if name == "guide":
        return _guide(n, device, **kw)
    if name == "mixture":
        return ProductMixture(n, 4, components=int(kw.pop("K", 8)), device=device, **kw)
    if name == "user_chain":
        return HandChain(n, device=device, **kw)
    if name == "free":
        return FreeRows(n, **kw)
    families = {"markov": markov, "hmm": hmm, "tree_potts": tree_potts}
    if name in families:
        if kw:
            raise SystemExit(f"{name} takes only n; got {sorted(kw)}")
        return families[name](n, device=device)
    raise SystemExit(
        f"unknown oracle {name!r}: one of nade, guide, mixture, user_chain, free, markov, hmm, "
        "tree_potts"
    )


# ----------------------------------------------------------------------------- counting
class OutsideOracle(TorchFunctionMode):
    """Counts torch calls (functions and tensor methods) made outside the oracle's methods,
    and the host reads among them; the oracle's own are counted apart."""

    def __init__(self):
        super().__init__()
        self.inside = 0
        self.engine = self.syncs = self.oracle = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.inside:
            self.oracle += 1
        else:
            self.engine += 1
            if getattr(func, "__name__", "") in _SYNCING or _waits(func, args, kwargs):
                self.syncs += 1
        return func(*args, **(kwargs or {}))


class Flagged:
    """The oracle behind a proxy with the same attributes and query methods, whose calls
    raise ``counter.inside`` while they run."""

    def __init__(self, oracle, counter: OutsideOracle):
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values
        for attr in ("device", "inference_safe", "num_draws", "consistent_queries"):
            if getattr(oracle, attr, None) is not None:
                setattr(self, attr, getattr(oracle, attr))
        for name in ORACLE_METHODS:
            method = getattr(oracle, name, None)
            if callable(method):
                setattr(self, name, self._flag(method, counter))

    @staticmethod
    def _flag(method, counter):
        def call(*args, **kwargs):
            counter.inside += 1
            try:
                return method(*args, **kwargs)
            finally:
                counter.inside -= 1

        return call


# ----------------------------------------------------------------------------- runs
def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_variant(oracle, draws: int, method: str, knobs: dict, args, count: bool) -> dict:
    _sync(args.device)
    before = _usage()
    start = time.perf_counter()
    r = sample_any_order(oracle, draws, method=method, seed=args.seed, schedule=knobs)
    _sync(args.device)
    wall = time.perf_counter() - start
    user, system, faults = (b - a for a, b in zip(before, _usage()))
    out = {
        "rounds": r.rounds,
        "rounds_per_draw": float(r.sample_rounds.double().mean()),
        "rows_per_draw": r.oracle_rows / draws,
        "wall": wall,
        # the engine's: the run's time (the per-run consistency check is timed apart) less
        # the time inside the oracle's methods
        "engine_us_per_row": 1e6
        * (r.wall_time - r.timing.get("oracle", 0.0))
        / max(1, r.oracle_rows),
        "kernel_share": system / (user + system) if user + system > 0 else math.nan,
        "faults_per_row": faults / max(1, r.oracle_rows),
    }
    if count:
        counter = OutsideOracle()
        proxy = Flagged(oracle, counter)
        with counter:
            again = sample_any_order(proxy, draws, method=method, seed=args.seed, schedule=knobs)
        if not declares_consistent_queries(oracle):
            # per round: the engine's work, without the consistency check made once per run
            check = OutsideOracle()
            with check:
                check_consistency(Flagged(oracle, check), args.device)
            counter.engine -= check.engine
            counter.syncs -= check.syncs
            counter.oracle -= check.oracle
        if not torch.equal(again.samples, r.samples):
            raise RuntimeError(f"{method} {knobs}: the counted run drew other samples")
        out["calls_per_round"] = counter.engine / r.rounds
        out["syncs_per_round"] = counter.syncs / r.rounds
        out["oracle_calls_per_round"] = counter.oracle / r.rounds
    return out


def _usage() -> tuple[float, float, int]:
    """This process's user and kernel CPU seconds and minor page faults so far (NaN where
    the platform does not count them)."""
    try:
        import resource
    except ImportError:  # pragma: no cover (Windows)
        return math.nan, math.nan, 0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_minflt


def _median_run(runs):
    """The run of median wall time among ``runs`` (the first run's counts kept), or the
    error message of a variant that failed."""
    if isinstance(runs, str):
        return runs
    median = dict(sorted(runs, key=lambda r: r["wall"])[len(runs) // 2])
    for key in ("calls_per_round", "syncs_per_round", "oracle_calls_per_round"):
        if key in runs[0]:
            median[key] = runs[0][key]
    return median


def _check_seconds(oracle, device: str) -> float:
    """Fastest of three runs of the consistency check that every run starts with."""
    times = []
    for _ in range(3):
        _sync(device)
        start = time.perf_counter()
        check_consistency(oracle, device)
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def describe(oracle, spec: str) -> str:
    kinds = [m.replace("log_marginals", "").lstrip("_") or "rows" for m in ORACLE_METHODS[1:]]
    has = [k for k, m in zip(kinds, ORACLE_METHODS[1:]) if callable(getattr(oracle, m, None))]
    return f"{spec} (n = {oracle.num_coords}, q = {oracle.num_values}; {', '.join(has) or 'rows'})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one oracle of each kind, n = 32, 1 and 2 draws (counted at 2): seconds",
    )
    parser.add_argument("--oracles", nargs="+", default=DEFAULT_ORACLES)
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    parser.add_argument("--draws", nargs="+", type=int, default=[1, 16, 256])
    parser.add_argument("--n", type=int, default=1024, help="n of every oracle without n=")
    parser.add_argument("--no-count", dest="count", action="store_false", help="no op counts")
    parser.add_argument(
        "--count-draws",
        nargs="+",
        type=int,
        help="count calls only at these draw counts (default: all of --draws); the counted "
        "run repeats the timed one under a TorchFunctionMode, several times slower",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time every variant this many times, the variants in turn, and report the run "
        "of median wall time (a shared machine's slow spells then hit every variant)",
    )
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="on a CPU, time the first variant of each draw count cold (by default it runs "
        "once untimed first: a process's first calls of a size fault in fresh memory, which "
        "once cost the first variant up to 3 times its time)",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    if args.smoke:
        args.n, args.draws = 32, [1, 2]
        args.count_draws = args.count_draws or [2]
        if args.oracles == DEFAULT_ORACLES:
            args.oracles = SMOKE_ORACLES
        args.oracles = [
            s.replace("n=4096", "n=32").replace("steps=300", "steps=5") for s in args.oracles
        ]
    if args.count_draws is None:
        args.count_draws = args.draws
    torch.set_num_threads(args.threads)
    variants = [(v, *parse_spec(v)) for v in args.variants]
    where = args.device
    if torch.device(where).type == "cuda":
        where += f" ({torch.cuda.get_device_name(torch.device(where))})"
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        load = "unknown"
    print(
        f"# Oracles users bring (torch {torch.__version__}, {args.threads} thread(s), {where}; "
        f"load average {load})\n\n"
        f"`{' '.join(['python', 'benchmarks/user_oracles.py', *sys.argv[1:]])}`\n\n"
        f"{lock_step_note()}\n"
    )
    print(
        "| oracle | draws | variant | rounds/draw | rounds (run) | rows/draw | rows/draw / n "
        "| wall/draw (s) | engine / row (us) | engine calls / round | host reads / round "
        "| oracle calls / round | in the kernel | page faults / row | this / fastest baseline |"
    )
    print("|" + "---|" * 15)
    start = time.perf_counter()
    notes = []
    for spec in args.oracles:
        built = time.perf_counter()
        oracle = build_oracle(spec, args.n, args.device)
        built = time.perf_counter() - built
        if declares_consistent_queries(oracle):
            check = "declares consistent queries (no check before its runs)"
        else:
            seconds = _check_seconds(oracle, args.device)
            check = f"the consistency check before each run takes {1e3 * seconds:.1f} ms"
        notes.append(f"- {describe(oracle, spec)}, built in {built:.1f} s; {check}")
        label, n = spec, oracle.num_coords
        if torch.device(args.device).type != "cpu":  # context, kernels, allocator
            for _, method, knobs in variants:
                sample_any_order(oracle, 2, method=method, seed=args.seed + 1, schedule=knobs)
        for draws in args.draws:
            results, count = {}, args.count and draws in args.count_draws
            if args.warmup and torch.device(args.device).type == "cpu":
                # the process's first calls of this size pay for fresh memory (glibc)
                _, method, knobs = variants[0]
                sample_any_order(oracle, draws, method=method, seed=args.seed + 1, schedule=knobs)
            runs = {v: [] for v, _, _ in variants}
            for repeat in range(args.repeats):  # in turn, so that a slow spell hits them all
                for v, m, k in variants:
                    if isinstance(runs[v], str):
                        continue
                    try:
                        runs[v].append(run_variant(oracle, draws, m, k, args, count and not repeat))
                    except Exception as error:  # report it in the table and go on
                        runs[v] = f"{type(error).__name__}: {error}"
            results = {v: _median_run(r) for v, r in runs.items()}
            baselines = [
                results[v]["wall"]
                for v, m, _ in variants
                if m != "autospec" and isinstance(results[v], dict)
            ]
            fastest = min(baselines) if baselines else math.nan
            for v, _, _ in variants:
                r = results[v]
                if isinstance(r, str):
                    print(f"| {label} | {draws} | {v} | fails: {r[:200]} |" + " |" * 11)
                    continue
                counts = (
                    f"{r['calls_per_round']:.0f} | {r['syncs_per_round']:.1f} | "
                    f"{r['oracle_calls_per_round']:.0f}"
                    if count
                    else "- | - | -"
                )
                print(
                    f"| {label} | {draws} | {v} | {r['rounds_per_draw']:.1f} | {r['rounds']} | "
                    f"{r['rows_per_draw']:.0f} | {r['rows_per_draw'] / n:.2f} | "
                    f"{r['wall'] / draws:.4f} | {r['engine_us_per_row']:.1f} | {counts} | "
                    f"{100 * r['kernel_share']:.0f}% | {r['faults_per_row']:.1f} | "
                    f"{r['wall'] / fastest:.2f} |",
                    flush=True,
                )
    print("\nOracles (size; query methods beyond `log_marginals`):\n")
    print("\n".join(notes))
    print(f"\n(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
