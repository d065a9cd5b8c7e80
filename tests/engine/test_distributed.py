"""Draws spread over the ranks of a process group (``distributed=True``).

Two gloo processes on the CPU, spawned from pytest, must return the full result on every rank,
identical draw for draw to one process with the same seed (discrete methods and engines, a
fixed order, a family oracle, a rank with no draws, diffusions and Euler-Maruyama chains);
mismatched calls and a missing process group raise clear errors. One spawn runs every scenario
(starting two Python processes is most of the cost); the comparisons run in the test process.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pyro_autospec.engine import Schedule
from pyro_autospec.engine.any_order import sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.engine.spread import spread_draws
from pyro_autospec.oracles import MarkovChainOracle
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser
from pyro_autospec.parallel import (
    ShardedOracle,
    broadcast_seeds,
    draw_shares,
    local_device,
    require_process_group,
)
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


# ------------------------------------------------------------------------ the scenarios
def chain(n: int = 40) -> MarkovChainOracle:
    return MarkovChainOracle(INIT, STAY, n)


def discrete_calls(distributed: bool) -> dict:
    """The discrete runs compared against one process, keyed by scenario name."""
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(5))
    return {
        "autospec": lambda: sample_any_order(chain(), 7, seed=11, distributed=distributed),
        "speculative_reference": lambda: sample_any_order(
            chain(24), 5, seed=3, method="speculative", engine="reference", distributed=distributed
        ),
        "agr24_fixed_order": lambda: sample_any_order(
            chain(), 4, seed=4, method="agr24", order=perm, distributed=distributed
        ),
        "sequential_capped": lambda: sample_any_order(
            chain(),
            5,
            seed=6,
            method="sequential",
            schedule=Schedule(max_rows_per_round=3),
            distributed=distributed,
        ),
        "one_draw": lambda: sample_any_order(chain(), 1, seed=7, distributed=distributed),
        "family": lambda: sample_any_order(FamilyOracle(), 6, seed=8, distributed=distributed),
        "family_lockstep": lambda: sample_any_order(  # global draw numbers in lockstep
            FamilyOracle(), 6, seed=8, method="gumbel_sequential", distributed=distributed
        ),
        "diffusion": lambda: sample_diffusion(
            FiniteSupportDenoiser(POINTS),
            5,
            num_steps=32,
            seed=2,
            return_paths=True,
            distributed=distributed,
        ),
        "sde_picard": lambda: sample_sde(
            lambda t, x: -x,
            SDE_TIMES,
            torch.arange(6.0).reshape(3, 2),
            3,
            method="picard",
            seed=9,
            distributed=distributed,
        ),
        "sde_reference_one_path": lambda: sample_sde(
            lambda t, x: -x,
            SDE_TIMES,
            torch.ones(2),
            1,
            seed=10,
            engine="reference",
            distributed=distributed,
        ),
    }


def engine_worker(rank: int) -> dict:
    scenarios: dict = {}
    for name, call in discrete_calls(distributed=True).items():
        attempt(scenarios, name, lambda call=call: as_dict(call()))
    attempt(
        scenarios,
        "seed_none",
        lambda: as_dict(sample_any_order(chain(), 3, seed=None, distributed=True)),
    )
    attempt(
        scenarios,
        "seed_mismatch",
        lambda: sample_any_order(chain(), 3, seed=rank, distributed=True),
    )
    attempt(
        scenarios,
        "num_samples_mismatch",
        lambda: sample_any_order(chain(), 3 + rank, seed=0, distributed=True),
    )
    attempt(
        scenarios,
        "method_mismatch",
        lambda: sample_any_order(
            chain(), 3, seed=0, method=("autospec", "sequential")[rank], distributed=True
        ),
    )
    attempt(
        scenarios,
        "sharded_refused",
        lambda: sample_any_order(ShardedOracle(chain()), 2, seed=0, distributed=True),
    )
    attempt(scenarios, "broadcast_seeds", lambda: broadcast_seeds([rank + 100, 7 * rank]))
    attempt(
        scenarios,
        "after_errors",
        lambda: as_dict(sample_any_order(chain(), 2, seed=1, distributed=True)),
    )
    return scenarios


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each of two gloo ranks returned for every scenario (one spawn for the module)."""
    return run_ranks(engine_worker, tmp_path_factory.mktemp("distributed"))


@pytest.mark.parametrize("name", list(discrete_calls(distributed=False)))
def test_every_rank_returns_the_single_process_draws(ranks, name):
    want = as_dict(discrete_calls(distributed=False)[name]())
    for rank in range(WORLD):
        assert_same(ranks[rank][name], want)
    got = ranks[0][name]
    assert got["per_rank"] == ranks[1][name]["per_rank"]
    per_rank = got["per_rank"]
    num = want["samples"].shape[0]
    assert per_rank["num_draws"] == [b - a for a, b in draw_shares(num, WORLD)]
    assert per_rank["first_draw"] == [a for a, _ in draw_shares(num, WORLD)]
    assert got["oracle_rows"] == sum(per_rank["oracle_rows"])
    assert got["rounds"] == max(per_rank["rounds"])
    # Rows are per-draw work, so the ranks' rows add up to the single-process run's.
    assert got["oracle_rows"] == want["oracle_rows"]
    if name != "sequential_capped":  # a rows-per-round cap makes rounds depend on the batch
        assert got["rounds"] == want["rounds"]


