"""Learned guides on Ising posteriors: AnyOrderGuide + AutoSpec + correction against NumPyro Gibbs.

One command (``python benchmarks/guides.py``) measures, in one run, the targets of the
learned-guides issue and prints markdown tables (``--smoke``: small sizes, well under a minute,
checks that the script works; its numbers say nothing about a full run). Parts (``--parts``):

``training``
    On the 16x16 Ising posterior (spins ``s = 2z - 1``, coupling ``J = 0.4`` between grid
    neighbours, ``y = s_true + N(0, 1)``): one guide per (architecture, objective) trained for the
    same wall time by ``fit_posterior``: steps per second, the negative ELBO reached, and the
    k-hat, weights' ESS and estimated IMH acceptance of 512 fresh draws. The first row is the
    trainer and network of the previous release (``"mlp"``, width 256, objective ``"both"``);
    the default architecture is picked from this table.
``ising``
    The same posterior: NumPyro ``DiscreteGibbs(modified=True)`` (ESS/s of magnetisation and
    coupling energy, and a longer reference run) against ``AutoSpec(model, guide=guide,
    correction="imh")`` with the default guide trained for ``--train-seconds``: k-hat, IMH
    acceptance, ESS per second of sampling and with the training amortised over 10,000 draws;
    rounds and rows per draw with the guide drawn sequentially, by autospeculation with the
    default schedule, and by autospeculation with a lean schedule (``rho = 0.25``,
    ``max_block = 8``: fewer rows, more rounds).
``bimodal``
    A 14x14 Ising posterior above the critical coupling (``J = 0.6``) with weak data (noise of
    standard deviation 2, antisymmetric about the vertical axis, plus an offset of 0.02): two
    magnetisation modes. The exact probability of each (transfer matrix over columns), against
    Gibbs' and the corrected guide's estimates, with their ESS/s; the guide must find both.
``amortised``
    One guide trained by ``fit_simulation`` (``objective="posterior"``: the model has a
    ``pyro.factor``), then k-hat and IMH acceptance on 20 held-out data sets drawn from the
    16x16 model's own prior predictive (Ising prior by 400 checkerboard Gibbs sweeps, then the
    noisy image), with no retraining: one engine run for all 20 (a family of targets).

Wall times depend on the machine and its load: the script prints ``uptime`` beside them.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARTS = ("training", "ising", "bimodal", "amortised")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, well under a minute")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--side", type=int, default=None, help="16x16 grid (smoke: 5)")
    parser.add_argument("--bimodal-side", type=int, default=None, help="14 (smoke: 4)")
    parser.add_argument("--train-seconds", type=float, default=None, help="120 (smoke: 0.1)")
    parser.add_argument("--compare-seconds", type=float, default=None, help="per row; 120")
    parser.add_argument("--bimodal-seconds", type=float, default=None, help="300 (smoke: 0.1)")
    parser.add_argument("--amortised-seconds", type=float, default=None, help="300 (smoke: 0.1)")
    parser.add_argument("--num-samples", type=int, default=None, help="per IMH chain; 1000")
    parser.add_argument("--gibbs-samples", type=int, default=None, help="20000 (smoke: 200)")
    parser.add_argument("--reference-factor", type=int, default=3)
    parser.add_argument("--num-particles", type=int, default=None, help="128 (smoke: 16)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--save-guide", type=Path, help="save the 'ising' guide (guide.save)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    smoke = args.smoke
    defaults = {
        "side": (5, 16),
        "bimodal_side": (4, 14),
        # smoke: one or two training steps each (a step is taken before the clock is read)
        "train_seconds": (0.1, 120.0),
        "compare_seconds": (0.1, 120.0),
        "bimodal_seconds": (0.1, 300.0),
        "amortised_seconds": (0.1, 300.0),
        "num_samples": (40, 1000),
        "gibbs_samples": (200, 20000),
        "num_particles": (16, 128),
    }
    for name, (small, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if smoke else full)
    return args


def load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable"


# ---------------------------------------------------------------------------------- models
def make_data(side: int, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A binary image (a disc on a background) and its noisy observation: Tensor[side^2]."""
    gen = torch.Generator().manual_seed(seed)
    i, j = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    c = (side - 1) / 2
    truth = (((i - c) ** 2 + (j - c) ** 2) < (side / 3) ** 2).double() * 2 - 1
    y = truth + noise * torch.randn(side, side, generator=gen, dtype=torch.float64)
    return truth.reshape(-1), y.reshape(-1).float()


