"""Drift and mean-oracle outputs are validated like a discrete oracle's rows.

An integer output is refused (never silently cast or truncated), NaN / inf is raised naming the
row, and a wrong shape is named, for ``sample_sde`` and ``sample_diffusion``, every method and
both engines.
"""

from __future__ import annotations

import pytest
import torch

from pyro_autospec.engine import Schedule
from pyro_autospec.engine.diffusion import euler_maruyama_log_prob, sample_diffusion, sample_sde
from pyro_autospec.engine.errors import OracleError

TIMES = torch.linspace(0, 1, 9)
CASES = [
    ("autospec", "fast"),
    ("sequential", "fast"),
    ("picard", "fast"),
    ("autospec", "reference"),
]


class Mean:
    """A MeanOracle of dimension 2 whose output is ``make(t, x)``."""

    dim = 2

    def __init__(self, make):
        self.make = make

    def __call__(self, t, x):
        return self.make(t, x)


def integer_drift(t, x):
    return (-3.7 * x).long()  # the truncation happens here; the engine must not accept it


def late_nan(t, x):
    out = -x
    out[t > 0.5] = float("nan")
    return out


def _sde(drift, method, engine):
    return sample_sde(drift, TIMES, torch.zeros(2), 3, method=method, engine=engine, seed=0)


def _diffusion(make, method, engine):
    return sample_diffusion(
        Mean(make), 3, times=TIMES, method=method, engine=engine, seed=0, dtype=torch.float32
    )


@pytest.mark.parametrize("method,engine", CASES)
@pytest.mark.parametrize("run", [_sde, _diffusion], ids=["sde", "diffusion"])
def test_integer_output_is_refused(run, method, engine):
    name = "drift" if run is _sde else "oracle"
    with pytest.raises(OracleError, match=rf"{name} returned a tensor of dtype torch.int64.*float"):
        run(integer_drift, method, engine)
    with pytest.raises(OracleError, match="dtype torch.bool.*a bool drift is a comparison"):
        run(lambda t, x: x > 0, method, engine)
    with pytest.raises(OracleError, match=r"dtype torch.complex64.*Return the real part"):
        run(lambda t, x: torch.complex(x.float(), x.float()), method, engine)


@pytest.mark.parametrize("method,engine", CASES)
@pytest.mark.parametrize("run", [_sde, _diffusion], ids=["sde", "diffusion"])
def test_nan_is_raised_with_its_row(run, method, engine):
    with pytest.raises(OracleError, match=r"NaN or inf in row \d+ of a (call|round) \(t = "):
        run(late_nan, method, engine)


@pytest.mark.parametrize("method,engine", CASES)
def test_diffusion_wrong_shape_is_named(method, engine):
    with pytest.raises(OracleError, match=r"oracle returned shape \(\d+, 3\).*d = 2"):
        _diffusion(lambda t, x: torch.zeros(x.shape[0], 3), method, engine)


def test_an_integer_dtype_is_refused():
    """Integer states would be truncated at every step (found by an outside user's sweep)."""
    with pytest.raises(ValueError, match="floating point torch.dtype"):
        sample_sde(lambda t, x: -x, TIMES, torch.zeros(2), 4, seed=0, dtype=torch.long)
    with pytest.raises(ValueError, match="floating point torch.dtype"):
        sample_diffusion(Mean(lambda t, x: x), 4, num_steps=8, seed=0, dtype=torch.long)