def test_seed_none_takes_rank_zero_key(ranks):
    a, b = ranks[0]["seed_none"], ranks[1]["seed_none"]
    assert "raised" not in a and "raised" not in b, a.get("tb", b.get("tb"))
    assert torch.equal(a["samples"], b["samples"])
    assert a["seed"] == b["seed"]  # rank 0's, recorded: it repeats the run in one process
    assert torch.equal(sample_any_order(chain(), 3, seed=a["seed"]).samples, a["samples"])


@pytest.mark.parametrize(
    "name, words",
    [
        ("seed_mismatch", "seeds differ"),
        ("num_samples_mismatch", "num_samples differs"),
        ("method_mismatch", "other arguments differ"),
        ("sharded_refused", "ShardedOracle"),
    ],
)
def test_mismatched_calls_raise_on_every_rank(ranks, name, words):
    for rank in range(WORLD):
        got = ranks[rank][name]
        assert isinstance(got, dict) and got.get("raised") == "ValueError", got
        assert words in got["message"]
        assert "same" in got["message"]


def test_group_still_works_after_errors(ranks):
    want = as_dict(sample_any_order(chain(), 2, seed=1))
    for rank in range(WORLD):
        assert_same(ranks[rank]["after_errors"], want)


def test_broadcast_seeds(ranks):
    assert ranks[0]["broadcast_seeds"] == ranks[1]["broadcast_seeds"] == [100, 0]


# ------------------------------------------------------------------------ one process
@pytest.mark.parametrize(
    "call",
    [
        lambda: sample_any_order(chain(), 2, seed=0, distributed=True),
        lambda: sample_diffusion(
            FiniteSupportDenoiser(POINTS), 2, num_steps=8, seed=0, distributed=True
        ),
        lambda: sample_sde(lambda t, x: -x, SDE_TIMES, torch.zeros(1), 2, seed=0, distributed=True),
        lambda: ShardedOracle(chain()),
        lambda: broadcast_seeds([1]),
    ],
)
def test_without_a_process_group_the_error_says_how_to_launch(call):
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node") as info:
        call()
    assert "process group" in str(info.value)


def test_argument_errors_come_before_the_group_check():
    with pytest.raises(ValueError, match="num_samples"):
        sample_any_order(chain(), 0, seed=0, distributed=True)


@pytest.mark.parametrize("num", [1, 2, 5, 7, 64])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_draw_shares_are_contiguous_balanced_and_cover_every_draw(num, world):
    shares = draw_shares(num, world)
    assert len(shares) == world and shares[0][0] == 0 and shares[-1][1] == num
    assert all(a[1] == b[0] for a, b in zip(shares[:-1], shares[1:]))
    sizes = [b - a for a, b in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert sizes[0] >= 1


def test_local_device():
    assert local_device("cpu") == torch.device("cpu")
    assert local_device(torch.device("cuda", 3)) == torch.device("cuda", 3)


def test_one_rank_group_matches_the_plain_call(one_rank_group):
    assert require_process_group() == (0, 1)
    plain = sample_any_order(chain(), 3, seed=5)
    spread = sample_any_order(chain(), 3, seed=5, distributed=True)
    assert_same(as_dict(spread), as_dict(plain))
    assert spread.per_rank["rounds"] == [plain.rounds]
    assert spread.per_rank["oracle_rows"] == [plain.oracle_rows]
    assert spread.per_rank["num_draws"] == [3] and spread.per_rank["first_draw"] == [0]
    # seed=None works in a group (rank 0's fresh key), and differs from run to run
    a = sample_any_order(chain(), 3, seed=None, distributed=True)
    b = sample_any_order(chain(), 3, seed=None, distributed=True)
    assert not torch.equal(a.samples, b.samples)


def test_spread_draws_checks_the_signature_canonically(one_rank_group):
    """Callables in the signature compare by name: two lambdas at different addresses agree."""
    calls = []

    def run_share(draw_ids, root_key, device):
        calls.append((draw_ids.tolist(), root_key, device))
        return sample_any_order(chain(8), 2, seed=0)

    result = spread_draws(2, 0, run_share, device="cpu", signature=({"rho": lambda: 0},))
    assert calls[0][0] == [0, 1] and calls[0][2] == torch.device("cpu")
    assert result.samples.shape == (2, 8)


def test_distributed_modules_do_not_import_pyro():
    root = Path(__file__).resolve().parents[2]
    for rel in (
        "pyro_autospec/engine/spread.py",
        "pyro_autospec/parallel/groups.py",
        "pyro_autospec/parallel/sharded.py",
    ):
        for node in ast.walk(ast.parse((root / rel).read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "pyro" or n.startswith("pyro.") for n in names), (rel, names)
