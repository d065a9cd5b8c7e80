"""The one list of sampling methods, their settings and their schedule knobs.

``sample_any_order`` (distributions on ``[q]^n``) and ``sample_diffusion`` / ``sample_sde``
(Euler-Maruyama chains) accept the methods of their setting. Knobs change rounds and rows
(latency against work), never the law of the output; with keyed randomness they do not even
change the draws, except ``max_block`` (which blocks are drafted) and the token-level windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["METHODS", "Method", "default_schedule", "resolve_knobs"]

DISCRETE, DIFFUSION = "discrete", "diffusion"


@dataclass(frozen=True)
class Method:
    """A sampler: its settings, whether its output is exact, and its own knobs."""

    name: str
    settings: tuple[str, ...]
    exact: bool
    summary: str
    knobs: dict = field(default_factory=dict)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "autospec",
            (DISCRETE, DIFFUSION),
            True,
            "recursive speculative rejection sampling: about sqrt(n) rounds",
        ),
        Method("sequential", (DISCRETE, DIFFUSION), True, "the chain rule: n rounds"),
        Method(
            "speculative",
            (DISCRETE,),
            True,
            "token-level self-speculation (speculative decoding without a draft model)",
            {"window": 8},
        ),
        Method(
            "agr24",
            (DISCRETE,),
            True,
            "the Gumbel-window sampler of Anari, Gao and Rubinstein (STOC 2024)",
            {"window_scale": 1.0},
        ),
        Method(
            "gumbel_sequential",
            (DISCRETE,),
            True,
            "the chain rule with agr24's fixed Gumbel noise: agr24's path-by-path reference",
        ),
        Method(
            "picard",
            (DIFFUSION,),
            False,
            "ParaDiGMS-style sliding-window Picard iteration (approximate)",
            {"window": 16, "tolerance": 0.1},
        ),
    )
}

#: Knobs every method of a setting accepts, with their defaults.
COMMON_KNOBS = {
    DISCRETE: {"max_rows_per_round": None, "max_elements": 2**24, "max_concurrent_draws": None},
    DIFFUSION: {
        "max_rows_per_round": None,
        "max_rows_per_call": None,
        "max_concurrent_draws": None,
    },
}


def default_schedule(num_coords: int) -> dict:
    """The default schedule of ``"autospec"`` on ``[q]^n`` for ``n = num_coords``.

    Returns
    -------
    dict
        ``rho``: batch growth of residual tries (batch ``r`` launches tries
        ``ceil((1+rho)^r) .. ceil((1+rho)^(r+1)) - 1``); ``max_block``: the largest block that
        is speculated (larger top-level blocks are cut into leaves without a draft, since for
        them ``TV(mu_S, nu_S)`` is close to one and the verification would be wasted);
        ``max_rows_per_round``: ``None`` (no cap).

    Notes
    -----
    None of these knobs changes the law of the output; they trade rounds (latency) against
    rows (work). Larger ``rho`` launches more tries at once: fewer rounds, more cancelled
    rows; ``rho = 3`` starts every residual with three parallel tries. ``max_block`` around
    ``sqrt(n)`` skips verifications of large blocks, which almost surely fail: in a random
    order ``TV(mu_S, nu_S)`` grows like ``|S| / sqrt(n)``; below 8 coordinates a split costs
    more rounds than a failed verification, hence the floor. On the binary Markov chain
    (n = 256..4096, ``benchmarks/rounds.py --sweep``) these defaults took 30-40% fewer rounds
    and fewer rows than ``rho = 1``, ``max_block = 4 sqrt(n)``.

    The defaults minimise rounds, which parallel hardware turns into time. On a CPU every row
    costs: with 16 draws at n = 4096 (Markov chain, HMM, tree Ising model;
    ``benchmarks/engine.py --parts race``) ``max_block=16`` took about twice the rounds, a
    third to a quarter of the rows and 26 to 60% less wall time than ``max_block=64`` (three
    runs).

    Examples
    --------
    >>> default_schedule(1024)
    {'rho': 3.0, 'max_block': 32, 'max_rows_per_round': None}
    """
    return {
        "rho": 3.0,
        "max_block": max(8, int(round(math.sqrt(num_coords)))),
        "max_rows_per_round": None,
    }


def resolve_knobs(method: str, setting: str, defaults: dict, given: dict) -> dict:
    """The knobs of ``method`` in ``setting``: defaults, then ``given``; unknown ones raise.

    ``defaults`` holds the setting's ``autospec`` knobs (``rho``, ``max_block``), which only
    ``"autospec"`` accepts.
    """
    if method not in METHODS or setting not in METHODS[method].settings:
        names = sorted(m for m, spec in METHODS.items() if setting in spec.settings)
        raise ValueError(f"method must be one of {names}; got {method!r}")
    knobs = dict(COMMON_KNOBS[setting])
    if method == "autospec":
        knobs.update(defaults)
    knobs.update(METHODS[method].knobs)
    unknown = sorted(set(given) - set(knobs))
    if unknown:
        raise TypeError(
            f"unknown schedule knobs {unknown} for method {method!r}; it accepts {sorted(knobs)}"
        )
    knobs.update(given)
    return knobs
