"""Fingerprints of the draws: has a change moved any draw of any sampler, bit for bit?

One short hash per run, for every oracle of the conformance catalogue (``CONFORMANCE``, the
shipped oracles and the user oracles; the sharded ones apart, which need a process group and
are the same draws as their inner oracle) under every method and several schedules, for the
default windows that depend on the batch and the oracle, for the diffusion samplers, and for
``AutoSpec`` on Pyro models with both of its samplers. A run's
hash covers its samples (the diffusions' rounded to 9 significant digits, so that a last-bit
difference in a sum does not count) and its rounds and rows; not the log probabilities, which
a float32 network's rows move in their last bits with the thread count while the draws stay.

The recorded fingerprints are ``tests/catalogue/draw_fingerprints.json``; the test
``tests/test_draws_unchanged.py`` compares against them. A refactor must leave them unchanged.
A change that moves draws on purpose (a new schedule, a fix) records them again and says why
in its commit::

    python -m tests.catalogue.fingerprints            # compare, list what moved
    python -m tests.catalogue.fingerprints --write    # record the current draws

Draws are integers and decisions compare float64 log ratios with keyed uniforms, so the
fingerprints hold across machines with the pinned torch (``requirements-dev.txt``); another
torch version may move the learned networks' draws (their float32 initialisation and
arithmetic) and the diffusion paths.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import sys
from pathlib import Path

import numpy as np
import torch

from pyro_autospec import AutoSpec
from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.oracles import GaussianMixtureDenoiser, MarkovChainOracle
from tests.catalogue.conformance import CONFORMANCE
from tests.catalogue.models import CASES
from tests.catalogue.user_oracles import HandChain

RECORDED = Path(__file__).with_name("draw_fingerprints.json")
DRAWS = 12

#: (label, method, knobs) of the discrete runs: every method, the default schedule, the block
#: rule with races, a hybrid of both, and a cap with continuous batching.
DISCRETE_RUNS = [
    ("autospec", "autospec", {}),
    ("autospec_blocks", "autospec", {"token_below": 0, "max_block": 4}),
    ("autospec_hybrid", "autospec", {"token_below": 3, "max_block": 5, "first_block": 2}),
    ("autospec_capped", "autospec", {"max_rows_per_round": 7, "max_concurrent_draws": 5}),
    ("speculative", "speculative", {"window": 3}),
    ("agr24", "agr24", {}),
    ("gumbel_sequential", "gumbel_sequential", {}),
    ("sequential", "sequential", {}),
]
DIFFUSION_RUNS = [
    ("sde_token", {}),
    ("sde_block", {"rule": "block"}),
    ("sde_sequential", {"method": "sequential"}),
    ("sde_picard", {"method": "picard"}),
]
PYRO_MODELS = ("hmm_markov", "mixed_supports", "plated_global_local")


def digest(*parts) -> str:
    """A 16-hex-digit hash of tensors, arrays and numbers; floats rounded to 9 significant
    digits."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            part = part.detach().cpu().numpy()
        array = np.asarray(part)
        if array.dtype.kind == "f":
            with np.errstate(invalid="ignore", divide="ignore"):
                array = np.array([float(f"{x:.9g}") for x in array.ravel()]).reshape(array.shape)
        elif array.dtype.kind == "b":
            array = array.astype(np.int64)
        h.update(str(array.shape).encode())
        h.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
    return h.hexdigest()[:16]


def _oracle(entry):
    made = entry.make()
    return next(made) if inspect.isgenerator(made) else made


def discrete_fingerprints() -> dict[str, str]:
    """``"oracle/run" -> hash`` for every non-sharded oracle of ``CONFORMANCE``."""
    out = {}
    for name, entry in CONFORMANCE.items():
        if name.startswith("sharded"):
            continue
        for label, method, knobs in DISCRETE_RUNS:
            result = sample_any_order(_oracle(entry), DRAWS, seed=7, method=method, schedule=knobs)
            out[f"{name}/{label}"] = digest(result.samples, result.rounds, result.oracle_rows)
    return out


