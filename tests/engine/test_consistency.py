"""An oracle that answers one question two ways is refused before sampling.

Each oracle below breaks the protocol in a way users do (found by sampling oracles written
outside the project): without the check, each sampler drew from its own law, silently (a
chi-square p-value of 0 against the sequential sampler for the chain that forgets its cut).
"""

import pytest
import torch

from pyro_autospec.engine import OracleError, sample_any_order
from pyro_autospec.engine.consistency import check_consistency
from pyro_autospec.oracles import MarkovChainOracle, TabularOracle

STAY = torch.tensor([[0.85, 0.15], [0.15, 0.85]], dtype=torch.float64)
CHAIN = MarkovChainOracle(torch.tensor([0.5, 0.5], dtype=torch.float64), STAY, 12)


class Rows:
    """The Markov chain's rows, targeted; subclasses add a faulty method."""

    num_coords, num_values = 12, 2

    def log_marginals_at(self, values, mask, targets):
        return CHAIN.log_marginals_at(values, mask, targets)


class ChainForgetsItsCut(Rows):
    def log_marginals_chain(self, values, mask, chain):
        return self.log_marginals_at(values, mask, chain)  # chain[:j] never pinned


class ChainForgetsItsPrefix(Rows):
    def log_marginals_chain(self, values, mask, chain):
        return CHAIN.log_marginals_chain(values, torch.zeros_like(mask), chain)


class ReadsUnpinnedValues(Rows):
    """Takes every coordinate holding a 1 as pinned (``values.bool()`` for ``mask``)."""

    def log_marginals_at(self, values, mask, targets):
        return CHAIN.log_marginals_at(values, mask | values.bool(), targets)


class DependsOnItsBatch(Rows):
    """Rows mixed with the batch's mean row (a batch statistic, as batch norm in training)."""

    def log_marginals_at(self, values, mask, targets):
        out = CHAIN.log_marginals_at(values, mask, targets).exp()
        return (0.5 * out + 0.5 * out.mean(0, keepdim=True)).log()


class WrongRowAfterChain(Rows):
    def log_marginals_chain(self, values, mask, chain):
        return CHAIN.log_marginals_chain(values, mask, chain)

    def log_marginals_chain_then(self, values, mask, chain, then):
        out = CHAIN.log_marginals_chain(values, mask, chain)
        return out, CHAIN.log_marginals_at(values, mask, then)  # the chain left unpinned


class TargetsSorted(Rows):
    """Answers its targets in coordinate order instead of the order asked: right whenever a
    row asks one target."""

    def log_marginals_at(self, values, mask, targets):
        return CHAIN.log_marginals_at(values, mask, targets.sort(1).values)


class ChainPinsEveryChain(Rows):
    """The indexing slip ``mask[:, chain[:, j]] = True``: pins coordinate ``j`` of every chain
    of the batch in every row; right for a batch of one chain."""

    def log_marginals_chain(self, values, mask, chain):
        mask, rows = mask.clone(), []
        for j in range(chain.shape[1]):
            rows.append(CHAIN.log_marginals_at(values, mask, chain[:, j : j + 1]))
            mask[:, chain[:, j]] = True
        return torch.cat(rows, 1)


class TargetsSortedFromThree(Rows):
    """Answers in coordinate order only where a row asks three targets or more (another path
    for wide windows, say): an outside test found the check asked one and two."""

    def log_marginals_at(self, values, mask, targets):
        if targets.shape[1] >= 3:
            targets = targets.sort(1).values
        return CHAIN.log_marginals_at(values, mask, targets)


class ChainPinsEveryChainFromThree(Rows):
    """:class:`ChainPinsEveryChain`'s slip only in calls of three chains or more: an outside
    test found the check asked one and two chains per call."""

    def log_marginals_chain(self, values, mask, chain):
        if chain.shape[0] < 3:
            return CHAIN.log_marginals_chain(values, mask, chain)
        return ChainPinsEveryChain().log_marginals_chain(values, mask, chain)


class ChainReadsZeros(Rows):
    """Reads zeros instead of its ``values`` (a buffer never filled): right wherever the pinned
    values are zeros, which are this chain's most probable values from a start at 0."""

    def log_marginals_chain(self, values, mask, chain):
        return CHAIN.log_marginals_chain(torch.zeros_like(values), mask, chain)


