"""``AutoSpec(distributed=True)``: every rank of a two-process gloo group returns the draws of
the single-process run with the same seed (discrete-only and mixed models), ``seed=None``
takes rank 0's seeds, and a missing process group raises a clear error before any work.

The ranks are spawned once for the module (``run_ranks`` of ``tests/catalogue/distributed.py``).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.infer import AutoSpec
from tests.catalogue.distributed import WORLD, attempt, run_ranks
from tests.infer._mixed_models import MIXTURE_DATA, mixture

DATA = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])


def chain_model(data):
    """A binary hidden Markov chain: six discrete latent sites, one Bernoulli emission each."""
    state = pyro.sample("z_0", dist.Bernoulli(0.5))
    for t, y in enumerate(data):
        if t:
            state = pyro.sample(f"z_{t}", dist.Bernoulli(0.2 + 0.6 * state))
        pyro.sample(f"y_{t}", dist.Bernoulli(0.15 + 0.7 * state), obs=y)


def discrete_run(seed, distributed: bool) -> dict:
    fit = AutoSpec(
        chain_model,
        num_samples=7,
        num_chains=2,
        seed=seed,
        disable_progbar=True,
        distributed=distributed,
        sampler="engine",  # the engine shares draws out (forward filtering draws them all)
    ).run(DATA)
    out = {k: v.detach().cpu() for k, v in fit.get_samples(group_by_chain=True).items()}
    if distributed:  # each chain's 7 draws were shared out over the ranks
        out["draws_per_rank"] = torch.tensor([r.per_rank["num_draws"] for r in fit.results])
    return out


def mixed_run(distributed: bool) -> dict:
    fit = AutoSpec(
        mixture,
        num_samples=4,
        warmup_steps=4,
        seed=3,
        disable_progbar=True,
        distributed=distributed,
    ).run(MIXTURE_DATA)
    return {k: v.detach().cpu() for k, v in fit.get_samples().items()}


def front_end_worker(rank: int) -> dict:
    scenarios: dict = {}
    attempt(scenarios, "discrete", lambda: discrete_run(5, True))
    torch.manual_seed(100 + rank)  # seed=None: the ranks' global generators differ
    attempt(scenarios, "seed_none", lambda: discrete_run(None, True))
    attempt(scenarios, "mixed", lambda: mixed_run(True))
    return scenarios


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(front_end_worker, tmp_path_factory.mktemp("front_end"))


def assert_same_samples(got: dict, want: dict) -> None:
    assert "raised" not in got, got.get("tb")
    got = dict(got)
    shares = got.pop("draws_per_rank", None)
    if shares is not None:
        assert shares.tolist() == [[4, 3], [4, 3]]
    want = {k: v for k, v in want.items() if k != "draws_per_rank"}
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs"


@pytest.mark.parametrize(
    "name, single",
    [("discrete", lambda: discrete_run(5, False)), ("mixed", lambda: mixed_run(False))],
)
def test_every_rank_gets_the_single_process_samples(ranks, name, single):
    want = single()
    for rank in range(WORLD):
        assert_same_samples(ranks[rank][name], want)


def test_seed_none_is_rank_zeros_run(ranks):
    first = ranks[0]["seed_none"]
    assert "raised" not in first, first.get("tb")
    for rank in range(1, WORLD):
        assert_same_samples(ranks[rank]["seed_none"], first)


def test_without_a_process_group_the_error_says_how_to_launch():
    fit = AutoSpec(chain_model, num_samples=2, seed=0, disable_progbar=True, distributed=True)
    with pytest.raises(RuntimeError, match="process group"):
        fit.run(DATA)


def test_distributed_must_be_a_bool():
    with pytest.raises(TypeError, match="distributed must be True or False"):
        AutoSpec(chain_model, num_samples=2, distributed="yes")
