"""Every entry point accepts the same seeds and refuses the others with the same message.

Ints in ``[0, 2**64)`` (each its own 64-bit key), torch and NumPy generators, and ``None``.
Negative ints, ints ``>= 2**64``, bools, floats and strings raise; nothing is reduced modulo
``2**64`` (``-1`` and ``2**64 - 1`` used to be the same seed; ``2**64`` overflowed).
"""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from torch.distributions import constraints

from pyro_autospec.engine import keys, sample_any_order
from pyro_autospec.engine.diffusion import sample_diffusion, sample_sde
from pyro_autospec.engine.keys import check_seed, derive_seed, seed_key
from pyro_autospec.infer import AutoSpec, AutoSpecKernel
from pyro_autospec.infer import seeds as seeds_module
from pyro_autospec.infer.seeds import ChainSeeds, chain_seeds, correction_seed
from pyro_autospec.oracles import MarkovChainOracle
from pyro_autospec.oracles.denoisers import FiniteSupportDenoiser

CHAIN = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.8, 0.2], [0.2, 0.8]]), 6)
DENOISER = FiniteSupportDenoiser(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
TIMES = torch.linspace(0, 1, 5)


def coin():
    pyro.sample("z", dist.Bernoulli(0.3))


ENTRY_POINTS = {
    "AutoSpec": lambda seed: AutoSpec(coin, num_samples=2, seed=seed, disable_progbar=True).run(),
    "AutoSpecKernel": lambda seed: AutoSpecKernel(coin, seed=seed),
    "sample_any_order": lambda seed: sample_any_order(CHAIN, 2, seed=seed),
    "sample_diffusion": lambda seed: sample_diffusion(DENOISER, 2, num_steps=4, seed=seed),
    "sample_sde": lambda seed: sample_sde(lambda t, x: -x, TIMES, torch.zeros(2), 2, seed=seed),
}
MESSAGE = r"seed must be an int in \[0, 2\*\*64\), a torch.Generator, a numpy.random.Generator"
BAD = {
    "negative": (-1, ValueError),
    "2**64": (2**64, ValueError),
    "huge": (10**30, ValueError),
    "np.int64 negative": (np.int64(-5), ValueError),
    "bool": (True, TypeError),
    "np.bool_": (np.bool_(True), TypeError),
    "float": (1.0, TypeError),
    "string": ("0", TypeError),
    "tensor": (torch.tensor(0), TypeError),
}
GOOD = {
    "0": 0,
    "2**64 - 1": 2**64 - 1,
    "2**63": 2**63,
    "np.uint64": np.uint64(2**64 - 1),
    "torch.Generator": torch.Generator().manual_seed(0),
    "numpy.Generator": np.random.default_rng(0),
    "None": None,
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_bad_seeds_raise_the_same_error_everywhere(entry, bad):
    seed, error = BAD[bad]
    with pytest.raises(error, match=MESSAGE):
        ENTRY_POINTS[entry](seed)


@pytest.mark.parametrize("good", sorted(GOOD))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_good_seeds_work_everywhere(entry, good):
    seed = GOOD[good]
    ENTRY_POINTS[entry](seed)


def test_no_two_int_seeds_share_a_key():
    """The edge of the range is its own seed (no reduction modulo 2**64)."""
    keys = {seed_key(s) for s in (0, 1, 2**63 - 1, 2**63, 2**64 - 1)}
    assert len(keys) == 5
    assert check_seed(np.uint64(7)) == 7 and type(check_seed(np.int32(7))) is int


def test_largest_seed_runs_autospec_reproducibly():
    a = AutoSpec(coin, num_samples=20, seed=2**64 - 1, disable_progbar=True).run()
    b = AutoSpec(coin, num_samples=20, seed=2**64 - 1, disable_progbar=True).run()
    assert torch.equal(a.get_samples()["z"], b.get_samples()["z"])


def test_derived_seeds_cover_the_whole_range():
    """Derived streams (a mixed run's discrete stage, the kernel's worker processes, which mix
    in ``torch.initial_seed()`` up to 2**64 - 1) hash any pair of 64-bit values."""
    from pyro_autospec.engine.keys import derive_seed

    derived = {derive_seed(s, i) for s in (0, 2**64 - 1) for i in (0, 1, 2**63, 2**64 - 1)}
    assert len(derived) == 8 and all(0 <= d < 2**63 for d in derived)


def test_kernel_in_a_worker_process_mixes_any_initial_seed(monkeypatch):
    """In a worker process that ``MCMC`` did not name (a pool's worker; ``MCMC``'s own are
    named by their chain, ``tests/infer/test_kernel.py``) the int seed is mixed with
    ``torch.initial_seed()``, whatever its size (reduced below ``2**62``)."""
    import pyro_autospec.infer.kernel as kernel_module

    monkeypatch.setattr(kernel_module.multiprocessing, "parent_process", lambda: object())
    draws = []
    for initial in (2**64 - 1, 2**64 - 1, 5):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(initial)
            kernel = AutoSpecKernel(coin, seed=2**64 - 1, draws_per_run=8)
            kernel.setup(0)
            draws.append(torch.stack([kernel.sample({})["z"] for _ in range(8)]))
    assert torch.equal(draws[0], draws[1])  # same worker seed, same draws


def test_one_seed_normaliser_derives_keyed_numbers():
    """An int seed's engine seeds are outputs of the keyed generator (one random-number system
    for an int seed: the engine's keys); a generator is drawn from."""

    def keyed_stream(seed, num, start=0):
        root = np.int64(keys.seed_key(seed))
        bits = keys.host_bits(root, np.arange(start, start + num, dtype=np.int64))
        return [int(b) & ((1 << 62) - 1) for b in bits.tolist()]

    assert chain_seeds(7, 3) == keyed_stream(7, 3)
    assert chain_seeds(7, 1, stream=1) == keyed_stream(derive_seed(7, 1), 1)  # mixed models
    assert all(0 <= s < 2**62 for s in chain_seeds(2**64 - 1, 50))
    numpy = np.random.default_rng(3).integers(0, 2**62, size=2).tolist()
    assert chain_seeds(np.random.default_rng(3), 2) == numpy
    gen = torch.Generator().manual_seed(5)
    assert chain_seeds(torch.Generator().manual_seed(5), 2) == [
        int(s) for s in torch.randint(0, 2**62, (2,), generator=gen).tolist()
    ]
    seeds = ChainSeeds(5)  # AutoSpecKernel: one engine seed per call, one stream
    assert [seeds(1)[0] for _ in range(3)] == keyed_stream(5, 3)
    assert correction_seed(5) == derive_seed(5, 1) != correction_seed(6)


def test_every_entry_point_takes_its_seeds_from_chain_seeds(monkeypatch):
    calls = []
    call = seeds_module.ChainSeeds.__call__

    def counting(self, num):
        calls.append(num)
        return call(self, num)

    monkeypatch.setattr(seeds_module.ChainSeeds, "__call__", counting)
    AutoSpec(coin, num_samples=2, num_chains=3, seed=0, disable_progbar=True).run()
    assert calls == [3]
    kernel = AutoSpecKernel(coin, seed=0, draws_per_run=2)
    kernel.setup(0)
    for _ in range(3):
        kernel.sample({})
    assert calls == [3, 1, 1]


def test_seed_none_follows_torch_global_generator():
    """``seed=None`` takes its key from torch's global generator, as ``AutoSpec(seed=None)``
    does: ``torch.manual_seed`` (or ``pyro.set_rng_seed``) repeats an engine run too."""
    oracle = MarkovChainOracle(torch.tensor([0.5, 0.5]), torch.tensor([[0.9, 0.1], [0.2, 0.8]]), 8)
    state = torch.get_rng_state()
    try:
        torch.manual_seed(3)
        first = sample_any_order(oracle, 20, seed=None).samples
        again = sample_any_order(oracle, 20, seed=None).samples
        torch.manual_seed(3)
        repeated = sample_any_order(oracle, 20, seed=None).samples
    finally:
        torch.set_rng_state(state)
    assert torch.equal(first, repeated) and not torch.equal(first, again)


def test_a_seeded_run_leaves_torch_global_generator_as_it_was():
    """Tracing a model with continuous sites draws them from torch's global generator; with an
    int seed the run keys every number it uses, so the user's stream is left alone (it was
    advanced by 28 draws)."""
    from pyro.ops.indexing import Vindex

    def mixture(data):
        locs = pyro.sample("locs", dist.Normal(torch.tensor([-2.0, 2.0]), 1.0).to_event(1))
        with pyro.plate("data", len(data)):
            z = pyro.sample("z", dist.Categorical(torch.tensor([0.5, 0.5])))
            pyro.sample("obs", dist.Normal(Vindex(locs)[..., z], 1.0), obs=data)

    data = torch.tensor([-2.1, -1.7, 2.2, 1.9, 2.5])
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(1)
        before = torch.get_rng_state()
        AutoSpec(mixture, 10, warmup_steps=10, seed=0, disable_progbar=True).run(data)
        assert torch.equal(torch.get_rng_state(), before)
    finally:
        torch.set_rng_state(saved)


@pytest.mark.parametrize("make", [lambda: None, lambda: torch.Generator().manual_seed(9)])
def test_the_seed_a_run_used_is_recorded_and_repeats_it(make):
    """``seed=None`` or a generator: the run draws an int seed, which ``diagnostics()`` and
    ArviZ's attributes record; passing it back repeats the draws (an outside test found no way
    to repeat such a run from its result)."""
    fit = AutoSpec(coin, num_samples=30, seed=make(), disable_progbar=True).run()
    used = fit.diagnostics()["seed"]
    assert isinstance(used, int) and fit.to_inference_data().posterior.attrs["seed"] == used
    again = AutoSpec(coin, num_samples=30, seed=used, disable_progbar=True).run()
    for name, value in fit.get_samples().items():
        assert torch.equal(value, again.get_samples()[name])
    assert AutoSpec(coin, 3, seed=12, disable_progbar=True).run().diagnostics()["seed"] == 12


def test_a_parameter_created_by_a_run_starts_from_the_users_stream():
    """A ``pyro.param`` first created inside ``AutoSpec.run`` takes its initial value from the
    user's generator as it stands, as a plain run of Pyro would (random restarts under
    ``pyro.set_rng_seed`` start from different points); it took the library's fixed seed,
    the same value whatever the user's seed. The user's stream is still left as it was."""

    def model(y):
        w = pyro.param("w_from_users_stream", torch.rand(2), constraint=constraints.simplex)
        with pyro.plate("d", len(y)):
            z = pyro.sample("z", dist.Categorical(w))
            pyro.sample("y", dist.Normal(z.float(), 1.0), obs=y)

    y = torch.tensor([0.5, 1.2, -0.3])
    saved = torch.get_rng_state()
    started = {}
    try:
        for user_seed in (0, 1):
            pyro.clear_param_store()
            torch.manual_seed(user_seed)
            poutine.trace(model).get_trace(y)  # a plain run of Pyro
            plain = pyro.param("w_from_users_stream").detach().clone()
            pyro.clear_param_store()
            torch.manual_seed(user_seed)
            before = torch.get_rng_state()
            AutoSpec(model, 20, seed=0, disable_progbar=True).run(y)
            assert torch.equal(torch.get_rng_state(), before)
            started[user_seed] = pyro.param("w_from_users_stream").detach().clone()
            torch.testing.assert_close(started[user_seed], plain, rtol=0, atol=0)
    finally:
        torch.set_rng_state(saved)
        pyro.clear_param_store()
    assert not torch.equal(started[0], started[1])