def bimodal_data(side: int, noise: float, offset: float, seed: int) -> torch.Tensor:
    """Weak data: noise antisymmetric about the vertical axis (no net field) plus an offset."""
    gen = torch.Generator().manual_seed(seed)
    eps = torch.randn(side, side, generator=gen, dtype=torch.float64)
    eps = (eps - eps.flip(1)) / math.sqrt(2.0)
    return (noise * eps + offset).reshape(-1).float()


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


def statistics(z, side: int) -> dict[str, np.ndarray]:
    """Magnetisation and coupling energy of draws z[..., side^2] in {0, 1}."""
    s = 2.0 * np.asarray(z, dtype=np.float64) - 1.0
    return {"magnetisation": s.mean(-1), "energy": -neighbour_product(s, side)}


def ess(values: np.ndarray) -> float:
    """ArviZ bulk ESS of values[chain, draw]."""
    import arviz as az

    return float(az.ess(np.asarray(values, dtype=np.float64)))


def magnetisation_law(field: torch.Tensor, coupling: float) -> tuple[float, torch.Tensor]:
    """Exact law of the number of + spins of ``p(s) ~ exp(J sum_<ij> s_i s_j + sum_i h_i s_i)``
    on a grid ``field[rows, cols]`` (free boundary), by a transfer matrix over a frontier of
    ``cols`` spins swept site by site (``O(rows cols^2 2^cols)``). Returns ``(log Z, law)``."""
    field = torch.as_tensor(field, dtype=torch.float64)
    rows, cols = field.shape
    n = rows * cols
    frontier = 1 << cols
    states = torch.arange(frontier)
    table = torch.zeros(frontier, n + 1, dtype=torch.float64)
    table[0, 0] = 1.0
    log_scale, done = 0.0, 0
    for r in range(rows):
        for c in range(cols):
            width = done + 1
            current = table[:, :width]
            up = ((states >> c) & 1) * 2 - 1 if r > 0 else torch.zeros(frontier, dtype=torch.long)
            left = ((states >> (c - 1)) & 1) * 2 - 1 if c > 0 else torch.zeros_like(up)
            local = float(field[r, c]) + coupling * (up + left).double()
            shape = (frontier >> (c + 1), 2, 1 << c, width)
            minus = (current * torch.exp(-local)[:, None]).reshape(shape).sum(1)
            plus = (current * torch.exp(local)[:, None]).reshape(shape).sum(1)
            out = torch.zeros(frontier >> (c + 1), 2, 1 << c, width + 1, dtype=torch.float64)
            out[:, 0, :, :width] = minus
            out[:, 1, :, 1:] = plus
            out = out.reshape(frontier, width + 1)
            top = out.max()
            log_scale += math.log(top)
            table[:, : width + 1] = out / top
            done += 1
    total = table.sum(0)
    return log_scale + math.log(total.sum()), total / total.sum()


def log_evidence(y: torch.Tensor, side: int, coupling: float, noise: float) -> float:
    """``log p(y)`` of the Ising model, exactly (for the KL of a guide)."""
    y = y.double()
    log_z, _ = magnetisation_law((y / noise**2).reshape(side, side), coupling)
    n = side * side
    const = n * math.log(0.5) - float(((y**2 + 1) / (2 * noise**2)).sum())
    return log_z + const - n * math.log(noise * math.sqrt(2 * math.pi))


