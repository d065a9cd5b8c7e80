import subprocess
import sys
import time
from pathlib import Path

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


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory):
    """One full build of the documentation (fresh output and doctrees, so every warning shows),
    as CI runs it; shared by tests/test_docs.py and tests/test_browser.py."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("docs")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html"]
    command += ["-d", str(out / "doctrees"), "docs", str(out / "html")]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=900)
    result.seconds = time.perf_counter() - start
    result.html = out / "html"
    return result


@pytest.fixture
def one_rank_group():
    """A gloo process group of this test's process alone, for the test's length."""
    from tests.catalogue.distributed import one_rank_group as group

    with group():
        yield
