import math

import pytest
import torch

import pyro_autospec.oracles.dpp as dpp_module
from pyro_autospec.engine import sample_any_order
from pyro_autospec.oracles._util import work_entries
from pyro_autospec.oracles.dpp import DPPOracle
from tests.catalogue.oracle_reference import (
    assert_chain_matches_rows,
    assert_same_marginals,
    enumerate_joint,
    random_chains,
    random_queries,
    tabular_reference,
)
from tests.catalogue.oracles import random_kernel
from tests.catalogue.references import dpp_log_prob
from tests.stats import assert_samples_match


def impossible_by_reference(oracle, values, mask):
    """Rows whose pins have probability 0 under the enumerated law of ``oracle.kernel``."""
    table = enumerate_joint(dpp_log_prob(oracle.kernel), oracle.num_coords, 2)
    reference = tabular_reference(lambda x: float(table[x]), oracle.num_coords, 2)
    return torch.isnan(reference.log_marginals(values, mask)).any(-1).any(-1)


def random_pins(n, batch, seed, in_probability=0.3):
    """Queries with few in-pins (values 1) and many out-pins, every mask density."""
    gen = torch.Generator().manual_seed(seed)
    values = (torch.rand(batch, n, generator=gen) < in_probability).long()
    mask = torch.rand(batch, n, generator=gen) < torch.rand(batch, 1, generator=gen)
    targets = torch.randint(0, n, (batch, 5), generator=gen)
    return values, mask, targets


@pytest.mark.parametrize("n,rank", [(1, None), (4, None), (6, None), (6, 3)])
def test_matches_brute_force(n, rank):
    kernel = random_kernel(n, seed=n, projection_rank=rank)
    oracle = DPPOracle(kernel=kernel)
    reference = tabular_reference(dpp_log_prob(oracle.kernel), n, 2)
    values, mask, targets = random_queries(n, 2, 200, seed=n)
    compared = assert_same_marginals(
        oracle, reference, values, mask, targets, exact_zeros=rank is None
    )
    assert compared > 50


def test_l_ensemble_matches_brute_force():
    gen = torch.Generator().manual_seed(3)
    features = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    ell = features @ features.T + 0.1 * torch.eye(5, dtype=torch.float64)
    oracle = DPPOracle(L=ell)

    def log_prob(x):
        idx = [i for i, v in enumerate(x) if v]
        det = torch.linalg.det(ell[idx][:, idx]) if idx else torch.tensor(1.0)
        return math.log(float(det)) - math.log(float(torch.linalg.det(torch.eye(5) + ell)))

    reference = tabular_reference(log_prob, 5, 2)
    values, mask, targets = random_queries(5, 2, 200, seed=1)
    assert_same_marginals(oracle, reference, values, mask, targets)


def test_sequential_schur_updates_agree():
    # the closed form equals the chain of rank-one Schur updates (the DPP oracle's Notes)
    kernel = random_kernel(6, seed=11)
    oracle = DPPOracle(kernel=kernel)
    values = torch.tensor([[1, 0, 0, 1, 0, 0]])
    mask = torch.tensor([[True, True, False, True, False, False]])
    k = oracle.kernel.clone()
    for i in [0, 1, 3]:
        if values[0, i] == 1:
            k = k - torch.outer(k[:, i], k[i, :]) / k[i, i]
        else:
            k = k + torch.outer(k[:, i], k[i, :]) / (1 - k[i, i])
    out = oracle.log_marginals(values, mask)[0]
    for i in [2, 4, 5]:
        torch.testing.assert_close(out[i, 1].exp(), k[i, i])


def test_batch_of_one_and_point_masses():
    oracle = DPPOracle(L=torch.tensor([[1.0, 0.5], [0.5, 1.0]]))
    values = torch.tensor([[1, 5]])
    mask = torch.tensor([[True, False]])
    out = oracle.log_marginals(values, mask)
    assert out.shape == (1, 2, 2)
    assert out[0, 0].tolist() == [-math.inf, 0.0]
    # P(1 in | 0 in) = det(L_{01}) / (det(L_{01}) + det(L_0)) = 0.75 / 1.75
    torch.testing.assert_close(out[0, 1, 1].exp(), torch.tensor(0.75 / 1.75, dtype=torch.float64))
    at = oracle.log_marginals_at(values, mask, torch.tensor([[1, 0]]))
    torch.testing.assert_close(at[0], out[0, [1, 0]])


