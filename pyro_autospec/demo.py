"""``pyro-autospec demo``: a Pyro model through ``AutoSpec``, beside Pyro, checked, and timed.

Four parts, all exact, so that every answer is known:

1. **A Pyro model through AutoSpec.** The dishonest casino (an HMM written with
   ``pyro.markov``: a hidden fair or loaded die behind ``T`` rolls, one discrete site per
   roll) sampled by ``AutoSpec(casino, num_samples=...).run(rolls)``; its ``repr``, its
   ``summary()`` (measured seconds per stage, rounds, rows) and its most probable path
   (``map``).
2. **Beside Pyro.** ArviZ summaries of AutoSpec's draws and of the draws of Pyro's own exact
   sampler for this model (``infer_discrete``: forward filtering, backward sampling,
   vectorised over the draws), and the wall time of each, the best of a few runs.
3. **Exactness.** Every site's posterior probability of the loaded die from AutoSpec's draws
   against the exact one (forward-backward, written out here in NumPy); and draws of a small,
   strongly coupled Potts table (every joint state enumerable) against its exact law: a
   chi-square p-value beside the sequential sampler's.
4. **The engine race.** On a binary Markov chain of length ``n`` (an oracle whose rows cost
   next to nothing): rounds, rows and wall time of autospeculation and of the sequential
   chain rule, for a batch of draws and for one draw alone (its latency).
"""

from __future__ import annotations

import argparse
import itertools
import textwrap
import time
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import scipy.stats
import torch
from pyro import poutine
from pyro.infer import config_enumerate, infer_discrete

from pyro_autospec.diagnostics.arviz import summary, to_inference_data
from pyro_autospec.engine import sample_any_order
from pyro_autospec.infer import AutoSpec
from pyro_autospec.oracles.markov import MarkovChainOracle
from pyro_autospec.oracles.tabular import TabularOracle

__all__ = ["potts_table", "run_demo"]

TRANS = [[0.95, 0.05], [0.10, 0.90]]  # fair -> fair, fair -> loaded; loaded -> ...
EMIT = [[1 / 6] * 6, [0.1] * 5 + [0.5]]  # the loaded die shows a six half of the time


def casino(rolls):
    """The dishonest casino: ``x_t`` = 1 when roll ``t`` comes from the loaded die."""
    trans, emit = torch.tensor(TRANS), torch.tensor(EMIT)
    x = 0
    for t in pyro.markov(range(len(rolls))):
        x = pyro.sample(f"x_{t}", dist.Categorical(trans[x] if t else torch.tensor([0.5, 0.5])))
        pyro.sample(f"y_{t}", dist.Categorical(emit[x]), obs=rolls[t])


def casino_rolls(num_rolls: int, seed: int = 0) -> torch.Tensor:
    """Rolls simulated from the model: fair stretches and loaded stretches."""
    rng = np.random.default_rng(seed)
    x, rolls = 0, []
    for _ in range(num_rolls):
        rolls.append(rng.choice(6, p=EMIT[x]))
        x = rng.choice(2, p=TRANS[x])
    return torch.tensor(rolls)


def exact_loaded_probability(rolls: torch.Tensor) -> np.ndarray:
    """``P(x_t = loaded | rolls)`` for every ``t``, by forward-backward (independent of the
    library: the reference the draws are checked against)."""
    trans, emit = np.array(TRANS), np.array(EMIT)
    y = rolls.numpy()
    num = len(y)
    alpha = np.zeros((num, 2))
    alpha[0] = 0.5 * emit[:, y[0]]
    alpha[0] /= alpha[0].sum()
    for t in range(1, num):
        alpha[t] = (alpha[t - 1] @ trans) * emit[:, y[t]]
        alpha[t] /= alpha[t].sum()
    beta = np.ones((num, 2))
    for t in range(num - 2, -1, -1):
        beta[t] = trans @ (emit[:, y[t + 1]] * beta[t + 1])
        beta[t] /= beta[t].sum()
    post = alpha * beta
    return post[:, 1] / post.sum(1)


def potts_table(n: int = 6, q: int = 3, coupling: float = 1.0, seed: int = 0) -> torch.Tensor:
    """Log weights [q]*n of a random Potts model on the complete graph (strong, mixed couplings)."""
    g = torch.Generator().manual_seed(seed)
    states = torch.tensor(list(itertools.product(range(q), repeat=n)))
    J = coupling * torch.randn(n, n, generator=g, dtype=torch.float64).triu(1)
    same = (states[:, :, None] == states[:, None, :]).double()
    return (J * same).sum((1, 2)).reshape([q] * n)


