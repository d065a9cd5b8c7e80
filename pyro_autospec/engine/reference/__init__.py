"""The reference engine: every draw and every residual try as a plain Python generator.

Slow and obviously correct. It shares with the fast engine only the keyed randomness, the
acceptance rules and the checked oracle access, so both give the same draws for the same seed:
the fast engine is tested against it draw for draw. It is also the one engine of the block
rule (windows accepted whole, residual races), which the samplers send here whatever their
``engine``.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import torch

from pyro_autospec.engine.euler import EulerOutput
from pyro_autospec.engine.euler_tokens import token_policy
from pyro_autospec.engine.methods import block_policy
from pyro_autospec.engine.reference.discrete import ReferenceDiscrete, token_draw
from pyro_autospec.engine.reference.euler import (
    ReferenceEuler,
    picard_draw,
    sequential_draw,
    steps_draw,
)
from pyro_autospec.engine.reference.recursion import draw
from pyro_autospec.engine.reference.scheduler import Scheduler
from pyro_autospec.engine.schedule import leaf_starts

__all__ = ["run_discrete", "run_euler"]


def run_discrete(rows, draw_keys: torch.Tensor, method: str, knobs: dict, progress: bool):
    """Run ``method`` on ``[q]^n`` with the reference engine.

    Returns
    -------
    samples : LongTensor[N, n]
    log_prob : DoubleTensor[N]
    rounds, oracle_rows : int
    sample_rounds : LongTensor[N]
    """
    rho = knobs.get("rho", 1.0)
    problem = ReferenceDiscrete(rows, rho if rho == "adaptive" else float(rho))
    if method == "autospec":
        leaves = leaf_starts(rows.n, int(knobs["max_block"]))
        policy = block_policy(knobs)
        roots = [draw(problem, s, int(k), leaves, policy) for s, k in enumerate(draw_keys.tolist())]
    else:
        roots = [
            token_draw(problem, method, s, int(k), knobs) for s, k in enumerate(draw_keys.tolist())
        ]
    roots = [_in_flight(problem, s, root) for s, root in enumerate(roots)]
    results, stats = _schedule(problem, roots, method, knobs, progress)
    samples = torch.from_numpy(np.stack([r[0] for r in results]))
    log_prob = torch.tensor([r[1] for r in results], dtype=torch.float64)
    return samples, log_prob, *stats


def _in_flight(problem: ReferenceDiscrete, s: int, root: Generator) -> Generator:
    """Draw ``s``'s generator between :meth:`~ReferenceDiscrete.start` and
    :meth:`~ReferenceDiscrete.finish`: it holds its order only while it runs (the scheduler
    starts a root when it first advances it)."""
    problem.start(s)
    try:
        return (yield from root)
    finally:
        problem.finish(s)


def run_euler(chain, evaluate, x0, draw_keys: torch.Tensor, method: str, knobs: dict, progress):
    """Run ``method`` on an Euler-Maruyama chain with the reference engine.

    Returns
    -------
    EulerOutput
        With the whole paths (and for ``"picard"`` the fixed noise, ``log_prob`` None).
    """
    problem = ReferenceEuler(chain, evaluate, x0, knobs.get("rho", 1.0))
    if method == "autospec" and knobs["rule"] == "token":
        policy = token_policy(knobs)
        roots = [steps_draw(problem, s, k, policy) for s, k in enumerate(draw_keys.tolist())]
    elif method == "autospec":
        leaves = leaf_starts(chain.num_steps, int(knobs["max_block"] or chain.num_steps))
        roots = [draw(problem, s, k, leaves) for s, k in enumerate(draw_keys.tolist())]
    elif method == "sequential":
        roots = [sequential_draw(problem, s, k) for s, k in enumerate(draw_keys.tolist())]
    else:
        roots = [
            picard_draw(problem, s, k, knobs["window"], knobs["tolerance"])
            for s, k in enumerate(draw_keys.tolist())
        ]
    results, stats = _schedule(problem, roots, method, knobs, progress)
    paths = torch.stack([r[0] for r in results])
    second = [r[1] for r in results]
    log_prob = noise = None
    if method == "picard":
        noise = torch.stack(second)
    else:
        log_prob = torch.tensor(second, dtype=torch.float64)
    rounds, rows, sample_rounds = stats
    return EulerOutput(paths[:, -1], paths, log_prob, rounds, rows, sample_rounds, noise=noise)


def _schedule(problem, roots: list, method: str, knobs: dict, progress) -> tuple[list, tuple]:
    """Run the draws' generators on one round scheduler: their results, and
    ``(rounds, rows, sample_rounds: LongTensor[N])``."""
    scheduler = Scheduler(
        problem.dispatch,
        max_rows_per_round=knobs["max_rows_per_round"],
        max_concurrent=knobs["max_concurrent_draws"],
        progress=progress,
        desc=method,
    )
    results = scheduler.run(roots)
    stats = scheduler.stats
    sample_rounds = torch.tensor(stats.sample_rounds, dtype=torch.long)
    return results, (stats.rounds, stats.oracle_rows, sample_rounds)
