"""The MeanOracle protocol, checked the same way on every mean oracle of the catalogue.

``tests/catalogue/conformance.py``'s ``MEAN_CONFORMANCE`` builds each mean oracle (denoiser)
small (one line per oracle: a new mean oracle is tested by adding a line there). For each,
``f(t[B], x[B, d]) -> Tensor[B, d]`` (see :class:`~pyro_autospec.engine.protocols.MeanOracle`):

* ``dim`` an int; the answer a floating-point tensor of shape ``[B, d]``, of its input's dtype
  and on its input's device, finite at every time (``t = 0`` and large ``t`` included) and for
  states far out;
* a batched call equals its rows asked one by one and in reverse order (rows of different
  times in one call: reading ``t[0]`` for every row is the common slip); the same question
  twice gets the same answer; inputs left unchanged; the same answers under
  :func:`torch.inference_mode` for an inference-safe oracle;
* ``f(0, 0) = E[Y]`` where the catalogue knows ``E[Y]``;
* every diffusion method of the registry runs on it.

The exactness of each denoiser against quadrature, brute force and the tower property is
``tests/oracles/test_denoisers.py``'s.
"""

from __future__ import annotations

import inspect
import re
import types

import pytest
import torch

import pyro_autospec.oracles as oracles_module
from pyro_autospec.engine.diffusion import sample_diffusion
from pyro_autospec.engine.methods import DIFFUSION, method_names
from pyro_autospec.engine.protocols import MeanOracle, is_inference_safe
from tests.catalogue.conformance import MEAN_CONFORMANCE

NAMES = sorted(MEAN_CONFORMANCE)
NUM_QUERIES = 24


def build(entry):
    """(oracle, close): the entry's oracle, and what ends it (a generator's group)."""
    made = entry.make()
    if isinstance(made, types.GeneratorType):
        return next(made), made.close
    return made, lambda: None


@pytest.fixture(params=NAMES)
def case(request):
    """(entry, oracle): the oracle built fresh for the test (a generator is closed after it)."""
    entry = MEAN_CONFORMANCE[request.param]
    oracle, close = build(entry)
    yield entry, oracle
    close()


def dtype_of(oracle) -> torch.dtype:
    """The dtype the oracle computes in (float64 when it does not say)."""
    return getattr(oracle, "dtype", torch.float64)


def tolerance(dtype: torch.dtype) -> float:
    return 1e-9 if dtype == torch.float64 else 1e-5


def queries(oracle, seed: int = 0):
    """(t, x): times from 0 to 1000 (0 and the largest included), each state ``t y + B_t`` for
    a random ``y`` of scale 2, and a few states far out (``|x|`` of 1e3 at small times)."""
    gen = torch.Generator().manual_seed(seed)
    dtype, d = dtype_of(oracle), oracle.dim
    t = torch.cat([torch.zeros(1), torch.logspace(-3, 3, NUM_QUERIES - 1)]).double()
    t = t[torch.randperm(NUM_QUERIES, generator=gen)]  # times mixed in the batch
    y = 2 * torch.randn(NUM_QUERIES, d, generator=gen, dtype=torch.float64)
    x = t[:, None] * y + t.sqrt()[:, None] * torch.randn(NUM_QUERIES, d, generator=gen).double()
    far = t < 1e-2
    x[far] = 1e3 * torch.sign(torch.randn(int(far.sum()), d, generator=gen).double())
    return t.to(dtype), x.to(dtype)


def test_protocol_attributes(case):
    entry, oracle = case
    assert isinstance(oracle, MeanOracle)
    assert isinstance(oracle.dim, int) and 1 <= oracle.dim <= 4, "keep the suite small"


def test_means_shape_dtype_device_and_finite(case):
    entry, oracle = case
    t, x = queries(oracle)
    means = oracle(t, x)
    assert isinstance(means, torch.Tensor)
    assert means.shape == (NUM_QUERIES, oracle.dim) and means.is_floating_point()
    assert means.dtype == x.dtype and means.device == x.device
    assert torch.isfinite(means).all(), "NaN or infinite means"
    one = oracle(t[:1], x[:1])  # a batch of one
    assert one.shape == (1, oracle.dim) and one.dtype == x.dtype


def test_a_batch_is_its_rows_one_by_one(case):
    """Rows of different times and states in one call (as every method but ``sequential``
    asks them) equal the rows asked alone and in a call in reverse order."""
    entry, oracle = case
    t, x = queries(oracle)
    together = oracle(t, x)
    alone = torch.cat([oracle(t[i : i + 1], x[i : i + 1]) for i in range(NUM_QUERIES)])
    reverse = oracle(t.flip(0), x.flip(0)).flip(0)
    atol = tolerance(together.dtype)
    torch.testing.assert_close(together, alone, atol=atol, rtol=atol)
    torch.testing.assert_close(together, reverse, atol=atol, rtol=atol)


def test_the_same_question_gets_the_same_answer(case):
    entry, oracle = case
    t, x = queries(oracle)
    first = oracle(t.clone(), x.clone())
    assert torch.equal(first, oracle(t.clone(), x.clone())), "the answers are random"


def test_inputs_are_left_unchanged(case):
    entry, oracle = case
    t, x = queries(oracle)
    before = (t.clone(), x.clone())
    oracle(t, x)
    assert torch.equal(t, before[0]) and torch.equal(x, before[1]), "wrote into its inputs"


