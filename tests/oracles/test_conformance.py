"""The MarginalOracle protocol, checked the same way on every oracle of the catalogue.

``tests/catalogue/conformance.py``'s ``CONFORMANCE`` builds each oracle small (one line per
oracle: a new oracle is tested by adding a line there). For each, whatever methods it offers
(``log_marginals``, ``log_marginals_at``, ``log_marginals_chain``,
``log_marginals_chain_then``; see :mod:`pyro_autospec.engine.protocols`):

* shapes and dtypes; every row normalised; pinned coordinates point masses where the oracle
  documents it; values at unpinned positions ignored; inputs left unchanged; the same answers
  under :func:`torch.inference_mode` for an inference-safe oracle;
* targeted rows equal full rows gathered at the targets; a chain query equals its rows asked
  one by one; ``chain_then``'s rows equal the targeted rows after the whole chain;
* the chain rule's law (every state enumerated, in several orders) is normalised, and for a
  consistent oracle equals its brute-force joint (or, without one, is the same in every order)
  to 1e-9: the exactness criterion, since sampling follows the oracle's chain rule;
* ``sample_any_order``'s ``log_prob`` of each draw is the chain rule along its order.

Queries pin coordinates of states drawn by the oracle's own chain rule, so every row is
conditioned on a possible assignment. Every marginal oracle ``pyro_autospec.oracles`` exports
has a line in ``CONFORMANCE`` (the mean oracles are ``tests/oracles/test_mean_conformance.py``'s).
"""

from __future__ import annotations

import inspect
import itertools
import re
import types

import pytest
import torch

import pyro_autospec.oracles as oracles_module
from pyro_autospec.engine import host_plane, sample_any_order
from pyro_autospec.engine.consistency import check_consistency
from pyro_autospec.engine.host_rows import HostRows
from pyro_autospec.engine.protocols import (
    MarginalOracle,
    has_chain_marginals,
    has_chain_then,
    has_targeted_marginals,
    is_inference_safe,
)
from tests.catalogue.conformance import CONFORMANCE
from tests.catalogue.oracle_reference import Wrapper
from tests.catalogue.oracles import DeclaredBorrowing

NAMES = sorted(CONFORMANCE)
NUM_QUERIES = 24


@pytest.fixture(params=NAMES)
def case(request):
    """(entry, oracle): the oracle built fresh for the test (a generator is closed after it)."""
    entry = CONFORMANCE[request.param]
    made = entry.make()
    if isinstance(made, types.GeneratorType):
        oracle = next(made)
        yield entry, oracle
        made.close()
    else:
        yield entry, made


def tolerance(rows: torch.Tensor) -> float:
    return 1e-9 if rows.dtype == torch.float64 else 1e-5


def full_rows(oracle, values, mask):
    """``log_marginals``, or every coordinate targeted for an oracle with targeted rows only."""
    if callable(getattr(oracle, "log_marginals", None)):
        return oracle.log_marginals(values, mask)
    targets = torch.arange(oracle.num_coords).expand(values.shape[0], -1)
    return oracle.log_marginals_at(values, mask, targets)


def rows_at(oracle, values, mask, targets):
    """``log_marginals_at``, or full rows gathered at the targets."""
    if has_targeted_marginals(oracle):
        return oracle.log_marginals_at(values, mask, targets)
    rows = oracle.log_marginals(values, mask)
    return rows.gather(1, targets[..., None].expand(-1, -1, rows.shape[-1]))


def chain_rule(oracle, states, order):
    """``log q_order(x)`` of every state by the chain rule in ``order``: DoubleTensor[M].
    ``-inf`` once a step has probability 0 (later rows, conditioned on an impossible
    assignment, may be NaN and are not read)."""
    m, n = states.shape
    total = torch.zeros(m, dtype=torch.float64)
    mask = torch.zeros(m, n, dtype=torch.bool)
    for i in order:
        rows = rows_at(oracle, states, mask, torch.full((m, 1), int(i)))[:, 0].double()
        possible = total > -torch.inf
        assert not torch.isnan(rows[possible]).any(), "NaN on a row of a possible prefix"
        step = rows.gather(1, states[:, i : i + 1])[:, 0]
        total = torch.where(possible, total + step, total)
        mask[:, i] = True
    return total


def draws(oracle, num: int, seed: int) -> torch.Tensor:
    """States drawn by the oracle's chain rule in index order (possible under it)."""
    gen = torch.Generator().manual_seed(seed)
    n = oracle.num_coords
    values = torch.zeros(num, n, dtype=torch.long)
    mask = torch.zeros(num, n, dtype=torch.bool)
    for i in range(n):
        probs = rows_at(oracle, values, mask, torch.full((num, 1), i))[:, 0].double().exp()
        values[:, i] = torch.multinomial(probs, 1, generator=gen)[:, 0]
        mask[:, i] = True
    return values


