"""ShardedOracle: every call's rows shared out over the ranks, the answers all-gathered.

Two gloo processes on the CPU (spawned once for the module) run the same sampling calls through
a ShardedOracle; every rank must return the unsharded oracle's draws, bit for bit, for every
query method (``log_marginals``, ``log_marginals_at``, ``log_marginals_chain``, a family's
``draws``, a mean oracle and a plain drift), while evaluating only its share of the rows. Ranks
out of lockstep and a replica that raises on one rank give errors on every rank, not a hang.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pyro_autospec.engine.any_order import sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.engine.protocols import (
    has_chain_marginals,
    has_chain_then,
    has_targeted_marginals,
)
from pyro_autospec.oracles import MarkovChainOracle, TreePottsOracle
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser
from pyro_autospec.parallel import ShardedOracle
from tests.catalogue.distributed import (
    INIT,
    POINTS,
    SDE_TIMES,
    STAY,
    WORLD,
    FamilyOracle,
    as_dict,
    assert_same,
    attempt,
    run_ranks,
)


# ------------------------------------------------------------------------ counting oracles
class RowsOnly:
    """A Markov chain behind ``log_marginals`` only, counting the rows it evaluates."""

    def __init__(self, n: int = 30):
        self.inner = MarkovChainOracle(INIT, STAY, n)
        self.num_coords, self.num_values = n, 2
        self.rows = 0

    def log_marginals(self, values, mask):
        self.rows += values.shape[0]
        return self.inner.log_marginals(values, mask)


class Targeted(RowsOnly):
    """Adds ``log_marginals_at``."""

    def log_marginals_at(self, values, mask, targets):
        self.rows += values.shape[0]
        return self.inner.log_marginals_at(values, mask, targets)


class ChainQueries(Targeted):
    """Adds native chain queries, answered coordinate by coordinate (obviously correct)."""

    conditionings = 0

    def log_marginals_chain(self, values, mask, chain):
        # rows: chains (about a rank's share of them); conditionings: chain positions
        self.rows += chain.shape[0]
        self.conditionings += chain.numel()
        rows = torch.arange(chain.shape[0])
        mask, out = mask.clone(), []
        for j in range(chain.shape[1]):
            out.append(self.inner.log_marginals_at(values, mask, chain[:, j : j + 1]))
            mask[rows, chain[:, j]] = True
        return torch.cat(out, 1)


class Raising(Targeted):
    """Raises on one rank only."""

    def log_marginals_at(self, values, mask, targets):
        if dist.is_initialized() and dist.get_rank() == 1:
            raise ArithmeticError("replica 1 is broken")
        return super().log_marginals_at(values, mask, targets)


def oracles() -> dict:
    """Fresh oracles of every kind, keyed by scenario name."""
    return {
        "rows_only": RowsOnly(),
        "targeted": Targeted(),
        "chain_queries": ChainQueries(),
        "markov": MarkovChainOracle(INIT, STAY, 64),
    }


def discrete_run(oracle, engine: str = "fast"):
    return sample_any_order(oracle, 3, seed=21, engine=engine)


def continuous_calls(wrap) -> dict:
    return {
        "diffusion": lambda: sample_diffusion(
            wrap(FiniteSupportDenoiser(POINTS)), 3, num_steps=32, seed=4, return_paths=True
        ),
        "sde": lambda: sample_sde(wrap(lambda t, x: -x), SDE_TIMES, torch.ones(2), 3, seed=5),
        "family": lambda: sample_any_order(wrap(FamilyOracle()), 6, seed=8),
    }


def query(rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 2, (rows, 30), generator=gen)
    mask = torch.rand(rows, 30, generator=gen) < 0.5
    targets = torch.randint(0, 30, (rows, 4), generator=gen)
    return values, mask, targets


def chain_query(chains: int, length: int, seed: int = 1):
    """``chains`` chains of ``length`` distinct unpinned coordinates (the last padded)."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 2, (chains, 30), generator=gen)
    keys = torch.rand(chains, 30, generator=gen)
    mask = keys > 0.7
    order = (keys + mask.double()).argsort(dim=1)[:, :length]
    order[:, -1] = order[:, -2]  # padding repeats the last coordinate
    return values, mask, order