def test_inference_mode_gives_the_same_means(case):
    entry, oracle = case
    if not is_inference_safe(oracle):
        pytest.skip("not inference-safe: the engine calls it with inference mode off")
    t, x = queries(oracle)
    expected = oracle(t, x)
    with torch.inference_mode():
        got = oracle(t.clone(), x.clone())
    atol = tolerance(expected.dtype)
    torch.testing.assert_close(got, expected, atol=atol, rtol=atol)


def test_the_mean_at_time_zero_is_the_mean_of_y(case):
    """``X_0 = 0`` carries no information: ``f(0, 0) = E[Y]``."""
    entry, oracle = case
    if entry.mean is None:
        pytest.skip("E[Y] not known in closed form")
    dtype = dtype_of(oracle)
    got = oracle(torch.zeros(3, dtype=dtype), torch.zeros(3, oracle.dim, dtype=dtype))
    expected = entry.mean.to(got).expand(3, -1)
    torch.testing.assert_close(got, expected, atol=tolerance(dtype), rtol=tolerance(dtype))


@pytest.mark.parametrize("method", method_names(DIFFUSION))
def test_every_diffusion_method_runs_on_it(case, method):
    """The engine's own checks of a mean oracle (finite means, rows alone and in a batch, the
    same answer twice) pass, and the draws are finite, ``[N, d]``."""
    entry, oracle = case
    result = sample_diffusion(oracle, 3, num_steps=16, seed=0, method=method)
    assert result.samples.shape == (3, oracle.dim)
    assert torch.isfinite(result.samples).all()


# ------------------------------------------------------------------------ every one is catalogued
def mean_oracle_classes() -> list[type]:
    """The mean oracles ``pyro_autospec.oracles`` exports: classes called as ``f(t, x)``
    (``__call__`` of their own; the denoisers, and ShardedOracle, which wraps one), not the
    protocol itself."""
    found = []
    for name in oracles_module.__all__:
        cls = getattr(oracles_module, name)
        if not inspect.isclass(cls) or getattr(cls, "_is_protocol", False):
            continue
        if any("__call__" in vars(base) for base in cls.__mro__ if base is not object):
            found.append(cls)
    return found


def entry_name(cls) -> str:
    """A catalogue name for ``cls``: ``CurieWeissOracle`` -> ``curie_weiss``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower().removesuffix("_denoiser")


def assert_every_mean_oracle_is_catalogued(catalogue) -> None:
    built = set()
    for entry in catalogue.values():
        oracle, close = build(entry)
        built.add(type(oracle))
        close()
    missing = [cls for cls in mean_oracle_classes() if cls not in built]
    assert not missing, "\n".join(
        f"pyro_autospec.oracles.{cls.__name__} has no entry in MEAN_CONFORMANCE: add one line "
        f'to tests/catalogue/conformance.py, e.g. "{entry_name(cls)}": '
        f"MC(lambda: {cls.__name__}(<small parameters, d of 2 or 3>), <E[Y] or None>),"
        for cls in missing
    )


def test_every_exported_mean_oracle_has_an_entry():
    assert {"GaussianDenoiser", "FiniteSupportDenoiser"} <= {
        cls.__name__ for cls in mean_oracle_classes()
    }
    assert_every_mean_oracle_is_catalogued(MEAN_CONFORMANCE)


def test_the_completeness_check_names_a_missing_oracle():
    without = {k: v for k, v in MEAN_CONFORMANCE.items() if k != "finite_support"}
    with pytest.raises(AssertionError, match="FiniteSupportDenoiser has no entry"):
        assert_every_mean_oracle_is_catalogued(without)


# ------------------------------------------------------------------------ the checks have power
class _Broken:
    """The Gaussian denoiser of the catalogue with one fault: ``fault`` names it."""

    inference_safe = True

    def __init__(self, fault: str):
        self.oracle = MEAN_CONFORMANCE["gaussian"].make()
        self.dim, self.dtype, self.fault = self.oracle.dim, self.oracle.dtype, fault

    def __call__(self, t, x):
        if self.fault == "first_time":  # every row at the batch's first time
            t = t[:1].expand(t.shape[0])
        means = self.oracle(t, x)
        if self.fault == "writes_inputs":
            x.zero_()
        if self.fault == "random":
            means = means + 1e-3 * torch.randn_like(means)
        if self.fault == "nan_far_out":
            means = torch.where(x.abs() > 100, torch.nan, means)
        if self.fault == "float32":
            means = means.float()
        if self.fault == "shifted":
            means = means + 0.1
        return means


@pytest.mark.parametrize(
    "fault, check",
    [
        ("first_time", test_a_batch_is_its_rows_one_by_one),
        ("writes_inputs", test_inputs_are_left_unchanged),
        ("random", test_the_same_question_gets_the_same_answer),
        ("nan_far_out", test_means_shape_dtype_device_and_finite),
        ("float32", test_means_shape_dtype_device_and_finite),
        ("shifted", test_the_mean_at_time_zero_is_the_mean_of_y),
    ],
)
def test_the_checks_catch_a_broken_mean_oracle(fault, check):
    entry = MEAN_CONFORMANCE["gaussian"]
    check((entry, _Broken("none")))  # the faultless wrapper passes
    with pytest.raises(AssertionError):
        check((entry, _Broken(fault)))