def queries(oracle, seed: int = 0):
    """(values, mask, targets): pins of possible states at every density (none, all), junk
    values in [0, q) at unpinned positions, targets with repeats (pinned ones too)."""
    n, q = oracle.num_coords, oracle.num_values
    gen = torch.Generator().manual_seed(seed)
    states = draws(oracle, NUM_QUERIES, seed)
    density = torch.rand(NUM_QUERIES, 1, generator=gen)
    mask = torch.rand(NUM_QUERIES, n, generator=gen) < density
    mask[0], mask[1] = False, True
    junk = torch.randint(0, q, (NUM_QUERIES, n), generator=gen)
    values = torch.where(mask, states, junk)
    targets = torch.randint(0, n, (NUM_QUERIES, n + 2), generator=gen)
    return values, mask, targets


def chains(oracle, seed: int = 1):
    """(values, mask, chain, lengths): a pinned prefix and a chain of distinct unpinned
    coordinates after it, padded by repeating its last coordinate; values of possible states
    at the prefix and on the chain, junk elsewhere."""
    n, q = oracle.num_coords, oracle.num_values
    gen = torch.Generator().manual_seed(seed)
    states = draws(oracle, NUM_QUERIES, seed)
    order = torch.rand(NUM_QUERIES, n, generator=gen).argsort(1)
    cut = torch.randint(0, n, (NUM_QUERIES,), generator=gen)
    cut[0] = 0
    lengths = 1 + (torch.rand(NUM_QUERIES, generator=gen) * (n - cut)).long()
    lengths[0] = n
    slots = torch.arange(n)
    mask = torch.zeros(NUM_QUERIES, n, dtype=torch.bool)
    mask.scatter_(1, order, slots < cut[:, None])
    position = (cut[:, None] + slots).clamp(max=n - 1)
    last = cut + lengths - 1
    position = torch.minimum(position, last[:, None])
    chain = order.gather(1, position)
    on_chain = torch.zeros_like(mask).scatter_(1, chain, True)
    junk = torch.randint(0, q, (NUM_QUERIES, n), generator=gen)
    values = torch.where(mask | on_chain, states, junk)
    return values, mask, chain, lengths


def assert_rows_close(got, expected, where=None):
    if where is not None:
        got, expected = got[where], expected[where]
    assert not torch.isnan(got).any() and not torch.isnan(expected).any()
    torch.testing.assert_close(got.exp(), expected.exp(), atol=tolerance(got), rtol=0)


# ------------------------------------------------------------------------ one row at a time
def test_protocol_attributes(case):
    entry, oracle = case
    assert isinstance(oracle.num_coords, int) and isinstance(oracle.num_values, int)
    assert 1 <= oracle.num_coords <= 8 and 2 <= oracle.num_values <= 4, "keep the suite small"
    assert callable(getattr(oracle, "log_marginals", None)) or has_targeted_marginals(oracle)
    if callable(getattr(oracle, "log_marginals", None)):
        assert isinstance(oracle, MarginalOracle)


def test_rows_shapes_normalised_and_point_masses(case):
    entry, oracle = case
    n, q = oracle.num_coords, oracle.num_values
    values, mask, targets = queries(oracle)
    rows = full_rows(oracle, values, mask)
    assert rows.shape == (NUM_QUERIES, n, q) and rows.is_floating_point()
    assert rows.device == values.device
    assert not torch.isnan(rows).any(), "NaN on a row conditioned on a possible assignment"
    norm = torch.logsumexp(rows.double(), -1)
    torch.testing.assert_close(norm, torch.zeros_like(norm), atol=tolerance(rows), rtol=0)
    if entry.point_masses:
        point = torch.full((NUM_QUERIES, n, q), -torch.inf, dtype=rows.dtype)
        point.scatter_(2, values.clamp(0, q - 1)[..., None], 0.0)
        assert_rows_close(rows, point, mask)  # a pinned coordinate is a point mass
        if has_targeted_marginals(oracle):
            at = oracle.log_marginals_at(values, mask, targets)
            pinned = mask.gather(1, targets)
            assert_rows_close(at, point.gather(1, _expand(targets, q)), pinned)


def _expand(index, q):
    return index[..., None].expand(*index.shape, q)