def prior_images(side: int, coupling: float, num: int, sweeps: int, seed: int) -> np.ndarray:
    """``num`` spin images from the Ising prior by checkerboard Gibbs sweeps: int8[num, side^2]."""
    rng = np.random.default_rng(seed)
    s = rng.choice([-1, 1], size=(num, side, side)).astype(np.float64)
    i, j = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    colours = [(i + j) % 2 == 0, (i + j) % 2 == 1]
    for _ in range(sweeps):
        for colour in colours:
            nb = np.zeros_like(s)
            nb[:, 1:, :] += s[:, :-1, :]
            nb[:, :-1, :] += s[:, 1:, :]
            nb[:, :, 1:] += s[:, :, :-1]
            nb[:, :, :-1] += s[:, :, 1:]
            p_plus = 1.0 / (1.0 + np.exp(-2.0 * coupling * nb))
            draw = np.where(rng.random(s.shape) < p_plus, 1.0, -1.0)
            s = np.where(colour, draw, s)
    return s.reshape(num, -1)


# ---------------------------------------------------------------------------------- samplers
def run_gibbs(y, side, coupling, noise, num_samples: int, seed: int, timed: bool = True):
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
        mcmc.run(jax.random.fold_in(key, 1), y_j, side, coupling, noise)
    start = time.perf_counter()
    mcmc.run(key, y_j, side, coupling, noise)
    z = np.asarray(mcmc.get_samples()["z"])
    return z[None], time.perf_counter() - start


def train_guide(model_args, architecture, objective, seconds, args, hidden_dim=None, layers=None):
    """A fresh guide trained by ``fit_posterior`` for ``seconds``: (guide, history, seconds)."""
    from pyro_autospec.guides import AnyOrderGuide

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    guide = AnyOrderGuide(
        pyro_model,
        model_args,
        architecture=architecture,
        hidden_dim=hidden_dim,
        num_layers=layers,
    )
    history = []
    if seconds > 0:
        lr = 1e-2 if architecture == "graph" else 3e-3
        history = guide.fit_posterior(
            num_steps=10**6,
            max_seconds=seconds,
            num_particles=args.num_particles,
            objective=objective,
            lr=lr,
            seed=args.seed,
            disable_progbar=True,
        )
    return guide, history, time.perf_counter() - start


def guide_draws(oracle, model_args, num, seed, method="sequential"):
    """Exact draws of a guide and their log weights: (samples, log_weight, seconds)."""
    from pyro_autospec.engine import sample_any_order
    from pyro_autospec.model.simulation import joint_log_prob

    guide = getattr(oracle, "guide", oracle)
    start = time.perf_counter()
    draws = sample_any_order(oracle, num, method=method, seed=seed)
    seconds = time.perf_counter() - start
    lp = joint_log_prob(pyro_model, model_args, {}, guide.layout, draws.samples)
    return draws, lp - draws.log_prob, seconds


# A schedule that spends fewer rows (fewer parallel residual tries, smaller speculated blocks)
# for more rounds: on a CPU, where every row is paid for, it is the cheaper way to draw a guide.
LEAN_SCHEDULE = {"rho": 0.25, "max_block": 8}
DRAWERS = {  # label -> (method, schedule knobs)
    "sequential": ("sequential", {}),
    "autospec": ("autospec", {}),
    "autospec, lean schedule": ("autospec", LEAN_SCHEDULE),
}


def run_autospec(model_args, guide, args, method: str, schedule: dict | None = None) -> dict:
    """AutoSpec(model, guide=guide, correction="imh") with the guide drawn by ``method``."""
    import warnings

    from pyro_autospec.infer import AutoSpec

    side = model_args[1]
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = AutoSpec(
            pyro_model,
            num_samples=args.num_samples,
            num_chains=2,
            method=method,
            guide=guide,
            correction="imh",
            seed=args.seed,
            disable_progbar=True,
            schedule=schedule,
        ).run(*model_args)
    seconds = time.perf_counter() - start
    z = run.get_samples(group_by_chain=True)["z"].numpy()
    stats = statistics(z, side)
    num_draws = sum(r.num_samples for r in run.results)  # guide draws, warm-up included
    weights = run.weight_diagnostics()
    diag = {
        "khat": weights["khat"]["all"],
        "weights_ess": weights["weights_ess"]["all"],
        "acceptance": float(run.get_extra_fields()["acceptance_rate"].double().mean()),
    }
    return {
        "seconds": seconds,
        "stats": stats,
        "ess": {k: ess(v) for k, v in stats.items()},
        "diag": diag,
        "num_draws": num_draws,
        "rounds": float(torch.cat([r.sample_rounds for r in run.results]).double().mean()),
        "rows": sum(r.oracle_rows for r in run.results) / num_draws,
        "warnings": [str(w.message) for w in caught],
        "z": z,
    }