class ChainTakesZeroForUnpinned(Rows):
    """Takes a pinned 0 for unpinned (0 as a padding token): ``mask & (values != 0)``. Right
    wherever the pinned values are not 0 (an outside user's sweep)."""

    def log_marginals_chain(self, values, mask, chain):
        return CHAIN.log_marginals_chain(values, mask & (values != 0), chain)


class ReadsTheLastCoordinate(Rows):
    """Reads coordinate 11 even when it is unpinned (an off-by-one on the mask), a coordinate
    the check's questions never ask about (an outside user's sweep)."""

    def log_marginals_at(self, values, mask, targets):
        mask = mask.clone()
        mask[:, 11] = True
        return CHAIN.log_marginals_at(values, mask, targets)


class ChainForgetsItsTarget(Rows):
    """A family of two chains (the second with the opposite start) whose chain query answers
    every chain for target 0: right for target 0 only (an outside user's sweep)."""

    num_draws = 2
    FLIP = MarkovChainOracle(torch.tensor([0.9, 0.1], dtype=torch.float64), STAY, 12)
    BASE = MarkovChainOracle(torch.tensor([0.1, 0.9], dtype=torch.float64), STAY, 12)

    def _target(self, draws):
        return [self.BASE, self.FLIP][int(draws[0])]  # the check asks one target per call

    def log_marginals_at(self, values, mask, targets, draws):
        return self._target(draws).log_marginals_at(values, mask, targets)

    def log_marginals_chain(self, values, mask, chain, draws):
        return self._target(torch.zeros_like(draws)).log_marginals_chain(values, mask, chain)


class FullRowsAreAStub(Rows):
    """The engine asks targeted rows of an oracle that has them, never full rows."""

    def log_marginals(self, values, mask):
        raise NotImplementedError("only targeted rows")


class Bfloat16Network(Rows):
    """Computed in bfloat16, returned in float64: two routes differ by rounding only."""

    def log_marginals_at(self, values, mask, targets):
        exact = CHAIN.log_marginals_at(values, mask, targets)
        return (exact + 1e-3 * values.shape[0] ** 0.5).bfloat16().double()

    def log_marginals_chain(self, values, mask, chain):
        return CHAIN.log_marginals_chain(values, mask, chain).bfloat16().double()


@pytest.mark.parametrize(
    "oracle, named",
    [
        (ChainForgetsItsCut(), "log_marginals_chain from cut 0"),
        (ChainForgetsItsPrefix(), "log_marginals_chain from cut 2"),
        (ReadsUnpinnedValues(), "other values at the unpinned coordinates"),
        (DependsOnItsBatch(), "in one batch"),
        (WrongRowAfterChain(), "log_marginals_chain_then's row after"),
        (TargetsSorted(), "2 targets per row"),
        (TargetsSortedFromThree(), "3 targets per row"),
        (ChainPinsEveryChain(), "two chains"),
        (ChainPinsEveryChainFromThree(), "16 chains"),
        (ChainReadsZeros(), "log_marginals_chain from cut 0"),
        (ChainTakesZeroForUnpinned(), "log_marginals_chain from cut 2"),
        (ReadsTheLastCoordinate(), "other values at the unpinned coordinates"),
        (ChainForgetsItsTarget(), "log_marginals_chain from cut 0"),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, str) else "",
)
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_an_oracle_answering_one_question_two_ways_is_refused(oracle, named, engine):
    with pytest.raises(OracleError, match=rf"two ways: .*{named}.*conditional of coordinate"):
        sample_any_order(oracle, getattr(oracle, "num_draws", 4), seed=0, engine=engine)


class Counting(Rows):
    def __init__(self):
        self.rows = 0

    def log_marginals_at(self, values, mask, targets):
        self.rows += values.shape[0]
        return super().log_marginals_at(values, mask, targets)


def test_the_check_is_small_and_leaves_the_draws_alone():
    """A consistent oracle passes; the check asks a few small questions, reads no engine
    randomness, and is not counted in the run's rows."""
    oracle = Counting()
    check_consistency(oracle)
    # each way round, the last row again, the rows again in a call of 64, the rows asking 3
    # targets and 12 (all the coordinates: the first row only), and the rows of a second
    # assignment alone then alternating with the first's in one call
    assert 0 < oracle.rows <= 2 * (3 * 8 + 1) + 64 + 8 + 1 + 8 + 2 * 8
    first = sample_any_order(Counting(), 6, seed=3)
    again = sample_any_order(CHAIN, 6, seed=3)
    assert torch.equal(first.samples, again.samples)
    assert first.oracle_rows == again.oracle_rows