def test_an_integer_dtype_names_where_it_came_from():
    """An oracle whose ``dtype`` attribute is an integer type was refused with the message for
    a dtype= argument, which the user never passed (found by an outside user)."""
    oracle = Mean(lambda t, x: x)
    oracle.dtype = torch.int64
    with pytest.raises(
        ValueError,
        match=r"floating point torch.dtype.*got torch.int64, from the oracle's `dtype` "
        r"attribute \(oracle.dtype\): give the oracle a floating point `dtype` attribute, or "
        r"pass dtype=torch.float32",
    ):
        sample_diffusion(oracle, 4, num_steps=8, seed=0)

    def drift(t, x):
        return -x

    drift.dtype = torch.int32
    with pytest.raises(ValueError, match=r"got torch.int32, from the drift's `dtype` attribute"):
        sample_sde(drift, TIMES, torch.zeros(2), 4, seed=0)
    # dtype= overrides the attribute, and a wrong dtype= is named as the argument
    assert sample_diffusion(oracle, 4, num_steps=8, seed=0, dtype=torch.float64).samples.shape[0]
    with pytest.raises(ValueError, match=r"got torch.int64, from the dtype= argument"):
        sample_diffusion(Mean(lambda t, x: x), 4, num_steps=8, seed=0, dtype=torch.long)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_samples_beyond_the_dtype_are_refused(rule):
    """A finite float64 drift whose chain leaves float32's range: an error, not inf samples
    (named where the chain first reaches a state the drift would see as inf)."""

    def huge(t, x):
        return torch.full(x.shape, 1e40, dtype=torch.float64)

    with pytest.raises(OracleError, match=r"beyond what the drift's dtype holds .*float64"):
        sample_sde(huge, TIMES, torch.zeros(2), 4, seed=0, schedule=Schedule(rule=rule))
    # a chain whose last step (where no drift is asked) leaves float32's range
    late = torch.tensor([0.0, 1.0, 1e40], dtype=torch.float64)  # a last step of 1e40
    with pytest.raises(OracleError, match="do not fit torch.float32"):
        sample_sde(
            lambda t, x: torch.ones_like(x),
            late,
            torch.zeros(2),
            4,
            seed=0,
            schedule=Schedule(rule=rule),
        )


class GuardedHalfMean:
    """The exact denoiser of Y ~ N(100, 1) in float16, guarded with ``nan_to_num``: the chain
    ``X_t = t Y + B_t`` leaves float16's range (65504) near t = 650, where the denoiser would
    see inf and answer a finite wrong mean (outside review: 69 for 100, silently)."""

    dim = 1
    dtype = torch.float16

    def __call__(self, t, x):
        t, x = t.float()[:, None], x.float()
        return torch.nan_to_num((100.0 + x) / (1.0 + t)).half()


@pytest.mark.parametrize("method,engine", CASES)
def test_a_chain_beyond_the_oracles_dtype_is_refused_not_sampled_on(method, engine):
    with pytest.raises(
        OracleError, match=r"beyond what the oracle's dtype holds .*torch.float16 holds at most"
    ):
        sample_diffusion(GuardedHalfMean(), 8, num_steps=1000, seed=0, method=method, engine=engine)
    out = sample_diffusion(GuardedHalfMean(), 8, num_steps=1000, seed=0, dtype=torch.float32)
    assert (out.samples - 100.0).abs().max() < 6.0


def reads_the_first_time(t, x):
    """A drift that assumes one time per call: right for the sequential sampler only."""
    return -x * (1.0 + t[:1, None])


@pytest.mark.parametrize(
    "method, engine", [("autospec", "fast"), ("picard", "fast"), ("autospec", "reference")]
)
def test_a_drift_that_mixes_its_rows_is_refused(method, engine):
    with pytest.raises(OracleError, match=r"row differently alone .* reading t\[0\]"):
        sample_sde(
            reads_the_first_time, TIMES, torch.ones(2), 4, seed=0, method=method, engine=engine
        )
    sample_sde(reads_the_first_time, TIMES, torch.ones(2), 4, seed=0, method="sequential")
    reads_the_first_time.consistent_queries = True  # the user's word: not checked
    try:
        sample_sde(reads_the_first_time, TIMES, torch.ones(2), 4, seed=0, method=method)
    finally:
        del reads_the_first_time.consistent_queries


@pytest.mark.parametrize(
    "rule, engine",
    [("token", "fast"), ("block", "fast"), ("token", "reference"), ("block", "reference")],
)
def test_a_drift_too_large_for_float64_squares_is_refused_not_raced_for_ever(rule, engine):
    """``|b|^2 h`` overflows: the log ratio is NaN; the block rule used to race for ever."""

    def huge(t, x):
        return torch.full(x.shape, 1e160, dtype=torch.float64)

    x0 = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(OracleError, match="too large for the chain's float64"):
        sample_sde(huge, TIMES, x0, 4, seed=0, schedule=Schedule(rule=rule), engine=engine)


