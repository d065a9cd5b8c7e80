"""Pyro models with discrete latent sites: the compiled enumeration oracle and AutoSpec's draws
against vectorised ``infer_discrete``, in one run.

Three tables:

1. **Per-round cost of the oracle** on the HMM of Pyro's ``examples/hmm.py`` (``model_1``,
   10 hidden states, 88 tones, one sequence of T steps, its continuous sites fixed): one
   oracle call on 1024 query rows (half the coordinates pinned at random) for T = 25..200,
   with ``log_marginals`` (all coordinates), ``log_marginals_at`` (16 targets, and 1 target
   per row, also by contraction with ``lower_chains=False``) and ``log_marginals_chain``
   (chains of 16 coordinates, what the engine asks), the median of 5 calls after one warm-up;
   and the fitted growth exponent of the cost in T (1 = linear).
2. **200 draws of that HMM at T = 200**: AutoSpec (autospeculation, exact) against Pyro's
   vectorised ``infer_discrete`` (forward-filter backward-sample over a particle plate,
   exact): wall time, rounds, rows, and how AutoSpec's time splits between the oracle and the
   engine; AutoSpec twice, with the oracle lowered to a chain and by contraction (the same
   draws).
3. **Other models**: the noisy 4x5 Ising grid and the factorial HMM (``model_3``): AutoSpec
   draws/s against ``infer_discrete`` draws/s (both exact and independent: ESS = draws) and,
   for the Ising grid, NumPyro's ``DiscreteGibbs`` ESS/s (skipped without NumPyro).

Speed is CPU wall-clock on the machine that runs it; print ``uptime`` beside it on a shared
machine. Rounds are the hardware-independent measure of latency.

Usage::

    python benchmarks/pyro_models.py            # full run (a few minutes)
    python benchmarks/pyro_models.py --smoke    # seconds, for CI
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import config_enumerate, infer_discrete

from pyro_autospec.infer import AutoSpec
from pyro_autospec.model import discover_sites
from pyro_autospec.model.enum import EnumOracle

# Pyro's examples/hmm.py models, verbatim: the same code the handler tests check.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.infer._pyro_hmm_examples import model_1 as hmm_model_1  # noqa: E402
from tests.infer._pyro_hmm_examples import model_3 as hmm_model_3  # noqa: E402

HIDDEN, TONES = 10, 88


# ------------------------------------------------------------------ models (Pyro's own code)
def hmm_data(T: int, hidden: int = HIDDEN, tones: int = TONES, seed: int = 0):
    """A sequence simulated from fixed 'sticky' transitions and sparse tone probabilities."""
    g = torch.Generator().manual_seed(seed)
    probs_x = 0.85 * torch.eye(hidden) + 0.15 / hidden
    probs_y = torch.rand(hidden, tones, generator=g) ** 3 * 0.5
    states = [0]
    for _ in range(T - 1):
        states.append(int(torch.multinomial(probs_x[states[-1]], 1, generator=g)))
    y = torch.bernoulli(probs_y[torch.tensor(states)], generator=g)
    return y[None], torch.tensor([T]), probs_x, probs_y


def conditioned_hmm(T: int, hidden: int = HIDDEN, tones: int = TONES):
    sequences, lengths, probs_x, probs_y = hmm_data(T, hidden, tones)
    model = poutine.condition(hmm_model_1, data={"probs_x": probs_x, "probs_y": probs_y})
    return model, (sequences, lengths, SimpleNamespace(hidden_dim=hidden, jit=False))


COUPLING, SIGMA = 0.5, 0.9


def ising(y):
    """Noisy Ising image: one Bernoulli site per pixel, pairwise couplings, Gaussian pixels."""
    rows, cols = y.shape
    spins = {}
    for i in range(rows):
        for j in range(cols):
            z = pyro.sample(f"z_{i}_{j}", dist.Bernoulli(0.5))
            spins[i, j] = 2.0 * z - 1.0
            pyro.sample(f"y_{i}_{j}", dist.Normal(spins[i, j], SIGMA), obs=y[i, j])
            if i > 0:
                pyro.factor(f"v_{i}_{j}", COUPLING * spins[i, j] * spins[i - 1, j])
            if j > 0:
                pyro.factor(f"h_{i}_{j}", COUPLING * spins[i, j] * spins[i, j - 1])


def ising_data(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    truth = torch.where(torch.arange(cols) < cols // 2, -1.0, 1.0).expand(rows, cols)
    return truth + SIGMA * torch.randn(rows, cols, generator=generator)


# ------------------------------------------------------------------------------ measuring
class TimedOracle:
    """Delegates to an oracle and adds up the seconds spent in it."""

    def __init__(self, inner):
        self.inner = inner
        self.num_coords, self.num_values = inner.num_coords, inner.num_values
        self.seconds = 0.0

    def _timed(self, method, *args, **kwargs):
        start = time.perf_counter()
        out = getattr(self.inner, method)(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return out

    def log_marginals(self, values, mask):
        return self._timed("log_marginals", values, mask)

    def log_marginals_at(self, values, mask, targets):
        return self._timed("log_marginals_at", values, mask, targets)

    def log_marginals_chain(self, values, mask, chain):
        return self._timed("log_marginals_chain", values, mask, chain)

    def log_normalizer(self):
        return self.inner.log_normalizer()


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: plans and caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def oracle_cost(T: int, rows: int, repeats: int) -> dict:
    model, args = conditioned_hmm(T)
    start = time.perf_counter()
    oracle = EnumOracle(model, args)
    compile_seconds = time.perf_counter() - start
    general = EnumOracle(model, args, lower_chains=False)
    g = torch.Generator().manual_seed(1)
    values = torch.randint(HIDDEN, (rows, T), generator=g)
    mask = torch.rand(rows, T, generator=g) < 0.5
    targets = torch.randint(T, (rows, 16), generator=g)
    # chains as the engine asks them: 16 distinct unpinned coordinates after each prefix
    keys = torch.rand(rows, T, generator=g) + mask.double()
    chain = keys.argsort(dim=1)[:, :16]
    one = targets[:, :1]
    return {
        "T": T,
        "compile": compile_seconds,
        "lowered": oracle._chain is not None,
        "full": median_seconds(lambda: oracle.log_marginals(values, mask), repeats),
        "at": median_seconds(lambda: oracle.log_marginals_at(values, mask, targets), repeats),
        "at1": median_seconds(lambda: oracle.log_marginals_at(values, mask, one), repeats),
        "chain": median_seconds(lambda: oracle.log_marginals_chain(values, mask, chain), repeats),
        "general_at1": median_seconds(lambda: general.log_marginals_at(values, mask, one), repeats),
    }


def growth_exponent(sizes, seconds) -> float:
    slope, _ = np.polyfit(np.log(sizes), np.log(seconds), 1)
    return float(slope)


def run_infer_discrete(model, args, num_draws: int, first_available_dim: int):
    """Vectorised infer_discrete: ``num_draws`` exact draws over a particle plate."""

    def particles(*a):
        with pyro.plate("particles", num_draws, dim=first_available_dim + 1):
            return model(*a)

    sampler = infer_discrete(config_enumerate(particles), first_available_dim=first_available_dim)
    start = time.perf_counter()
    trace = poutine.trace(sampler).get_trace(*args)
    return time.perf_counter() - start, trace


def run_autospec(
    model, args, num_draws: int, method: str = "autospec", seed: int = 0, lower_chains=True
) -> dict:
    start = time.perf_counter()
    layout = discover_sites(model, args)
    oracle = TimedOracle(EnumOracle(model, args, layout=layout, lower_chains=lower_chains))
    compile_seconds = time.perf_counter() - start
    fit = AutoSpec(
        model, num_samples=num_draws, oracle=oracle, method=method, seed=seed, disable_progbar=True
    )
    start = time.perf_counter()
    fit.run(*args)
    wall = time.perf_counter() - start
    result = fit.results[0]
    return {
        "wall": wall + compile_seconds,
        "compile": compile_seconds,
        "oracle": oracle.seconds,
        "rounds_per_draw": float(result.sample_rounds.double().mean()),
        "run_rounds": result.rounds,
        "rows_per_draw": result.oracle_rows / num_draws,
        "fit": fit,
    }


def draws_of(run: dict) -> torch.Tensor:
    """The discrete draws [draws, n] of a :func:`run_autospec` result."""
    return run["fit"].results[0].samples


def discrete_gibbs_ess_per_second(y: torch.Tensor, num_samples: int) -> dict:
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as ndist
        from numpyro.diagnostics import effective_sample_size
        from numpyro.infer import MCMC, DiscreteGibbs
    except ImportError as e:
        return {"skipped": f"NumPyro/JAX not importable ({e}); pip install numpyro jax"}
    y_np = jnp.asarray(y.numpy())
    rows, cols = y.shape

    def model():
        spins = {}
        for i in range(rows):
            for j in range(cols):
                z = numpyro.sample(f"z_{i}_{j}", ndist.Bernoulli(0.5))
                spins[i, j] = 2.0 * z - 1.0
                numpyro.sample(f"y_{i}_{j}", ndist.Normal(spins[i, j], SIGMA), obs=y_np[i, j])
                if i > 0:
                    numpyro.factor(f"v_{i}_{j}", COUPLING * spins[i, j] * spins[i - 1, j])
                if j > 0:
                    numpyro.factor(f"h_{i}_{j}", COUPLING * spins[i, j] * spins[i, j - 1])

    mcmc = MCMC(
        DiscreteGibbs(model, modified=True),
        num_warmup=num_samples // 2,
        num_samples=num_samples,
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(0))
    samples = mcmc.get_samples()
    jax.block_until_ready(samples)
    wall = time.perf_counter() - start
    chain = np.stack([np.asarray(v, dtype=np.float64) for v in samples.values()], -1)
    ess = effective_sample_size(chain[None])
    ess = float(np.nanmin(np.where(np.isfinite(ess), ess, num_samples)))
    return {"wall": wall, "ess": ess}


def fmt(x, digits=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    parser.add_argument("--rows", type=int, default=1024, help="query rows per oracle call")
    parser.add_argument("--num-draws", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    lengths = [25, 50, 100, 200]
    grid = (4, 5)
    if args.smoke:
        lengths, args.rows, args.num_draws, args.repeats, grid = [5, 10], 16, 8, 1, (2, 3)
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    # warm-up: first calls pay one-time imports and initialisations (seconds), not measured
    warm_model, warm_args = conditioned_hmm(3, hidden=2, tones=2)
    run_autospec(warm_model, warm_args, 4)
    run_infer_discrete(warm_model, warm_args, 4, first_available_dim=-4)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# torch threads = 1; load average (1 min) at start: {load:.2f}\n")

    # 1. per-round cost
    costs = [oracle_cost(T, args.rows, args.repeats) for T in lengths]
    print(
        f"## Oracle cost per round: examples/hmm.py model_1, {HIDDEN} states, {TONES} tones, "
        f"{args.rows} rows\n"
    )
    print(
        "| T | compile s | lowered to a chain | log_marginals ms (all n, contraction) "
        "| ms per step | log_marginals_at ms, 16 targets | log_marginals_at ms, 1 target "
        "| the same by contraction (lower_chains=False) | log_marginals_chain ms, chains of 16 |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for c in costs:
        print(
            f"| {c['T']} | {fmt(c['compile'], 2)} | {'yes' if c['lowered'] else 'no'} "
            f"| {fmt(1000 * c['full'])} | {fmt(1000 * c['full'] / c['T'], 2)} "
            f"| {fmt(1000 * c['at'])} | {fmt(1000 * c['at1'])} | {fmt(1000 * c['general_at1'])} "
            f"| {fmt(1000 * c['chain'])} |"
        )
    slopes = {
        key: growth_exponent(lengths, [c[key] for c in costs])
        for key in ("full", "at", "at1", "general_at1", "chain")
    }
    print(
        f"\nGrowth in T (log-log slope over T = {lengths[0]}..{lengths[-1]}; 1 = linear): "
        f"log_marginals {slopes['full']:.2f}, log_marginals_at (16 targets) {slopes['at']:.2f}, "
        f"(1 target) {slopes['at1']:.2f}, by contraction {slopes['general_at1']:.2f}, "
        f"log_marginals_chain {slopes['chain']:.2f}.\n"
    )

    # 2. 200 draws at the largest T
    T = lengths[-1]
    model, model_args = conditioned_hmm(T)
    auto = run_autospec(model, model_args, args.num_draws)
    general = run_autospec(model, model_args, args.num_draws, lower_chains=False)
    ffbs_wall, _ = run_infer_discrete(model, model_args, args.num_draws, first_available_dim=-4)
    print(f"## {args.num_draws} draws of model_1 at T = {T}\n")
    print(
        "| method | wall s | rounds per draw | whole-run rounds | oracle rows per draw "
        "| oracle s | engine and log joint s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, a in (
        ("AutoSpec (autospec, EnumOracle lowered to a chain)", auto),
        ("AutoSpec (autospec, EnumOracle by contraction: lower_chains=False)", general),
    ):
        print(
            f"| {label} | {fmt(a['wall'], 2)} "
            f"| {fmt(a['rounds_per_draw'], 1)} | {a['run_rounds']} "
            f"| {fmt(a['rows_per_draw'])} | {fmt(a['oracle'], 2)} "
            f"| {fmt(a['wall'] - a['oracle'] - a['compile'], 2)} |"
        )
    print(
        f"| Pyro infer_discrete, vectorised over {args.num_draws} particles | "
        f"{fmt(ffbs_wall, 2)} | - | 1 pass | - | - | - |"
    )
    print(
        f"\nAutoSpec / infer_discrete wall time: {auto['wall'] / ffbs_wall:.2f}x "
        f"(compile {auto['compile']:.2f} s included); by contraction "
        f"{general['wall'] / ffbs_wall:.2f}x. Same draws: "
        f"{bool(torch.equal(draws_of(auto), draws_of(general)))}.\n"
    )

    # 3. other models
    rows = []
    y = ising_data(*grid)
    ising_auto = run_autospec(ising, (y,), args.num_draws)
    ising_ffbs, _ = run_infer_discrete(ising, (y,), args.num_draws, first_available_dim=-2)
    gibbs = discrete_gibbs_ess_per_second(y, args.num_draws * (1 if args.smoke else 5))
    rows.append((f"Ising {grid[0]}x{grid[1]}", grid[0] * grid[1], ising_auto, ising_ffbs, gibbs))
    sequences, lengths3, probs_x, probs_y = hmm_data(50 if not args.smoke else 5, 4, 16)
    fhmm = poutine.condition(
        hmm_model_3,
        data={
            "probs_w": probs_x[:2, :2] / probs_x[:2, :2].sum(-1, keepdim=True),
            "probs_x": probs_x[:2, :2] / probs_x[:2, :2].sum(-1, keepdim=True),
            "probs_y": probs_y[:4].reshape(2, 2, 16),
        },
    )
    fhmm_args = (sequences, lengths3, SimpleNamespace(hidden_dim=4, jit=False))
    fhmm_auto = run_autospec(fhmm, fhmm_args, args.num_draws)
    fhmm_ffbs, _ = run_infer_discrete(fhmm, fhmm_args, args.num_draws, first_available_dim=-4)
    rows.append(
        (
            f"factorial HMM (model_3), T = {int(lengths3[0])}",
            fhmm_auto["fit"].layout.num_coords,
            fhmm_auto,
            fhmm_ffbs,
            None,
        )
    )
    print(f"## Other models, {args.num_draws} draws each\n")
    print(
        "| model | n | AutoSpec draws/s | rounds per draw | infer_discrete draws/s "
        "| NumPyro DiscreteGibbs ESS/s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, a, ffbs, g in rows:
        gibbs_text = (
            "-" if g is None else ("skipped" if "skipped" in g else fmt(g["ess"] / g["wall"]))
        )
        print(
            f"| {name} | {n} | {fmt(args.num_draws / a['wall'])} "
            f"| {fmt(a['rounds_per_draw'], 1)} | {fmt(args.num_draws / ffbs)} | {gibbs_text} |"
        )
    if gibbs is not None and "skipped" in gibbs:
        print(f"\n{gibbs['skipped']}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n# load average (1 min) at the end: {load:.2f}")


if __name__ == "__main__":
    main()