def test_projection_dpp_has_fixed_size():
    kernel = random_kernel(5, seed=2, projection_rank=2)
    oracle = DPPOracle(kernel=kernel)
    values = torch.tensor([[1, 1, 0, 0, 0]])
    mask = torch.tensor([[True, True, False, False, False]])
    out = oracle.log_marginals(values, mask)[0, 2:].exp()
    torch.testing.assert_close(out[:, 1], torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(), "exactly one of kernel"),
        (dict(kernel=torch.eye(2), L=torch.eye(2)), "exactly one of kernel"),
        (dict(kernel=torch.ones(2, 3)), "square"),
        (dict(kernel=torch.tensor([[0.5, 0.1], [0.0, 0.5]])), "symmetric"),
        (dict(kernel=2 * torch.eye(2)), "eigenvalues in \\[0, 1\\]"),
        (dict(L=-torch.eye(2)), "positive semi-definite"),
        (dict(L=torch.eye(2), features=torch.ones(2, 1)), "exactly one of"),
        (dict(features=torch.ones(3)), "features must be a \\[n, d\\] matrix"),
    ],
)
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPPOracle(**kwargs)


# -- low-rank kernels, features= and the choice of formulation ---------------------------------
PATHS = ["auto", "lowrank", "block"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n,rank", [(6, 3), (7, 1), (6, 5)])
def test_low_rank_kernel_matches_brute_force(n, rank, path):
    oracle = DPPOracle(kernel=random_kernel(n, seed=10 + n + rank, rank=rank))
    assert oracle.rank == rank and oracle.factor.shape == (n, rank)
    oracle.path = path
    reference = tabular_reference(dpp_log_prob(oracle.kernel), n, 2)
    values, mask, targets = random_queries(n, 2, 200, seed=rank)
    assert assert_same_marginals(oracle, reference, values, mask, targets) > 50
    # more in-pins than the rank: impossible, NaN
    values = torch.ones(1, n, dtype=torch.long)
    mask = torch.arange(n)[None] <= rank
    assert torch.isnan(oracle.log_marginals(values, mask)[~mask]).all()


@pytest.mark.parametrize("path", PATHS)
def test_projection_kernel_exact_zeros(path):
    n, rank = 6, 3
    oracle = DPPOracle(kernel=random_kernel(n, seed=2, projection_rank=rank))
    assert (oracle.rank, oracle.num_unit) == (rank, rank)
    oracle.path = path
    reference = tabular_reference(dpp_log_prob(oracle.kernel), n, 2)
    values, mask, targets = random_queries(n, 2, 300, seed=5)
    assert assert_same_marginals(oracle, reference, values, mask, targets) > 50
    # rank items in: no room for more (exact zeros); n - rank out: the rest are in (exact ones)
    values = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 5, 5, 5], [0, 0, 0, 0, 5, 5]])
    mask = torch.tensor([[True, True, True, False, False, False]] * 2 + [[True] * 4 + [False] * 2])
    prob = oracle.log_marginals(values, mask).exp()
    assert prob[0, 3:, 1].tolist() == [0.0, 0.0, 0.0]
    assert prob[1, 3:, 1].tolist() == [1.0, 1.0, 1.0]
    # four items out: only two left for a set of size 3, impossible
    assert torch.isnan(prob[2, 4:]).all()
    # the sampler never draws more (or fewer) items than the rank
    samples = sample_any_order(DPPOracle(kernel=random_kernel(12, 3, 4)), 64, seed=0).samples
    assert (samples.sum(1) == 4).all()


