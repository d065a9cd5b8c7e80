"""The one list of sampling methods, their settings and their schedule knobs.

Every other list of methods (the front end's, its error messages) is read from
:data:`METHODS` with :func:`method_names`.

``sample_any_order`` (distributions on ``[q]^n``) and ``sample_diffusion`` / ``sample_sde``
(Euler-Maruyama chains) accept the methods of their setting. Knobs change rounds and rows
(latency against work), never the law of the output; with keyed randomness they do not even
change the draws, except ``max_block`` (which blocks are drafted) and the token-level windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyro_autospec.engine.schedule import BlockPolicy

__all__ = [
    "DIFFUSION",
    "DISCRETE",
    "METHODS",
    "Method",
    "block_policy",
    "default_schedule",
    "knob_names",
    "method_names",
    "resolve_knobs",
]

DISCRETE, DIFFUSION = "discrete", "diffusion"


@dataclass(frozen=True)
class Method:
    """A sampler: its settings, whether its output is exact, and its own knobs.

    ``front_end``: whether the Pyro front end (``AutoSpec``, ``AutoSpecKernel``) offers it;
    a method that exists to test another (``"gumbel_sequential"``) is the engine's only.
    """

    name: str
    settings: tuple[str, ...]
    exact: bool
    summary: str
    knobs: dict = field(default_factory=dict)
    front_end: bool = True


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "autospec",
            (DISCRETE, DIFFUSION),
            True,
            "autospeculation: windows drafted from the prefix, verified in one round each",
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
            front_end=False,
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
        The knobs of :class:`~pyro_autospec.engine.schedule.BlockPolicy` and of the races:

        * ``blocks="adaptive"``: every draw chooses its next window from its own past (grown
          after a window that passed whole, shrunk after one that did not);
          ``"fixed"``: the balanced tiling into blocks of about ``max_block``;
        * ``max_block``: the largest window, ``max(8, 2 sqrt(n))``; ``min_block``: the
          smallest (2); ``first_block``: a draw's first window (``None``: ``max_block``);
        * ``token_below``: windows below this size keep their longest accepted prefix and
          redraw one token from the residual, as in speculative decoding; windows at or above
          it are accepted or rejected whole and repaired by residual races (autospeculation's
          block rule). ``None`` (the default): every window token by token; ``0``: every
          window as a block;
        * ``rho``: batch growth of residual tries (batch ``r`` launches tries
          ``ceil((1+rho)^r) .. ceil((1+rho)^(r+1)) - 1``), and ``race_depth``: races nested
          deeper than this draw their tries by the chain rule instead of recursively;
        * ``max_rows_per_round``: ``None`` (no cap).

    Notes
    -----
    None of these knobs changes the law of the output (:mod:`pyro_autospec.engine.schedule`
    says why); they trade rounds (latency) against rows (work) and, except the caps, change
    which random numbers the draws read. The same seed and knobs give the same draws on any
    device and batch. Every window is drafted from the marginals given the draw's prefix (one
    row) and verified against the chain rule in one round. The token rule with adaptive
    windows is the default because it took fewer rounds and rows than the block rule with
    residual races on every family measured (:doc:`/benchmarks`).

    Examples
    --------
    >>> default_schedule(1024)["max_block"], default_schedule(1024)["token_below"]
    (64, None)
    """
    return {
        "rho": 3.0,
        "max_block": max(8, int(round(2 * math.sqrt(num_coords)))),
        "max_rows_per_round": None,
        "blocks": "adaptive",
        "min_block": 2,
        "first_block": None,
        "race_depth": 1,
        "token_below": None,
    }


def method_names(setting: str | None = None, front_end: bool = False) -> tuple[str, ...]:
    """The names of the methods, in the order of :data:`METHODS`.

    Parameters
    ----------
    setting : {"discrete", "diffusion"}, optional
        Only the methods of this setting (default: all).
    front_end : bool
        Only the methods the Pyro front end offers.

    Examples
    --------
    >>> method_names(DISCRETE, front_end=True)
    ('autospec', 'sequential', 'speculative', 'agr24')
    """
    return tuple(
        name
        for name, method in METHODS.items()
        if (setting is None or setting in method.settings) and (method.front_end or not front_end)
    )


def knob_names(setting: str = DISCRETE) -> tuple[str, ...]:
    """Every knob some method of ``setting`` accepts (the setting's common knobs, the
    ``"autospec"`` schedule's and the baselines' own), in a stable order."""
    names = list(COMMON_KNOBS[setting])
    if setting == DISCRETE:
        names += [k for k in default_schedule(1) if k not in names]
    for method in METHODS.values():
        if setting in method.settings:
            names += [k for k in method.knobs if k not in names]
    return tuple(names)


def block_policy(knobs: dict) -> BlockPolicy:
    """The :class:`~pyro_autospec.engine.schedule.BlockPolicy` of resolved ``"autospec"``
    knobs."""
    return BlockPolicy(
        max_block=int(knobs["max_block"]),
        blocks=knobs.get("blocks", "fixed"),
        min_block=int(knobs.get("min_block", 2)),
        first_block=knobs.get("first_block"),
        race_depth=knobs.get("race_depth"),
        token_below=knobs.get("token_below", 0),
    )


def resolve_knobs(method: str, setting: str, defaults: dict, given: dict) -> dict:
    """The knobs of ``method`` in ``setting``: defaults, then ``given``; unknown ones raise.

    ``defaults`` holds the setting's ``autospec`` knobs (``rho``, ``max_block``), which only
    ``"autospec"`` accepts.
    """
    if method not in METHODS or setting not in METHODS[method].settings:
        names = sorted(method_names(setting))
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
