"""Drift and mean-oracle outputs are validated like a discrete oracle's rows.

An integer output is refused (never silently cast or truncated), NaN / inf is raised naming the
row, and a wrong shape is named, for ``sample_sde`` and ``sample_diffusion``, every method and
both engines.
"""

from __future__ import annotations

import pytest
import torch

from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
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
    with pytest.raises(OracleError, match="dtype torch.bool"):
        run(lambda t, x: x > 0, method, engine)


@pytest.mark.parametrize("method,engine", CASES)
@pytest.mark.parametrize("run", [_sde, _diffusion], ids=["sde", "diffusion"])
def test_nan_is_raised_with_its_row(run, method, engine):
    with pytest.raises(OracleError, match=r"NaN or inf in row \d+ of a call \(t = "):
        run(late_nan, method, engine)


@pytest.mark.parametrize("method,engine", CASES)
def test_diffusion_wrong_shape_is_named(method, engine):
    with pytest.raises(OracleError, match=r"oracle returned shape \(\d+, 3\).*d = 2"):
        _diffusion(lambda t, x: torch.zeros(x.shape[0], 3), method, engine)
