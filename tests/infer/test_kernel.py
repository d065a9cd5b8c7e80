"""AutoSpecKernel inside pyro.infer.MCMC, and az.from_pyro on it."""

import os
import subprocess
import sys
from pathlib import Path

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC

import pyro_autospec.infer.kernel as kernel_module
from pyro_autospec.infer import AutoSpec, AutoSpecKernel
from pyro_autospec.infer.self_check import SelfCheckError

DATA = torch.tensor([0.3, 1.8, 2.4])
LOCS = torch.tensor([-1.0, 0.5, 2.0])


def model(y):
    g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    with pyro.plate("data", len(y)):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(z + LOCS[g], 0.8), obs=y)  # indexes with a Categorical


def test_mcmc_driver_and_from_pyro_log_likelihood():
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=16)
    mcmc = MCMC(kernel, num_samples=30, warmup_steps=0, num_chains=1, disable_progbar=True)
    mcmc.run(DATA)
    samples = mcmc.get_samples()
    assert samples["g"].shape == (30,) and samples["z"].shape == (30, 3)
    assert samples["z"].dtype == torch.float32  # Bernoulli: its native dtype
    assert set(samples["g"].tolist()) <= {0.0, 1.0, 2.0}
    diag = mcmc.diagnostics()
    assert diag["divergences"] == {"chain 0": []}
    assert diag["rounds"]["chain 0"] > 0
    mcmc.summary()
    with _no_vectorized_trace_warning():
        idata = az.from_pyro(mcmc)
    assert idata.posterior["z"].shape == (1, 30, 3)
    assert not idata.sample_stats["diverging"].values.any()
    # the log likelihood group is there and correct: the model saw g as a long index
    ll = idata.log_likelihood["y"].values
    g = samples["g"].long()
    direct = dist.Normal(samples["z"] + LOCS[g][:, None], 0.8).log_prob(DATA)
    np.testing.assert_allclose(ll.reshape(30, 3), direct.numpy(), atol=1e-5)


class _no_vectorized_trace_warning:
    """Fail if ArviZ falls back to 'Could not get vectorized trace' (it drops the group)."""

    def __enter__(self):
        import warnings

        self._context = warnings.catch_warnings()
        self._context.__enter__()
        warnings.filterwarnings("error", message=".*Could not get vectorized trace.*")

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


def test_kernel_model_hands_native_dtypes_to_the_model():
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=4)
    kernel.setup(0, DATA)
    seen = {}

    def spy(y):
        value = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
        seen["dtype"] = value.dtype

    kernel.model.model = spy
    conditioned = pyro.poutine.condition(kernel.model, data={"g": torch.tensor(2.0)})
    conditioned(DATA)
    assert seen["dtype"] == torch.long


def test_chains_run_in_worker_processes_still_give_dtypes_and_transforms_in_the_main_one():
    """With chains in worker processes ``MCMC`` never sets the kernel up in the main process;
    it calls ``setup`` there only when ``kernel.transforms`` is ``None``. Without it
    ``kernel.model`` had no dtypes (``Predictive`` and ``az.from_pyro`` then handed the model
    float Categorical values) and the transforms were empty."""
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=4)
    assert kernel.transforms is None
    mcmc = MCMC(kernel, num_samples=4, warmup_steps=0, num_chains=1, disable_progbar=True)
    mcmc._set_transforms(DATA)  # what MCMC.run does in the main process after the workers
    assert kernel.model.dtypes == {"g": torch.long, "z": torch.float32}
    assert set(mcmc.transforms) == {"z"}
    assert kernel._oracle is None  # setting up is cheap: the oracle is built on a first draw
    posterior = {"g": torch.tensor([2.0, 0.0]), "z": torch.zeros(2, 3)}
    predicted = pyro.infer.Predictive(kernel.model, posterior_samples=posterior)(DATA)
    assert predicted["y"].shape == (2, 3)


@pytest.mark.filterwarnings("ignore:num_chains=2 is more than available_cpu")
def test_two_chains_differ():
    kernel = AutoSpecKernel(model, seed=1, draws_per_run=8)
    mcmc = MCMC(kernel, num_samples=20, warmup_steps=2, num_chains=2, disable_progbar=True)
    mcmc.run(DATA)
    grouped = mcmc.get_samples(group_by_chain=True)
    assert grouped["z"].shape == (2, 20, 3)
    assert not torch.equal(grouped["z"][0], grouped["z"][1])


@pytest.mark.skipif(not hasattr(az, "from_pyro"), reason="ArviZ 1.x has no from_pyro")
def test_from_pyro_reads_an_autospec_run_as_it_reads_an_mcmc():
    """``az.from_pyro(autospec)``, which a Pyro user tries first, reads ``kernel.model`` like
    an ``MCMC``'s: the posterior in its chains, no divergences, and the conditional log
    likelihood given each draw."""
    autospec = AutoSpec(model, 30, num_chains=2, seed=0, disable_progbar=True).run(DATA)
    assert autospec.kernel.model is model
    with _no_vectorized_trace_warning():
        idata = az.from_pyro(autospec)
    samples = autospec.get_samples()
    assert idata.posterior["z"].shape == (2, 30, 3)
    assert not idata.sample_stats["diverging"].values.any()
    ll = idata.log_likelihood["y"].values.reshape(60, 3)
    direct = dist.Normal(samples["z"] + LOCS[samples["g"]][:, None], 0.8).log_prob(DATA)
    np.testing.assert_allclose(ll, direct.numpy(), atol=1e-5)


