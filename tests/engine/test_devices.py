"""Same code, same seed, same samples on every device.

The engine's randomness is keyed (seed, draw, block, thread) and computed with the same integer
arithmetic on every device, and the oracles compute in float64 on their own device, so a GPU
run must reproduce the CPU run draw for draw. These tests
run only where CUDA is available (the device machine); CI has no GPU and skips them. One
test needs no GPU: rows perturbed by rounding noise must give the same samples.
"""

from __future__ import annotations

import math

import pytest
import torch

from pyro_autospec.engine import OracleError, sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.oracles import (
    CurieWeissOracle,
    DPPOracle,
    FiniteSupportDenoiser,
    HMMOracle,
    MarkovChainOracle,
    SpanningTreeOracle,
    TabularOracle,
    TreePottsOracle,
)
from tests.catalogue.oracles import DeclaredBorrowing

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _oracles(device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    n = 48
    stay = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    T = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    emission = torch.randn(n, 3, generator=g, dtype=torch.float64)
    pts = torch.rand(n, 2, generator=g, dtype=torch.float64)
    L = 3.0 * torch.exp(-(torch.cdist(pts, pts) ** 2) * n / 2)
    features = torch.randn(n, 6, generator=g, dtype=torch.float64) / 2
    parents = [int(torch.randint(0, i, (), generator=g)) for i in range(1, n)]
    edges = torch.tensor([[p, i + 1] for i, p in enumerate(parents)])
    side = 5
    grid = [(r * side + c, r * side + c + 1) for r in range(side) for c in range(side - 1)]
    grid += [(r * side + c, (r + 1) * side + c) for r in range(side - 1) for c in range(side)]
    table = torch.randn(3, 3, 3, 3, generator=g, dtype=torch.float64)
    return {
        "markov": MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, n, device=device),
        "hmm": HMMOracle(torch.full((3,), 1 / 3), T, emission, device=device),
        "dpp_full": DPPOracle(L=L, device=device),
        "dpp_lowrank": DPPOracle(features=features, device=device),
        "tree_potts": TreePottsOracle(
            edges,
            torch.full((n - 1,), 0.5, dtype=torch.float64),
            0.1 * torch.randn(n, 2, generator=g, dtype=torch.float64),
            num_values=2,
            device=device,
        ),
        "spanning_tree": SpanningTreeOracle(side * side, torch.tensor(grid), device=device),
        "curie_weiss": CurieWeissOracle(n, beta=1.0, device=device),
        "tabular": TabularOracle(logits=table, device=device),
    }


NAMES = [
    "markov",
    "hmm",
    "dpp_full",
    "dpp_lowrank",
    "tree_potts",
    "spanning_tree",
    "curie_weiss",
    "tabular",
]


class _Rounded:
    """An oracle whose rows differ from another's by rounding noise, as a GPU's do."""

    def __init__(self, oracle, eps: float, seed: int = 0):
        self.oracle, self.eps = oracle, eps
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values
        self.generator = torch.Generator().manual_seed(seed)

    def log_marginals(self, values, mask):
        rows = self.oracle.log_marginals(values, mask)
        noise = torch.randn(rows.shape, generator=self.generator, dtype=rows.dtype)
        return rows + self.eps * noise


@pytest.mark.parametrize("method", ["autospec", "speculative", "agr24"])
@pytest.mark.parametrize("name", ["markov", "hmm", "spanning_tree", "curie_weiss"])
def test_rounding_noise_does_not_shift_the_random_stream(name, method):
    """Rows 1e-14 apart give the same samples: every random number is keyed, so a log ratio
    that is exactly 0 on one device and -1e-16 on another cannot change which random numbers
    later decisions read, and no stale draft row conditioned on a drafted value the target
    calls impossible (whose entries are rounding noise, on the spanning tree) is used."""
    oracle = _oracles("cpu")[name]
    for seed in (0, 1, 5):  # the spanning tree's impossible prefixes needed seeds 0 and 1
        a = sample_any_order(oracle, 16, seed=seed, method=method)
        # the wrapper answers no chain queries, whose default window on a CPU differs: the
        # same schedule is passed
        noisy = _Rounded(oracle, 1e-14)
        b = sample_any_order(noisy, 16, seed=seed, method=method, schedule=a.schedule)
        assert torch.equal(a.samples, b.samples), seed
    assert a.oracle_rows == b.oracle_rows


@needs_cuda
def test_cuda_lean_windows_for_many_draws_reproduce_on_cpu():
    """256 draws in flight on a GPU take the rows-lean window; the recorded schedule gives
    the GPU's draws on the CPU."""
    n = 256
    stay = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    cpu = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, n)
    gpu = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, n, device="cuda")
    b = sample_any_order(gpu, 256, seed=5)
    assert b.schedule["max_block"] == 16
    a = sample_any_order(cpu, 256, seed=5, schedule=b.schedule)
    assert torch.equal(a.samples, b.samples.cpu())
    assert torch.equal(a.sample_rounds, b.sample_rounds.cpu()) and a.oracle_rows == b.oracle_rows