@pytest.mark.parametrize("path", PATHS)
def test_features_match_brute_force_and_l_ensemble(path):
    gen = torch.Generator().manual_seed(4)
    phi = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    oracle = DPPOracle(features=phi)
    assert oracle.rank == 3 and oracle._kernel_padded is None
    oracle.path = path
    ell = phi @ phi.T
    torch.testing.assert_close(oracle.kernel, DPPOracle(L=ell).kernel, atol=1e-12, rtol=0)

    def log_prob(x):
        idx = [i for i, v in enumerate(x) if v]
        det = float(torch.linalg.det(ell[idx][:, idx])) if idx else 1.0
        if det < 1e-12:
            return -math.inf
        return math.log(det) - math.log(float(torch.linalg.det(torch.eye(6) + ell)))

    reference = tabular_reference(log_prob, 6, 2)
    values, mask, targets = random_queries(6, 2, 200, seed=2)
    assert assert_same_marginals(oracle, reference, values, mask, targets, exact_zeros=False) > 50


def test_rank_deficient_features():
    # d = 4 features spanning only 2 dimensions: rank 2
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(7, 2, generator=gen, dtype=torch.float64) @ torch.randn(
        2, 4, generator=gen, dtype=torch.float64
    )
    oracle = DPPOracle(features=phi)
    assert oracle.rank == 2
    torch.testing.assert_close(oracle.kernel, DPPOracle(L=phi @ phi.T).kernel)


def test_zero_kernel():
    oracle = DPPOracle(features=torch.zeros(3, 2))
    assert oracle.rank == 0
    values = torch.tensor([[0, 0, 0], [1, 0, 0]])
    mask = torch.tensor([[False] * 3, [True, False, False]])
    prob = oracle.log_marginals(values, mask).exp()
    assert prob[0, :, 1].tolist() == [0.0, 0.0, 0.0]
    assert torch.isnan(prob[1, 1:]).all()


def test_out_pins_of_probability_zero_give_nan():
    # item 0 is always in (K_00 = 1, a unit eigenvalue): pinning it out is impossible
    rest = random_kernel(4, seed=1, rank=2)
    kernel = torch.zeros(5, 5, dtype=torch.float64)
    kernel[0, 0] = 1.0
    kernel[1:, 1:] = rest
    values = torch.tensor([[0, 0, 1, 0, 0], [1, 0, 1, 0, 0]])
    mask = torch.tensor([[True, False, False, False, False], [True, True, True, False, False]])
    impossible = impossible_by_reference(DPPOracle(kernel=kernel), values, mask)
    assert impossible.tolist() == [True, False]
    for path in PATHS:
        oracle = DPPOracle(kernel=kernel)
        oracle.path = path
        out = oracle.log_marginals(values, mask)
        assert torch.isnan(out[0, 1:]).all()
        assert not torch.isnan(out[1]).any()


