import numpy as np
import pytest
import torch

#: Failure rate per statistical test, as in Pyro's own suite.
P_THRESHOLD = 2e-5


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    np.random.seed(0)
    yield


def pytest_configure(config):
    # Small tensors dominate these tests; one intra-op thread avoids thread contention on a
    # 2-core CI machine (it made no difference to results, only to time).
    torch.set_num_threads(1)