@pytest.mark.parametrize("reader", range(4))
@pytest.mark.parametrize("read", range(4))
def test_a_row_reading_any_unpinned_coordinate_is_caught(read, reader):
    """An outside test: a row that reads whether an unpinned coordinate holds 0 passed for
    the pairs whose reader came after the read coordinate in the probe's one order (7 of 12),
    and the samplers then disagreed; the rows are now asked along the reverse order too."""
    if read == reader:
        pytest.skip("a row reads its own coordinate only as the value it asks for")

    small = MarkovChainOracle(torch.ones(3) / 3, torch.full((3, 3), 0.2) + 0.4 * torch.eye(3), 4)

    class ReadsZero:
        num_coords, num_values = 4, 3

        def log_marginals(self, values, mask):
            out = small.log_marginals(values, mask).clone()
            out[:, reader, 0] += 2.0 * ((~mask[:, read]) & (values[:, read] == 0)).double()
            return torch.log_softmax(out, -1)

    with pytest.raises(OracleError, match="other values at the unpinned coordinates"):
        check_consistency(ReadsZero())


def _small_chain(n: int, q: int = 2) -> MarkovChainOracle:
    stay = torch.full((q, q), 0.2 / max(q - 1, 1)) + (0.8 - 0.2 / max(q - 1, 1)) * torch.eye(q)
    return MarkovChainOracle(torch.ones(q) / q, stay, n)


class ReadsWhetherTwoUnpinnedDiffer:
    """Row ``reader`` leans towards 0 when unpinned coordinates ``a`` and ``b`` differ: with
    zeros, or one value, at every unpinned coordinate they never do."""

    def __init__(self, n, reader, a, b):
        self.chain, self.reader, self.a, self.b = _small_chain(n), reader, a, b
        self.num_coords, self.num_values = n, 2

    def log_marginals(self, values, mask):
        out = self.chain.log_marginals(values, mask).clone()
        free = ~mask[:, self.a] & ~mask[:, self.b]
        out[:, self.reader, 0] += 2.0 * (free & (values[:, self.a] != values[:, self.b])).double()
        return torch.log_softmax(out, -1)


class TrustsTheNextWhenThePreviousIsPinned:
    """An off-by-one: row ``i`` reads coordinate ``i + 1`` whenever ``i - 1`` is pinned."""

    def __init__(self, n):
        self.chain = _small_chain(n)
        self.num_coords, self.num_values = n, 2

    def log_marginals(self, values, mask):
        shifted = mask.clone()
        shifted[:, 2:] |= mask[:, :-2]  # row i sees i + 1 as pinned when i - 1 is
        return self.chain.log_marginals(values, mask | shifted)


@pytest.mark.parametrize(
    "oracle",
    [
        ReadsWhetherTwoUnpinnedDiffer(4, 0, 2, 3),
        ReadsWhetherTwoUnpinnedDiffer(5, 1, 3, 4),
        TrustsTheNextWhenThePreviousIsPinned(3),
        TrustsTheNextWhenThePreviousIsPinned(5),
    ],
    ids=lambda o: f"{type(o).__name__}-{o.num_coords}",
)
def test_small_oracles_are_asked_every_conditional(oracle):
    """An outside test: rows that read whether two unpinned coordinates differ, and an
    off-by-one that the two probe orders never ask at n = 3, passed, and the samplers then
    disagreed. An oracle of at most 5 coordinates is asked every conditional given any set
    of the others, with zeros and with values that differ at the unpinned coordinates."""
    with pytest.raises(OracleError, match="answers one conditional two ways"):
        check_consistency(oracle)
    check_consistency(oracle.chain)  # the chain itself passes


class ChunkedReusingTheFirstMask:
    """Answers the rows after its first 8 with the first row's mask: a bug that shows only in
    calls of more than 8 rows (the probe's other calls hold at most 8)."""

    num_coords, num_values = 12, 2

    def log_marginals(self, values, mask):
        mask = mask.clone()
        mask[8:] = mask[0]
        return CHAIN.log_marginals(values, mask)


def test_rows_that_depend_on_the_size_of_their_call_are_caught():
    """An outside test: rows that changed only in calls of more than 8 rows passed (the
    check's calls held at most 8), and three samplers drew another law. The probe's rows are
    asked again in a call of 64, in reverse order."""
    with pytest.raises(OracleError, match="in a call of 64 rows, in reverse order"):
        check_consistency(ChunkedReusingTheFirstMask())


