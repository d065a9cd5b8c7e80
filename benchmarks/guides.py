"""A learned guide + AutoSpec + correction against NumPyro DiscreteGibbs on a 2-D Ising posterior.

Target: the posterior of a ``side x side`` Ising model (spins ``s = 2z - 1``, coupling ``J``
between grid neighbours, uniform prior field) given a noisy binary image ``y = s_true + noise``
(Gaussian, ``sigma``). Statistics: magnetisation ``mean(s)`` and coupling energy
``-sum_<ij> s_i s_j``.

Measured, in one run:

1. NumPyro ``DiscreteGibbs(modified=True)``: ESS/s of both statistics (ArviZ ``ess``), and a
   long reference run (``--reference-factor`` times longer) for the estimates.
2. ``AnyOrderGuide`` trained by ``fit_posterior`` (training time reported separately), then
   ``AutoSpec(model, guide=guide, correction=...)``: ESS/s counting sampling time only, and
   with the training time amortised over 10,000 draws; Pareto k-hat and weights' ESS.
3. Rounds per draw of autospeculation against sequential sampling of the same guide (``n``),
   and wall time per draw: latency of a single draw and throughput of a batch.

The issue's done criteria are printed as PASS / MISS lines; misses are reported, not hidden.
``--smoke`` runs in well under a minute on 2 CPU cores (a 6x6 grid, a small guide, short
training, few draws): it checks that the script works; its numbers say nothing about a long run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


METHODS = ("autospec", "sequential")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="short training, few draws")
    parser.add_argument("--side", type=int, default=None, help="grid side (16; smoke: 6)")
    parser.add_argument("--coupling", type=float, default=0.4, help="J (critical ~0.44)")
    parser.add_argument("--noise", type=float, default=1.0, help="observation sigma")
    parser.add_argument("--correction", default="imh", choices=["imh", "importance"])
    parser.add_argument("--train-steps", type=int, default=None, help="600 (smoke: 10)")
    parser.add_argument("--num-particles", type=int, default=64)
    parser.add_argument(
        "--objective",
        default="both",
        choices=["both", "reverse", "forward"],
        help="fit_posterior's estimator (see --compare-objectives)",
    )
    parser.add_argument("--lr-decay", type=float, default=0.1, help="cosine decay of the rate")
    parser.add_argument(
        "--compare-objectives",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead of the benchmark: train one guide per objective for STEPS steps and "
        "report the negative ELBO, k-hat and weights' ESS of 512 draws of each",
    )
    parser.add_argument("--hidden-dim", type=int, default=None, help="256 (smoke: 32)")
    parser.add_argument("--num-samples", type=int, default=None, help="AutoSpec draws per chain")
    parser.add_argument("--gibbs-samples", type=int, default=None)
    parser.add_argument("--reference-factor", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save-guide", type=Path, help="save the trained guide's state_dict")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.side is None:
        args.side = 6 if args.smoke else 16
    if args.hidden_dim is None:
        args.hidden_dim = 32 if args.smoke else 256
    if args.train_steps is None:
        args.train_steps = 10 if args.smoke else 600
    if args.num_samples is None:
        args.num_samples = 60 if args.smoke else 1000
    if args.gibbs_samples is None:
        args.gibbs_samples = 300 if args.smoke else 20000
    return args


def make_data(side: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A binary image (a disc on a background) and its noisy observation: Tensor[side^2]."""
    gen = torch.Generator().manual_seed(seed)
    i, j = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    c = (side - 1) / 2
    truth = (((i - c) ** 2 + (j - c) ** 2) < (side / 3) ** 2).double() * 2 - 1
    y = truth + noise * torch.randn(side, side, generator=gen, dtype=torch.float64)
    return truth.reshape(-1), y.reshape(-1).float()


def neighbour_product(s, side: int):
    """sum over grid neighbours of s_i s_j, for s[..., side^2] (torch or jax arrays)."""
    grid = s.reshape(s.shape[:-1] + (side, side))
    return (grid[..., 1:, :] * grid[..., :-1, :]).sum((-1, -2)) + (
        grid[..., :, 1:] * grid[..., :, :-1]
    ).sum((-1, -2))