def preset_fingerprints() -> dict[str, str]:
    """``"preset/run" -> hash``: the default windows that depend on the batch and the oracle
    (:func:`~pyro_autospec.engine.methods.default_max_block`), at a size where they differ:
    an oracle without chain queries with 3 and 4 draws in flight, and one with them."""
    stay = torch.tensor([[0.8, 0.2], [0.3, 0.7]], dtype=torch.float64)
    runs = {
        "rows_only_3_draws": (HandChain(64, stay=0.8), 3),
        "rows_only_4_draws": (HandChain(64, stay=0.8), 4),
        "chains_4_draws": (MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 64), 4),
    }
    out = {}
    for label, (oracle, draws) in runs.items():
        result = sample_any_order(oracle, draws, seed=9)
        out[f"preset/{label}"] = digest(
            result.samples, result.rounds, result.oracle_rows, result.schedule["max_block"]
        )
    return out


def diffusion_fingerprints() -> dict[str, str]:
    """``"diffusion/run" -> hash``: an SDE with a nonlinear drift under each rule and method,
    and stochastic localization of a Gaussian mixture."""
    out = {}
    times = torch.linspace(0.0, 1.0, 25, dtype=torch.float64)
    x0 = torch.tensor([0.3, -0.2], dtype=torch.float64)
    for label, knobs in DIFFUSION_RUNS:
        method = knobs.get("method", "autospec")
        schedule = {k: v for k, v in knobs.items() if k != "method"}
        drift = lambda t, x: -torch.sin(2 * x)  # noqa: E731
        result = sample_sde(drift, times, x0, DRAWS, seed=3, method=method, schedule=schedule)
        out[f"diffusion/{label}"] = digest(result.samples, result.rounds, result.oracle_rows)
    means = torch.tensor([[-1.0, 0.5], [1.5, 0.0]], dtype=torch.float64)
    covs = 0.2 * torch.eye(2, dtype=torch.float64).expand(2, 2, 2)
    mixture = GaussianMixtureDenoiser(torch.tensor([0.3, 0.7]), means, covs)
    for label, knobs in (("localization", {}), ("localization_block", {"rule": "block"})):
        result = sample_diffusion(mixture, DRAWS, num_steps=32, seed=5, schedule=knobs)
        out[f"diffusion/{label}"] = digest(result.samples, result.rounds, result.oracle_rows)
    return out


def pyro_fingerprints() -> dict[str, str]:
    """``"pyro/model/sampler" -> hash`` of ``AutoSpec(model).run(*args)`` with both samplers."""
    out = {}
    for name in PYRO_MODELS:
        model, args, _ = CASES[name]
        for sampler in ("auto", "engine"):
            run = AutoSpec(model, num_samples=DRAWS, seed=11, sampler=sampler, disable_progbar=True)
            run.run(*args)
            samples = run.get_samples()
            out[f"pyro/{name}/{sampler}"] = digest(*(samples[k] for k in sorted(samples)))
    return out


def fingerprints() -> dict[str, str]:
    """Every fingerprint, by name."""
    return {
        **discrete_fingerprints(),
        **preset_fingerprints(),
        **diffusion_fingerprints(),
        **pyro_fingerprints(),
    }


def compare(now: dict[str, str], recorded: dict[str, str]) -> list[str]:
    """What moved: names whose hash changed, and names added or gone."""
    lines = [f"moved: {k}" for k in sorted(now) if k in recorded and now[k] != recorded[k]]
    lines += [f"new: {k}" for k in sorted(set(now) - set(recorded))]
    lines += [f"gone: {k}" for k in sorted(set(recorded) - set(now))]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="record the current draws")
    args = parser.parse_args(argv)
    now = fingerprints()
    if args.write:
        RECORDED.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(now)} fingerprints in {RECORDED}")
        return 0
    lines = compare(now, json.loads(RECORDED.read_text()))
    print("\n".join(lines) if lines else f"all {len(now)} fingerprints unchanged")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
