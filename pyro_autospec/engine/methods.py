"""The one list of sampling methods, their settings and their schedule knobs.

Every other list of methods (the front end's, its error messages) is read from
:data:`METHODS` with :func:`method_names`.

``sample_any_order`` (distributions on ``[q]^n``) and ``sample_diffusion`` / ``sample_sde``
(Euler-Maruyama chains) accept the methods of their setting. Knobs change rounds and rows
(latency against work), never the law of the output; with keyed randomness they do not even
change the draws, except ``max_block`` (which blocks are drafted) and the token-level windows.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from pyro_autospec._warnings import user_stacklevel
from pyro_autospec.engine.schedule import BlockPolicy

__all__ = [
    "DEFAULT",
    "DIFFUSION",
    "DIFFUSION_AUTOSPEC",
    "DISCRETE",
    "METHODS",
    "Method",
    "Schedule",
    "block_policy",
    "on_cpu",
    "default_max_block",
    "default_max_elements",
    "default_schedule",
    "KEYWORD_KNOBS_DEPRECATED",
    "accepts_keyword_knobs",
    "fold_keyword_knobs",
    "given_knobs",
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

#: The knobs of ``"autospec"`` on diffusions (``None``: chosen by the rule when the run
#: starts, :mod:`pyro_autospec.engine.diffusion`).
DIFFUSION_AUTOSPEC = {"rule": "token", "max_block": None, "min_block": None, "rho": None}

#: Knobs every method of a setting accepts, with their defaults.
COMMON_KNOBS = {
    DISCRETE: {"max_rows_per_round": None, "max_elements": None, "max_concurrent_draws": None},
    DIFFUSION: {
        "max_rows_per_round": None,
        "max_rows_per_call": None,
        "max_concurrent_draws": None,
    },
}


class _Default:
    """The value of a :class:`Schedule` field that was not set: the method's default."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DEFAULT"

    def __reduce__(self):
        return (_Default, ())


#: A :class:`Schedule` field left to the method's default (``None`` is a value of its own for
#: some knobs: no cap, no race depth, every window token by token).
DEFAULT: Any = _Default()


