"""The reference engine compares float64 log ratios: a Python float handed to ``torch.tensor``
would be rounded to float32 (the default dtype) and could flip an acceptance."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_autospec.engine import keys
from pyro_autospec.engine.errors import OracleError
from pyro_autospec.engine.euler import check_log_ratio
from pyro_autospec.engine.reference.recursion import _float64
from pyro_autospec.engine.rejection import accept_draft


def test_a_log_ratio_just_above_log_u_is_accepted_in_float64():
    u = torch.tensor(0.3, dtype=torch.float64)
    log_u = float(keys.log(u.reshape(1))[0])
    ratio = float(np.nextafter(log_u, math.inf))  # accepted: log(u) < ratio
    assert bool(accept_draft(_float64(ratio), u))
    # rounded to float32 the same ratio falls below log(u): the decision would flip
    assert not bool(accept_draft(torch.tensor(ratio), u))


def test_large_finite_log_densities_are_not_taken_for_overflow():
    check_log_ratio(0.0, -5.5e48, "drift")  # finite in float64, -inf in float32
    with pytest.raises(OracleError, match="too large"):
        check_log_ratio(float("nan"), 0.0, "drift")