def pyro_model(y, side: int, coupling: float, noise: float):
    import pyro
    import pyro.distributions as dist

    with pyro.plate("pixels", side * side):
        z = pyro.sample("z", dist.Bernoulli(0.5))
    s = 2.0 * z - 1.0
    # keepdim: the factor keeps its batch dimension at the plate's position under outer plates.
    pyro.factor("coupling", coupling * neighbour_product(s, side).unsqueeze(-1))
    with pyro.plate("obs", side * side):
        pyro.sample("y", dist.Normal(s, noise), obs=y)


def numpyro_model(y, side: int, coupling: float, noise: float):
    import numpyro
    import numpyro.distributions as ndist

    with numpyro.plate("pixels", side * side):
        z = numpyro.sample("z", ndist.Bernoulli(0.5))
    s = 2.0 * z - 1.0
    numpyro.factor("coupling", coupling * neighbour_product(s, side))
    with numpyro.plate("obs", side * side):
        numpyro.sample("y", ndist.Normal(s, noise), obs=y)


def statistics(z: np.ndarray, side: int) -> dict[str, np.ndarray]:
    """Magnetisation and coupling energy of draws z[..., side^2] in {0, 1}."""
    s = 2.0 * np.asarray(z, dtype=np.float64) - 1.0
    return {"magnetisation": s.mean(-1), "energy": -neighbour_product(s, side)}


def ess(values: np.ndarray) -> float:
    """ArviZ bulk ESS of values[chain, draw]."""
    import arviz as az

    return float(az.ess(np.asarray(values, dtype=np.float64)))