@dataclass(frozen=True, eq=False)
class Schedule(Mapping):
    """The knobs of a run's schedule, in one typed object.

    Every sampler (:func:`~pyro_autospec.sample_any_order`, :func:`~pyro_autospec.sample_sde`,
    :func:`~pyro_autospec.sample_diffusion`, :class:`~pyro_autospec.AutoSpec`,
    :class:`~pyro_autospec.AutoSpecKernel`) takes one as ``schedule=``, and every result
    records the schedule that ran as one (``result.schedule``, defaults filled in): passing it
    back with the same seed gives the same draws. A field left unset (:data:`DEFAULT`) takes
    the method's default; a knob the method does not have raises ``TypeError``. It is also a
    read-only mapping of the knobs that are set, so ``**schedule`` and ``schedule["rho"]`` work.
    No knob changes the law of the output: they trade rounds (latency) against rows (work)
    and memory.

    Parameters
    ----------
    max_rows_per_round : int or None
        Every method: a cap on the rows of one round: draws are taken oldest first while
        their requests fit, and a round takes at least one draw's whole request (a window's
        rows), so a cap below one request is exceeded by that draw;
        ``None``: no cap.
    max_concurrent_draws : int or None
        Every method: continuous batching, at most this many draws in flight.
    max_elements : int
        ``[q]^n``: the largest oracle call, in entries of its inputs and outputs: each row
        (or chain) counts its ``n`` input values and ``q`` output entries per coordinate it
        answers, ``n (q + 1)`` for a whole row of ``log_marginals`` (memory; by default
        ``2**20`` on a CPU, ``2**24`` elsewhere, :func:`default_max_elements`).
    max_rows_per_call : int or None
        Diffusions: cut a round into drift calls of at most this many rows (memory).
    max_block : int or None
        ``"autospec"``: the largest window (``[q]^n``: ``max(8, 2 sqrt n)``, or
        ``max(8, sqrt n)`` on an accelerator with 256 draws in flight or more,
        :func:`default_max_block`; diffusions:
        ``max(8, 2 sqrt N)`` for the token rule, the whole chain for the block rule).
    min_block : int
        ``"autospec"``: the smallest adaptive window (2).
    first_block : int or None
        ``"autospec"`` on ``[q]^n``: a draw's first window (``None``: ``max_block``).
    blocks : {"adaptive", "fixed"}
        ``"autospec"`` on ``[q]^n``: windows from each draw's past, or a fixed tiling.
    token_below : int or None
        ``"autospec"`` on ``[q]^n``: windows below this size use the token rule, the others
        the block rule (``None``, the default: every window token by token; ``0``: blocks).
    rule : {"token", "block"}
        ``"autospec"`` on diffusions: step by step (the default) or blocks with residual races.
    rho : float, "adaptive" or callable
        The block rule's growth of residual-try batches (``[q]^n``: 3; diffusions: 1);
        ``"adaptive"`` sizes each race from its rejection (about ``1 / TV`` tries at once,
        :func:`~pyro_autospec.engine.schedule.adaptive_rho`); a callable, diffusions only.
    race_depth : int or None
        ``"autospec"`` on ``[q]^n``: races nested deeper than this draw their tries by the
        chain rule (1; ``None``: never).
    window : int
        ``"speculative"``: tokens drafted per window (8); ``"picard"``: steps per iteration
        (16).
    window_scale : float
        ``"agr24"``: the scale of its window (1).
    tolerance : float
        ``"picard"``: the convergence tolerance (0.1).

    Examples
    --------
    >>> schedule = Schedule(max_block=32, race_depth=None)
    >>> dict(schedule)
    {'max_block': 32, 'race_depth': None}
    >>> schedule.replace(max_block=16)["max_block"]
    16
    >>> Schedule.of({"rho": 2.0, "token_below": 0})
    Schedule(token_below=0, rho=2.0)
    """

    max_rows_per_round: int | None = DEFAULT
    max_concurrent_draws: int | None = DEFAULT
    max_elements: int = DEFAULT
    max_rows_per_call: int | None = DEFAULT
    max_block: int | None = DEFAULT
    min_block: int = DEFAULT
    first_block: int | None = DEFAULT
    blocks: str = DEFAULT
    token_below: int | None = DEFAULT
    rule: str = DEFAULT
    rho: float | str | Callable | None = DEFAULT
    race_depth: int | None = DEFAULT
    window: int = DEFAULT
    window_scale: float = DEFAULT
    tolerance: float = DEFAULT

    @classmethod
    def of(cls, knobs: Mapping) -> Schedule:
        """The schedule of a mapping of knobs (a :class:`Schedule` is returned as is).

        Raises
        ------
        TypeError
            For a name that is no schedule knob, or a value that is not a mapping.
        """
        if isinstance(knobs, Schedule):
            return knobs
        if not isinstance(knobs, Mapping):
            raise TypeError(
                f"schedule must be a Schedule or a dict of schedule knobs; got "
                f"{type(knobs).__name__}"
            )
        unknown = sorted(set(knobs) - set(_FIELDS))
        if unknown:
            raise TypeError(f"unknown schedule knobs {unknown}; a Schedule has {list(_FIELDS)}")
        return cls(**knobs)

    def replace(self, **knobs: Any) -> Schedule:
        """A copy with ``knobs`` set (``DEFAULT`` unsets one)."""
        return Schedule.of({**self, **knobs}) if knobs else self

    def __getitem__(self, name: str) -> Any:
        value = getattr(self, name, DEFAULT) if name in _FIELDS else DEFAULT
        if value is DEFAULT:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return (name for name in _FIELDS if getattr(self, name) is not DEFAULT)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        inside = ", ".join(f"{name}={value!r}" for name, value in self.items())
        return f"Schedule({inside})"