def _random_l(n, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    return a @ a.T / n


@pytest.mark.parametrize(
    "make",
    [
        lambda: DPPOracle(features=torch.randn(40, 6, generator=torch.Generator().manual_seed(0))),
        lambda: DPPOracle(L=_random_l(30, seed=1)),
        lambda: DPPOracle(kernel=random_kernel(30, seed=3, rank=12)),
        lambda: DPPOracle(kernel=random_kernel(30, seed=4)),
    ],
)
def test_formulations_agree(make, monkeypatch):
    oracle = make()
    n = oracle.num_coords
    values, mask, targets = random_pins(n, 150, seed=n)
    paths = PATHS + (["free"] if oracle._ell_padded is not None else [])
    results = {}
    for path in paths:
        oracle.path = path
        results[path] = oracle.log_marginals_at(values, mask, targets).exp()
    full = oracle.log_marginals(values, mask).exp()
    # tiny chunks give the same answers
    monkeypatch.setattr(dpp_module, "_MAX_WORK_ENTRIES", 1)
    oracle.path = "auto"
    chunked = oracle.log_marginals_at(values, mask, targets).exp()
    # so do one chunk for everything (the attribute overrides the module's budget)
    oracle.max_work_entries = 1 << 40
    whole = oracle.log_marginals_at(values, mask, targets).exp()
    oracle.max_work_entries = None
    nan = torch.isnan(results["block"]).any(-1).any(-1)
    assert (~nan).sum() > 100
    for path, got in results.items():
        assert torch.equal(torch.isnan(got).any(-1).any(-1), nan), path
        torch.testing.assert_close(got[~nan], results["block"][~nan], atol=1e-10, rtol=0)
    torch.testing.assert_close(chunked[~nan], results["auto"][~nan], atol=1e-12, rtol=0)
    torch.testing.assert_close(whole[~nan], results["auto"][~nan], atol=1e-12, rtol=0)
    assert torch.equal(torch.isnan(whole).any(-1).any(-1), nan)
    rows = torch.arange(len(values))[:, None]
    torch.testing.assert_close(full[rows, targets][~nan], results["auto"][~nan])


def test_features_sampler_is_exact():
    # chi-square of the full sampler on a rank-3 dual L-ensemble of 6 items
    gen = torch.Generator().manual_seed(7)
    phi = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    oracle = DPPOracle(features=phi)
    joint = enumerate_joint(dpp_log_prob(oracle.kernel), 6, 2)
    joint = joint - torch.logsumexp(joint.flatten(), 0)
    result = sample_any_order(oracle, 2000, seed=7, order="random")
    assert (result.samples.sum(1) <= 3).all()
    assert_samples_match(result.samples, joint, 2)


def test_path_is_checked_when_set():
    oracle = DPPOracle(kernel=random_kernel(4, seed=5))
    with pytest.raises(ValueError, match="path must be one of"):
        oracle.path = "cholesky"
    with pytest.raises(ValueError, match="built from L="):
        oracle.path = "free"
    assert oracle.path == "auto"


def test_chunk_budget_by_device():
    cpu = torch.device("cpu")
    assert work_entries(cpu, 12345) == 12345
    if torch.cuda.is_available():
        gpu = torch.device("cuda")
        memory = torch.cuda.get_device_properties(gpu).total_memory
        assert 1 << 10 <= work_entries(gpu, 1 << 10) <= max(1 << 10, memory // 8 // 16)


def test_batched_solve_with_several_threads():
    # pytorch/pytorch#141358: after torch.set_num_threads(2), MKL's batched LU returned wrong
    # solutions without an error (torch 2.13.0+cpu: 29 of 150 batches of this loop, all of
    # them the 8 systems of size 256). The oracle's solves must stay right whatever the
    # thread count, without changing it.
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(0)
        for _ in range(10):
            for batch, m in [(8, 256), (20, 300), (4, 500), (64, 128), (30, 64)]:
                eye = torch.eye(m, dtype=torch.float64)
                system = torch.randn(batch, m, m, generator=gen, dtype=torch.float64) + 3 * eye
                rhs = torch.randn(batch, m, 2, generator=gen, dtype=torch.float64)
                solution, singular = dpp_module._solve(system, rhs)
                assert not singular.any()
                torch.testing.assert_close(system @ solution, rhs, atol=1e-8, rtol=0)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


def _chain_oracles(n):
    gen = torch.Generator().manual_seed(n)
    return {
        "kernel": DPPOracle(kernel=random_kernel(n, seed=n)),
        "L": DPPOracle(L=_random_l(n, seed=n)),
        "features": DPPOracle(features=torch.randn(n, 6, generator=gen, dtype=torch.float64)),
    }


@pytest.mark.parametrize(
    "kind,path",
    [(kind, path) for kind in ("kernel", "L", "features") for path in PATHS] + [("L", "free")],
)
def test_chain_queries_match_rows(kind, path):
    # Full-rank kernels make every pin possible; 6 generic features make exactly the rows
    # with more than 6 items in impossible (the oracle's count rule, NaN both ways).
    n = 150
    oracle = _chain_oracles(n)[kind]
    oracle.path = path
    values, mask, chain = random_chains(n, 2, 40, 17, seed=1, pin_probability=0.2)
    if kind == "features":  # few items in, so that most rows are possible
        values = torch.where(torch.rand(values.shape) < 0.02, values, 0)
    compared = assert_chain_matches_rows(oracle, values, mask, chain, exact_zeros=False)
    assert compared > 40 * 17 // 4
    if kind == "features":  # more items in than the rank (6): NaN, as for rows
        values = torch.ones(1, n, dtype=torch.long)
        out = oracle.log_marginals_chain(values, mask[:1] & False, torch.arange(9)[None])
        assert not torch.isnan(out[0, :7]).any() and torch.isnan(out[0, 7:]).all()
        assert out[0, 6, 1] == -math.inf  # the seventh item has no room


@pytest.mark.parametrize(
    "kind,path", [(kind, path) for kind in ("kernel", "L", "features") for path in PATHS]
)
def test_chain_then_row_matches_rows(kind, path):
    # the row after the chain: the [L + T] block, eliminated over the chain only
    n = 150
    oracle = _chain_oracles(n)[kind]
    oracle.path = path
    values, mask, chain = random_chains(n, 2, 40, 17, seed=2, pin_probability=0.2)
    if kind == "features":
        values = torch.where(
            torch.rand(values.shape, generator=torch.Generator().manual_seed(4)) < 0.02, values, 0
        )
    then = torch.randint(0, n, (40, 6), generator=torch.Generator().manual_seed(3))
    then[:, -1] = chain[:, 0]  # pinned by the chain: a point mass
    out, after = oracle.log_marginals_chain_then(values, mask, chain, then)
    torch.testing.assert_close(out, oracle.log_marginals_chain(values, mask, chain), equal_nan=True)
    pinned = mask.clone()
    pinned.scatter_(1, chain, True)
    expected = oracle.log_marginals_at(values, pinned, then)
    possible = ~torch.isnan(expected).any(-1).any(-1)
    assert int(possible.sum()) > 20
    torch.testing.assert_close(after[possible].exp(), expected[possible].exp(), atol=1e-9, rtol=0)
    first = values.gather(1, chain[:, :1])[:, 0].clamp(0, 1)
    assert torch.equal(after[:, -1].exp(), torch.nn.functional.one_hot(first, 2).double())
    # an empty chain: the row after it is a plain row
    _, alone = oracle.log_marginals_chain_then(values, mask, chain[:, :0], then)
    rows = oracle.log_marginals_at(values, mask, then)
    possible = ~torch.isnan(rows).any(-1).any(-1)
    torch.testing.assert_close(alone[possible].exp(), rows[possible].exp(), atol=1e-9, rtol=0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rank,projection", [(3, False), (3, True)])
def test_chain_queries_with_impossible_pins(rank, projection, path):
    # Low-rank and projection kernels: pins of probability 0 inside the chain make the rows
    # after them impossible (zero pivots); possibility is decided by enumeration.
    n = 7
    if projection:
        kernel = random_kernel(n, seed=3, projection_rank=rank)
    else:
        kernel = random_kernel(n, seed=3, rank=rank)
    oracle = DPPOracle(kernel=kernel)
    oracle.path = path
    reference = tabular_reference(dpp_log_prob(oracle.kernel), n, 2)
    values, mask, chain = random_chains(n, 2, 150, 5, seed=rank, pin_probability=0.2)
    compared = assert_chain_matches_rows(
        oracle, values, mask, chain, reference=reference, exact_zeros=False
    )
    assert compared > 150


def test_chain_elimination_by_hand():
    # in, out, in on a 3 x 3 kernel: the chain rule of rank-one Schur updates
    kernel = random_kernel(3, seed=4)
    oracle = DPPOracle(kernel=kernel)
    values = torch.tensor([[1, 0, 1]])
    chain = torch.tensor([[0, 1, 2]])
    out = oracle.log_marginals_chain(values, torch.zeros(1, 3, dtype=torch.bool), chain)
    k = oracle.kernel.clone()
    expected = []
    for i in range(3):
        expected.append(float(k[i, i]))
        pivot = k[i, i] if values[0, i] == 1 else k[i, i] - 1
        k = k - torch.outer(k[:, i], k[i, :]) / pivot
    torch.testing.assert_close(out[0, :, 1].exp(), torch.tensor(expected, dtype=torch.float64))