# ------------------------------------------------------------------------ the ranks
def sharded_worker(rank: int) -> dict:
    scenarios: dict = {}
    for name, oracle in oracles().items():

        def run(oracle=oracle):
            sharded = ShardedOracle(oracle)
            out = as_dict(discrete_run(sharded))
            out.update(rows=getattr(oracle, "rows", None), calls=sharded.calls)
            return out

        attempt(scenarios, name, run)
    attempt(
        scenarios,
        "reference_engine",
        lambda: as_dict(discrete_run(ShardedOracle(Targeted()), "reference")),
    )
    for name, call in continuous_calls(ShardedOracle).items():
        attempt(scenarios, name, lambda call=call: as_dict(call()))
    for rows in (1, 5):
        sharded = ShardedOracle(Targeted())
        attempt(
            scenarios, f"direct_{rows}", lambda s=sharded, r=rows: s.log_marginals_at(*query(r))
        )
    for chains, length in ((1, 9), (3, 5)):
        replica = ChainQueries()
        sharded = ShardedOracle(replica)
        attempt(
            scenarios,
            f"chain_{chains}x{length}",
            lambda s=sharded, r=replica, c=chains, n=length: {
                "out": s.log_marginals_chain(*chain_query(c, n)),
                "conditionings": r.conditionings,
            },
        )
    sharded = ShardedOracle(Targeted())
    values, mask, targets = query(4)
    attempt(
        scenarios,
        "out_of_lockstep",
        lambda: sharded.log_marginals_at(values[: 3 + rank], mask[: 3 + rank], targets[: 3 + rank]),
    )
    attempt(
        scenarios, "inputs_differ", lambda: sharded.log_marginals_at(values * rank, mask, targets)
    )
    attempt(
        scenarios,
        "raises_on_one_rank",
        lambda: ShardedOracle(Raising()).log_marginals_at(values, mask, targets),
    )
    attempt(scenarios, "after_errors", lambda: as_dict(discrete_run(ShardedOracle(Targeted()))))
    return scenarios


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(sharded_worker, tmp_path_factory.mktemp("sharded"))


@pytest.mark.parametrize("name", list(oracles()))
def test_sharded_draws_equal_the_unsharded_oracle(ranks, name):
    oracle = oracles()[name]
    want = as_dict(discrete_run(oracle))
    for rank in range(WORLD):
        got = ranks[rank][name]
        assert_same(got, want)
        assert got["rounds"] == want["rounds"] and got["oracle_rows"] == want["oracle_rows"]
    if name == "markov":
        return
    # Each rank evaluated about half the rows (at most one padding row per call).
    total, calls = oracle.rows, ranks[0][name]["calls"]
    for rank in range(WORLD):
        rows = ranks[rank][name]["rows"]
        assert total / WORLD <= rows <= total / WORLD + calls * (WORLD - 1), (rows, total, calls)


def test_reference_engine(ranks):
    want = as_dict(discrete_run(Targeted(), "reference"))
    for rank in range(WORLD):
        assert_same(ranks[rank]["reference_engine"], want)


@pytest.mark.parametrize("name", list(continuous_calls(lambda oracle: oracle)))
def test_sharded_mean_oracles_drifts_and_families(ranks, name):
    want = as_dict(continuous_calls(lambda oracle: oracle)[name]())
    for rank in range(WORLD):
        assert_same(ranks[rank][name], want)


