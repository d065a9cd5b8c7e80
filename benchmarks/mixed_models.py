"""Models with continuous AND discrete latent sites: ESS per second of every method, one run.

Three small models (a Gaussian mixture, an HMM with an unknown transition probability, a
change-point model), each sampled by

* **AutoSpec**: Pyro's NUTS on the continuous sites with the discrete sites enumerated out,
  then one exact draw of the discrete sites given each continuous draw (on a CPU one
  elimination pass, forward filtering, backward sampling, for every draw at once);
* **Pyro NUTS + infer_discrete**: the same NUTS chain, then ``infer_discrete`` once per draw
  (what Pyro's tutorials do);
* **NumPyro DiscreteHMCGibbs** (NUTS on the continuous sites, Gibbs updates of the discrete
  ones) and **NumPyro MixedHMC** (HMC with discrete updates), when NumPyro is installed.

For each: total wall time, the smallest bulk ESS over the continuous coordinates and over the
discrete coordinates (from one chain), ESS per second, and the largest error of a posterior
mean against the exact posterior (computed on a grid), in standard errors. Every method gets
the same number of warm-up and kept draws. CPU wall-clock on the machine that runs it.

Usage::

    python benchmarks/mixed_models.py            # 1000 draws after 500 warm-up (minutes)
    python benchmarks/mixed_models.py --smoke    # seconds, for CI
    python benchmarks/mixed_models.py --scaling  # the discrete step against the data size

``--scaling`` times the discrete step alone (20 draws after 10 warm-up steps of a short NUTS
tree) of a mixture whose assignments live in the data plate, as the data grow, drawn by the
elimination (``sampler="auto"``) and by the any-order engine (``sampler="engine"``), whose
every oracle row contracts the whole model (up to n = 1000: it grows as n^2); then 2000
draws at n = 1000, whose tables the elimination takes in chunks of draws.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import MCMC, NUTS, config_enumerate, infer_discrete
from pyro.ops.indexing import Vindex
from pyro.ops.stats import effective_sample_size

from pyro_autospec.infer import AutoSpec

# ---------------------------------------------------------------------- the three models
# The models, their data and their exact posteriors are the ones the front end's tests check
# against (tests/infer/_mixed_models.py): one copy for both.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.infer._mixed_models import (  # noqa: E402
    CHANGE_DATA,
    HMM_DATA,
    HMM_LOCS,
    MIXTURE_DATA,
    change_point,
    change_point_exact,
    mixture,
    mixture_exact,
)
from tests.infer._mixed_models import hmm_exact as _hmm_exact  # noqa: E402
from tests.infer._mixed_models import hmm_unknown_transition as hmm  # noqa: E402


def hmm_exact() -> dict:
    """Posterior means of ``stay`` and of each ``x_t``, keyed by site name."""
    exact = _hmm_exact()
    return {"stay": exact["stay"], **{f"x_{t}": m for t, m in enumerate(exact["x"])}}


def numpyro_models():
    """The same three models in NumPyro (None if NumPyro is not installed)."""
    try:
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as nd
    except ImportError:
        return None

    def n_mixture(data):
        with numpyro.plate("components", 2):
            locs = numpyro.sample("locs", nd.Normal(jnp.array([-2.0, 2.0]), 1.0))
        with numpyro.plate("data", len(data)):
            assignment = numpyro.sample("assignment", nd.Categorical(jnp.array([0.5, 0.5])))
            numpyro.sample("obs", nd.Normal(locs[assignment], 1.0), obs=data)

    def n_hmm(data):
        stay = numpyro.sample("stay", nd.Beta(2.0, 2.0))
        trans = jnp.array([[stay, 1 - stay], [1 - stay, stay]])
        locs = jnp.asarray(HMM_LOCS.numpy())
        x = 0
        for t in range(len(data)):
            x = numpyro.sample(f"x_{t}", nd.Categorical(trans[x]))
            numpyro.sample(f"y_{t}", nd.Normal(locs[x], 0.8), obs=data[t])

    def n_change_point(counts):
        T = len(counts)
        early = numpyro.sample("early", nd.Gamma(2.0, 0.5))
        late = numpyro.sample("late", nd.Gamma(2.0, 0.5))
        tau = numpyro.sample("tau", nd.Categorical(jnp.ones(T) / T))
        rate = jnp.where(jnp.arange(T) < tau, early, late)
        with numpyro.plate("time", T):
            numpyro.sample("counts", nd.Poisson(rate), obs=counts)

    return {"mixture": n_mixture, "hmm": n_hmm, "change_point": n_change_point}


MODELS = {
    "mixture": (
        "Gaussian mixture (2 locs, 6 points)",
        mixture,
        MIXTURE_DATA,
        mixture_exact,
        ["locs"],
        ["assignment"],
        1,
    ),
    "hmm": (
        "HMM, unknown transition (T = 8)",
        hmm,
        HMM_DATA,
        hmm_exact,
        ["stay"],
        [f"x_{t}" for t in range(len(HMM_DATA))],
        0,
    ),
    "change_point": (
        "change point (T = 10)",
        change_point,
        CHANGE_DATA,
        change_point_exact,
        ["early", "late"],
        ["tau"],
        1,
    ),
}


# ----------------------------------------------------------------------------- methods
def run_autospec(model, data, num_samples, warmup, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fit = AutoSpec(
            model, num_samples=num_samples, warmup_steps=warmup, seed=seed, disable_progbar=True
        )
        start = time.perf_counter()
        fit.run(data)
        wall = time.perf_counter() - start
    samples = {k: v.double() for k, v in fit.get_samples().items()}
    return wall, samples


def run_pyro_infer_discrete(model, data, num_samples, warmup, seed, max_plate_nesting):
    pyro.set_rng_seed(seed)
    start = time.perf_counter()
    mcmc = MCMC(
        NUTS(config_enumerate(model), max_plate_nesting=max_plate_nesting),
        num_samples=num_samples,
        warmup_steps=warmup,
        disable_progbar=True,
    )
    mcmc.run(data)
    draws = mcmc.get_samples()
    discrete = {}
    for i in range(num_samples):
        conditioned = pyro.poutine.condition(model, data={k: v[i] for k, v in draws.items()})
        sampler = infer_discrete(
            config_enumerate(conditioned), first_available_dim=-1 - max_plate_nesting
        )
        trace = pyro.poutine.trace(sampler).get_trace(data)
        for name, site in trace.nodes.items():
            if site["type"] == "sample" and not site["is_observed"] and name not in draws:
                discrete.setdefault(name, []).append(site["value"])
    wall = time.perf_counter() - start
    samples = {k: v.double() for k, v in draws.items()}
    samples.update({k: torch.stack(v).double() for k, v in discrete.items()})
    return wall, samples


def run_numpyro(kind, model, data, num_samples, warmup, seed):
    import jax
    from numpyro.infer import HMC, DiscreteHMCGibbs, MixedHMC
    from numpyro.infer import MCMC as NMCMC
    from numpyro.infer import NUTS as NNUTS

    if kind == "DiscreteHMCGibbs":
        kernel = DiscreteHMCGibbs(NNUTS(model))
    else:
        kernel = MixedHMC(HMC(model, trajectory_length=1.2), num_discrete_updates=20)
    mcmc = NMCMC(kernel, num_warmup=warmup, num_samples=num_samples, progress_bar=False)
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), jax.numpy.asarray(data.numpy()))
    samples = mcmc.get_samples()
    jax.block_until_ready(samples)
    wall = time.perf_counter() - start
    return wall, {k: torch.tensor(np.array(v), dtype=torch.float64) for k, v in samples.items()}


def min_ess(samples: dict, names: list) -> float:
    values = []
    for name in names:
        chain = samples[name].reshape(1, samples[name].shape[0], -1)
        ess = effective_sample_size(chain)
        ess = torch.where(torch.isnan(ess), float(chain.shape[1]), ess)
        values.append(float(ess.min()))
    return min(values)


def worst_error(samples: dict, exact: dict, binary: set) -> float:
    """Largest |mean - exact| in standard errors (sd / sqrt(ESS)) over every coordinate."""
    worst = 0.0
    for name, truth in exact.items():
        draws = samples[name].reshape(samples[name].shape[0], -1)
        truth = truth.reshape(-1).double()
        if name in binary:
            sd = (truth * (1 - truth)).sqrt()
        else:
            sd = draws.std(0)
        ess = effective_sample_size(draws[None])
        ess = torch.where(torch.isnan(ess), float(draws.shape[0]), ess).clamp(min=2.0)
        z = (draws.mean(0) - truth).abs() / (sd / ess.sqrt()).clamp(min=1e-12)
        worst = max(worst, float(z.max()))
    return worst


def fmt(x, digits=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def plated_mixture(data):
    """Three components with unknown means; the assignments live in the data plate."""
    locs = pyro.sample("locs", dist.Normal(torch.tensor([-2.0, 0.0, 2.0]), 1.0).to_event(1))
    with pyro.plate("data", len(data)):
        z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
        pyro.sample("obs", dist.Normal(Vindex(locs)[..., z], 1.0), obs=data)


def scaling(smoke: bool) -> None:
    """The discrete step of a mixed model against the data size, by sampler; the last row
    takes many draws, whose tables together exceed one elimination's limit (it goes chunk by
    chunk of draws)."""
    if smoke:
        cases, engine_up_to = [(60, 5), (120, 5)], 120
    else:
        cases, engine_up_to = [(250, 20), (500, 20), (1000, 20), (4000, 20), (1000, 2000)], 1000
    print(
        "# the discrete step of a mixture (assignments in the data plate), after 10 warm-up "
        "steps (max_tree_depth 3); torch threads = 1\n"
    )
    print(
        "| n | draws | sampler | drew with | elimination chunks | NUTS s | discrete step s "
        "| evaluation + self-check s |"
    )
    print("|---:|---:|---|---|---:|---:|---:|---:|")
    for n, draws in cases:
        gen = torch.Generator().manual_seed(0)
        data = torch.cat(
            [torch.randn(n // 3, generator=gen) - 2, torch.randn(n - n // 3, generator=gen) + 1]
        )
        for sampler in ("auto", "engine"):
            if sampler == "engine" and (n > engine_up_to or draws > 20):
                continue
            fit = AutoSpec(
                plated_mixture,
                draws,
                warmup_steps=10,
                seed=0,
                sampler=sampler,
                disable_progbar=True,
                nuts_kwargs={"max_tree_depth": 3},
            ).run(data)
            t = fit.timing
            step = sum(t.get(k, 0.0) for k in ("compiling", "oracle", "engine"))
            checks = t.get("evaluation", 0.0) + t.get("self-check", 0.0)
            result = fit.results[0]
            chunks = (
                result.rounds // int(result.sample_rounds[0]) if result.method == "ffbs" else "-"
            )
            print(
                f"| {n} | {draws} | {sampler} | {result.method} | {chunks} | {t['nuts']:.2f} "
                f"| {step:.2f} | {checks:.2f} |",
                flush=True,
            )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument(
        "--scaling", action="store_true", help="the discrete step against the data size"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.scaling:
        scaling(args.smoke)
        return
    if args.smoke:  # the mixture: the cheapest model, with binary and continuous sites
        args.num_samples, args.warmup, args.models = 20, 20, ["mixture"]
    numpyro_versions = numpyro_models()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# {args.num_samples} draws after {args.warmup} warm-up steps, one chain per method; "
        f"torch threads = 1; load average (1 min) at start: {load:.2f}\n"
    )
    print(
        "| model | method | wall s | min ESS continuous | ESS/s continuous "
        "| min ESS discrete | ESS/s discrete | worst mean error (SE) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for key in args.models:
        title, model, data, exact_fn, continuous, discrete, mpn = MODELS[key]
        exact = exact_fn()
        binary = set(discrete) if key != "change_point" else set()
        runs = [
            (
                "AutoSpec (Pyro NUTS + exact discrete draws)",
                partial(run_autospec, model, data, args.num_samples, args.warmup, 0),
            ),
            (
                "Pyro NUTS + infer_discrete per draw",
                partial(
                    run_pyro_infer_discrete, model, data, args.num_samples, args.warmup, 0, mpn
                ),
            ),
        ]
        if numpyro_versions is not None:
            for kind in ("DiscreteHMCGibbs", "MixedHMC"):
                runs.append(
                    (
                        f"NumPyro {kind}",
                        partial(
                            run_numpyro,
                            kind,
                            numpyro_versions[key],
                            data,
                            args.num_samples,
                            args.warmup,
                            0,
                        ),
                    )
                )
        for name, fn in runs:
            wall, samples = fn()
            if key == "hmm":
                samples["x"] = torch.stack([samples[f"x_{t}"] for t in range(len(HMM_DATA))], -1)
            ess_c, ess_d = min_ess(samples, continuous), min_ess(samples, discrete)
            error = worst_error(samples, exact, binary)
            print(
                f"| {title} | {name} | {fmt(wall, 1)} | {fmt(ess_c, 0)} | {fmt(ess_c / wall)} "
                f"| {fmt(ess_d, 0)} | {fmt(ess_d / wall)} | {fmt(error, 1)} |"
            )
    if numpyro_versions is None:
        print(
            "\nNumPyro/JAX not importable: the NumPyro rows are skipped (pip install numpyro jax)."
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n# load average (1 min) at the end: {load:.2f}")


if __name__ == "__main__":
    main()
