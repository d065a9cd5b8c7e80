"""Rounds and wall time of a trained diffusion guide: autospec against sequential sampling.

Model (the one of ``tutorials/05_diffusion_guides.ipynb``): a logistic regression with an
intercept and two covariates, ``w ~ N(0, I_3)``, ``y_i ~ Bernoulli(sigmoid(x_i . w))`` for
``--num-data`` fixed covariate rows. A :class:`~pyro_autospec.guides.diffusion.DiffusionGuide`
is trained by simulation (prior predictive pairs, amortised), then the same guide is sampled
on one simulated data set with ``method="autospec"`` (both rules) and ``method="sequential"`` (same law:
the guide's Euler-Maruyama chain). Prints one markdown table: rounds per draw (median, p90),
rows per draw and wall time of each method, from one run.

Run ``python benchmarks/diffusion_guides.py`` (about a minute on 2 CPU cores) or ``--smoke``
(seconds). Rounds and rows do not depend on the machine; wall times do (single-threaded torch
unless ``--threads``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyro
import pyro.distributions as dist
import torch

from pyro_autospec.guides.diffusion import DiffusionGuide
from pyro_autospec.infer.continuous import sample_continuous


def make_covariates(num_data: int, seed: int = 0) -> torch.Tensor:
    """Design matrix Tensor[num_data, 3]: an intercept column and two standard normals."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([torch.ones(num_data, 1), torch.randn(num_data, 2, generator=gen)], 1)


def logistic_model(covariates: torch.Tensor, y: torch.Tensor | None = None):
    """``w ~ N(0, I_3)``, ``y_i ~ Bernoulli(logits = covariates_i . w)``."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", covariates.shape[0]):
        pyro.sample("y", dist.Bernoulli(logits=(covariates * w).sum(-1)), obs=y)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, runs in seconds")
    parser.add_argument("--num-data", type=int, default=40)
    parser.add_argument("--num-samples", type=int, default=None, help="draws per method")
    parser.add_argument("--num-steps", type=int, default=256, help="Euler-Maruyama steps N")
    parser.add_argument("--delta", type=float, default=1e-3, help="grid ends at T = 1 / delta")
    parser.add_argument("--num-simulations", type=int, default=None)
    parser.add_argument("--num-iterations", type=int, default=None)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(args.threads)
    num_samples = args.num_samples or (8 if args.smoke else 200)
    num_sims = args.num_simulations or (100 if args.smoke else 20000)
    num_iterations = args.num_iterations or (5 if args.smoke else 3000)
    num_steps = 16 if args.smoke else args.num_steps
    covariates = make_covariates(args.num_data, args.seed)
    with pyro.poutine.seed(rng_seed=args.seed + 1):  # one data set from the prior predictive
        trace = pyro.poutine.trace(pyro.poutine.uncondition(logistic_model)).get_trace(
            covariates, torch.zeros(args.num_data)
        )
    data = trace.nodes["y"]["value"]
    torch.manual_seed(args.seed)  # the network's initial weights (training is seeded below)
    guide = DiffusionGuide(
        logistic_model,
        (covariates, data),
        hidden_dim=args.hidden_dim,
        num_steps=num_steps,
        delta=args.delta,
    )
    start = time.perf_counter()
    guide.fit_simulation(
        num_sims, num_iterations=num_iterations, lr=3e-3, seed=args.seed, disable_progbar=True
    )
    train_time = time.perf_counter() - start
    print(
        f"# Diffusion guide benchmark: logistic regression (d = 3, {args.num_data} data), "
        f"N = {num_steps} steps, delta = {args.delta}, {num_samples} draws per method; guide "
        f"hidden_dim = {args.hidden_dim}, trained on {num_sims} simulations x "
        f"{num_iterations} iterations in {train_time:.1f} s\n"
    )
    print(
        "| method | rounds/draw median | rounds/draw p90 | total rounds | rows/draw (mean) "
        "| wall time (s) | posterior mean of w |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    variants = {
        "autospec": ("autospec", {}),
        "autospec, rule=block": ("autospec", {"rule": "block"}),
        "sequential": ("sequential", {}),
    }
    for label, (method, knobs) in variants.items():
        out = sample_continuous(
            guide,
            num_samples,
            covariates,
            data,
            method=method,
            seed=args.seed,
            log_joint=False,
            schedule=knobs,
        )
        rounds = out.sample_rounds.double().numpy()
        row = {
            "method": label,
            "median": float(np.median(rounds)),
            "p90": float(np.quantile(rounds, 0.9)),
            "rounds": out.rounds,
            "rows": out.oracle_rows / num_samples,
            "wall": out.diffusion.wall_time,
            "mean": [round(float(v), 2) for v in out.samples["w"].mean(0)],
        }
        rows.append(row)
        print(
            f"| {label} | {row['median']:.0f} | {row['p90']:.0f} | {row['rounds']} "
            f"| {row['rows']:.1f} | {row['wall']:.2f} | {row['mean']} |"
        )
    return rows


def main(argv=None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