def test_a_drift_that_differs_alone_by_rounding_passes():
    """A network computed in bfloat16 may take another kernel for one row than for four and
    differ by a bfloat16 step (about 4e-3): not refused, as the discrete check allows it."""

    def rounding(t, x):
        return -x * (1.0 + 4e-3 * (t.shape[0] == 1))

    sample_sde(rounding, TIMES, torch.ones(2), 4, seed=0)


class BufferedDrift:
    """``b(t, x) = -4 (x - 2 t)`` written into one buffer the drift reuses at every call."""

    def __init__(self):
        self.buffer = torch.empty(1024, 1, dtype=torch.float64)

    def __call__(self, t, x):
        out = self.buffer[: x.shape[0]]
        torch.mul(x - 2.0 * t[:, None], -4.0, out=out)
        return out


def _plain(t, x):
    return (x - 2.0 * t[:, None]) * -4.0


@pytest.mark.parametrize("method, engine", CASES)
def test_a_drift_answering_in_its_own_buffer_gives_the_plain_drifts_draws(method, engine):
    """Cut into calls (``max_rows_per_call``) the answers of earlier calls were kept without a
    copy, and a drift's reused buffer overwrote them: the law was wrong (variance 1.6 for
    0.14), silently. Every answer is copied now, and the log density too."""
    x0 = torch.tensor([3.0], dtype=torch.float64)
    kw = {"method": method, "engine": engine, "seed": 0, "schedule": {"max_rows_per_call": 16}}
    plain = sample_sde(_plain, TIMES, x0, 200, return_paths=True, **kw)
    buffered = sample_sde(BufferedDrift(), TIMES, x0, 200, **kw)
    assert torch.equal(plain.samples, buffered.samples)
    logs = [
        euler_maruyama_log_prob(d, TIMES, plain.paths[:20], max_rows_per_call=10)
        for d in (_plain, BufferedDrift())
    ]
    assert torch.equal(logs[0], logs[1])


def test_an_inference_safe_drift_that_works_in_place_passes_the_consistency_check():
    """The check handed one input to several calls: a drift that negates its input in place
    (which the engine allows) was refused as answering rows differently."""

    class InPlace:
        inference_safe = True

        def __call__(self, t, x):
            return x.mul_(-1.0)

    x0 = torch.tensor([0.5, -0.3], dtype=torch.float64)
    in_place = sample_sde(InPlace(), TIMES, x0, 20, seed=0)
    assert torch.equal(in_place.samples, sample_sde(lambda t, x: -x, TIMES, x0, 20, seed=0).samples)


def test_a_diverging_picard_iteration_is_named_not_blamed_on_the_drift():
    """-x**3 from x0 = 4 with h = 0.05: the chain is tame, Picard's iterates overflow."""
    times = torch.linspace(0, 1, 21)
    x0 = torch.tensor([4.0], dtype=torch.float64)
    sample_sde(lambda t, x: -(x**3), times, x0, 4, seed=0)  # the exact chain runs
    with pytest.raises(OracleError, match="Picard iteration diverged"):
        sample_sde(lambda t, x: -(x**3), times, x0, 4, seed=0, method="picard")


def test_a_nan_the_block_rule_asked_about_is_not_called_reached():
    """The block rule needs every drafted row finite: its error says the state was asked
    about (perhaps a draft), and that the token rule raises only where the chain goes; it
    said "a state the chain reached" (outside review)."""
    with pytest.raises(OracleError, match=r"a state the sampler asked about .*rule='token'"):
        sample_sde(late_nan, TIMES, torch.zeros(2), 3, seed=0, schedule=Schedule(rule="block"))
    with pytest.raises(OracleError, match="a state the chain reached"):
        sample_sde(late_nan, TIMES, torch.zeros(2), 3, seed=0)


@pytest.mark.parametrize("method", ["autospec", "sequential"])
def test_an_answer_on_another_device_is_named(method):
    """It raised torch's own RuntimeError from ``.item()`` on a meta tensor (outside review)."""
    with pytest.raises(OracleError, match=r"returned a tensor on meta; .* device of its input"):
        sample_sde(lambda t, x: x.to("meta"), TIMES, torch.zeros(2), 3, seed=0, method=method)