@pytest.mark.parametrize("rows", [1, 5])
def test_direct_calls_with_fewer_or_odd_rows(ranks, rows):
    want = Targeted().log_marginals_at(*query(rows))
    for rank in range(WORLD):
        got = ranks[rank][f"direct_{rows}"]
        assert isinstance(got, torch.Tensor), got
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("chains, length", [(1, 9), (3, 5)])
def test_chain_queries_are_split_by_conditionings(ranks, chains, length):
    """One long chain is shared out too: each rank evaluates about half its positions."""
    want = ChainQueries().log_marginals_chain(*chain_query(chains, length))
    for rank in range(WORLD):
        got = ranks[rank][f"chain_{chains}x{length}"]
        assert "raised" not in got, got
        assert got["out"].shape == want.shape and torch.equal(got["out"], want)
        share = -(-chains * length // WORLD)
        # a rank's share, padded to its longest sub-chain (at most two partial chains)
        assert got["conditionings"] <= 2 * max(share, length), got["conditionings"]
    evaluated = sum(ranks[r][f"chain_{chains}x{length}"]["conditionings"] for r in range(WORLD))
    assert chains * length <= evaluated < WORLD * chains * length


@pytest.mark.parametrize(
    "name, words",
    [
        ("out_of_lockstep", ["out of lockstep", "rank 0: call 1 of method 2 with 3 rows"]),
        ("inputs_differ", ["out of lockstep", "inputs differ"]),
    ],
)
def test_ranks_out_of_lockstep_raise_on_every_rank(ranks, name, words):
    for rank in range(WORLD):
        got = ranks[rank][name]
        assert isinstance(got, dict) and got.get("raised") == "RuntimeError", got
        for word in words:
            assert word in got["message"]


def test_a_replica_raising_on_one_rank_raises_on_every_rank(ranks):
    zero, one = ranks[0]["raises_on_one_rank"], ranks[1]["raises_on_one_rank"]
    assert zero.get("raised") == one.get("raised") == "RuntimeError", (zero, one)
    assert "rank(s) [1]" in zero["message"]
    assert "replica 1 is broken" in one["message"] and "rank 1" in one["message"]


def test_group_still_works_after_errors(ranks):
    want = as_dict(discrete_run(Targeted()))
    for rank in range(WORLD):
        assert_same(ranks[rank]["after_errors"], want)


# ------------------------------------------------------------------------ one process
def test_offers_only_the_methods_of_the_replica(one_rank_group):
    rows_only, targeted, chains = (
        ShardedOracle(o) for o in (RowsOnly(), Targeted(), ChainQueries())
    )
    assert not has_targeted_marginals(rows_only) and not has_chain_marginals(rows_only)
    assert has_targeted_marginals(targeted) and not has_chain_marginals(targeted)
    assert has_targeted_marginals(chains) and has_chain_marginals(chains)
    # a chain query with the row after it is not sharded: hidden, so asked as sharded rows
    tree = TreePottsOracle.ising([(0, 1), (1, 2)], coupling=0.5)
    assert has_chain_then(tree) and not has_chain_then(ShardedOracle(tree))
    assert rows_only.num_coords == 30 and rows_only.num_values == 2
    assert ShardedOracle(FamilyOracle()).num_draws == 6
    assert ShardedOracle(FiniteSupportDenoiser(POINTS)).dim == 2
    with pytest.raises(AttributeError):
        rows_only.no_such_attribute  # noqa: B018


class LinearDrift(torch.nn.Module):
    """A drift with parameters and no ``device`` attribute: ``b(t, x) = -x W``."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(2, dtype=torch.float64))

    def forward(self, t, x):
        return -x @ self.weight


def test_device_and_dtype_of_a_module_replica(one_rank_group):
    drift = LinearDrift()
    sharded = ShardedOracle(drift)
    assert sharded.device == torch.device("cpu") and sharded.dtype == torch.float64
    plain = sample_sde(drift, SDE_TIMES, torch.ones(2), 2, seed=0)
    assert torch.equal(
        sample_sde(sharded, SDE_TIMES, torch.ones(2), 2, seed=0).samples, plain.samples
    )


def test_wrapper_errors(one_rank_group):
    sharded = ShardedOracle(Targeted())
    with pytest.raises(ValueError, match="already a ShardedOracle"):
        ShardedOracle(sharded)
    with pytest.raises(TypeError, match="not callable"):
        ShardedOracle(object())(torch.zeros(1), torch.zeros(1, 2))
    assert "Targeted" in repr(sharded)
