"""AutoSpec against vectorised ``infer_discrete`` on Pyro models that both can sample exactly.

Five shapes of model, each conditioned on fixed parameters (discrete latent sites only):

* ``hmm``: the HMM of Pyro's enumeration tutorial (``hmm_model`` with ``pyro.markov``, 10
  hidden states, categorical emissions over 4 symbols, transition and emission conditioned),
  T = 200;
* ``dbn``: a dynamic Bayesian network, three chains coupled per step (each step's sites
  depend on the previous step's and on each other), T = 60;
* ``fhmm``: a factorial HMM, two independent chains of 4 states emitting one observation per
  step together, T = 100;
* ``nested``: nested plates of chains: 10 sequences (a plate) of T = 20 steps, each step a
  binary site whose emission sits in a plate of 3 tones;
* ``gmm``: Gaussian-mixture assignments, 200 points, 3 components with fixed locations;
* ``tiny``: 10 binary sites with a few pairwise factors.

For each, one vectorised ``infer_discrete`` call over a particle plate of ``--draws``
particles (Pyro's forward-filter backward-sample, exact), and one ``AutoSpec(...).run``
(exact, self-checked on every draw) with the sampler it picks by default. The fixed cost of a
run (tracing and compiling; for ``infer_discrete`` the same call with one particle) is shown
apart. ``--profile`` splits AutoSpec's time into its parts (discover sites, build oracle,
sampler, evaluate + self-check) for the default sampler and for the autospeculation engine.

``--suite`` runs the same comparison on every model of the Pyro test-suite catalogue that
AutoSpec samples (``tests/infer/_pyro_suite_models.py``: models copied from Pyro's own tests
and examples, continuous sites fixed), ``--draws`` draws each (default 1000 there), and also
times ``infer_discrete`` the way Pyro's docs use it, one call per draw (20 calls, or those
of the first second, scaled to the draws). Each model runs once untimed first; the table ends with the median ratio.

Usage::

    python benchmarks/pyro_vs_infer_discrete.py            # the table in benchmarks/README.md
    python benchmarks/pyro_vs_infer_discrete.py --profile  # where the time goes
    python benchmarks/pyro_vs_infer_discrete.py --suite    # Pyro's test-suite models
    python benchmarks/pyro_vs_infer_discrete.py --smoke    # seconds, for CI
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import config_enumerate, infer_discrete
from pyro.ops.indexing import Vindex

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package

import pyro_autospec.infer.discrete_run as run_mod  # noqa: E402
from pyro_autospec.infer import AutoSpec  # noqa: E402

# ----------------------------------------------------------------------------------- models


def tutorial_hmm(data, data_dim, hidden_dim=10):
    """Pyro's enumeration tutorial HMM, verbatim but for the print."""
    with pyro.plate("hidden_state", hidden_dim):
        transition = pyro.sample("transition", dist.Dirichlet(0.5 * torch.ones(hidden_dim)))
        emission = pyro.sample("emission", dist.Dirichlet(0.5 * torch.ones(data_dim)))
    x = 0  # initial state
    for t, y in pyro.markov(enumerate(data)):
        x = pyro.sample(f"x_{t}", dist.Categorical(transition[x]), infer={"enumerate": "parallel"})
        pyro.sample(f"y_{t}", dist.Categorical(emission[x]), obs=y)