_FIELDS = tuple(f.name for f in fields(Schedule))


def given_knobs(schedule: Mapping | None, knobs: Mapping | None = None) -> dict:
    """The knobs a caller gave: those of ``schedule=`` (a :class:`Schedule` or a dict) and the
    keyword ones (none by default).

    Knobs given as keywords are deprecated (a :class:`FutureWarning` at the user's line names the
    ``schedule=`` to pass instead) and still honoured: a keyword may not repeat a window knob of
    ``schedule``, and a cap (:data:`COMMON_KNOBS`: rows per round or call, elements per call, draws
    in flight) given as a keyword replaces the schedule's. The way to run a result's schedule again
    with other caps is ``schedule=result.schedule.replace(max_concurrent_draws=8)``: with the window
    knobs fixed, caps do not change the draws.

    Examples
    --------
    >>> given_knobs(Schedule(max_block=8, rho=2.0))
    {'max_block': 8, 'rho': 2.0}
    >>> given_knobs({"max_concurrent_draws": 4})
    {'max_concurrent_draws': 4}
    """
    given = {} if schedule is None else dict(Schedule.of(schedule))
    knobs = {} if knobs is None else knobs
    caps = set().union(*COMMON_KNOBS.values())
    twice = sorted((set(given) & set(knobs)) - caps)
    if twice:
        change = ", ".join(f"{name}={knobs[name]!r}" for name in twice)
        raise TypeError(
            f"schedule knobs {twice} given both in schedule= and as keywords; to run a "
            f"schedule with other values for them, pass schedule=schedule.replace({change})"
        )
    known = {name: value for name, value in knobs.items() if name in _FIELDS}
    if known:  # an unknown name is refused by the method's own check, not called deprecated
        warnings.warn(
            _keywords_message(schedule, known), FutureWarning, stacklevel=user_stacklevel()
        )
    return {**given, **knobs}


#: How the :class:`FutureWarning` of knobs given as keywords begins (for warning filters:
#: ``-W "error:schedule knobs as keywords:FutureWarning"``).
KEYWORD_KNOBS_DEPRECATED = "schedule knobs as keywords"


def _keywords_message(schedule: Mapping | None, knobs: Mapping) -> str:
    """What :func:`given_knobs` says of knobs given as keywords: the ``schedule=`` to pass."""
    inside = ", ".join(f"{name}={value!r}" for name, value in knobs.items())
    if schedule is None:
        instead = f"schedule=Schedule({inside}) (from pyro_autospec import Schedule)"
    else:
        instead = f"the schedule with them: schedule=Schedule.of(schedule).replace({inside})"
    return (
        f"{KEYWORD_KNOBS_DEPRECATED} ({inside}) are deprecated and will be refused in a "
        f"future release; pass {instead}"
    )


def fold_keyword_knobs(options: Mapping) -> dict:
    """``options`` (a sampler's keyword arguments) with its schedule knobs folded into one
    ``schedule=`` :class:`Schedule`, warning as :func:`given_knobs` does for knobs given as
    keywords.

    For objects that keep a sampler's options for later calls (the diffusion distributions):
    the warning points at the line that built them, not at a later ``sample()``.

    Examples
    --------
    >>> fold_keyword_knobs({"device": "cpu", "schedule": {"max_block": 8}})
    {'device': 'cpu', 'schedule': Schedule(max_block=8)}
    """
    options = dict(options)
    knobs = {name: options.pop(name) for name in list(options) if name in _FIELDS}
    schedule = options.pop("schedule", None)
    if schedule is None and not knobs:
        return options
    merged = given_knobs(schedule, knobs)
    options["schedule"] = Schedule.of(merged)
    return options


def _refuse_unknown(func: Callable, unknown: list[str]) -> None:
    raise TypeError(
        f"unknown schedule knobs or arguments {unknown} for {func.__qualname__}(); the "
        f"schedule knobs go in schedule=Schedule(...) (one of {list(_FIELDS)})"
    )


