"""The engine runs in inference mode; foreign code (oracles, drifts) runs outside it.

What must hold: an oracle or drift that is not ``inference_safe`` is called with inference
mode off and in the caller's grad mode, so a tensor it creates while sampling (a parameter set
on first use, like ``pyro.param``) stays trainable; built-in oracles are called in inference
mode; every tensor a sampler returns is an ordinary tensor that can be written in place.
"""

from __future__ import annotations

import pytest
import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.methods import DISCRETE, METHODS
from pyro_autospec.engine.modes import calling, engine_mode, ordinary
from pyro_autospec.engine.protocols import is_inference_safe
from pyro_autospec.oracles import MarkovChainOracle
from pyro_autospec.oracles.denoisers import GaussianDenoiser

TRANSITION = [[0.7, 0.3], [0.4, 0.6]]
DISCRETE_METHODS = [name for name, m in METHODS.items() if DISCRETE in m.settings]


def chain(n: int = 12) -> MarkovChainOracle:
    return MarkovChainOracle([0.5, 0.5], TRANSITION, n=n)


class Recording:
    """Wraps an oracle; records the modes of every call; creates a parameter on first use."""

    def __init__(self, inner, inference_safe: bool = False):
        self.inner = inner
        self.num_coords, self.num_values = inner.num_coords, inner.num_values
        self.inference_safe = inference_safe
        self.modes: set[tuple[bool, bool]] = set()
        self.weight: torch.Tensor | None = None

    def _record(self) -> None:
        self.modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        if self.weight is None:  # what pyro.param does on first use
            self.weight = torch.zeros(3).requires_grad_(True)

    def log_marginals(self, values, mask):
        self._record()
        return self.inner.log_marginals(values, mask)

    def log_marginals_at(self, values, mask, targets):
        self._record()
        return self.inner.log_marginals_at(values, mask, targets)