def test_a_float32_network_passes_within_its_rounding():
    """Answers computed in float32 by different routes (one pass over a chain, or row by row)
    differ in their last bits: within the float32 tolerance."""

    class Float32Chain(Rows):
        def log_marginals_at(self, values, mask, targets):
            return CHAIN.log_marginals_at(values, mask, targets).float()

        def log_marginals_chain(self, values, mask, chain):
            out = CHAIN.log_marginals_chain(values, mask, chain).float()
            return out + 1e-6 * torch.randn(out.shape)  # rounding noise

    check_consistency(Float32Chain())


def test_full_rows_of_a_wide_oracle_are_asked_within_the_engines_call_size():
    """``[B, n, q]`` full rows are asked a few at a time (at most ``2**20`` entries), as the
    engine asks them on a CPU: the check never needs more memory than sampling."""

    class Wide:
        num_coords, num_values = 600, 2000
        largest = 0

        def log_marginals(self, values, mask):
            Wide.largest = max(Wide.largest, values.shape[0] * 600 * 2000)
            return torch.full((values.shape[0], 600, 2000), -torch.log(torch.tensor(2000.0)))

    check_consistency(Wide())
    assert 0 < Wide.largest <= 600 * 2000


def test_an_oracle_declaring_consistent_queries_is_not_checked():
    """``consistent_queries = True`` is the oracle's word (the library's own oracles give it,
    backed by the conformance tests): the engine then asks no extra question."""

    class Declared(ChainForgetsItsCut):
        consistent_queries = True

    assert sample_any_order(Declared(), 2, seed=0).samples.shape == (2, 12)
    built_in = Counting()
    built_in.consistent_queries = True
    sample_any_order(built_in, 2, seed=0, method="sequential")
    assert built_in.rows == 2 * 12  # the draws' rows only


def test_only_the_methods_the_engine_calls_are_asked_and_rounding_passes():
    """A stub ``log_marginals`` beside ``log_marginals_at`` is never called; answers that
    differ by a network's bfloat16 rounding are one answer."""
    check_consistency(FullRowsAreAStub())
    check_consistency(Bfloat16Network())
    assert sample_any_order(FullRowsAreAStub(), 3, seed=0).samples.shape == (3, 12)


class ThenForgetsTheSecondChain(Rows):
    """``log_marginals_chain_then`` pinning every chain of a batch with the first chain's
    mask: caught at n = 3 too, where the check's second cut is 1 (its reviewer's case)."""

    num_coords = 3
    SHORT = MarkovChainOracle(torch.tensor([0.5, 0.5], dtype=torch.float64), STAY, 3)

    def log_marginals_at(self, values, mask, targets):
        return self.SHORT.log_marginals_at(values, mask, targets)

    def log_marginals_chain(self, values, mask, chain):
        return self.SHORT.log_marginals_chain(values, mask, chain)

    def log_marginals_chain_then(self, values, mask, chain, then):
        first = mask[:1].expand_as(mask)
        return self.SHORT.log_marginals_chain_then(values, first, chain, then)


def test_a_short_chain_then_that_mixes_its_chains_is_refused():
    with pytest.raises(OracleError, match="log_marginals_chain_then asked two chains"):
        check_consistency(ThenForgetsTheSecondChain())


def test_one_coordinate_with_targeted_rows_is_checked_without_an_error():
    """n = 1 has no second target to pair a row with (an internal IndexError before)."""

    class One:
        num_coords, num_values = 1, 3

        def log_marginals_at(self, values, mask, targets):
            return torch.log_softmax(
                torch.tensor([[[0.1, 0.5, -0.2]]]).expand(len(values), 1, 3), -1
            )

    result = sample_any_order(One(), 5, seed=0)
    assert result.samples.shape == (5, 1)