def accepts_keyword_knobs(
    refuse_unknown: Callable[[Callable, list[str]], None] | None = None,
) -> Callable[[Callable], Callable]:
    """Decorator: a sampler whose signature takes the schedule only as ``schedule=`` still
    accepts its knobs as keywords, the deprecated spelling, kept out of the signature.

    A keyword that the function does not take and that names a :class:`Schedule` field is
    folded into ``schedule=`` (:func:`given_knobs`: a :class:`FutureWarning` at the user's
    line, the same draws); any other keyword the function does not take is refused by
    ``refuse_unknown(func, names)`` (default: a ``TypeError`` that names the knobs) before the
    function runs. ``inspect.signature`` and ``help()`` show the function's own signature.

    Examples
    --------
    >>> @accepts_keyword_knobs()
    ... def run(n, *, schedule=None):
    ...     return dict(Schedule.of(schedule or {}))
    >>> run(3, schedule=Schedule(rho=2.0))
    {'rho': 2.0}
    >>> str(inspect.signature(run))
    '(n, *, schedule=None)'
    >>> run(3, speed=2)
    Traceback (most recent call last):
    ...
    TypeError: unknown schedule knobs or arguments ['speed'] for run(); the schedule knobs ...
    """
    refuse = refuse_unknown or _refuse_unknown

    def decorate(func: Callable) -> Callable:
        own = set(inspect.signature(func).parameters)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            extra = [name for name in kwargs if name not in own]
            unknown = sorted(name for name in extra if name not in _FIELDS)
            if unknown:
                refuse(func, unknown)
            if extra:  # knobs as keywords: folded into schedule=, with the warning
                knobs = {name: kwargs.pop(name) for name in extra}
                kwargs["schedule"] = Schedule.of(given_knobs(kwargs.get("schedule"), knobs))
            return func(*args, **kwargs)

        return wrapper

    return decorate


def default_max_elements(device) -> int:
    """The default size of one oracle call on ``[q]^n`` (``max_elements``, in entries of its
    inputs and outputs), by device: ``2**20`` on a CPU, ``2**24`` elsewhere.

    A preset by hardware that never changes the draws (a call's size only cuts a round into
    calls). On a CPU, large calls make an oracle's own temporaries tens of megabytes, which
    the allocator may map afresh on every call; a GPU wants large calls. The measurements
    behind it are in ``benchmarks/README.md`` ("A preset by hardware").

    Examples
    --------
    >>> default_max_elements("cpu"), default_max_elements("cuda")
    (1048576, 16777216)
    """
    return 2**20 if on_cpu(device) else 2**24


def on_cpu(device) -> bool:
    """Whether ``device`` (a ``torch.device`` or its name, e.g. ``"cuda:1"``) is the CPU."""
    return str(device).split(":")[0] == "cpu"


#: Draws in flight from which an accelerator's default window is rows-lean
#: (:func:`default_max_block`).
LEAN_DRAWS = 256

#: Draws in flight from which a CPU's default window is rows-lean for an oracle without chain
#: queries (:func:`default_max_block`).
LEAN_ROWS_DRAWS = 4

#: Draws in flight from which a CPU's default window is one coordinate for an oracle without
#: chain queries (:func:`default_max_block`): sequential sampling's draws, on its lock-step path.
SEQUENTIAL_DRAWS = 16


