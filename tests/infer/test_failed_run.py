"""A failed ``run()`` leaves no draws: not its own partial ones, not an earlier run's."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.infer import AutoSpec, SelfCheckError


def coins():
    with pyro.plate("p", 2):
        pyro.sample("z", dist.Bernoulli(0.95))


class Switchable:
    """The exact oracle of ``coins`` until ``wrong`` is set, then a uniform one."""

    num_coords, num_values = 2, 2

    def __init__(self):
        self.wrong = False

    def log_marginals(self, values, mask):
        p = torch.tensor([0.5, 0.5] if self.wrong else [0.05, 0.95], dtype=torch.float64)
        return p.log().expand(values.shape[0], 2, 2).clone()


READERS = {
    "get_samples": lambda fit: fit.get_samples(),
    "to_inference_data": lambda fit: fit.to_inference_data(),
    "get_extra_fields": lambda fit: fit.get_extra_fields(),
    "diagnostics": lambda fit: fit.diagnostics(),
    "summary": lambda fit: fit.summary(),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_failed_second_run_leaves_no_stale_draws(reader):
    oracle = Switchable()
    fit = AutoSpec(coins, num_samples=20, oracle=oracle, seed=0, disable_progbar=True)
    fit.run()
    assert fit.get_samples()["z"].shape == (20, 2)
    oracle.wrong = True
    with pytest.raises(SelfCheckError):
        fit.run()
    with pytest.raises(RuntimeError, match=r"last AutoSpec.run\(\) failed \(SelfCheckError: "):
        READERS[reader](fit)
    assert fit.results == [] and fit.layout is None and fit.run_kind is None
    oracle.wrong = False  # a successful run makes the object readable again
    fit.run()
    assert fit.get_samples()["z"].shape == (20, 2)


def test_a_model_error_also_discards_the_earlier_draws():
    def model(fail):
        z = pyro.sample("z", dist.Bernoulli(0.3))
        if fail:
            raise ValueError("the model failed")
        return z

    fit = AutoSpec(model, num_samples=5, seed=0, disable_progbar=True).run(False)
    with pytest.raises(ValueError, match="the model failed"):
        fit.run(True)
    with pytest.raises(RuntimeError, match="ValueError: the model failed"):
        fit.get_samples()


def test_never_run_says_so():
    fit = AutoSpec(coins, num_samples=5, disable_progbar=True)
    with pytest.raises(RuntimeError, match=r"call AutoSpec.run\(\*args, \*\*kwargs\) first"):
        fit.get_samples()