class SlightlyNoisy(Rows):
    """An oracle with its own random state: logits jittered by ``scale`` on every call, too
    little for two ways of asking to differ by a hundredth, enough for no sampler to be exact.
    """

    def __init__(self, scale, dtype=torch.float64):
        self.scale, self.dtype = scale, dtype
        self.generator = torch.Generator().manual_seed(0)

    def log_marginals_at(self, values, mask, targets):
        out = CHAIN.log_marginals_at(values, mask, targets)
        noise = torch.randn(out.shape, generator=self.generator, dtype=out.dtype)
        return torch.log_softmax(out + self.scale * noise, -1).to(self.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_oracle_with_small_random_noise_is_refused(dtype):
    """Noise of a hundredth in the logits moves a row by about 0.003 in probability, under the
    check's tolerance for two ways of asking; the same row asked twice shows it."""
    with pytest.raises(OracleError, match=r"same question twice.*same answer each time"):
        sample_any_order(SlightlyNoisy(0.01, dtype), 2, seed=0)


def test_noise_within_the_dtypes_rounding_passes():
    check_consistency(SlightlyNoisy(1e-9))


class ReadsOneUnpinnedValue:
    """Rows that move when coordinate ``coord`` is unpinned and holds ``trigger``: an oracle
    reading a stale value, for one value only (found outside the project: with one batch of
    other values, filled with 1, five such oracles in fifteen passed the check)."""

    num_coords, num_values = 5, 3

    def __init__(self, coord: int, trigger: int):
        g = torch.Generator().manual_seed(4)
        self.bump = torch.randn(5, 3, generator=g, dtype=torch.float64) * 1.5
        self.base = torch.randn(5, 3, generator=g, dtype=torch.float64)
        self.coord, self.trigger = coord, trigger

    def log_marginals(self, values, mask):
        hit = (values[:, self.coord] == self.trigger) & ~mask[:, self.coord]
        rows = self.base + hit.double()[:, None, None] * self.bump
        return torch.log_softmax(rows, -1)


@pytest.mark.parametrize("trigger", [1, 2])
@pytest.mark.parametrize("coord", range(5))
def test_a_row_reading_one_value_of_an_unpinned_coordinate_is_refused(coord, trigger):
    with pytest.raises(OracleError, match=r"other values at the unpinned coordinates \(filled"):
        check_consistency(ReadsOneUnpinnedValue(coord, trigger))


class WritesIntoItsValues:
    """Reads its inputs, then uses ``values`` as scratch: harmless in sampling (an oracle that
    does not borrow its inputs gets fresh ones, in grad mode writable), but the check handed
    one call's inputs to the next, and refused the oracle as answering two ways."""

    num_coords, num_values = 4, 2

    def log_marginals(self, values, mask):
        out = MarkovChainOracle(torch.tensor([0.5, 0.5]), STAY.float(), 4).log_marginals(
            values, mask
        )
        values.zero_()
        return out


def test_an_oracle_writing_into_its_inputs_after_reading_them_is_not_misjudged():
    with torch.enable_grad():
        check_consistency(WritesIntoItsValues())


_TABLES = [
    TabularOracle(logits=2.0 * torch.randn([3] * 5, generator=g, dtype=torch.float64))
    for g in (torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
]


class ChainsReadTheFirstChainsValues:
    """Exact rows; chains that read the first chain's values for every chain of the call."""

    num_coords, num_values = 5, 3

    def log_marginals_at(self, values, mask, targets):
        return _TABLES[0].log_marginals_at(values, mask, targets)

    def log_marginals_chain(self, values, mask, chain):
        return _TABLES[0].log_marginals_chain(values[:1].expand_as(values), mask, chain)


class FamilyReadsTheFirstRowsTarget:
    """Target ``d`` of the family is table ``d % 2``; every row reads ``draws[0]``."""

    num_coords, num_values, num_draws = 5, 3, 4

    def log_marginals_at(self, values, mask, targets, draws):
        odd = (draws[:1].expand_as(draws) % 2 == 1)[:, None, None]
        a, b = (table.log_marginals_at(values, mask, targets) for table in _TABLES)
        return torch.where(odd, b, a)


@pytest.mark.parametrize(
    "oracle, words",
    [
        (ChainsReadTheFirstChainsValues(), "chains of two assignments in one call"),
        (FamilyReadsTheFirstRowsTarget(), "rows for two targets of the family alternating"),
    ],
    ids=["chains", "family"],
)
def test_a_call_answering_every_row_for_its_first_is_caught(oracle, words):
    """An outside test: every question of the probe pinned one assignment (and asked one
    target of a family), so a method answering the whole call for its first chain's values
    or its first row's target passed, and every sampler drew from another law (p = 0 against
    the exact table). The check now asks two assignments, and two targets, in one call."""
    with pytest.raises(OracleError, match=words):
        check_consistency(oracle)
    with pytest.raises(OracleError, match=words):
        sample_any_order(oracle, 4, seed=0)