def default_max_block(
    num_coords: int,
    draws_in_flight: int = 1,
    device="cpu",
    chain_queries: bool = True,
    targeted_queries: bool = True,
) -> int:
    """The default largest window of ``"autospec"`` on ``[q]^n`` (``max_block``): a preset by
    hardware, batch and oracle.

    ``max(8, 2 sqrt n)`` (rounds first), except where rows set the time:

    * on an accelerator with at least :data:`LEAN_DRAWS` draws in flight, whose rounds already
      fill the device: ``max(8, sqrt n)``, which spends fewer rows on imperfect oracles for a
      few more rounds on consistent ones;
    * on a CPU with at least :data:`LEAN_ROWS_DRAWS` draws in flight and an oracle without
      chain queries (no ``log_marginals_chain``): ``max(8, sqrt(n) / 4)``. Such an oracle
      pays a full call per verified token, so a round of several draws costs its rows, and
      windows of up to ``2 sqrt n`` spend more rows on an imperfect network than AGR24 does;
      shorter windows bring the rows close to AGR24's, in fewer rounds;
    * on a CPU, whatever the draws, for an oracle with whole rows alone (``log_marginals``,
      no ``log_marginals_at`` and no chain queries): ``max(8, sqrt(n) / 4)`` too. Every
      verified token then costs a whole ``[n, q]`` row, so the rows decide the time, and
      the large calls of long windows cost more per row on a CPU than short ones;
    * on a CPU with at least :data:`SEQUENTIAL_DRAWS` draws in flight and an oracle without
      chain queries: ``1``, a window of one coordinate drawn from its row. These are
      sequential sampling's draws, run on its lock-step path: the draws in flight already fill
      every call, so fewer rounds save nothing, and sequential sampling spends exactly ``n``
      rows, in the smallest calls, with the least work per row.

    On a CPU with chain queries every row is paid for too, but a chain costs about one row, and
    with fewer draws the rounds matter more; the measurements behind each choice are in
    ``benchmarks/README.md`` ("The window with many draws on the H100", "Oracles without chain
    queries on a CPU", "Oracles with whole rows alone on a CPU"). Like every knob it changes
    which random numbers the draws read, not their law; the result records it, and passing
    the schedule back gives the same draws on any device. The diffusions' token rule takes
    ``default_max_block(N)``, ``max(8, 2 sqrt N)`` on every device.

    Examples
    --------
    >>> default_max_block(1024), default_max_block(1024, 256, "cpu")
    (64, 64)
    >>> default_max_block(1024, 256, "cuda"), default_max_block(1024, 255, "cuda")
    (32, 64)
    >>> default_max_block(1024, 4, "cpu", chain_queries=False)
    8
    >>> default_max_block(4096, 4, "cpu", chain_queries=False)
    16
    >>> default_max_block(4096, 16, "cpu", chain_queries=False)
    1
    >>> default_max_block(4096, 16, "cuda", chain_queries=False)
    128
    >>> default_max_block(1024, 3, "cpu", chain_queries=False)
    64
    >>> default_max_block(1024, 1, "cpu", chain_queries=False, targeted_queries=False)
    8
    """
    if on_cpu(device):
        if not chain_queries and draws_in_flight >= SEQUENTIAL_DRAWS:
            return 1
        lean_rows = draws_in_flight >= LEAN_ROWS_DRAWS or not targeted_queries
        if not chain_queries and lean_rows:
            return max(8, int(round(math.sqrt(num_coords) / 4)))
        return max(8, int(round(2 * math.sqrt(num_coords))))
    lean = draws_in_flight >= LEAN_DRAWS
    return max(8, int(round((1 if lean else 2) * math.sqrt(num_coords))))