def _chain_in_a_worker(monkeypatch, chain, seed, global_seed):
    """The draws of ``MCMC``'s worker ``chain`` (the kernel set up as in that process),
    under torch's global seed ``global_seed`` (which ``MCMC`` sets in each worker)."""
    monkeypatch.setattr(kernel_module, "_worker_chain", lambda: chain)
    torch.manual_seed(global_seed)
    mcmc = MCMC(
        AutoSpecKernel(model, seed=seed, draws_per_run=4),
        num_samples=12,
        warmup_steps=0,
        num_chains=1,
        disable_progbar=True,
    )
    mcmc.run(DATA)
    return mcmc.get_samples()["z"]


@pytest.mark.parametrize("kind", ["int", "torch", "numpy"])
def test_chains_in_worker_processes_differ_and_reproduce(monkeypatch, kind):
    """With more than two CPUs ``MCMC`` runs chains in worker processes, each a copy of the
    main one: a generator seed gave every chain the same draws, and an int seed mixed in the
    worker's global seed, so a run could not be reproduced (found outside the project)."""

    def seed():
        if kind == "int":
            return 3
        if kind == "torch":
            return torch.Generator().manual_seed(3)
        return np.random.default_rng(3)

    first = _chain_in_a_worker(monkeypatch, 0, seed(), global_seed=10)
    second = _chain_in_a_worker(monkeypatch, 1, seed(), global_seed=11)
    again = _chain_in_a_worker(monkeypatch, 1, seed(), global_seed=99)
    assert not torch.equal(first, second)
    assert torch.equal(second, again)


_FORKED_CHAINS = """
import pyro, torch, pyro.distributions as dist
import pyro.infer.mcmc.api as api
from pyro.infer import MCMC
from pyro_autospec import AutoSpecKernel

api.mp.cpu_count = lambda: 4  # MCMC then forks a worker per chain, as on a larger machine


def model(y):
    with pyro.plate("p", 3):
        z = pyro.sample("z", dist.Bernoulli(0.5))
        pyro.sample("y", dist.Normal(2 * z - 1.0, 1.0), obs=y)


if __name__ == "__main__":
    y = torch.tensor([1.0, -1.0, 0.5])
    pyro.poutine.trace(model).get_trace(y).compute_log_prob()  # torch runs in the parent first
    kernel = AutoSpecKernel(model, seed=0, draws_per_run=20)
    mcmc = MCMC(kernel, 10, warmup_steps=0, num_chains=2, disable_progbar=True)
    mcmc.run(y)
    print(tuple(mcmc.get_samples(group_by_chain=True)["z"].shape))
"""


def test_chains_in_forked_worker_processes_finish_after_the_parent_ran_torch(tmp_path):
    """A worker forked after the parent ran a torch operation hung in its first parallel one
    (OpenMP after fork; Pyro's own kernels too): the kernel runs its worker on one thread."""
    script = tmp_path / "forked_chains.py"
    script.write_text(_FORKED_CHAINS)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("(2, 10, 3)")


def _ring(y):
    """A chain whose last factor reads its first site, past the ``pyro.markov`` history: the
    enumeration does not reproduce it, and its law is wrong where the draws rarely go."""
    first = None
    for t in pyro.markov(range(len(y))):
        z = pyro.sample(f"z_{t}", dist.Bernoulli(0.5))
        first = z if t == 0 else first
        scale = 2.0 if t == len(y) - 1 else 0.3
        pyro.sample(f"y_{t}", dist.Normal(2 * z - 1.0, scale), obs=y[t])
        if t == len(y) - 1:
            pyro.factor("prior_last", -8.0 * (1 - z))
            pyro.factor("close", 12.0 * (1 - z) * (1 - first))


def test_the_kernel_reads_the_law_at_uniform_probes_as_autospec_does():
    """An outside test: with 26 sites (too many to refuse before sampling), ``AutoSpec``
    raised the self-check's error at its uniform probes but the kernel, which had none,
    returned P(z_25 = 0) = 0.00 against 0.97 silently. The kernel's first engine run now
    evaluates the same probes."""
    y = torch.ones(26)
    y[0] = -1.0
    with pytest.raises(SelfCheckError):
        AutoSpec(_ring, 200, seed=0, disable_progbar=True).run(y)
    mcmc = MCMC(AutoSpecKernel(_ring, seed=0), num_samples=200, disable_progbar=True)
    with pytest.raises(SelfCheckError):
        mcmc.run(y)