@needs_cuda
@pytest.mark.parametrize("method", ["autospec", "speculative", "agr24", "sequential"])
@pytest.mark.parametrize(
    "name",
    NAMES,
)
def test_cuda_reproduces_cpu_draw_for_draw(name, method):
    cpu = _oracles("cpu")[name]
    gpu = _oracles("cuda")[name]
    assert torch.device(gpu.device).type == "cuda"
    a = sample_any_order(cpu, 16, seed=5, method=method)
    b = sample_any_order(gpu, 16, seed=5, method=method)
    assert torch.equal(a.samples, b.samples)
    assert torch.equal(a.sample_rounds, b.sample_rounds) and a.oracle_rows == b.oracle_rows
    torch.testing.assert_close(a.log_prob, b.log_prob, rtol=0, atol=1e-8)
    assert math.isfinite(float(b.log_prob.sum()))


@needs_cuda
@pytest.mark.parametrize("num_samples", [16, 256])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_lock_step_with_fresh_and_borrowed_inputs_reproduces_cpu(name, num_samples):
    """Sequential sampling with every draw in flight runs in lock step: on CUDA over dense
    tensors, handed to an oracle that borrows its inputs as views of the tensors the step
    keeps, and to one that does not as fresh copies. Both give the CPU's draws."""
    cpu = _oracles("cpu")[name]
    gpu = _oracles("cuda")[name]
    a = sample_any_order(cpu, num_samples, seed=3, method="sequential")
    for borrows in (False, True):
        b = sample_any_order(
            DeclaredBorrowing(gpu, borrows), num_samples, seed=3, method="sequential"
        )
        assert torch.equal(a.samples, b.samples.cpu()), borrows
        torch.testing.assert_close(a.log_prob, b.log_prob.cpu(), rtol=0, atol=1e-8)


@needs_cuda
@pytest.mark.parametrize("method", ["autospec", "sequential", "picard"])
def test_cuda_diffusion_reproduces_cpu(method):
    # The flat verification sums segments with torch.segment_reduce on CUDA and the sequential
    # chain runs in lockstep: the same keyed noise and float64 arithmetic as on the CPU, so
    # the same rounds and the same draws up to the last bits of the drifts.
    kwargs = {"num_steps": 64, "delta": 0.02, "seed": 4, "method": method, "return_paths": True}
    _diffusion_on_cpu_and_cuda(12, **kwargs)


def _diffusion_on_cpu_and_cuda(num: int, **kwargs) -> None:
    """A six-point target sampled on the CPU and on CUDA: the same rounds, rows and draws."""
    angles = torch.arange(6, dtype=torch.float64) * (2 * math.pi / 6)
    points = torch.stack([torch.cos(angles), torch.sin(angles)], -1)
    weights = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 2.0])
    a = sample_diffusion(FiniteSupportDenoiser(points, weights), num, **kwargs)
    b = sample_diffusion(FiniteSupportDenoiser(points, weights, device="cuda"), num, **kwargs)
    assert b.samples.device.type == "cuda"
    assert torch.equal(a.sample_rounds, b.sample_rounds.cpu()) and a.oracle_rows == b.oracle_rows
    torch.testing.assert_close(a.samples, b.samples.cpu(), rtol=0, atol=1e-9)


@needs_cuda
@pytest.mark.parametrize(
    ("method", "knobs"),
    [("autospec", {"rule": "block"}), ("autospec", {}), ("picard", {}), ("sequential", {})],
)
def test_cuda_reference_diffusion_reproduces_cpu(method, knobs):
    # The reference engine (and the block rule, which always runs on it) built its block
    # noise on the host: a GPU run raised a device mismatch that no CPU test could see.
    kwargs = {"num_steps": 32, "delta": 0.02, "seed": 4, "method": method, "engine": "reference"}
    _diffusion_on_cpu_and_cuda(4, **kwargs, **knobs)


@needs_cuda
@pytest.mark.parametrize("method", ["autospec", "agr24", "sequential"])
def test_cuda_reference_engine_reproduces_cpu(method):
    cpu = _oracles("cpu")["markov"]
    gpu = _oracles("cuda")["markov"]
    a = sample_any_order(cpu, 4, seed=5, method=method, engine="reference")
    b = sample_any_order(gpu, 4, seed=5, method=method, engine="reference")
    assert torch.equal(a.samples, b.samples.cpu())
    assert torch.equal(a.sample_rounds, b.sample_rounds.cpu()) and a.oracle_rows == b.oracle_rows


class _WritesIntoItsMask:
    """Answers rows only, borrows its inputs and clears the coordinates it was shown as pinned
    (a bug a user's oracle can have): the engine must refuse it on the device as on the host."""

    borrows_inputs = True
    inference_safe = True  # called in inference mode, where PyTorch lets the write through

    def __init__(self, oracle):
        self.inner = oracle
        self.num_coords, self.num_values = oracle.num_coords, oracle.num_values

    def log_marginals(self, values, mask):
        rows = self.inner.log_marginals(values, mask)
        mask.zero_()
        return rows


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("method", ["sequential", "autospec"])
def test_writes_into_borrowed_inputs_are_refused_on_the_device(device, method):
    """The borrowed-inputs check compares the inputs of a call with a copy taken on the
    oracle's device (the mask of an inference-safe oracle is writable there too)."""
    oracle = _WritesIntoItsMask(_oracles(device)["markov"])
    with pytest.raises(OracleError, match="wrote into the inputs it borrows"):
        sample_any_order(oracle, 16, seed=0, method=method)