def test_targeted_rows_are_full_rows_at_the_targets(case):
    entry, oracle = case
    if not has_targeted_marginals(oracle) or not callable(getattr(oracle, "log_marginals", None)):
        pytest.skip("needs log_marginals and log_marginals_at")
    n, q = oracle.num_coords, oracle.num_values
    values, mask, targets = queries(oracle)
    at = oracle.log_marginals_at(values, mask, targets)
    rows = oracle.log_marginals(values, mask)
    assert at.shape == (NUM_QUERIES, n + 2, q) and at.dtype == rows.dtype
    assert_rows_close(at, rows.gather(1, _expand(targets, q)))
    one = oracle.log_marginals_at(values[:1], mask[:1], targets[:1, :1])  # a batch of one
    assert one.shape == (1, 1, q)
    assert_rows_close(one[0, 0], rows[0, targets[0, 0]])


def test_values_at_unpinned_positions_are_ignored(case):
    entry, oracle = case
    q = oracle.num_values
    values, mask, targets = queries(oracle)
    other = torch.where(mask, values, (values + 1) % q)
    torch.testing.assert_close(full_rows(oracle, other, mask), full_rows(oracle, values, mask))
    if has_targeted_marginals(oracle):
        torch.testing.assert_close(
            oracle.log_marginals_at(other, mask, targets),
            oracle.log_marginals_at(values, mask, targets),
        )


def test_inputs_are_left_unchanged(case):
    entry, oracle = case
    values, mask, targets = queries(oracle)
    inputs = (values, mask, targets)
    before = [x.clone() for x in inputs]
    full_rows(oracle, values, mask)
    rows_at(oracle, values, mask, targets)
    values, mask, chain, _ = chains(oracle)
    chain_inputs = (values, mask, chain)
    chain_before = [x.clone() for x in chain_inputs]
    if has_chain_marginals(oracle):
        oracle.log_marginals_chain(values, mask, chain)
    if has_chain_then(oracle):
        oracle.log_marginals_chain_then(values, mask, chain, chain[:, :2])
    for x, y in zip(inputs + chain_inputs, before + chain_before, strict=True):
        assert torch.equal(x, y), "the oracle wrote into its inputs"


def test_inference_mode_gives_the_same_rows(case):
    entry, oracle = case
    if not is_inference_safe(oracle):
        pytest.skip("not inference-safe: the engine calls it with inference mode off")
    values, mask, targets = queries(oracle)
    expected = rows_at(oracle, values, mask, targets)
    with torch.inference_mode():
        got = rows_at(oracle, values.clone(), mask.clone(), targets.clone())
    torch.testing.assert_close(got, expected, atol=tolerance(expected), rtol=0)


# ------------------------------------------------------------------------ chain queries
def test_chain_query_is_its_rows_one_by_one(case):
    entry, oracle = case
    if not has_chain_marginals(oracle):
        pytest.skip("no log_marginals_chain: the engine asks the rows one by one")
    n, q = oracle.num_coords, oracle.num_values
    values, mask, chain, lengths = chains(oracle)
    got = oracle.log_marginals_chain(values, mask, chain)
    assert got.shape == (NUM_QUERIES, n, q) and got.is_floating_point()
    grown = mask.clone()
    for j in range(n):
        expected = rows_at(oracle, values, grown, chain[:, j : j + 1])[:, 0]
        real = j < lengths  # padding rows are ignored by the engine
        assert_rows_close(got[:, j], expected, real)
        if entry.point_masses:  # a padding repeat is pinned: a point mass
            assert_rows_close(got[:, j], expected, ~real)
        grown = grown.scatter(1, chain[:, j : j + 1], True)


def test_chain_then_rows_are_the_rows_after_the_chain(case):
    entry, oracle = case
    if not has_chain_then(oracle):
        pytest.skip("no log_marginals_chain_then: the engine asks targeted rows")
    n, q = oracle.num_coords, oracle.num_values
    values, mask, chain, lengths = chains(oracle)
    gen = torch.Generator().manual_seed(2)
    then = torch.randint(0, n, (NUM_QUERIES, 3), generator=gen)
    out, after = oracle.log_marginals_chain_then(values, mask, chain, then)
    assert out.shape == (NUM_QUERIES, n, q) and after.shape == (NUM_QUERIES, 3, q)
    real = torch.arange(n) < lengths[:, None]
    grown, by_rows = mask.clone(), []
    for j in range(n):
        by_rows.append(rows_at(oracle, values, grown, chain[:, j : j + 1])[:, 0])
        grown = grown.scatter(1, chain[:, j : j + 1], True)
    assert_rows_close(out, torch.stack(by_rows, 1), real)
    if has_chain_marginals(oracle):
        assert_rows_close(out, oracle.log_marginals_chain(values, mask, chain), real)
    pinned = mask.scatter(1, chain, True)
    expected = rows_at(oracle, values, pinned, then)
    # the protocol: a point mass at its value where ``then`` is pinned by the prefix or chain
    point = torch.full_like(expected, -torch.inf).scatter_(2, values.gather(1, then)[..., None], 0)
    expected = torch.where(pinned.gather(1, then)[..., None], point, expected)
    assert_rows_close(after, expected)


