"""``AutoSpec(..., device=...)``: the device reaches the oracle, the engine and the log joint.

The plumbing is tested with ``device="cpu"``; the CUDA test runs only where a GPU is present.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.infer import AutoSpec
from pyro_autospec.model.enum import EnumOracle


def model(y):
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Categorical(torch.ones(3, device=y.device) / 3))
        locs = torch.tensor([-1.0, 0.0, 1.0], device=y.device)
        pyro.sample("y", dist.Normal(locs[z], 1.0), obs=y)


def test_device_keyword_reaches_oracle_and_engine():
    y = torch.tensor([0.3, -0.9, 1.4])
    plain = AutoSpec(model, num_samples=20, seed=0, disable_progbar=True).run(y)
    on_cpu = AutoSpec(model, num_samples=20, seed=0, device="cpu", disable_progbar=True).run(y)
    assert torch.equal(plain.get_samples()["z"], on_cpu.get_samples()["z"])
    assert on_cpu.get_samples()["z"].device.type == "cpu"
    assert EnumOracle(model, (y,), device="cpu").device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_end_to_end():
    y = torch.tensor([0.3, -0.9, 1.4], device="cuda")
    fit = AutoSpec(model, num_samples=50, seed=0, device="cuda", disable_progbar=True).run(y)
    samples = fit.get_samples()
    assert samples["z"].device.type == "cuda"
    cpu = AutoSpec(model, num_samples=50, seed=0, disable_progbar=True).run(y.cpu())
    # same law; the self-check passed on the GPU
    assert abs(samples["z"].float().mean().item() - cpu.get_samples()["z"].float().mean()) < 0.5
    fit.to_inference_data()