def _table(rows: list[tuple[str, ...]]) -> str:
    """A markdown table with aligned columns (first column left, the others right)."""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        cells = [
            row[k].ljust(widths[k]) if k == 0 else row[k].rjust(widths[k]) for k in range(len(row))
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _best_of(repeats: int, job):
    """Run ``job()`` ``repeats`` times: (last result, best seconds, slowest seconds)."""
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = job()
        seconds.append(time.perf_counter() - start)
    return out, min(seconds), max(seconds)


def _wall(best: float, worst: float) -> str:
    return f"{best:.2f} ({best:.2f}-{worst:.2f})"


def _heading(text: str) -> None:
    print(f"\n{text}\n{'=' * len(text)}")


def run_demo(
    num_rolls: int = 60,
    num_samples: int = 300,
    n: int = 512,
    race_samples: int = 16,
    exact_samples: int = 2000,
    repeats: int = 3,
    seed: int = 0,
) -> dict:
    """Run the four parts, print them, and return the numbers.

    Parameters
    ----------
    num_rolls : int
        Rolls of the casino (its discrete sites).
    num_samples : int
        Draws of the casino's posterior per sampler.
    n : int
        Length of the Markov chain of the engine race.
    race_samples : int
        Draws per method in the engine race.
    exact_samples : int
        Draws per method of the Potts table.
    repeats : int
        Runs behind every wall time (the best is shown, with the spread).
    seed : int
        Seed of every run.

    Returns
    -------
    dict
        ``"wall"`` (best seconds per sampler of part 2 and per engine-race row), ``"max_z"``
        (part 3: the largest standardised error of a site's probability, AutoSpec's draws),
        ``"p_value"`` and ``"tv"`` (AutoSpec on the Potts table), ``"self_check"``
        (AutoSpec's self-check passed), ``"map"`` (the most probable path),
        ``"rounds_per_draw"`` (engine race: autospec and sequential).

    Examples
    --------
    >>> numbers = run_demo(num_rolls=20, num_samples=40, n=64, repeats=1)  # doctest: +SKIP
    """
    out: dict = {"wall": {}}
    rolls = casino_rolls(num_rolls, seed)
    print(
        f"pyro-autospec demo (torch threads: {torch.get_num_threads()}). Every wall time is the "
        f"best of {repeats} runs, the range of all {repeats} in brackets."
    )

    # 1. ------------------------------------------------------------------------ AutoSpec
    _heading("1. A Pyro model through AutoSpec")
    print(
        f"The dishonest casino: a hidden fair or loaded die behind {num_rolls} rolls, an HMM "
        f"written\nwith pyro.markov (one discrete site x_t per roll; x_t = 1: loaded).\n"
        f"\n    fit = AutoSpec(casino, num_samples={num_samples}, seed={seed}).run(rolls)\n"
    )

    def autospec(method="autospec", sampler="auto"):
        return AutoSpec(
            casino,
            num_samples=num_samples,
            seed=seed,
            method=method,
            sampler=sampler,
            disable_progbar=True,
        ).run(rolls)

    fit, best, worst = _best_of(repeats, autospec)
    out["wall"]["autospec"] = best
    print(f"{fit!r}\n\n>>> fit.summary()")
    fit.summary()
    out["self_check"] = fit._run.max_self_check_error is not None
    path = fit.map(rolls)
    out["map"] = [int(path[f"x_{t}"]) for t in range(num_rolls)]
    print(
        "\n>>> fit.map(rolls)  # the most probable path (Viterbi), F = fair, L = loaded\n"
        + "".join("FL"[x] for x in out["map"])
        + "\nrolls: "
        + "".join(str(int(r) + 1) for r in rolls)
    )

    # 2. ---------------------------------------------------------------- beside Pyro
    _heading("2. Beside Pyro: ArviZ summaries and wall time")

    def vectorised(data):
        with pyro.plate("draws", num_samples, dim=-1):
            casino(data)

    decoder = infer_discrete(config_enumerate(vectorised), first_available_dim=-2)

    def pyro_draws():
        pyro.set_rng_seed(seed)
        trace = poutine.trace(decoder).get_trace(rolls)
        return {f"x_{t}": trace.nodes[f"x_{t}"]["value"] for t in range(num_rolls)}

    reference, ref_best, ref_worst = _best_of(repeats, pyro_draws)
    sequential, seq_best, seq_worst = _best_of(repeats, lambda: autospec("sequential"))
    engine, eng_best, eng_worst = _best_of(repeats, lambda: autospec(sampler="engine"))
    out["wall"].update(
        {"sequential": seq_best, "infer_discrete": ref_best, "autospeculation": eng_best}
    )
    exact = exact_loaded_probability(rolls)
    shown = sorted({0, int(np.argmin(np.abs(exact - 0.5))), num_rolls // 2, num_rolls - 1})
    names = [f"x_{t}" for t in shown]
    ours = _arviz_summary(fit.to_inference_data(), names)
    theirs = _arviz_summary(_as_idata(reference, names), names)
    rows = [("site", "exact", "AutoSpec: mean", "sd", "ess_bulk", "r_hat")]
    rows[0] += ("Pyro: mean", "sd", "ess_bulk", "r_hat")
    for t, name in zip(shown, names, strict=True):
        rows.append((name, f"{exact[t]:.3f}", *ours[name], *theirs[name]))
    print(
        f"az.summary of {num_samples} draws from AutoSpec and from Pyro's infer_discrete "
        f"(independent\ndraws, given to ArviZ as 2 chains of {num_samples // 2}), at "
        f"{len(names)} sites; 'exact' is P(loaded | rolls) by\nforward-backward:\n"
    )
    print(_table(rows))
    default = fit.results[0].method  # "ffbs" on a CPU: forward filtering, backward sampling
    label = {
        "autospec": f"AutoSpec(casino) [default sampler: {default}]",
        "autospeculation": 'AutoSpec(casino, sampler="engine")',
        "sequential": 'AutoSpec(casino, method="sequential")',
        "infer_discrete": "Pyro's infer_discrete, vectorised",
    }
    rows = [("sampler", "wall (s)", "rounds per draw", "rounds, whole run", "rows per draw")]
    for key, result, (b, w) in (
        ("autospec", fit, (best, worst)),
        ("autospeculation", engine, (eng_best, eng_worst)),
        ("sequential", sequential, (seq_best, seq_worst)),
    ):
        engine = result.results[0]
        rows.append(
            (
                label[key],
                _wall(b, w),
                f"{engine.sample_rounds.double().mean().item():.1f}",
                f"{engine.rounds}",
                f"{engine.oracle_rows / num_samples:.0f}",
            )
        )
    rows.append((label["infer_discrete"], _wall(ref_best, ref_worst), "-", "-", "-"))
    print(
        f"\nWall time of {num_samples} draws of the casino, each sampler from the model and the "
        f"rolls\n(AutoSpec's run(): tracing, compiling, sampling, evaluating and self-check; "
        f"Pyro's: one\ntraced infer_discrete call):\n"
    )
    print(_table(rows))
    if worst > 2 * best:
        print(
            "(AutoSpec's slowest run is its first: the first oracle compiled in a process also "
            "pays one-time\nimports.)"
        )
    fastest = min(out["wall"], key=out["wall"].get)
    how = (
        "forward filtering, backward sampling: one pass, all draws at once"
        if default == "ffbs"
        else "the any-order engine"
    )
    advice = (
        f"Fastest here: {label[fastest]}. On a CPU AutoSpec's default sampler for a chain "
        f"like this one is {default!r} ({how}), the same kind of pass as infer_discrete, plus "
        f'the evaluation and self-check of every draw. Autospeculation (sampler="engine") '
        f"pays where rounds are the cost (a GPU, a neural oracle, long chains; see part 4 and "
        f"the 'Choosing a method' page)."
    )
    print("\n" + textwrap.fill(advice, width=95))

    # 3. ------------------------------------------------------------------- exactness
    _heading("3. Exactness")
    samples = fit.get_samples()
    draws = torch.stack([samples[f"x_{t}"] for t in range(num_rolls)], -1).double().numpy()
    error = draws.mean(0) - exact
    se = np.sqrt(np.maximum(exact * (1 - exact), 1e-12) / draws.shape[0])
    varying = exact * (1 - exact) * draws.shape[0] > 5.0
    z = np.abs(error[varying]) / se[varying]
    out["max_z"] = float(z.max()) if z.size else 0.0
    bound = scipy.stats.norm.isf(0.0005 / max(int(varying.sum()), 1))
    print(
        f"AutoSpec's P(loaded) at each of the {num_rolls} rolls against forward-backward:\n"
        f"largest error {np.abs(error).max():.3f}, largest |z| {out['max_z']:.2f} over "
        f"{int(varying.sum())} sites (exact draws stay below {bound:.1f}\nin at least 999 "
        f"runs of 1000, normal approximation).\nSelf-check of every draw: "
        f"{'passed' if out['self_check'] else 'not run'} (log p(x, data) - log q(x) constant)."
    )
    table = potts_table()
    oracle = TabularOracle(logits=table)
    probs = oracle.log_probs.exp().flatten().numpy()
    q, m = oracle.num_values, oracle.num_coords
    print(
        f"\nA coupled Potts table (q = {q}, n = {m}, {q**m} states), {exact_samples} draws "
        f"per sampler\nagainst the exact probabilities:"
    )
    for method in ("autospec", "sequential"):
        result = sample_any_order(oracle, exact_samples, seed=seed + 1, method=method)
        idx = result.samples.numpy() @ (q ** np.arange(m - 1, -1, -1))
        counts = np.bincount(idx, minlength=q**m)
        keep = probs * exact_samples >= 5
        observed = np.append(counts[keep], counts[~keep].sum())
        expected = np.append(probs[keep], probs[~keep].sum()) * exact_samples
        p = scipy.stats.chisquare(observed, expected).pvalue
        tv = 0.5 * np.abs(counts / exact_samples - probs).sum()
        print(f"  {method:<10}: chi-square p-value {p:.3f}, total variation to exact {tv:.4f}")
        if method == "autospec":
            out.update(p_value=float(p), tv=float(tv))
    print(
        "(Same oracle for both; p-values of exact samplers look like uniform draws, and the TV\n"
        " values are sampling noise of the same size for both.)"
    )

    # 4. ---------------------------------------------------------------- engine race
    _heading("4. The engine race")
    chain = MarkovChainOracle(
        torch.tensor([0.5, 0.5]), torch.tensor([[0.73, 0.27], [0.27, 0.73]]), n
    )
    rows = [("method", "draws", "rounds per draw", "rows per draw", "wall (s)")]
    out["rounds_per_draw"] = {}
    for draws_wanted in (race_samples, 1):
        for method in ("autospec", "sequential"):
            result, b, w = _best_of(
                repeats,
                lambda method=method, k=draws_wanted: sample_any_order(
                    chain, k, seed=seed, method=method
                ),
            )
            per_draw = result.sample_rounds.double().mean().item()
            if draws_wanted == race_samples:
                out["rounds_per_draw"][method] = per_draw
            out["wall"][f"race {method} x{draws_wanted}"] = b
            rows.append(
                (
                    method,
                    f"{draws_wanted}",
                    f"{per_draw:.1f}",
                    f"{result.oracle_rows / draws_wanted:.0f}",
                    _wall(b, w),
                )
            )
    print(
        f"Draws of a binary Markov chain of length n = {n} (stay probability 0.73), in random "
        f"orders,\nfrom one engine call each; wall time of that call:\n"
    )
    print(_table(rows))
    print(
        "\nA round is one batched oracle call: the latency on parallel hardware. A row is one\n"
        "conditioning: the total work. Rounds become time where a call costs about the same\n"
        "whatever its rows (a GPU, a neural network oracle); on a CPU every row is paid for."
    )
    return out


def _arviz_summary(idata, names: list[str]) -> dict[str, tuple[str, ...]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant sites: r_hat 0/0
        table = summary(idata, var_names=names, kind="all")
    return {
        name: (
            f"{table.loc[name, 'mean']:.3f}",
            f"{table.loc[name, 'sd']:.3f}",
            f"{table.loc[name, 'ess_bulk']:.0f}",
            f"{table.loc[name, 'r_hat']:.2f}",
        )
        for name in names
    }


def _as_idata(draws: dict, names: list[str]):
    """Independent draws ``[N]`` as ArviZ data with 2 chains (as AutoSpec exports them)."""
    half = next(iter(draws.values())).shape[0] // 2
    return to_inference_data({k: draws[k][: 2 * half].reshape(2, half) for k in names})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="pyro-autospec demo", description=__doc__.splitlines()[0])
    parser.add_argument("--rolls", type=int, default=60, help="casino rolls (default 60)")
    parser.add_argument(
        "--num-samples", type=int, default=300, help="draws of the casino per sampler (300)"
    )
    parser.add_argument("--n", type=int, default=512, help="engine race chain length (512)")
    parser.add_argument(
        "--race-samples", type=int, default=16, help="draws per method in the engine race (16)"
    )
    parser.add_argument(
        "--exact-samples", type=int, default=2000, help="draws of the Potts table (2000)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs behind each wall time (default 3: best)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes and one run each (a test of the demo)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: the engine's tensors are small, and on a busy "
        "CPU extra threads wait on each other)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.rolls, args.num_samples, args.n = 12, 40, 64
        args.race_samples, args.exact_samples, args.repeats = 4, 1000, 1
    run_demo(
        num_rolls=args.rolls,
        num_samples=args.num_samples,
        n=args.n,
        race_samples=args.race_samples,
        exact_samples=args.exact_samples,
        repeats=args.repeats,
        seed=args.seed,
    )
