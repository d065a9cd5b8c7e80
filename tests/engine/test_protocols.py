"""The engine's contract (``engine/protocols.py``): what an oracle declares is read once."""

import pytest
import torch

from pyro_autospec.engine import sample_any_order
from pyro_autospec.engine.protocols import Capabilities
from pyro_autospec.oracles import MarkovChainOracle


def test_capabilities_of_a_bare_oracle_are_all_off():
    class Bare:
        num_coords, num_values = 3, 2

        def log_marginals(self, values, mask):
            return torch.full((len(values), 3, 2), -0.6931471805599453, dtype=torch.float64)

    caps = Capabilities.of(Bare())
    assert caps == Capabilities(False, False, False, False, False, False, None)


@pytest.mark.parametrize("consistent", [True, False])
@pytest.mark.parametrize("method", ["autospec", "sequential", "agr24", "speculative"])
def test_a_run_reads_each_declared_capability_once(method, consistent):
    """What an oracle declares (``inference_safe``, ``consistent_queries``, ``borrows_inputs``,
    ``num_draws``) is read once per run into one record that the checks, the schedule, the
    consistency probe and the rows share: an oracle whose declarations change while it is
    asked cannot be seen two ways in one run."""
    flags = ("inference_safe", "consistent_queries", "borrows_inputs", "num_draws")
    stay = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
    chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 24)

    class Counting:
        def __init__(self):
            self.reads = dict.fromkeys(flags, 0)

        def __getattr__(self, name):
            if name in flags:
                self.reads[name] += 1
                if name == "consistent_queries":
                    return consistent
            return getattr(chain, name)

    for num_samples in (1, 16):
        oracle = Counting()
        sample_any_order(oracle, num_samples, seed=0, method=method)
        assert oracle.reads == dict.fromkeys(flags, 1), (num_samples, oracle.reads)