# ---------------------------------------------------------------------------------- parts
def part_training(args, model_args) -> str:
    """Architectures and objectives at the same wall time; returns the default's name."""
    from pyro_autospec.diagnostics.weights import weight_diagnostics

    side = model_args[1]
    evidence = log_evidence(model_args[0], side, model_args[2], model_args[3])
    print(
        f"\n### Training: {side}x{side} Ising posterior, {args.compare_seconds:.0f} s of "
        f"fit_posterior per row, {args.num_particles} particles per step; quality from 512 "
        f"fresh sequential draws; log p(y) = {evidence:.2f} (exact, transfer matrix)\n"
    )
    print(
        "| architecture | objective | steps | steps/s | -ELBO, last 10 steps | KL(q \\|\\| p) of "
        "512 draws | k-hat | weights' ESS / 512 | IMH acceptance (estimated) | draws/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = [
        ("mlp", "both", 256, None, " (previous release)"),
        ("mlp", "forward", 256, None, ""),
        ("transformer", "both", 64, None, ""),
        ("graph", "both", None, None, ""),
        ("graph", "forward", None, None, ""),
        ("graph", "forward", None, 1, ", 1 round of learned messages"),
    ]
    if args.smoke:
        rows = [rows[0], rows[4]]
    best, best_kl = None, math.inf
    for architecture, objective, width, layers, note in rows:
        guide, history, seconds = train_guide(
            model_args, architecture, objective, args.compare_seconds, args, width, layers
        )
        draws, lw, sample_seconds = guide_draws(guide, model_args, 512, args.seed + 1)
        diag = weight_diagnostics(lw, correction="imh")
        kl = float(-lw.mean()) + evidence
        label = f"{architecture}" + (f", width {width}" if width else "") + note
        print(
            f"| {label} | {objective} | {len(history)} | {len(history) / seconds:.2f} | "
            f"{np.mean(history[-10:]):.2f} | {kl:.2f} | {diag.khat:.2f} | "
            f"{diag.weights_ess:.1f} | {diag.imh_acceptance:.2f} | "
            f"{512 / sample_seconds:.1f} |",
            flush=True,
        )
        if kl < best_kl:
            best, best_kl = f"{architecture}/{objective}", kl
    print(f"\nLowest KL at equal training time: {best}. ({load()})")
    return best