# ------------------------------------------------------------------------ the joint
def test_the_engines_consistency_check_passes(case):
    """The check the engine runs before sampling an oracle that does not declare
    ``consistent_queries`` passes on every catalogued oracle: the shipped ones, which declare
    it (this test is what the declaration rests on), and the user oracles, which are checked
    at every run."""
    entry, oracle = case
    check_consistency(oracle)


def test_chain_rule_law_is_the_joint(case):
    """Every state enumerated: the chain rule's law in three orders is normalised and, for a
    consistent oracle, equals the brute-force joint (or the law in another order) to 1e-9."""
    entry, oracle = case
    n, q = oracle.num_coords, oracle.num_values
    states = torch.tensor(list(itertools.product(range(q), repeat=n)))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3)).tolist()
    laws = [chain_rule(oracle, states, order) for order in (range(n), range(n)[::-1], perm)]
    atol = tolerance(rows_at(oracle, states[:1], states[:1] < 0, states[:1, :1]))
    for law in laws:
        torch.testing.assert_close(torch.logsumexp(law, 0).item(), 0.0, atol=atol, rtol=0)
    if not entry.consistent:
        return
    if entry.log_prob is not None:
        log_prob = entry.log_prob(oracle)
        joint = torch.tensor([log_prob(tuple(x)) for x in states.tolist()], dtype=torch.float64)
        expected = joint - torch.logsumexp(joint, 0)
    else:
        expected = laws[0]
    for law in laws:
        torch.testing.assert_close(law.exp(), expected.exp(), atol=1e-9, rtol=0)


def test_sampler_log_prob_is_the_chain_rule(case):
    """``sample_any_order`` draws by the oracle's chain rule in a random order per draw: each
    draw's ``log_prob`` is the chain rule along its order (the joint, for an exact oracle)."""
    entry, oracle = case
    n, q = oracle.num_coords, oracle.num_values
    result = sample_any_order(oracle, 6, seed=0)
    assert result.samples.shape == (6, n)
    states = torch.tensor(list(itertools.product(range(q), repeat=n)))
    atol = tolerance(rows_at(oracle, states[:1], states[:1] < 0, states[:1, :1]))
    for b in range(6):
        expected = chain_rule(oracle, result.samples[b : b + 1], result.orders[b].tolist())
        assert expected.item() > -torch.inf
        torch.testing.assert_close(result.log_prob[b : b + 1], expected, atol=atol, rtol=0)
    if entry.consistent and entry.log_prob is not None:
        log_prob = entry.log_prob(oracle)
        joint = torch.tensor([log_prob(tuple(x)) for x in states.tolist()], dtype=torch.float64)
        joint = joint - torch.logsumexp(joint, 0)
        index = (result.samples * q ** torch.arange(n - 1, -1, -1)).sum(1)
        torch.testing.assert_close(result.log_prob, joint[index], atol=1e-9, rtol=0)


def test_sequential_lock_step_on_the_host_and_on_the_device_agree(case, monkeypatch):
    """Sequential sampling with every draw in flight runs in lock step: on a CPU over the host
    control plane's arrays, elsewhere over dense tensors on the oracle's device (run here on a
    CPU with ``HostRows.zero_copy`` off); each with fresh inputs for every call, or, for an
    oracle that borrows its inputs, the same ones updated in place. All ask the same rows:
    the same draws and log probabilities, bit for bit, for every oracle."""
    _, oracle = case
    steps = []
    counted = host_plane._Lockstep._counted

    def count(self):
        steps.append((type(self), getattr(self, "borrowed", None)))
        counted(self)

    monkeypatch.setattr(host_plane._Lockstep, "_counted", count)
    fresh, borrowing = DeclaredBorrowing(oracle, False), DeclaredBorrowing(oracle, True)
    host = sample_any_order(fresh, 7, seed=5, method="sequential")
    borrowed = sample_any_order(borrowing, 7, seed=5, method="sequential")
    monkeypatch.setattr(HostRows, "zero_copy", False)
    device = sample_any_order(fresh, 7, seed=5, method="sequential")
    device_borrowed = sample_any_order(borrowing, 7, seed=5, method="sequential")
    n, lockstep = oracle.num_coords, host_plane._HostLockstep
    on_host = [(lockstep, False)] * n + [(lockstep, True)] * n
    assert steps == on_host + [(host_plane._Lockstep, None)] * (2 * n)
    for other in (borrowed, device, device_borrowed):
        assert torch.equal(host.samples, other.samples)
        assert torch.equal(host.log_prob, other.log_prob)