def run_gibbs(y, args, num_samples: int, seed: int, timed: bool = True) -> tuple[dict, float]:
    import jax
    import jax.numpy as jnp
    from numpyro.infer import MCMC, DiscreteGibbs

    kernel = DiscreteGibbs(numpyro_model, modified=True)
    mcmc = MCMC(
        kernel,
        num_warmup=max(200, num_samples // 10),
        num_samples=num_samples,
        progress_bar=False,
    )
    key = jax.random.PRNGKey(seed)
    y_j = jnp.asarray(y.numpy())
    if timed:
        # Compile on a first run of the same MCMC object (it caches the compiled sampler), so
        # that the timed second run is sampling only.
        mcmc.run(jax.random.fold_in(key, 1), y_j, args.side, args.coupling, args.noise)
    start = time.perf_counter()
    mcmc.run(key, y_j, args.side, args.coupling, args.noise)
    z = np.asarray(mcmc.get_samples()["z"])
    seconds = time.perf_counter() - start
    return statistics(z[None], args.side), seconds


def train_guide(args, model_args, objective: str, num_steps: int):
    """A fresh guide trained by ``fit_posterior``; returns (guide, history, seconds)."""
    from pyro_autospec.guides import AnyOrderGuide

    torch.manual_seed(args.seed)
    guide = AnyOrderGuide(pyro_model, model_args, hidden_dim=args.hidden_dim, num_layers=2)
    start = time.perf_counter()
    history = guide.fit_posterior(
        *model_args,
        num_steps=num_steps,
        num_particles=args.num_particles,
        objective=objective,
        lr_decay=args.lr_decay,
        method="sequential",
        seed=args.seed,
        disable_progbar=True,
    )
    return guide, history, time.perf_counter() - start


def guide_weights(guide, model_args, num: int, seed: int) -> tuple[float, float, float]:
    """k-hat, weights' ESS and mean of log q - log p over ``num`` exact draws of the guide."""
    from pyro_autospec.diagnostics.weights import pareto_khat, weights_ess
    from pyro_autospec.engine import sample_any_order
    from pyro_autospec.infer.sites import log_joint

    draws = sample_any_order(guide, num, method="sequential", seed=seed)
    values = guide.layout.from_coords(draws.samples)
    lw = log_joint(guide.model, model_args, {}, guide.layout, values) - draws.log_prob.double()
    return pareto_khat(lw), weights_ess(lw), float(-lw.mean())


def compare_objectives(args, model_args) -> int:
    """Train one guide per objective with the same budget; print a table."""
    print(
        "\n| objective | steps | training (s) | -ELBO, last 10 steps | k-hat (512 draws) | "
        "weights' ESS / 512 |"
    )
    print("|---|---|---|---|---|---|")
    for objective in ("reverse", "both", "forward"):
        guide, history, seconds = train_guide(args, model_args, objective, args.compare_objectives)
        khat, w_ess, _ = guide_weights(guide, model_args, 512, args.seed + 1)
        print(
            f"| {objective} | {args.compare_objectives} | {seconds:.0f} | "
            f"{np.mean(history[-10:]):.1f} | {khat:.2f} | {w_ess:.1f} |",
            flush=True,
        )
    return 0


def run_autospec(model_args, guide, args, method: str) -> dict:
    """AutoSpec(model, guide=guide, correction=...) with the guide drawn by ``method``."""
    import warnings

    from pyro_autospec.infer import AutoSpec

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = AutoSpec(
            pyro_model,
            num_samples=args.num_samples,
            num_chains=2,
            method=method,
            guide=guide,
            correction=args.correction,
            seed=args.seed,
            disable_progbar=True,
        ).run(*model_args)
    seconds = time.perf_counter() - start
    z = run.get_samples(group_by_chain=True)["z"].numpy()
    stats = statistics(z, args.side)
    num_draws = sum(r.num_samples for r in run.results)  # guide draws, warm-up included
    out = {
        "seconds": seconds,
        "stats": stats,
        "ess": {k: ess(v) for k, v in stats.items()},
        "weights": run.weight_diagnostics(),
        "num_draws": num_draws,
        "rounds": float(torch.cat([r.sample_rounds for r in run.results]).double().mean()),
        "rows": sum(r.oracle_rows for r in run.results) / num_draws,
        "warnings": [str(w.message) for w in caught],
    }
    if args.correction == "imh":
        out["acceptance"] = float(run.get_extra_fields()["accepted"].double().mean())
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    import pyro

    from pyro_autospec.engine import sample_any_order

    pyro.set_rng_seed(args.seed)
    side, n = args.side, args.side**2
    _, y = make_data(side, args.noise, args.seed)
    model_args = (y, side, args.coupling, args.noise)
    print(
        f"# {side}x{side} Ising posterior (n = {n}), J = {args.coupling}, sigma = {args.noise}; "
        f"{'smoke' if args.smoke else 'full'} run, torch threads = {args.threads}"
    )
    if args.compare_objectives:
        return compare_objectives(args, model_args)

    # 1. Gibbs and the reference.
    gibbs, gibbs_seconds = run_gibbs(y, args, args.gibbs_samples, args.seed)
    ref_n = args.gibbs_samples * args.reference_factor
    reference, ref_seconds = run_gibbs(y, args, ref_n, args.seed + 1, timed=False)
    gibbs_ess = {k: ess(v) for k, v in gibbs.items()}
    ref_ess = {k: ess(v) for k, v in reference.items()}
    print(
        f"Gibbs: {args.gibbs_samples} steps (one sweep over all {n} spins each) in "
        f"{gibbs_seconds:.1f}s; "
        f"reference: {ref_n} steps in {ref_seconds:.1f}s (compilation included)",
        flush=True,
    )

    # 2. Train the guide.
    guide, history, train_seconds = train_guide(args, model_args, args.objective, args.train_steps)
    print(
        f"Training ({args.objective}, lr decay {args.lr_decay}): {args.train_steps} steps of "
        f"{args.num_particles} particles in {train_seconds:.1f}s; -ELBO "
        f"{np.mean(history[:5]):.1f} -> {np.mean(history[-10:]):.1f}",
        flush=True,
    )

    if args.save_guide is not None:
        torch.save(guide.state_dict(), args.save_guide)
        print(f"Saved the trained guide to {args.save_guide}")

    # 3. AutoSpec + correction, the guide drawn by autospeculation and (for comparison) by the
    #    sequential chain rule: the same law, different rounds and rows.
    runs = {method: run_autospec(model_args, guide, args, method) for method in METHODS}
    for method, r in runs.items():
        for w in r["warnings"]:
            print(f"  warning ({method}): {w}")
        accept = f", IMH acceptance {r['acceptance']:.2f}" if "acceptance" in r else ""
        print(
            f"AutoSpec, guide drawn by {method} ({args.correction}): {r['num_draws']} guide draws "
            f"in {r['seconds']:.1f}s; k-hat {r['weights']['khat']['all']:.2f}, weights' ESS "
            f"{r['weights']['weights_ess']['all']:.1f}{accept}; rounds per draw "
            f"{r['rounds']:.1f}, rows per draw {r['rows']:.0f} (n = {n})",
            flush=True,
        )

    # 4. Rounds and wall time per draw against sequential sampling of the same guide.
    timing = {}
    for method in METHODS:
        single = [sample_any_order(guide, 1, method=method, seed=s) for s in range(5)]
        batch = sample_any_order(guide, 64, method=method, seed=7)
        timing[method] = {
            "latency": float(np.median([r.wall_time for r in single])),
            "single_rounds": float(np.median([r.rounds for r in single])),
            "throughput": 64 / batch.wall_time,
            "rounds": float(batch.sample_rounds.double().mean()),
            "batch_rounds": batch.rounds,
            "rows": batch.oracle_rows / 64,
        }

    print(
        "\n| statistic | sampler | ESS | ESS/s (sampling) | ESS/s, training amortised over 10k "
        "draws | ratio to Gibbs (amortised) | mean +- MCSE | reference mean +- MCSE |"
    )
    print("|---|---|---|---|---|---|---|---|")
    passes = []
    for key in ("magnetisation", "energy"):
        g_rate = gibbs_ess[key] / gibbs_seconds
        r_mean, r_se = reference[key].mean(), reference[key].std() / math.sqrt(ref_ess[key])
        g_mean, g_se = gibbs[key].mean(), gibbs[key].std() / math.sqrt(gibbs_ess[key])
        print(
            f"| {key} | NumPyro DiscreteGibbs | {gibbs_ess[key]:.1f} | {g_rate:.1f} | - | 1 | "
            f"{g_mean:.3f} +- {g_se:.3f} | {r_mean:.3f} +- {r_se:.3f} |"
        )
        g_agree = abs(g_mean - r_mean) < 3 * math.hypot(g_se, r_se)
        for method, r in runs.items():
            e = r["ess"][key]
            per_draw = r["seconds"] / r["num_draws"]
            amortised = e / (r["num_draws"] * (per_draw + train_seconds / 10_000))
            ratio = amortised / g_rate
            o_mean = r["stats"][key].mean()
            o_se = r["stats"][key].std() / math.sqrt(max(e, 1.0))
            print(
                f"| {key} | AutoSpec + guide ({method}) + {args.correction} | {e:.1f} | "
                f"{e / r['seconds']:.3g} | {amortised:.3g} | {ratio:.2g} | "
                f"{o_mean:.3f} +- {o_se:.3f} | {r_mean:.3f} +- {r_se:.3f} |"
            )
            if method == "autospec":
                agree = abs(o_mean - r_mean) < 3 * math.hypot(o_se, r_se) and g_agree
                passes.append((f"ESS/s >= 5x Gibbs on {key} (amortised)", ratio >= 5))
                passes.append((f"estimates of {key} agree with the reference within 3 SE", agree))
    print(
        "\n| guide drawn by | rounds per draw (batch of 64) | whole-batch rounds | rows per draw | "
        "latency of one draw (s) | rounds of one draw | throughput, batch of 64 (draws/s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for method, t in timing.items():
        print(
            f"| {method} | {t['rounds']:.1f} | {t['batch_rounds']} | {t['rows']:.0f} | "
            f"{t['latency']:.3f} | {t['single_rounds']:.0f} | {t['throughput']:.1f} |"
        )
    print(f"\nTraining time: {train_seconds:.1f}s (not in the sampling ESS/s columns).")
    passes.append(("rounds per draw <= n / 5", timing["autospec"]["rounds"] <= n / 5))
    khat = runs["autospec"]["weights"]["khat"]["all"]
    passes.append(("Pareto k-hat < 0.7 (correction trustworthy)", khat < 0.7))
    print()
    for name, ok in passes:
        print(f"{'PASS' if ok else 'MISS'}: {name}")
    print(f"device: CPU ({torch.get_num_threads()} torch thread(s)); no GPU in this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