def part_ising(args, model_args) -> None:
    from pyro_autospec.engine import sample_any_order

    y, side, coupling, noise = model_args
    n = side * side
    print(f"\n### {side}x{side} Ising posterior, J = {coupling}, sigma = {noise}: Gibbs vs guide\n")
    z, gibbs_seconds = run_gibbs(y, side, coupling, noise, args.gibbs_samples, args.seed)
    gibbs = statistics(z, side)
    ref_n = args.gibbs_samples * args.reference_factor
    z_ref, ref_seconds = run_gibbs(y, side, coupling, noise, ref_n, args.seed + 1, timed=False)
    reference = statistics(z_ref, side)
    gibbs_ess = {k: ess(v) for k, v in gibbs.items()}
    ref_ess = {k: ess(v) for k, v in reference.items()}
    print(
        f"Gibbs: {args.gibbs_samples} sweeps over all {n} spins in {gibbs_seconds:.1f} s; "
        f"reference: {ref_n} sweeps in {ref_seconds:.1f} s (compilation included). ({load()})"
    )
    guide, history, train_seconds = train_guide(
        model_args, "graph", "forward", args.train_seconds, args
    )
    if history:
        print(
            f"Guide: AnyOrderGuide(model, args) (graph, defaults), built and trained "
            f"({len(history)} steps of fit_posterior, objective 'forward') in "
            f"{train_seconds:.1f} s; -ELBO {np.mean(history[:5]):.2f} -> "
            f"{np.mean(history[-10:]):.2f}. ({load()})"
        )
    if args.save_guide is not None:
        guide.save(args.save_guide)
        print(f"Saved the guide to {args.save_guide}")
    runs = {
        label: run_autospec(model_args, guide, args, method, schedule)
        for label, (method, schedule) in DRAWERS.items()
    }
    print(
        "\n| guide drawn by | guide draws | seconds | k-hat | weights' ESS | IMH acceptance | "
        "rounds per draw | rows per draw |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for method, r in runs.items():
        d = r["diag"]
        print(
            f"| {method} | {r['num_draws']} | {r['seconds']:.1f} | {d['khat']:.2f} | "
            f"{d['weights_ess']:.0f} | {d['acceptance']:.2f} | {r['rounds']:.1f} | "
            f"{r['rows']:.0f} |"
        )
        for w in r["warnings"]:
            print(f"  warning ({method}): {w}")
    print(
        "\n| statistic | sampler | ESS | ESS/s (sampling) | ESS/s, training amortised over "
        "10k draws | ratio to Gibbs | mean +- MCSE | reference mean +- MCSE |"
    )
    print("|---|---|---|---|---|---|---|---|")
    checks = []
    for key in ("magnetisation", "energy"):
        g_rate = gibbs_ess[key] / gibbs_seconds
        r_mean = reference[key].mean()
        r_se = reference[key].std() / math.sqrt(ref_ess[key])
        g_mean, g_se = gibbs[key].mean(), gibbs[key].std() / math.sqrt(gibbs_ess[key])
        print(
            f"| {key} | NumPyro DiscreteGibbs | {gibbs_ess[key]:.0f} | {g_rate:.1f} | - | 1 | "
            f"{g_mean:.3f} +- {g_se:.3f} | {r_mean:.3f} +- {r_se:.3f} |"
        )
        for method, r in runs.items():
            e = r["ess"][key]
            per_draw = r["seconds"] / r["num_draws"]
            amortised = e / (r["num_draws"] * (per_draw + train_seconds / 10_000))
            o_mean = r["stats"][key].mean()
            o_se = r["stats"][key].std() / math.sqrt(max(e, 1.0))
            print(
                f"| {key} | AutoSpec + guide ({method}) + imh | {e:.0f} | "
                f"{e / r['seconds']:.3g} | {amortised:.3g} | {amortised / g_rate:.2g} | "
                f"{o_mean:.3f} +- {o_se:.3f} | {r_mean:.3f} +- {r_se:.3f} |"
            )
            if method != "sequential":
                checks.append(
                    (
                        f"ESS/s >= 0.1x Gibbs on {key} (amortised), guide drawn by {method}",
                        amortised >= 0.1 * g_rate,
                    )
                )
            if method == "sequential":
                checks.append(
                    (f"ESS/s >= 0.1x Gibbs on {key} (amortised)", amortised >= 0.1 * g_rate)
                )
                checks.append(
                    (f"ESS/s beats Gibbs on {key} (amortised; moonshot)", amortised >= g_rate)
                )
                agree = abs(o_mean - r_mean) < 3 * math.hypot(o_se, r_se)
                checks.append((f"{key} agrees with the reference within 3 SE", agree))
    diag = runs["sequential"]["diag"]
    khat, acceptance = diag["khat"], diag["acceptance"]
    checks.append((f"k-hat <= 0.7 within 10 minutes of training ({khat:.2f})", khat <= 0.7))
    checks.append((f"IMH acceptance >= 0.3 ({acceptance:.2f})", acceptance >= 0.3))
    timing = {}
    for label, (method, schedule) in DRAWERS.items():
        single = [
            sample_any_order(guide, 1, method=method, seed=s, schedule=schedule) for s in range(5)
        ]
        batch = sample_any_order(guide, 64, method=method, seed=7, schedule=schedule)
        timing[label] = (
            float(np.median([r.wall_time for r in single])),
            float(np.median([r.rounds for r in single])),
            64 / batch.wall_time,
            float(batch.sample_rounds.double().mean()),
            batch.oracle_rows / 64,
        )
    print(
        "\n| guide drawn by | latency of one draw (s) | rounds of one draw | throughput, batch "
        "of 64 (draws/s) | rounds per draw (batch of 64) | rows per draw |"
    )
    print("|---|---|---|---|---|---|")
    for method, (lat, rnd, thr, brnd, rows) in timing.items():
        print(f"| {method} | {lat:.3f} | {rnd:.0f} | {thr:.1f} | {brnd:.1f} | {rows:.0f} |")
    print()
    for name, ok in checks:
        print(f"{'PASS' if ok else 'MISS'}: {name}")
    print(f"({load()})")


def part_bimodal(args) -> None:
    side, coupling, noise, offset = args.bimodal_side, 0.6, 2.0, 0.02
    n = side * side
    y = bimodal_data(side, noise, offset, args.seed)
    model_args = (y, side, coupling, noise)
    start = time.perf_counter()
    _, law = magnetisation_law((y.double() / noise**2).reshape(side, side), coupling)
    exact_plus = float(law[n // 2 + 1 :].sum())
    exact_zero = float(law[n // 2]) if n % 2 == 0 else 0.0
    print(
        f"\n### Two modes: {side}x{side} Ising posterior, J = {coupling} (critical 0.44), weak "
        f"data (sigma = {noise}, offset {offset}); exact law of the magnetisation by transfer "
        f"matrix in {time.perf_counter() - start:.1f} s\n"
    )
    z, gibbs_seconds = run_gibbs(y, side, coupling, noise, args.gibbs_samples, args.seed)
    m_gibbs = statistics(z, side)["magnetisation"]
    switches = int(np.sum(np.diff(np.sign(m_gibbs[0])) != 0))
    guide, history, train_seconds = train_guide(
        model_args, "graph", "forward", args.bimodal_seconds, args
    )
    draws, lw, _ = guide_draws(guide, model_args, 512, args.seed + 2)
    raw_plus = float(((2 * draws.samples.double() - 1).sum(-1) > 0).double().mean())
    run = run_autospec(model_args, guide, args, "sequential")
    m_ours = run["stats"]["magnetisation"]
    d = run["diag"]
    print(
        f"Guide trained {len(history)} steps in {train_seconds:.1f} s; its own draws (before "
        f"correction) put {raw_plus:.3f} of their mass on M > 0; AutoSpec + IMH: k-hat "
        f"{d['khat']:.2f}, IMH acceptance {d['acceptance']:.2f}, {run['num_draws']} guide draws "
        f"in {run['seconds']:.1f} s. ({load()})\n"
    )
    print(
        "| sampler | P(M > 0) | P(M = 0) | sign switches of M | ESS of M | ESS/s (sampling) | "
        "ESS/s, training amortised over 10k draws |"
    )
    print("|---|---|---|---|---|---|---|")
    print(f"| exact (transfer matrix) | {exact_plus:.4f} | {exact_zero:.4f} | - | - | - | - |")
    g_ess = ess(m_gibbs)
    print(
        f"| NumPyro DiscreteGibbs, {args.gibbs_samples} sweeps | {(m_gibbs > 0).mean():.4f} | "
        f"{(m_gibbs == 0).mean():.4f} | {switches} | {g_ess:.0f} | {g_ess / gibbs_seconds:.3g} | - |"
    )
    o_ess = ess(m_ours)
    per_draw = run["seconds"] / run["num_draws"]
    amortised = o_ess / (run["num_draws"] * (per_draw + train_seconds / 10_000))
    plus = (m_ours > 0).mean()
    se = math.sqrt(max(plus * (1 - plus), 1e-12) / max(ess((m_ours > 0).astype(float)), 1.0))
    print(
        f"| AutoSpec + guide + imh, 2 x {args.num_samples} | {plus:.4f} +- {se:.4f} | "
        f"{(m_ours == 0).mean():.4f} | {int(np.sum(np.diff(np.sign(m_ours), axis=-1) != 0))} | "
        f"{o_ess:.0f} | {o_ess / run['seconds']:.3g} | {amortised:.3g} |"
    )
    both = 0.0 < raw_plus < 1.0
    print(f"\n{'PASS' if both else 'MISS'}: the guide's own draws visit both modes")
    agree = abs(plus - exact_plus) < 3 * se
    print(f"{'PASS' if agree else 'MISS'}: corrected P(M > 0) within 3 SE of the exact value")


def part_amortised(args, model_args) -> None:
    from pyro_autospec.diagnostics.weights import weight_diagnostics
    from pyro_autospec.engine import sample_any_order
    from pyro_autospec.guides import AnyOrderGuide
    from pyro_autospec.model.simulation import joint_log_prob

    y, side, coupling, noise = model_args
    num_sets, per_set = (4, 64) if args.smoke else (20, 400)
    print(
        f"\n### Amortised: one guide, {num_sets} held-out data sets of the {side}x{side} model "
        f"(prior predictive), no retraining; {per_set} draws per data set\n"
    )
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    guide = AnyOrderGuide(pyro_model, model_args)
    history = guide.fit_simulation(
        4096,
        max_seconds=args.amortised_seconds,
        num_steps=10**6,
        num_particles=args.num_particles,
        datasets_per_step=8,
        posterior_objective="forward",
        lr=1e-2,
        seed=args.seed,
        disable_progbar=True,
    )
    train_seconds = time.perf_counter() - start
    spins = prior_images(side, coupling, num_sets, 400, args.seed + 7)
    rng = np.random.default_rng(args.seed + 8)
    held_out = torch.as_tensor(spins + noise * rng.normal(size=spins.shape), dtype=torch.float32)
    context = guide.context_for({"y": held_out})
    family = guide.conditioned(context, repeats=per_set)
    start = time.perf_counter()
    draws = sample_any_order(family, num_sets * per_set, method="sequential", seed=args.seed)
    sample_seconds = time.perf_counter() - start
    index = torch.arange(num_sets).repeat_interleave(per_set)
    lp = joint_log_prob(
        pyro_model, model_args, {}, guide.layout, draws.samples, {"y": held_out[index]}
    )
    lw = (lp - draws.log_prob).reshape(num_sets, per_set)
    diags = [weight_diagnostics(w, correction="imh") for w in lw]
    khats = np.array([d.khat for d in diags])
    accept = np.array([d.imh_acceptance for d in diags])
    print(
        f"fit_simulation (objective 'posterior', 4096 simulated data sets): {len(history)} "
        f"steps in {train_seconds:.1f} s; {num_sets * per_set} draws in {sample_seconds:.1f} s "
        f"(one engine run). ({load()})\n"
    )
    print("| data set | " + " | ".join(str(k) for k in range(num_sets)) + " |")
    print("|---|" + "---|" * num_sets)
    print("| k-hat | " + " | ".join(f"{k:.2f}" for k in khats) + " |")
    print("| IMH acceptance (estimated) | " + " | ".join(f"{a:.2f}" for a in accept) + " |")
    median = float(np.median(khats))
    print(
        f"\nmedian k-hat {median:.2f} (max {khats.max():.2f}); median IMH acceptance "
        f"{np.median(accept):.2f}"
    )
    print(f"{'PASS' if median <= 0.7 else 'MISS'}: median k-hat <= 0.7 with no retraining")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    import pyro

    pyro.set_rng_seed(args.seed)
    side = args.side
    _, y = make_data(side, 1.0, args.seed)
    model_args = (y, side, 0.4, 1.0)
    print(
        f"# Learned guides benchmark ({'smoke' if args.smoke else 'full'} run, parts "
        f"{args.parts}, torch threads = {args.threads}); {load()}"
    )
    if "training" in args.parts:
        part_training(args, model_args)
    if "ising" in args.parts:
        part_ising(args, model_args)
    if "bimodal" in args.parts:
        part_bimodal(args)
    if "amortised" in args.parts:
        part_amortised(args, model_args)
    print(f"\ndevice: CPU ({torch.get_num_threads()} torch thread(s)); no GPU was lent to this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