def hmm_case(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden, data_dim = 10, 4
    transition = torch.distributions.Dirichlet(torch.ones(hidden)).sample((hidden,))
    transition = 0.5 * transition + 0.5 * torch.eye(hidden)
    emission = torch.rand(hidden, data_dim, generator=gen) + 0.1
    emission = emission / emission.sum(-1, keepdim=True)
    data = torch.randint(0, data_dim, (T,), generator=gen)
    model = poutine.condition(tutorial_hmm, data={"transition": transition, "emission": emission})
    return model, (data, data_dim), T


def dbn(ys, coupling):
    """Three binary chains; chain c at step t depends on itself at t - 1 and chain c - 1 at t."""
    prev = [0, 0, 0]
    for t in pyro.markov(range(len(ys))):
        cur = []
        for c in range(3):
            logit = coupling[0] * (2.0 * prev[c] - 1.0)
            if c > 0:
                logit = logit + coupling[1] * (2.0 * cur[c - 1] - 1.0)
            cur.append(pyro.sample(f"s{c}_{t}", dist.Bernoulli(logits=logit)))
        loc = cur[0] + cur[1] + cur[2]
        pyro.sample(f"y_{t}", dist.Normal(loc, 0.8), obs=ys[t])
        prev = cur


def dbn_case(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ys = 3.0 * torch.rand(T, generator=gen)
    return dbn, (ys, torch.tensor([1.5, 0.8])), 3 * T


def fhmm(ys, trans, locs):
    """Two independent 4-state chains emitting one observation per step together."""
    w, x = 0, 0
    for t in pyro.markov(range(len(ys))):
        w = pyro.sample(f"w_{t}", dist.Categorical(trans[w]))
        x = pyro.sample(f"x_{t}", dist.Categorical(trans[x]))
        pyro.sample(f"y_{t}", dist.Normal(locs[w] + 0.5 * locs[x], 0.7), obs=ys[t])


def fhmm_case(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    trans = 0.7 * torch.eye(4) + 0.075
    locs = torch.tensor([-2.0, -0.5, 0.5, 2.0])
    ys = 3.0 * torch.randn(T, generator=gen)
    return fhmm, (ys, trans, locs), 2 * T


def nested(ys, trans, emit):
    """A plate of sequences, each a binary chain whose emissions sit in a plate of tones."""
    num_seq, T, tones = ys.shape
    tones_plate = pyro.plate("tones", tones, dim=-1)
    with pyro.plate("sequences", num_seq, dim=-2):
        x = torch.tensor(0)
        for t in pyro.markov(range(T)):
            x = pyro.sample(f"x_{t}", dist.Bernoulli(Vindex(trans)[x.long()]))
            with tones_plate:
                probs = Vindex(emit)[x.long(), torch.arange(tones)]
                pyro.sample(f"y_{t}", dist.Bernoulli(probs), obs=ys[:, t])


def nested_case(T: int, seed: int = 0, num_seq: int = 10, tones: int = 3):
    gen = torch.Generator().manual_seed(seed)
    trans = torch.tensor([0.2, 0.85])
    emit = torch.tensor([[0.2, 0.3, 0.7], [0.8, 0.6, 0.3]])
    ys = (torch.rand(num_seq, T, tones, generator=gen) < 0.5).float()
    return nested, (ys, trans, emit), num_seq * T


def gmm(data, weights, locs):
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(weights))
        pyro.sample("y", dist.Normal(locs[z], 1.0), obs=data)


def gmm_case(N: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    locs = torch.tensor([-3.0, 0.0, 3.0])
    data = locs[torch.randint(0, 3, (N,), generator=gen)] + torch.randn(N, generator=gen)
    return gmm, (data, torch.tensor([0.3, 0.3, 0.4]), locs), N


def tiny(ys):
    z = [pyro.sample(f"z{i}", dist.Bernoulli(0.4)) for i in range(10)]
    for i in range(0, 10, 2):
        pyro.factor(f"f{i}", 0.7 * (2 * z[i] - 1) * (2 * z[i + 1] - 1))
        pyro.sample(f"y{i}", dist.Normal(z[i] + z[i + 1], 1.0), obs=ys[i // 2])


def tiny_case(_: int = 0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tiny, (torch.randn(5, generator=gen),), 10


CASES = {
    "hmm": (hmm_case, 200, 20),
    "dbn": (dbn_case, 60, 10),
    "fhmm": (fhmm_case, 100, 10),
    "nested": (nested_case, 20, 5),
    "gmm": (gmm_case, 200, 20),
    "tiny": (tiny_case, 0, 0),
}

# ----------------------------------------------------------------------------------- timing


def run_infer_discrete(model, args, num_draws: int, depth: int = 2, kwargs=None):
    """One vectorised infer_discrete call: ``num_draws`` exact draws over a particle plate
    left of the model's ``depth`` plate dims (every model here nests plates at most 2 deep)."""
    first = -(depth + 2)

    def particles(*a, **k):
        with pyro.plate("_particles", num_draws, dim=first + 1):  # a name no model uses
            return model(*a, **k)

    sampler = infer_discrete(config_enumerate(particles), first_available_dim=first)
    start = time.perf_counter()
    with poutine.block():
        poutine.trace(sampler).get_trace(*args, **(kwargs or {}))
    return time.perf_counter() - start


def run_autospec(model, args, num_draws: int, **kwargs):
    start = time.perf_counter()
    fit = AutoSpec(model, num_samples=num_draws, seed=0, disable_progbar=True, **kwargs)
    fit.run(*args)
    return time.perf_counter() - start, fit


@contextmanager
def timed_parts(parts: dict):
    """Accumulate seconds of AutoSpec's stages into ``parts`` by wrapping their functions."""
    import pyro_autospec.infer.autospec as auto_mod

    wrapped = [(auto_mod, "discover_sites", "discover sites")]
    import pyro_autospec.engine as engine_mod

    wrapped.append((engine_mod, "sample_any_order", "sampler"))
    # Where each stage's function is looked up, in this checkout or an older one (the script
    # also profiles older commits): the draws' evaluation moved from discrete_run.py to
    # draws.py, the self-check from common.py to self_check.py, the engine call to run_base.py.
    homes = {}
    for short in ("draws", "self_check", "common", "run_base"):
        try:
            homes[short] = importlib.import_module(f"pyro_autospec.infer.{short}")
        except ImportError:
            continue
    checker = homes.get("self_check", homes.get("common"))
    evaluator = homes.get("draws", run_mod)
    # (the FFBS stages, where this checkout has them: the script also profiles older commits)
    for owner, name, label in (
        (run_mod, "build_oracle", "build oracle"),
        (evaluator, "evaluate", "evaluate"),
        # the name the run kinds call the engine by (run_base.py's engine_run, or older
        # discrete_run.py's own import)
        (homes.get("run_base"), "sample_any_order", "sampler"),
        (run_mod, "sample_any_order", "sampler"),
        (checker, "check_exact_draws", "self-check"),
        (run_mod, "sample_exact", "sampler"),
        (run_mod, "plan_ffbs", "forward pass"),
        (run_mod.DiscreteRun, "_ffbs_oracle", "build oracle"),
    ):
        if hasattr(owner, name):
            wrapped.append((owner, name, label))
    saved = []
    for module, name, label in wrapped:
        fn = getattr(module, name)
        saved.append((module, name, fn))

        def timer(*a, _fn=fn, _label=label, **k):
            start = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                parts[_label] = parts.get(_label, 0.0) + time.perf_counter() - start

        setattr(module, name, timer)
    try:
        yield parts
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def profile(cases: dict, draws: int, repeats: int) -> None:
    print(
        "| model | n | sampler | total s | discover sites | build oracle | forward pass | "
        "sampler | evaluate | self-check | rest | of the sampler: oracle | rounds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    warm_model, warm_args, _ = tiny_case()
    run_autospec(warm_model, warm_args, 2)  # imports and first calls, outside the timings
    # the signature, not the code object: the front end's __init__ is wrapped (for the
    # deprecated spelling of schedule knobs), and inspect follows the wrapper to it
    has_sampler = "sampler" in inspect.signature(AutoSpec).parameters
    variants = [{}, {"sampler": "engine"}] if has_sampler else [{}]
    for kwargs in variants:
        run_autospec(warm_model, warm_args, 2, **kwargs)
    for name, (make, size, _) in cases.items():
        model, args, n = make(size)
        for kwargs in variants:
            runs = []
            for _ in range(repeats):
                parts: dict = {}
                with timed_parts(parts):
                    wall, fit = run_autospec(model, args, draws, **kwargs)
                runs.append((wall, parts, fit))
            wall, parts, fit = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            method = fit.results[0].method
            rest = wall - sum(parts.values())
            oracle = sum(r.timing.get("oracle", 0.0) for r in fit.results)
            rounds = sum(r.rounds for r in fit.results)
            cells = [
                parts.get(k, 0.0)
                for k in (
                    "discover sites",
                    "build oracle",
                    "forward pass",
                    "sampler",
                    "evaluate",
                    "self-check",
                )
            ]
            print(
                f"| {name} | {n} | {method} | {wall:.3f} | "
                + " | ".join(f"{c:.3f}" for c in cells)
                + f" | {rest:.3f} | {oracle:.3f} | {rounds} |"
            )


def table(cases: dict, draws: int, repeats: int) -> None:
    print(
        f"| model | discrete sites | AutoSpec s ({draws} draws) | AutoSpec fixed s | sampler | "
        f"infer_discrete s ({draws} draws) | infer_discrete fixed s | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    warm_model, warm_args, _ = tiny_case()
    run_autospec(warm_model, warm_args, 2)  # imports and first calls, outside the timings
    run_infer_discrete(warm_model, warm_args, 2)
    for name, (make, size, _) in cases.items():
        model, args, n = make(size)
        # interleaved, so that a load on a shared machine hits both alike
        times: dict = {"auto": [], "auto1": [], "ref": [], "ref1": []}
        for _ in range(repeats):
            seconds, fit = run_autospec(model, args, draws)
            times["auto"].append(seconds)
            times["ref"].append(run_infer_discrete(model, args, draws))
            times["auto1"].append(run_autospec(model, args, 1)[0])
            times["ref1"].append(run_infer_discrete(model, args, 1))
        wall, fixed, ref, ref_fixed = (
            statistics.median(times[k]) for k in ("auto", "auto1", "ref", "ref1")
        )
        print(
            f"| {name} | {n} | {wall:.3f} | {fixed:.3f} | {fit.results[0].method} | "
            f"{ref:.3f} | {ref_fixed:.3f} | {wall / ref:.2f}x |"
        )


def suite(draws: int, repeats: int, only: list | None, smoke: bool) -> None:
    """AutoSpec against ``infer_discrete`` on the Pyro test-suite catalogue's models."""
    from tests.infer._pyro_suite_models import CASES as SUITE

    cases = [c for c in SUITE if not (c.refusal or c.model_error)]
    if only:
        cases = [c for c in cases if c.name in only]
    if smoke:
        cases = cases[:: max(1, len(cases) // 4)][:4]
    loop_calls = min(20, draws)
    print(
        f"| model | sampler | AutoSpec s ({draws} draws) | infer_discrete s, vectorised | "
        f"ratio | infer_discrete s, one call per draw ({loop_calls} calls or 1 s, scaled) | "
        f"ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios, loop_ratios, failed = [], [], []
    for case in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            method, wall, vec, loop = _time_suite_case(case, draws, repeats, loop_calls)
        cells = []
        variants = (("vectorised", vec, ratios, 4, 2), ("one per draw", loop, loop_ratios, 3, 3))
        for kind, seconds, kept, digits, ratio_digits in variants:
            if isinstance(seconds, str):
                failed.append(f"{case.name} ({kind}: {seconds})")
                cells.append("fails | -")
            else:
                kept.append(wall / seconds)
                cells.append(f"{seconds:.{digits}f} | {wall / seconds:.{ratio_digits}f}x")
        print(f"| {case.name} | {method} | {wall:.4f} | {' | '.join(cells)} |")
    if ratios:
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"\nAutoSpec / vectorised infer_discrete over {len(ratios)} models: median "
            f"{statistics.median(ratios):.2f}x (quartiles {quartiles[0]:.2f}x, "
            f"{quartiles[2]:.2f}x; from {min(ratios):.2f}x to {max(ratios):.2f}x); AutoSpec "
            f"faster on {sum(r < 1 for r in ratios)}."
        )
    if loop_ratios:
        print(
            f"AutoSpec / infer_discrete one call per draw over {len(loop_ratios)} models: "
            f"median {statistics.median(loop_ratios):.3f}x (from {min(loop_ratios):.3f}x to "
            f"{max(loop_ratios):.3f}x)."
        )
    if failed:
        print(f"infer_discrete failed ({len(failed)}): {', '.join(failed)}.")


def _time_suite_case(case, draws: int, repeats: int, loop_calls: int):
    """``(sampler, AutoSpec s, vectorised infer_discrete s or its error, one call per draw
    s)`` of one catalogue case, medians of ``repeats`` interleaved runs after an untimed one."""
    from tests.infer._pyro_suite_models import _copy_args, _plate_nesting, prepare, set_params

    model, args, kwargs, _ = prepare(case)
    depth = case.max_plate_nesting
    if depth is None:
        depth = _plate_nesting(model, args, kwargs)

    def autospec(num):
        set_params(case)
        start = time.perf_counter()
        fit = AutoSpec(model, num_samples=num, seed=0, disable_progbar=True)
        fit.run(*_copy_args(args), **kwargs)
        return time.perf_counter() - start, fit.results[0].method

    def vectorised(num):
        set_params(case)
        return run_infer_discrete(model, _copy_args(args), num, depth=depth, kwargs=kwargs)

    def one_per_draw(num):
        """Seconds per call of ``num`` calls, or of those made in the first second."""
        set_params(case)
        sampler = infer_discrete(config_enumerate(model), first_available_dim=-(depth + 1))
        start, calls = time.perf_counter(), 0
        with poutine.block():
            while calls < num and (calls == 0 or time.perf_counter() - start < 1.0):
                poutine.trace(sampler).get_trace(*_copy_args(args), **kwargs)
                calls += 1
        return (time.perf_counter() - start) / calls

    autospec(min(draws, 10))  # first calls and caches, outside the timings
    errors = {}
    for name, first in (
        ("vec", lambda: vectorised(min(draws, 10))),
        ("loop", lambda: one_per_draw(1)),
    ):
        try:
            first()
        except Exception as e:  # noqa: BLE001 - reported, left out of the median
            errors[name] = type(e).__name__
    times: dict = {"auto": [], "vec": [], "loop": []}
    for _ in range(repeats):  # interleaved, so that a load hits all three alike
        seconds, method = autospec(draws)
        times["auto"].append(seconds)
        if "vec" not in errors:
            times["vec"].append(vectorised(draws))
        if "loop" not in errors:
            times["loop"].append(one_per_draw(loop_calls) * draws)
    vec, loop = (errors.get(k) or statistics.median(times[k]) for k in ("vec", "loop"))
    return method, statistics.median(times["auto"]), vec, loop


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--profile", action="store_true", help="where AutoSpec's time goes")
    parser.add_argument("--suite", action="store_true", help="Pyro's test-suite models")
    parser.add_argument("--draws", type=int, default=None, help="200; 1000 with --suite")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="model names")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    if args.draws is None:
        args.draws = 1000 if args.suite else 200
    if args.suite:
        if args.smoke:
            args.draws, args.repeats = min(args.draws, 50), 1
        print(
            f"torch {torch.__version__}, pyro {pyro.__version__}, threads "
            f"{torch.get_num_threads()}, draws {args.draws}, median of {args.repeats}"
        )
        suite(args.draws, args.repeats, args.only, args.smoke)
        return
    cases = {k: v for k, v in CASES.items() if args.only is None or k in args.only}
    if args.smoke:
        cases = {k: (make, smoke, smoke) for k, (make, _, smoke) in cases.items()}
        args.draws, args.repeats = min(args.draws, 20), 1
    print(
        f"torch {torch.__version__}, pyro {pyro.__version__}, threads "
        f"{torch.get_num_threads()}, draws {args.draws}, median of {args.repeats}"
    )
    if args.profile:
        profile(cases, args.draws, args.repeats)
    else:
        table(cases, args.draws, args.repeats)


if __name__ == "__main__":
    main()
