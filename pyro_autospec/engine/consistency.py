"""A check, before sampling, that an oracle gives one answer to one question.

The engine asks the same conditional in several ways: as a targeted row
(``log_marginals_at``) or a full row (``log_marginals``), inside a chain query
(``log_marginals_chain``), after a chain (``log_marginals_chain_then``), alone or batched
with other rows, and with arbitrary values at the unpinned coordinates. Every sampler is exact
for the oracle's chain rule only if all of these agree: a chain query that forgets to pin its
cut, or rows that read unpinned values, give each sampler its own law, and a test that
compares autospeculation with the sequential sampler on such an oracle fails for the oracle's
reason, not the sampler's.

:func:`check_consistency` asks a handful of small questions every way the oracle offers and
raises :class:`~pyro_autospec.engine.errors.OracleError` where two answers differ. It draws
no random numbers (the questions follow a fixed order and fixed values), so the
draws that follow do not change; it costs at most ``2 L + 14`` oracle calls of at most ``L``
rows, ``L = min(n, 8)``, one of :data:`LARGE_CALL` rows, and for ``n <= 5`` seven more of
``n 2^(n - 1)`` rows (every conditional, :func:`_every_question`), and asks only the methods
the engine would ask. It
cannot prove an oracle consistent, only catch the common slips (differences of a hundredth
in probability or more), and an oracle with random answers (one question asked twice, word
for word, may differ by no more than the rounding of the output's dtype). A row that reads
an unpinned coordinate only when it holds a value other than those asked (the values 0, 1, 2
and ``q - 1``, and the three most probable of a probed coordinate) passes it.
"""

from __future__ import annotations

import torch

from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.methods import default_max_elements
from pyro_autospec.engine.modes import calling, engine_mode, foreign_inputs
from pyro_autospec.engine.protocols import Capabilities
from pyro_autospec.engine.rows import _tolerance as row_tolerance
from pyro_autospec.engine.rows import then_pair

__all__ = ["check_consistency", "check_drift_consistency", "PROBE_LENGTH"]

#: Why an oracle may answer one question two ways, and the fix (in both checks' messages).
_EVAL_HINT = "(a network in training mode with dropout does not: call .eval() on it)"

#: How many coordinates the questions pin at most.
PROBE_LENGTH = 8


#: The smallest difference in probability taken as two answers, whatever the output's dtype:
#: a network computed in bfloat16 and returned in float32 or float64 differs between two
#: routes by a few thousandths; the slips this check is for differ by a tenth or more.
TOLERANCE = 0.01


def _tolerance(dtype: torch.dtype) -> float:
    """Largest difference in probability two answers to one question may show:
    :data:`TOLERANCE`, or the row checks' allowance for a narrower output (``1000 eps``, at
    most ``0.05``)."""
    return max(TOLERANCE, row_tolerance(dtype))


class _LeftToTheEngine(Exception):
    """An answer of the wrong type or shape: the engine's own checks report it."""