def default_schedule(num_coords: int) -> dict:
    """The default schedule of ``"autospec"`` on ``[q]^n`` for ``n = num_coords``.

    Returns
    -------
    dict
        The knobs of :class:`~pyro_autospec.engine.schedule.BlockPolicy` and of the races:

        * ``blocks="adaptive"``: every draw chooses its next window from its own past (grown
          after a window that passed whole, shrunk after one that did not);
          ``"fixed"``: the balanced tiling into blocks of about ``max_block`` (runs on the
          reference engine, as the block rule does);
        * ``max_block``: the largest window, ``max(8, 2 sqrt(n))`` (:func:`sample_any_order
          <pyro_autospec.sample_any_order>` takes ``max(8, sqrt(n))`` on an accelerator with
          256 draws in flight or more, ``max(8, sqrt(n) / 4)`` on a CPU with 4 draws in
          flight or more for an oracle without chain queries, and ``1`` (sequential sampling's
          draws) there from 16 draws in flight: :func:`default_max_block`);
          ``min_block``: the smallest (2); ``first_block``: a draw's first window (``None``:
          ``max_block``);
        * ``token_below``: windows below this size keep their longest accepted prefix and
          redraw one token from the residual, as in speculative decoding; windows at or above
          it are accepted or rejected whole and repaired by residual races (autospeculation's
          block rule). ``None`` (the default): every window token by token; ``0``: every
          window as a block;
        * ``rho``: batch growth of residual tries (batch ``r`` launches tries
          ``ceil((1+rho)^r) .. ceil((1+rho)^(r+1)) - 1``; ``"adaptive"``: per race, from
          the rejected draft's log ratio, about ``1 / TV`` tries at once), and
          ``race_depth``: races nested
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
        "max_block": default_max_block(num_coords),
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
    autospec = default_schedule(1) if setting == DISCRETE else DIFFUSION_AUTOSPEC
    names += [k for k in autospec if k not in names]
    for method in METHODS.values():
        if setting in method.settings:
            names += [k for k in method.knobs if k not in names]
    return tuple(names)


def is_count(value: Any, minimum: int = 1) -> bool:
    """Whether ``value`` is an int (Python's or NumPy's, not a bool) of at least ``minimum``.

    Examples
    --------
    >>> is_count(3), is_count(np.int64(1)), is_count(True), is_count(2.0), is_count(0)
    (True, True, False, False, False)
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        return False
    return bool(value >= minimum)


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (Python's or NumPy's, not a bool).

    Examples
    --------
    >>> is_real(0.5), is_real(np.float32(2)), is_real(True), is_real("0.1")
    (True, True, False, False)
    """
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def check_windows(knobs: dict, given: Mapping) -> None:
    """Check the window knobs of resolved ``"autospec"`` knobs (``max_block`` resolved).

    ``min_block`` and ``first_block`` must be positive ints (``first_block`` may be ``None``,
    and is at most ``max_block``); ``token_below`` and ``race_depth`` ints >= 0 or ``None``.
    A ``min_block`` the caller gave above ``max_block`` raises rather than being clamped;
    the default ``min_block`` of 2 becomes a ``max_block`` of 1 in ``knobs``, so that the
    recorded schedule, passed back, gives the same draws.

    Raises
    ------
    ValueError
        For a window knob that is no positive int, or ``min_block > max_block``.

    Examples
    --------
    >>> check_windows({"max_block": 8, "min_block": 16}, given={"min_block": 16})
    Traceback (most recent call last):
    ...
    ValueError: min_block=16 is larger than max_block=8 (this run's default); pass ...
    """
    for name in ("min_block", "first_block"):
        value = knobs.get(name)
        if value is None and name == "first_block":
            continue
        if name in knobs and not is_count(value):
            none = " or None" if name == "first_block" else ""
            raise ValueError(f"{name} must be a positive int{none}; got {value!r}")
    for name in ("token_below", "race_depth"):  # None, or an int >= 0 (not a bool)
        value = knobs.get(name)
        if value is not None and not is_count(value, 0):
            raise ValueError(f"{name} must be an int >= 0 or None; got {value!r}")
    first = knobs.get("first_block")
    if first is not None and first > knobs["max_block"]:
        raise ValueError(
            f"first_block={first} is larger than max_block={knobs['max_block']}; a draw's "
            f"first window is at most max_block: pass a smaller first_block, or a larger "
            f"max_block"
        )
    if knobs["min_block"] <= knobs["max_block"]:
        return
    if "min_block" in given:
        where = "" if "max_block" in given else " (this run's default)"
        raise ValueError(
            f"min_block={knobs['min_block']} is larger than max_block={knobs['max_block']}"
            f"{where}; pass max_block >= {knobs['min_block']} too, or a smaller min_block"
        )
    knobs["min_block"] = knobs["max_block"]  # the recorded schedule holds the window used


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
