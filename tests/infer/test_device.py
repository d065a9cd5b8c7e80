"""``AutoSpec(..., device=...)``: the device reaches the oracle, the engine and the log joint.

The plumbing is tested with ``device="cpu"``; the CUDA test runs only where a GPU is present.
"""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import MCMC

from pyro_autospec.guides import AnyOrderGuide
from pyro_autospec.infer import AutoSpec, AutoSpecKernel
from pyro_autospec.model.enum import EnumOracle
from pyro_autospec.model.randomness import HiddenRandomnessError


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


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def mixed_model(y):
    # a continuous scale and a discrete assignment per point: NUTS, then exact discrete draws
    scale = pyro.sample("scale", dist.LogNormal(torch.zeros((), device=y.device), 1.0))
    model_locs = torch.tensor([-1.0, 1.0], device=y.device)
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(torch.full((len(y),), 0.5, device=y.device)))
        pyro.sample("y", dist.Normal(model_locs[z.long()], scale), obs=y)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_model_on_the_device(device):
    y = torch.tensor([0.8, -1.2, 1.1], device=device)
    fit = AutoSpec(
        mixed_model, num_samples=30, warmup_steps=20, seed=0, device=device, disable_progbar=True
    ).run(y)
    samples = fit.get_samples()
    assert samples["z"].device.type == device and samples["scale"].device.type == device
    assert samples["z"].shape == (30, 3) and bool((samples["scale"] > 0).all())
    fit.diagnostics()
    fit.to_inference_data()


def ising_chain(data, coupling=0.8):
    # tests/catalogue/guide_models.py's chain, with its constants on the data's device
    n = data.shape[-1]
    with pyro.plate("sites", n):
        z = pyro.sample("z", dist.Bernoulli(torch.full((n,), 0.5, device=data.device)))
    s = 2.0 * z - 1.0
    pyro.factor("coupling", coupling * (s[..., 1:] * s[..., :-1]).sum(-1, keepdim=True))
    with pyro.plate("obs", n):
        pyro.sample("y", dist.Normal(s, 1.0), obs=data)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("correction", ["importance", "imh"])
def test_a_learned_guide_on_the_device(device, correction):
    data = torch.tensor([1.0, 0.5, -0.3, -1.0], device=device)
    torch.manual_seed(0)
    guide = AnyOrderGuide(ising_chain, (data,), architecture="mlp", hidden_dim=8).to(device)
    fit = AutoSpec(
        ising_chain,
        num_samples=40,
        num_chains=2,
        guide=guide,
        correction=correction,
        seed=0,
        device=device,
        disable_progbar=True,
    ).run(data)
    assert fit.get_samples()["z"].device.type == device
    assert fit.get_samples()["z"].shape == (80, 4)
    fit.diagnostics()
    fit.to_inference_data()


@pytest.mark.parametrize("device", DEVICES)
def test_the_kernel_in_mcmc_on_the_device(device):
    y = torch.tensor([0.3, -0.9, 1.4], device=device)
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=8, device=device)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=0, disable_progbar=True)
    mcmc.run(y)
    z = mcmc.get_samples()["z"]
    assert z.shape == (20, 3) and z.device.type == "cpu"  # MCMC stores draws on the CPU
    assert kernel._oracle.device.type == device
    assert kernel.max_self_check_error is not None


def hidden_on_the_device(y):
    with poutine.block(hide=["z"]):
        z = pyro.sample("z", dist.Bernoulli(torch.tensor(0.9, device=y.device)))
    w = pyro.sample("w", dist.Bernoulli(0.2 + 0.6 * z))
    pyro.sample("y", dist.Normal(w, 1.0), obs=y)


def noise_on_the_device(y):
    z = pyro.sample("z", dist.Bernoulli(torch.tensor(0.4, device=y.device)))
    noise = torch.randn((), device=y.device)
    pyro.sample("y", dist.Normal(z + noise, 1.0), obs=y)


@pytest.mark.parametrize("device", DEVICES)
def test_hidden_randomness_on_the_device_is_refused(device):
    """The device's own generator is watched too: a latent site hidden by ``poutine.block``
    draws from it, and so does noise made on the device just before a scored site."""
    y = torch.tensor(1.0, device=device)
    with pytest.raises(HiddenRandomnessError, match="The sample site 'z' drew a random value"):
        AutoSpec(hidden_on_the_device, 50, seed=0, device=device, disable_progbar=True).run(y)
    with pytest.raises(HiddenRandomnessError, match="just before the sample site .y."):
        AutoSpec(noise_on_the_device, 50, seed=0, device=device, disable_progbar=True).run(y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mixed", [False, True])
def test_a_run_leaves_the_users_generators_alone(device, mixed):
    """A run seeds torch's generators for its traces and its NUTS chains (``torch.manual_seed``
    seeds the GPUs' too) and draws from the device's: a CUDA test found the user's CUDA stream
    reseeded after a run, where only the CPU's was put back."""
    y = torch.tensor([0.3, -0.9, 1.4], device=device)
    state = torch.cuda.get_rng_state if device == "cuda" else torch.get_rng_state
    before = state()
    AutoSpec(
        mixed_model if mixed else model,
        20,
        10 if mixed else 0,
        seed=0,
        device=device,
        disable_progbar=True,
    ).run(y)
    assert torch.equal(before, state())


@pytest.mark.skipif(torch.cuda.is_initialized(), reason="CUDA already started")
def test_a_run_leaves_a_cuda_seed_queued_before_cuda_starts_alone():
    """A review: before CUDA starts, ``torch.manual_seed(1234)`` only queues CUDA's seed, and
    the library's own ``torch.manual_seed`` inside a run replaced it, so that the user's CUDA
    stream started from the library's seed once the user touched the GPU."""

    def queued():
        callback = torch.cuda._lazy_seed_tracker.manual_seed_all_cb
        return None if callback is None else callback[0]

    torch.manual_seed(1234)
    before = queued()
    y = torch.tensor([0.8, -1.2, 1.1])
    AutoSpec(model, 20, seed=0, disable_progbar=True).run(y)
    AutoSpec(mixed_model, 20, 10, seed=0, disable_progbar=True).run(y)
    assert queued() is before and before is not None