class _Probe:
    """The questions and the oracle's answers, on one device, for the last target of a family
    (not target 0, so that a method that forgets its ``draws`` answers another question)."""

    def __init__(
        self,
        oracle,
        device: torch.device,
        grad_enabled: bool,
        caps: Capabilities,
        reverse: bool = False,
        target: int | None = None,
    ):
        self.oracle = oracle
        self.device = device
        self.n, self.q = int(oracle.num_coords), int(oracle.num_values)
        self.caps = caps
        self.family = caps.num_draws is not None
        last = max(caps.num_draws - 1, 0) if self.family else 0
        self.target = last if target is None else target
        self.call = calling(oracle, grad_enabled, caps.inference_safe)  # as the engine calls it
        self.tolerance = TOLERANCE
        self.rounding = 0.0  # the rows' rounding allowance, of the widest dtype returned
        generator = torch.Generator().manual_seed(0)
        self.order = torch.randperm(self.n, generator=generator)[: min(self.n, PROBE_LENGTH)]
        if reverse:  # the same coordinates the other way: each pair is asked both ways round
            self.order = self.order.flip(0)

    def _extra(self, rows: int, draws: torch.Tensor | None = None) -> dict:
        """The ``draws=`` of a call of ``rows`` rows: the probe's target, or ``draws`` (one
        target per row)."""
        if not self.family:
            return {}
        if draws is not None:
            return {"draws": draws.to(self.device, copy=True)}
        return {"draws": torch.full((rows,), self.target, dtype=torch.long, device=self.device)}

    def _normalised(self, out, name: str, shape: tuple, coords=None) -> torch.Tensor:
        """``out`` checked for its ``shape`` (else the engine reports it) and normalised in
        float64 on the host; of full rows ``[B, n, q]``, only coordinate ``coords[b]`` of row
        ``b``."""
        if (
            not isinstance(out, torch.Tensor)
            or tuple(out.shape) != shape
            or not out.dtype.is_floating_point
            or out.layout != torch.strided
            or out.device.type != self.device.type
        ):
            raise _LeftToTheEngine  # its output checks name what is wrong, and the fix
        self.tolerance = max(self.tolerance, _tolerance(out.dtype))
        self.rounding = max(self.rounding, row_tolerance(out.dtype))
        out = out.detach()
        if coords is not None:
            out = out[torch.arange(shape[0], device=out.device), coords.to(out.device)]
        return torch.log_softmax(out.to("cpu", torch.float64), -1)

    def pinned(self, k: int) -> torch.Tensor:
        """BoolTensor[n]: the coordinates ``order[:k]``."""
        mask = torch.zeros(self.n, dtype=torch.bool)
        mask[self.order[:k]] = True
        return mask

    def inputs(self, values: torch.Tensor, pinned: list[int]):
        """``values`` [B, n] and the masks [B, n] pinning ``order[:pinned[b]]``."""
        mask = torch.stack([self.pinned(k) for k in pinned])
        return values.to(self.device, copy=True), mask.to(self.device)

    def rows(self, values: torch.Tensor, pinned: list[int], targeted: bool) -> torch.Tensor:
        """Row ``b``: the conditional of ``order[pinned[b]]`` given ``order[:pinned[b]]``."""
        values, mask = self.inputs(values, pinned)
        return self.ask(values, mask, self.order[pinned], targeted)

    def ask(
        self,
        values: torch.Tensor,
        mask: torch.Tensor,
        coords: torch.Tensor,
        targeted: bool,
        draws: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Row ``b`` ([B, q], normalised): the conditional of coordinate ``coords[b]`` given
        ``values[b]`` where ``mask[b]`` (``values``, ``mask`` [B, n] on the device); for a
        family, of target ``draws[b]`` (default: the probe's)."""
        rows = len(coords)
        with self.call():
            if targeted:
                targets = coords.view(-1, 1).to(self.device, copy=True)
                extra = self._extra(rows, draws)
                out = self.oracle.log_marginals_at(values, mask, targets, **extra)
                return self._normalised(out, "log_marginals_at", (rows, 1, self.q))[:, 0]
            # full rows in calls no larger than the engine's own on this device
            per_call = max(1, default_max_elements(self.device) // (self.n * self.q))
            pieces = []
            for lo in range(0, rows, per_call):
                part = slice(lo, lo + per_call)
                size = len(coords[part])
                extra = self._extra(size, None if draws is None else draws[part])
                out = self.oracle.log_marginals(values[part], mask[part], **extra)
                shape = (size, self.n, self.q)
                pieces.append(self._normalised(out, "log_marginals", shape, coords[part]))
        return torch.cat(pieces)

    def grouped_rows(self, values: torch.Tensor, pinned: list[int], width: int) -> torch.Tensor:
        """As :meth:`rows` through ``log_marginals_at``, each row asking ``width`` targets out
        of coordinate order: ``order[pinned[b]]`` and the ``width - 1`` smallest unpinned
        other coordinates, the largest first, so that an answer in any order but the
        targets' shows, also one that only a call of that many targets per row gives. Rows
        with fewer unpinned partners (the last ones) are left out."""
        values, mask = self.inputs(values, pinned)
        free = ~mask.cpu()
        coords = self.order[pinned]
        free[torch.arange(len(pinned)), coords] = False
        asked = int((free.sum(1) >= width - 1).sum())  # a prefix: rows pin more and more
        partners = [torch.nonzero(free[b]).flatten()[: width - 1] for b in range(asked)]
        targets = torch.stack(
            [
                torch.cat([coords[b : b + 1], partners[b]]).sort(descending=True).values
                for b in range(asked)
            ]
        ).reshape(asked, width)
        place = (targets == coords[:asked, None]).long().argmax(1)
        with self.call():
            out = self.oracle.log_marginals_at(
                values[:asked],
                mask[:asked],
                targets.to(self.device, copy=True),
                **self._extra(asked),
            )
        out = self._normalised(out, "log_marginals_at", (asked, width, self.q))
        return out[torch.arange(asked), place]

    def chains(
        self,
        values: torch.Tensor,
        cuts: list[int],
        length: int,
        then: bool,
        draws: torch.Tensor | None = None,
    ):
        """Chain ``c``: ``order[cuts[c]:cuts[c] + length]`` given ``order[:cuts[c]]`` of
        ``values`` ([n], or [C, n]: one assignment per chain), all in one call; for a family,
        of target ``draws[c]`` (default: the probe's); with ``then``, also the row of the
        coordinate after each chain."""
        values, mask = self.inputs(values.expand(len(cuts), -1), cuts)
        chain = torch.stack([self.order[cut : cut + length] for cut in cuts])
        chain = chain.to(self.device, copy=True)
        extra, shape = self._extra(len(cuts), draws), (len(cuts), length, self.q)
        with self.call():
            if not then:
                out = self.oracle.log_marginals_chain(values, mask, chain, **extra)
                return self._normalised(out, "log_marginals_chain", shape), None
            after_coord = torch.stack([self.order[cut + length : cut + length + 1] for cut in cuts])
            out, after = then_pair(
                self.oracle.log_marginals_chain_then(
                    values, mask, chain, after_coord.to(self.device, copy=True), **extra
                )
            )
        out = self._normalised(out, "log_marginals_chain_then", shape)
        after = self._normalised(after, "log_marginals_chain_then", (len(cuts), 1, self.q))
        return out, after[:, 0]

    def compare_again(self, answer: torch.Tensor, expected: torch.Tensor, first: int) -> None:
        """Raise if one question asked twice, with the same inputs in a call of the same size,
        got answers ``answer`` and ``expected`` (``[1, q]``) further apart than the rounding of
        the output's dtype: an oracle with its own random state, whose noise may be too small
        for :meth:`compare` to see."""
        gap = float(torch.nan_to_num((answer.exp() - expected.exp()).abs().amax(), nan=0.0))
        if not gap > self.rounding:
            return
        raise OracleError(
            f"The oracle answers the same question twice with two answers: the conditional of "
            f"coordinate {int(self.order[first])} given {first} pinned coordinates, asked twice "
            f"with the same inputs, changed by {gap:.3g} in probability (more than the "
            f"{self.rounding:.3g} its dtype's rounding allows). Every sampler is exact for "
            "the oracle's chain rule only if the same question gets the same answer each time: "
            "an oracle that draws random numbers (noise, sampling) has no chain rule, and each "
            f"sampler would draw from a law of its own {_EVAL_HINT}. Make its answers a "
            "function of the question; if the difference is rounding of a nondeterministic "
            "kernel, set "
            "consistent_queries = True on the oracle to skip this check."
        )

    def compare_rows(
        self, answer: torch.Tensor, expected: torch.Tensor, rows: torch.Tensor, how: str, base: str
    ) -> None:
        """As :meth:`compare`, for rows ``b`` that ask the conditional of coordinate
        ``order[rows[b]]`` given ``order[:rows[b]]``."""
        gap = torch.nan_to_num((answer.exp() - expected.exp()).abs().amax(-1), nan=0.0)
        worst = int(gap.argmax())
        if float(gap[worst]) > self.tolerance:
            first = int(rows[worst])
            self.compare(answer[worst : worst + 1], expected[worst : worst + 1], how, base, first)

    def compare(
        self, answer: torch.Tensor, expected: torch.Tensor, how: str, base: str, first: int = 0
    ) -> None:
        """Raise if the conditionals ``answer`` [K, q] and ``expected`` [K, q] (of the
        coordinates ``order[first:first + K]``) differ."""
        gap = (answer.exp() - expected.exp()).abs().amax(-1)
        gap = torch.nan_to_num(gap, nan=0.0)  # NaN is for the engine's row checks to report
        worst = int(gap.argmax())
        if not float(gap[worst]) > self.tolerance:
            return
        coord, given = int(self.order[first + worst]), first + worst
        raise OracleError(
            f"The oracle answers one conditional two ways: {how} differs from {base} (the "
            f"conditional of coordinate {coord} given {given} pinned coordinates) "
            f"by {float(gap[worst]):.3g} in probability (more than {self.tolerance:.3g}). "
            "Every sampler is exact for the oracle's chain rule only if all its methods agree: "
            "a chain query must pin the prefix (mask) and the chain coordinates before each "
            "row (each chain of a batch its own), log_marginals_at must answer its targets in "
            "the order given, a row must ignore the values at unpinned coordinates and not "
            "depend on the other rows of its batch (nor read another row's values, or for a "
            "family another row's target: draws[b] is row b's), and the same question must get "
            "the same "
            f"answer each time {_EVAL_HINT}. Fix the method named, or remove it (the engine then "
            "asks plain rows). If the methods are right and differ by rounding only, set "
            "consistent_queries = True on the oracle to skip this check."
        )


def check_consistency(
    oracle, device: torch.device | str = "cpu", capabilities: Capabilities | None = None
) -> None:
    """Raise :class:`~pyro_autospec.engine.errors.OracleError` where the oracle answers one
    question two ways.

    Pins the coordinates of a fixed order one by one at a probable value (0 and values other
    than 0 in turn, each with at least :data:`TOLERANCE` of the mass where it can; one row
    each, so the prefix has positive probability; for a family, the last target), asks the
    last of these rows once more with the same inputs (the answers may differ by the rounding
    of the output's dtype only: ``1000 eps``, at least ``1e-5``, at most ``0.05``), and asks
    the same conditionals again, only through the methods the engine will call: all in one batch
    with other values at every unpinned coordinate (a batch for each of the values 1, 2 and
    ``q - 1`` that exist; at a probed coordinate its most, second and third most probable
    value but 0), as targeted rows (``log_marginals_at``,
    else full rows; and 2, 3 and up to :data:`WIDE_TARGETS` targets per row, the largest
    coordinate first), and as chain queries from two cuts (0, and 2, after a pin at 0 where 0
    has that mass), one chain per call, two in one call and :data:`WIDE_CHAINS` in one call
    (their cuts cycling), with the row after the chain where the
    oracle answers it (``log_marginals_chain_then``). Then the rows alone and in the batches
    again along the reverse order, so that each pair of probed coordinates is asked with either
    one unpinned; and a second assignment (the other kind of value pinned at each step; for a
    family, target 0) asked alone, then alternating with the first in one call, rows and
    chains (:func:`_mixed_batches`). The answers must agree within
    :data:`TOLERANCE` in probability (more for outputs narrower than float32). Rows with NaN or
    that do not sum to one are left to the engine's row checks, which name them.

    Parameters
    ----------
    oracle : MarginalOracle
        Its ``num_coords`` and ``num_values`` already checked.
    device : torch.device or str
        Where the engine will ask it.
    capabilities : Capabilities, optional
        What ``oracle`` offers, as a run already read it; read from ``oracle`` if not given.

    Raises
    ------
    OracleError
        Naming the two ways that disagree and by how much.

    An oracle that sets ``consistent_queries = True`` is not checked by the engine
    (:func:`~pyro_autospec.engine.protocols.declares_consistent_queries`).

    Examples
    --------
    >>> from pyro_autospec.oracles import MarkovChainOracle
    >>> stay = torch.tensor([[0.8, 0.2], [0.2, 0.8]])
    >>> chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 16)
    >>> check_consistency(chain)
    >>> class Unpinned:  # a chain query that forgets its prefix
    ...     num_coords, num_values = 16, 2
    ...     def log_marginals(self, values, mask):
    ...         return chain.log_marginals(values, mask)
    ...     def log_marginals_chain(self, values, mask, c):
    ...         return chain.log_marginals_chain(values, torch.zeros_like(mask), c)
    >>> check_consistency(Unpinned())
    Traceback (most recent call last):
    ...
    pyro_autospec.engine.errors.OracleError: The oracle answers one conditional two ways: ...
    """
    caps = Capabilities.of(oracle) if capabilities is None else capabilities
    grad_enabled = torch.is_grad_enabled()
    # the oracle is called as the engine calls it: its inputs made in inference mode, unless it
    # needs ordinary ones (the engine makes those outside it)
    ordinary_inputs = foreign_inputs(oracle, grad_enabled, caps.inference_safe, caps.borrows_inputs)
    try:
        with engine_mode(not ordinary_inputs):
            forward = _Probe(oracle, torch.device(device), grad_enabled, caps)
            asked = _check(forward)
            if asked is not None:  # two assignments (two targets of a family) in one call
                second = _Probe(oracle, torch.device(device), grad_enabled, caps, target=0)
                _mixed_batches(forward, asked, second)
            # a row reads an unpinned coordinate only if that coordinate comes after it in the
            # probe's order: the rows again in the reverse order, so that every pair of probed
            # coordinates is asked with the other one unpinned
            _check(_Probe(oracle, torch.device(device), grad_enabled, caps, reverse=True), True)
            if asked is not None and forward.n <= EVERY_QUESTION_SIZE:
                _every_question(forward, *asked)
    except _LeftToTheEngine:
        pass


def _pinned_value(row: torch.Tensor, k: int) -> int:
    """The value the ``k``-th question pins, with at least :data:`TOLERANCE` of the mass
    where it can (so the pinned prefix keeps a positive probability), else the most
    probable: 0 at odd ``k``, so that a method taking a pinned 0 for unpinned (0 as padding)
    answers another question; at even ``k`` the most probable value other than 0, so that a
    method reading zeros instead of its ``values`` (a buffer never filled) does."""
    if k % 2 and float(row[0].exp()) >= TOLERANCE:
        return 0
    others = row[1:].exp()
    if others.numel() and float(others.max()) >= TOLERANCE:
        return 1 + int(others.argmax())
    return int(row.argmax())


def _scrambled(
    probe: _Probe, values: torch.Tensor, expected: torch.Tensor
) -> list[tuple[str, torch.Tensor]]:
    """The probe's questions with other values at the unpinned coordinates: for each fill
    ``r`` (up to three, by the values ``1, 2, q - 1`` that differ), a name and the inputs
    ``[L, n]`` of the ``L`` probed rows, where each coordinate not pinned by a row holds the
    fill's value, or at a probed coordinate its ``r``-th most probable value but 0 (in its
    support; the rows asked alone saw 0 there, where the values start)."""
    fills = sorted({v for v in (1, 2, probe.q - 1) if 1 <= v < probe.q}) or [0]
    ranked = expected.clone()
    ranked[:, 0] = -float("inf")
    ranked = torch.sort(ranked, dim=-1, descending=True, stable=True).indices  # [L, q]
    batches = []
    for r, fill in enumerate(fills):
        other = values.clone()
        other[probe.pinned(len(expected)).logical_not()] = fill
        for j, row in enumerate(expected):
            value = int(ranked[j, min(r, probe.q - 1)])
            if value != 0 and torch.isfinite(row[value]):
                other[probe.order[j]] = value
        inputs = torch.stack(
            [torch.where(probe.pinned(k), values, other) for k in range(len(expected))]
        )
        batches.append((f"filled with {fill}", inputs))
    return batches


def _every_question(probe: _Probe, values: torch.Tensor, expected: torch.Tensor) -> None:
    """Ask every conditional of one coordinate given any set of the others (``n 2^(n - 1)``
    rows), pinned at ``values``, with zeros and with other values at the unpinned coordinates,
    and raise where a row moves: a row may read unpinned coordinates only in a way the
    probes along two orders do not ask (whether two of them differ; a coordinate pinned out of
    order). For an oracle of at most :data:`EVERY_QUESTION_SIZE` coordinates, all of them
    probed (``expected`` [n, q]: each coordinate's row along the probe's order)."""
    n, q, targeted = probe.n, probe.q, probe.caps.targeted
    coords, masks = [], []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for bits in range(1 << (n - 1)):
            mask = torch.zeros(n, dtype=torch.bool)
            mask[[j for b, j in enumerate(others) if bits >> b & 1]] = True
            coords.append(i)
            masks.append(mask)
    coords, mask = torch.tensor(coords), torch.stack(masks)
    ranked = expected.clone()
    ranked[:, 0] = -float("inf")  # values other than 0 at each coordinate, most probable first
    ranked = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    by_coord = torch.empty_like(ranked)
    by_coord[probe.order] = ranked
    finite = torch.isfinite(expected.gather(1, ranked))
    finite_by_coord = torch.empty_like(finite)
    finite_by_coord[probe.order] = finite
    # [n] values at the unpinned coordinates instead of zeros, each in its coordinate's
    # support: its most probable value but 0 (its second, its third), and the most probable
    # at every other coordinate, so that two unpinned coordinates differ
    ranks = [by_coord[:, r].where(finite_by_coord[:, r], 0) for r in range(min(3, q - 1))]
    names = ["the most probable value but 0", "the second", "the third"]
    fills = list(zip(names, ranks))
    if ranks:
        parity = torch.arange(n) % 2
        for side in (0, 1):
            fill = ranks[0].where(parity == side, 0)
            fills.append(("values that differ from one coordinate to the next", fill))
    device = probe.device
    base_values = torch.where(mask, values, 0)
    # copies for each call, as the engine hands them: an oracle that writes into its inputs
    # after reading them (harmless in sampling) must not change the later questions
    base = probe.ask(
        base_values.to(device, copy=True), mask.to(device, copy=True), coords, targeted
    )
    back = torch.arange(len(coords)).flip(0)  # the same call in reverse order
    fills.append(("zeros, in the call's reverse order", None))
    for name, fill in fills:
        if fill is None:
            answer = probe.ask(
                base_values[back].to(device), mask[back].to(device), coords[back], targeted
            )[back]
        else:
            scrambled = torch.where(mask, values, fill)
            answer = probe.ask(scrambled.to(device), mask.to(device, copy=True), coords, targeted)
        gap = torch.nan_to_num((answer.exp() - base.exp()).abs().amax(-1), nan=0.0)
        worst = int(gap.argmax())
        if float(gap[worst]) > probe.tolerance:
            given = torch.nonzero(mask[worst]).flatten().tolist()
            raise OracleError(
                f"The oracle answers one conditional two ways: the conditional of coordinate "
                f"{int(coords[worst])} given coordinates {given} changes by "
                f"{float(gap[worst]):.3g} in probability (more than {probe.tolerance:.3g}) "
                f"when the coordinates not pinned hold {name} instead of 0. A row must "
                "ignore the values at unpinned coordinates (read values only where mask is "
                "True). If the difference is rounding only, set consistent_queries = True on "
                "the oracle to skip this check."
            )


#: The rows of the call that asks the probe's rows again, repeated and in reverse order.
LARGE_CALL = 64

#: The most targets per row that the probe's targeted rows ask in one call.
WIDE_TARGETS = 16

#: The chains of the call that asks the probe's chains many at a time.
WIDE_CHAINS = 16

#: Oracles of at most this many coordinates are asked every conditional
#: (:func:`_every_question`, ``n 2^(n - 1)`` rows: 80 at 5).
EVERY_QUESTION_SIZE = 5


def _rows_alone(probe: _Probe, again: bool = False, other_values: bool = False):
    """The probe's rows asked one at a time along its order, each coordinate then pinned in
    its support (:func:`_pinned_value`; ``other_values``: the other kind of value at each
    step). With ``again``, the last question is asked a second time, word for word. Returns
    the values pinned ([n]) and the rows ([L, q]), or ``None`` where a row has no mass."""
    targeted = probe.caps.targeted
    values = torch.zeros(probe.n, dtype=torch.long)
    expected = []
    length = len(probe.order)
    for k in range(length):
        row = probe.rows(values.unsqueeze(0), [k], targeted)[0]
        if not bool(torch.isfinite(row).any()):
            return None
        if again and k == length - 1:
            repeated = probe.rows(values.unsqueeze(0), [k], targeted)
            probe.compare_again(repeated, row.unsqueeze(0), k)
        expected.append(row)
        values[probe.order[k]] = _pinned_value(row, k + int(other_values))
    return values, torch.stack(expected)


def _mixed_batches(first: _Probe, asked: tuple, second: _Probe) -> None:
    """Rows and chains of two assignments (for a family, of two targets) in one call.

    ``second`` pins the other kind of value at each step of the same order (and asks target
    0 of a family, where ``first`` asks the last): its rows asked alone, then ``first``'s and
    its rows alternating in one call, and their chains (cuts 0 and 2) in one call, must each
    be the row asked alone. A method that reads the first row's or chain's values for the
    whole call (``values[:1]``), or the first row's target (``draws[0]``), answers the other
    assignment's question in every second row.
    """
    other = _rows_alone(second, other_values=True)
    if other is None:
        return
    (values_a, expected_a), (values_b, expected_b) = asked, other
    length, targeted = len(expected_a), first.caps.targeted
    way = "log_marginals_at" if targeted else "log_marginals"
    base = f"{way} asked one row at a time"
    pinned = torch.arange(length).repeat_interleave(2)  # row 2k: first's, 2k + 1: second's
    values = torch.stack([values_a, values_b]).repeat(length, 1)
    draws = torch.tensor([first.target, second.target]).repeat(length)
    mask = torch.stack([first.pinned(int(k)) for k in pinned])
    answer = first.ask(
        values.to(first.device), mask.to(first.device), first.order[pinned], targeted, draws
    )
    whose = "for two targets of the family" if first.family else "of two assignments"
    how = f"{way} asked rows {whose} alternating in one call"
    steps = torch.arange(length)
    first.compare_rows(answer[0::2], expected_a, steps, how, base)
    second.compare_rows(answer[1::2], expected_b, steps, how, base)
    cut = min(2, length - 1)
    if first.caps.chains and cut >= 1:
        size = length - cut
        cuts = [0, cut, 0, cut]
        chain_values = torch.stack([values_a, values_a, values_b, values_b])
        chain_draws = torch.tensor([first.target] * 2 + [second.target] * 2)
        out, _ = first.chains(chain_values, cuts, size, then=False, draws=chain_draws)
        how = f"log_marginals_chain asked chains {whose} in one call (cuts 0 and {cut} each)"
        for c, (probe, expected) in enumerate(
            [(first, expected_a), (first, expected_a), (second, expected_b), (second, expected_b)]
        ):
            start = cuts[c]
            probe.compare(out[c], expected[start : start + size], how, base, first=start)


def _check(probe: _Probe, rows_only: bool = False):
    """Ask ``probe``'s questions; with ``rows_only``, only the rows alone and in the batches
    with other values at the unpinned coordinates (the other ways were asked already).
    Returns the values pinned along the probe's order ([n]) and the rows asked alone
    ([L, q]), or ``None`` where a row has no mass (the engine's row checks report it)."""
    length = len(probe.order)
    targeted = probe.caps.targeted
    way = "log_marginals_at" if targeted else "log_marginals"
    base = f"{way} asked one row at a time"
    alone = _rows_alone(probe, again=True)
    if alone is None:
        return None  # no mass: the engine's row checks report it
    values, expected = alone
    pinned = list(range(length))
    # the same rows in one batch, with other values wherever a coordinate is not pinned, so
    # that a row reading an unpinned coordinate shows it: a batch per fill (up to three:
    # values 1, 2 and q - 1), since a row may read one value only. At a probed coordinate the
    # fill's most probable value but 0 (its second, its third), in its support as the
    # engine's values are; at the others (whose rows were not asked) the fill's value
    batches = _scrambled(probe, values, expected)
    for fill, scrambled in batches:
        how = f"{way} with other values at the unpinned coordinates ({fill}), in one batch"
        probe.compare(probe.rows(scrambled, pinned, targeted), expected, how, base)
    if rows_only:
        return values, expected
    # the same rows repeated to a call of LARGE_CALL rows, in reverse order: a row that
    # depends on its place or on the size of its call (a chunk of rows reading the first
    # chunk's mask; another path past a size) shows
    rows = torch.arange(length).repeat(max(1, LARGE_CALL // length)).flip(0)
    answer = probe.rows(values.expand(len(rows), -1), rows.tolist(), targeted)
    how = f"{way} asked again in a call of {len(rows)} rows, in reverse order"
    probe.compare_rows(answer, expected[rows], rows, how, base)
    # several targets in one row, out of coordinate order: two, three, and as many as the
    # probe's rows allow (up to WIDE_TARGETS; an answer that changes past a number of targets)
    widths = sorted({w for w in (2, 3, min(probe.n, WIDE_TARGETS)) if w <= probe.n})
    for width in widths if targeted else ():
        out = probe.grouped_rows(batches[0][1], pinned, width)
        if len(out):
            how = f"log_marginals_at with {width} targets per row, the largest coordinate first"
            probe.compare(out, expected[: len(out)], how, base)
    # a second cut whose prefix pins a 0 and a value other than 0 (the pins alternate)
    cut = min(2, length - 1)
    if probe.caps.chains:
        for start in sorted({0, cut}):
            out, _ = probe.chains(values, [start], length - start, then=False)
            how = f"log_marginals_chain from cut {start}"
            probe.compare(out[0], expected[start:], how, base, first=start)
        if cut >= 1:  # two chains of one batch, from different cuts
            out, _ = probe.chains(values, [0, cut], length - cut, then=False)
            how = f"log_marginals_chain asked two chains (cuts 0 and {cut}) in one call"
            probe.compare(out[0], expected[: length - cut], how, base)
            probe.compare(out[1], expected[cut:], how, base, first=cut)
            # many chains of one call, their cuts cycling (an answer that changes past a
            # number of chains per call: every chain given the first chain's pins, say)
            starts = sorted({0, 1, cut}, reverse=True)
            many = (starts * WIDE_CHAINS)[:WIDE_CHAINS]
            size = length - cut
            out, _ = probe.chains(values, many, size, then=False)
            how = f"log_marginals_chain asked {len(many)} chains (cuts {starts}) in one call"
            for c, start in enumerate(many):
                probe.compare(out[c], expected[start : start + size], how, base, first=start)
    if probe.caps.chain_then and length >= 2:
        out, after = probe.chains(values, [0], length - 1, then=True)
        probe.compare(out[0], expected[:-1], "log_marginals_chain_then's chain", base)
        probe.compare(after, expected[-1:], "log_marginals_chain_then's row after", base)
        then_cut = min(cut, length - 2)  # two chains of at least one row, and a row after
        if then_cut >= 1:
            size = length - then_cut - 1
            out, after = probe.chains(values, [0, then_cut], size, then=True)
            how = f"log_marginals_chain_then asked two chains (cuts 0 and {then_cut}) in one call"
            probe.compare(out[0], expected[:size], how, base)
            probe.compare(out[1], expected[then_cut : then_cut + size], how, base, first=then_cut)
            probe.compare(after[:1], expected[size : size + 1], how, base, first=size)
            probe.compare(after[1:], expected[then_cut + size :], how, base, first=then_cut + size)
    return values, expected


def check_drift_consistency(evaluate, times: torch.Tensor, x0: torch.Tensor) -> None:
    """Raise :class:`~pyro_autospec.engine.errors.OracleError` where a drift (or a diffusion's
    mean oracle) answers a row differently alone and in a call with other rows.

    The sequential sampler asks one time per call; the other samplers ask rows of different
    times and states in one call. A drift that reads ``t[0]`` for every row (one time per
    batch assumed) or mixes its rows is then exact for the sequential sampler only, and every
    other sampler draws from another law, silently. Asks up to 4 rows at times spread over
    ``times`` (states near the first draws' starts): in one call, in one call in reverse order,
    and one by one; relative differences above :data:`TOLERANCE` (more for outputs narrower
    than float32) raise. Draws no random numbers and counts no rounds.

    Parameters
    ----------
    evaluate : DriftEvaluator
        The run's checked drift calls (:class:`~pyro_autospec.engine.euler.DriftEvaluator`).
    times : Tensor[N + 1]
        The run's time grid.
    x0 : Tensor[D, d]
        The draws' starting states.

    Raises
    ------
    OracleError
        Naming the time of the row whose answers differ, and by how much.

    An oracle (or drift) that sets ``consistent_queries = True`` is not checked by the engine.
    """
    steps = int(times.shape[0]) - 1
    picks = sorted({round(j * (steps - 1) / 3) for j in range(4)}) if steps > 1 else [0]
    if len(picks) < 2:
        return
    t = times[picks].to(x0.dtype)
    shift = 0.1 * torch.arange(len(picks), dtype=x0.dtype, device=x0.device)[:, None]
    x = x0[torch.arange(len(picks)) % x0.shape[0]] + shift
    try:
        # fresh inputs for every call: a drift may write into its input (the engine hands
        # every call inputs nothing reads afterwards)
        together = evaluate(t.clone(), x.clone())
        reverse = evaluate(t.flip(0), x.flip(0)).flip(0)
        alone = torch.cat(
            [evaluate(t[i : i + 1].clone(), x[i : i + 1].clone()) for i in range(len(picks))]
        )
    except OracleError:
        return  # the engine's output checks report it, at the row where sampling meets it
    # a network computed in bfloat16 may take another kernel for one row than for four, and
    # differ by a bfloat16 step; the slip this check is for differs by the answer's own size
    tolerance = _tolerance(evaluate.dtype)
    for answer, how in ((together, "in one call"), (reverse, "in one call in reverse order")):
        gap = ((answer - alone).abs() / (1 + alone.abs())).amax(-1)
        worst = int(gap.argmax())
        if float(gap[worst]) > tolerance:
            raise OracleError(
                f"The {evaluate.name} answers a row differently alone and with other rows "
                f"{how}: at time t = {float(t[worst]):.4g} by {float(gap[worst]):.3g} "
                f"(relative, more than {tolerance:.3g}). Every sampler but the sequential one "
                f"asks rows of different times and states in one call, so each row of the answer "
                f"must depend on its own t[i] and x[i] only (a common slip: reading t[0] for "
                f"every row), and the same row must get the same answer each time "
                f"{_EVAL_HINT}. Fix it, or, if the difference is rounding, set "
                f"consistent_queries = True on it to skip this check."
            )