# ------------------------------------------------------------------------ every one is catalogued
def marginal_oracle_classes() -> list[type]:
    """The exact oracles of marginals ``pyro_autospec.oracles`` exports: subclasses of
    ``ExactOracle`` (not the base itself, which answers nothing) and classes that implement
    ``log_marginals`` or ``log_marginals_at``, not the protocols."""
    exact = oracles_module.ExactOracle
    found = []
    for name in oracles_module.__all__:
        cls = getattr(oracles_module, name)
        if not inspect.isclass(cls) or getattr(cls, "_is_protocol", False) or cls is exact:
            continue
        if issubclass(cls, exact) or any(
            callable(getattr(cls, method, None)) for method in ("log_marginals", "log_marginals_at")
        ):
            found.append(cls)
    return found


def entry_name(cls) -> str:
    """A catalogue name for ``cls``: ``CurieWeissOracle`` -> ``curie_weiss``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower().removesuffix("_oracle")


def assert_every_marginal_oracle_is_catalogued(catalogue) -> None:
    built = set()
    for entry in catalogue.values():
        made = entry.make()
        if isinstance(made, types.GeneratorType):
            built.add(type(next(made)))
            made.close()
        else:
            built.add(type(made))
    missing = [cls for cls in marginal_oracle_classes() if cls not in built]
    assert not missing, "\n".join(
        f"pyro_autospec.oracles.{cls.__name__} has no entry in CONFORMANCE: add one line to "
        f'tests/catalogue/conformance.py, e.g. "{entry_name(cls)}": '
        f"C(lambda: {cls.__name__}(<small parameters, n of 3 to 6, q of 2 to 4>), "
        "fixed(<its brute-force log_prob, from tests/catalogue/references.py>)),"
        for cls in missing
    )


def test_every_exported_marginal_oracle_has_an_entry():
    assert {"TabularOracle", "CurieWeissOracle"} <= {
        cls.__name__ for cls in marginal_oracle_classes()
    }
    assert_every_marginal_oracle_is_catalogued(CONFORMANCE)


def test_the_completeness_check_names_a_missing_oracle():
    without = {k: v for k, v in CONFORMANCE.items() if k != "curie_weiss"}
    with pytest.raises(AssertionError, match="CurieWeissOracle has no entry"):
        assert_every_marginal_oracle_is_catalogued(without)


# ------------------------------------------------------------------------ the checks have power
class _Broken(Wrapper):
    """A tabular oracle with one fault: ``fault`` names it."""

    def __init__(self, fault: str):
        super().__init__(CONFORMANCE["tabular"].make())
        self.fault = fault

    def log_marginals(self, values, mask):
        if self.fault == "writes_inputs":
            values[:, 0] = 0
        rows = self.oracle.log_marginals(values, mask)
        if self.fault == "unnormalised":
            rows = rows + 1e-6
        return rows

    def log_marginals_at(self, values, mask, targets):
        if self.fault == "other_joint":  # the conditionals of another table
            return self.other.log_marginals_at(values, mask, targets)
        return self.oracle.log_marginals_at(values, mask, targets)

    def log_marginals_chain(self, values, mask, chain):
        if self.fault == "chain_ignores_chain":  # every row conditioned on the prefix only
            return self.oracle.log_marginals_at(values, mask, chain)
        return self.oracle.log_marginals_chain(values, mask, chain)

    @property
    def other(self):
        from pyro_autospec.oracles import TabularOracle

        return TabularOracle(logits=self.oracle.log_probs.flip(0))


@pytest.mark.parametrize(
    "fault, check",
    [
        ("unnormalised", test_rows_shapes_normalised_and_point_masses),
        ("writes_inputs", test_inputs_are_left_unchanged),
        ("other_joint", test_targeted_rows_are_full_rows_at_the_targets),
        ("other_joint", test_chain_rule_law_is_the_joint),
        ("chain_ignores_chain", test_chain_query_is_its_rows_one_by_one),
    ],
)
def test_the_checks_catch_a_broken_oracle(fault, check):
    entry = CONFORMANCE["tabular"]
    check((entry, _Broken("none")))  # the faultless wrapper passes
    with pytest.raises(AssertionError):
        check((entry, _Broken(fault)))