@pytest.mark.parametrize("method", DISCRETE_METHODS)
def test_foreign_oracle_runs_outside_inference_mode(method):
    oracle = Recording(chain())
    sample_any_order(oracle, 3, seed=0, method=method)
    assert oracle.modes == {(False, True)}  # the caller's grad mode: enabled
    with torch.no_grad():
        sample_any_order(oracle, 3, seed=1, method=method)
    assert (False, False) in oracle.modes
    # the parameter created while sampling trains like any other
    with torch.no_grad():
        oracle.weight.add_(1.0)
    (oracle.weight * 2.0).sum().backward()
    assert torch.equal(oracle.weight.grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("method", DISCRETE_METHODS)
def test_safe_oracle_runs_in_inference_mode(method):
    oracle = Recording(chain(), inference_safe=True)
    sample_any_order(oracle, 3, seed=0, method=method)
    assert oracle.modes == {(True, False)}


def test_safe_and_foreign_draws_agree():
    safe = sample_any_order(Recording(chain(), True), 5, seed=4, method="autospec")
    foreign = sample_any_order(Recording(chain(), False), 5, seed=4, method="autospec")
    assert torch.equal(safe.samples, foreign.samples)


def test_built_in_oracles_are_inference_safe():
    assert is_inference_safe(chain())
    assert is_inference_safe(GaussianDenoiser(torch.zeros(2), torch.eye(2, dtype=torch.float64)))
    assert not is_inference_safe(Recording(chain()))

    class Truthy:
        inference_safe = 1  # only True itself opts in

    assert not is_inference_safe(Truthy())


@pytest.mark.parametrize("method", [*DISCRETE_METHODS, "reference"])
def test_discrete_results_are_ordinary_tensors(method):
    engine = "reference" if method == "reference" else "fast"
    result = sample_any_order(
        chain(), 3, seed=0, method="autospec" if engine == "reference" else method, engine=engine
    )
    for name in ("samples", "log_prob", "sample_rounds", "orders"):
        tensor = getattr(result, name)
        assert not tensor.is_inference(), name
        tensor.add_(0)  # writable outside inference mode


class RecordingDrift:
    """A drift (the Gaussian denoiser's) that records the modes of its calls."""

    def __init__(self):
        self.inner = GaussianDenoiser(torch.zeros(2), torch.eye(2, dtype=torch.float64))
        self.dim = 2
        self.modes: set[tuple[bool, bool]] = set()

    def __call__(self, t, x):
        self.modes.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return self.inner(t, x)


@pytest.mark.parametrize("method", ["autospec", "sequential", "picard"])
def test_diffusion_runs_foreign_drifts_outside_inference_mode(method):
    drift = RecordingDrift()
    result = sample_diffusion(drift, 4, num_steps=8, method=method, seed=0, return_paths=True)
    assert drift.modes == {(False, True)}  # the caller's grad mode, as for an oracle (it was off)
    with torch.no_grad():
        sample_diffusion(drift, 4, num_steps=8, method=method, seed=0)
    assert (False, False) in drift.modes
    for name in ("samples", "log_prob", "paths", "times", "error"):
        tensor = getattr(result, name)
        if tensor is not None:
            assert not tensor.is_inference(), name
            tensor.add_(0)


def test_sde_results_are_ordinary_tensors():
    result = sample_sde(lambda t, x: -x, torch.linspace(0, 1, 9), torch.zeros(2), 4, seed=0)
    assert not result.samples.is_inference()
    assert not result.log_prob.is_inference()


def test_calling_and_ordinary():
    with engine_mode():
        inside = torch.ones(2)
        with calling(Recording(chain()), grad_enabled=True)():
            assert not torch.is_inference_mode_enabled()
            assert torch.is_grad_enabled()
        with calling(chain())():
            assert torch.is_inference_mode_enabled()
    assert inside.is_inference()
    copy = ordinary(inside)
    assert not copy.is_inference() and torch.equal(copy, inside)
    plain = torch.ones(2)
    assert ordinary(plain) is plain
    assert ordinary(None) is None


def _double_well(x):
    return (x**4 / 4 - x**2 / 2).sum(-1)


def _autograd_drift(t, x):
    """-grad U(x), written as users write a Langevin drift."""
    x = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(_double_well(x).sum(), x)
    return -grad


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_a_drift_may_differentiate_a_potential(method):
    """An outside test: such a drift failed ('element 0 of tensors does not require grad'),
    since drifts were called with grad off whatever the caller's mode."""
    times = torch.linspace(0.0, 1.0, 17)
    x0 = torch.tensor([[0.5, -0.2]], dtype=torch.float64).expand(8, 2)
    by_hand = sample_sde(lambda t, x: x - x**3, times, x0, 8, seed=0, method=method)
    result = sample_sde(_autograd_drift, times, x0, 8, seed=0, method=method)
    torch.testing.assert_close(result.samples, by_hand.samples)


def test_setting_requires_grad_on_an_input_needs_grad_or_names_the_copy():
    """With grad enabled the inputs are the drift's own copies; under no_grad they are the
    engine's inference tensors, and setting requires_grad on one names the copy to make."""

    def in_place(t, x):
        with torch.enable_grad():
            x.requires_grad_()
            (grad,) = torch.autograd.grad(_double_well(x).sum(), x)
        return -grad

    times = torch.linspace(0.0, 1.0, 9)
    x0 = torch.tensor([[0.5, -0.2]], dtype=torch.float64).expand(4, 2)
    by_hand = sample_sde(lambda t, x: x - x**3, times, x0, 4, seed=0)
    torch.testing.assert_close(sample_sde(in_place, times, x0, 4, seed=0).samples, by_hand.samples)
    with torch.no_grad(), pytest.raises(OracleError, match=r"x = x.clone\(\).requires_grad_"):
        sample_sde(in_place, times, x0, 4, seed=0)


class _Embedding:
    """A learned any-order network's usual first layer: an embedding of the values, whose
    backward saves its indices (an outside review: 'Inference tensors cannot be saved for
    backward', raw, under the default grad mode)."""

    num_coords, num_values = 6, 2

    def __init__(self):
        self.table = torch.nn.Parameter(
            torch.randn(2, 2, generator=torch.Generator().manual_seed(0))
        )

    def log_marginals(self, values, mask):
        embedded = torch.nn.functional.embedding(values, self.table) * mask.unsqueeze(-1)
        logits = embedded.sum(1, keepdim=True).expand(-1, self.num_coords, -1)
        return torch.log_softmax(logits.double(), -1)


@pytest.mark.parametrize("method", ["autospec", "sequential", "agr24"])
@pytest.mark.parametrize("num_samples", [1, 16])
def test_a_network_oracle_saving_its_inputs_runs_in_the_default_grad_mode(method, num_samples):
    oracle = _Embedding()
    result = sample_any_order(oracle, num_samples, seed=0, method=method)
    with torch.no_grad():
        again = sample_any_order(oracle, num_samples, seed=0, method=method)
    assert torch.equal(result.samples, again.samples)
    assert torch.equal(result.log_prob, again.log_prob)


def test_a_network_drift_runs_in_the_default_grad_mode():
    """nn.Linear saves its input for backward: the drift's state must be an ordinary tensor."""
    net = torch.nn.Linear(2, 2)
    times = torch.linspace(0.0, 1.0, 9)
    for method in ("autospec", "sequential", "picard"):
        result = sample_sde(lambda t, x: net(x), times, torch.zeros(2), 4, seed=0, method=method)
        with torch.no_grad():
            again = sample_sde(lambda t, x: net(x), times, torch.zeros(2), 4, seed=0, method=method)
        assert torch.equal(result.samples, again.samples), method
        assert torch.equal(result.log_prob, again.log_prob), method
