"""Tier 2: AutoSpec is exact under every Pyro handler real models use.

Each test writes the model as Pyro users do (several are faithful small copies of Pyro's own
``examples/hmm.py``, ``examples/mixed_hmm`` and ``examples/capture_recapture/cjs.py``), writes
its joint density BY HAND (no pyro_autospec, no Pyro handler), enumerates it, and tests
AutoSpec's draws against it by chi-square (fixed seeds, p > 2e-5, >= 30 expected per bin).
Masked terms are left out of the density and scaled terms are multiplied by their scale, as in
``trace.log_prob_sum()`` (what ``pyro.infer.MCMC`` and ``infer_discrete`` use).
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import config_enumerate
from pyro.ops.indexing import Vindex
from torch.distributions import constraints

from pyro_autospec.infer import (
    AutoSpec,
    IntractableEnumerationError,
    SelfCheckError,
    SubsamplingError,
)
from pyro_autospec.model.enum import EnumOracle
from tests.catalogue.brute_force import (
    assert_draws_follow,
    enumerate_joint,
    flatten_draws,
    lp,
    marginal_means,
)
from tests.catalogue.oracles import RowsOnly
from tests.infer._pyro_hmm_examples import model_1, model_2, model_3

_SAMPLER = {"name": "auto"}


@pytest.fixture(autouse=True, params=["auto", "engine"])
def sampler(request):
    """Every test twice: the default sampler (forward filtering, backward sampling on these
    models) and the any-order engine."""
    _SAMPLER["name"] = request.param
    yield request.param
    _SAMPLER["name"] = "auto"


def sample(model, *args, num_samples=3000, seed=0, **kwargs):
    kwargs.setdefault("sampler", _SAMPLER["name"])
    return AutoSpec(model, num_samples=num_samples, seed=seed, disable_progbar=True, **kwargs).run(
        *args
    )


# ------------------------------------------------------------------ poutine.mask: the issue
def masked():
    with pyro.plate("p", 2), poutine.mask(mask=torch.tensor([True, False])):
        pyro.sample("z", dist.Bernoulli(0.9))


def test_mask_minimal_case_gives_090_050():
    fit = sample(masked, num_samples=4000)
    states, probs = enumerate_joint([2, 2], lambda s: lp(dist.Bernoulli(0.9), float(s[0])))
    np.testing.assert_allclose(marginal_means(states, probs), [0.9, 0.5])
    draws = flatten_draws(fit.get_samples(), ["z"])
    assert_draws_follow(draws, states, probs)
    mean = draws.mean(0)
    se = np.sqrt(np.array([0.9 * 0.1, 0.25]) / len(draws))
    assert np.all(np.abs(mean - [0.9, 0.5]) < 5 * se), mean


# -------------------------------------------------------------------------------- obs_mask
Y_OBS = torch.tensor([1.0, 1.0, 0.0, 1.0])
Y_MASK = torch.tensor([True, True, False, False])


def obs_mask_model(y, m):
    p = pyro.sample("p", dist.Categorical(torch.tensor([0.3, 0.7])))
    probs = torch.tensor([0.2, 0.8])[p]
    with pyro.plate("d", 4):
        pyro.sample("y", dist.Bernoulli(probs), obs=y, obs_mask=m)


def test_obs_mask_imputes_exactly():
    fit = sample(obs_mask_model, Y_OBS, Y_MASK, num_samples=3000)

    def joint(s):
        p, imputed = s[0], s[1:]
        total = math.log([0.3, 0.7][p])
        rate = [0.2, 0.8][p]
        for i in range(4):
            value = float(Y_OBS[i]) if Y_MASK[i] else float(imputed[i])
            total += lp(dist.Bernoulli(rate), value)  # masked draws are uniform elsewhere
        return total

    states, probs = enumerate_joint([2] + [2] * 4, joint)
    samples = fit.get_samples()
    assert_draws_follow(flatten_draws(samples, ["p", "y_unobserved"]), states, probs)
    # the deterministic site 'y' interleaves data and imputations, as Pyro defines it
    expected = torch.where(Y_MASK, Y_OBS, samples["y_unobserved"])
    torch.testing.assert_close(samples["y"], expected)


# ------------------------------------------------------------------------------ poutine.scale
def scaled(y):
    z = pyro.sample("z", dist.Categorical(torch.tensor([0.2, 0.3, 0.5])))
    with poutine.scale(scale=3.0):
        pyro.sample("y", dist.Normal(z.float(), 1.0), obs=y)


def test_scale_draws_follow_the_scaled_density_and_say_so():
    y = torch.tensor(0.4)
    with pytest.warns(
        UserWarning, match=r"'y' \(mean scale 3\) are scaled.*lp includes the scales"
    ) as caught:
        fit = sample(scaled, y, num_samples=3000)
    assert caught[0].filename == __file__  # points at the line that called run()

    def joint(s):
        return math.log([0.2, 0.3, 0.5][s[0]]) + 3.0 * lp(dist.Normal(float(s[0]), 1.0), y)

    states, probs = enumerate_joint([3], joint)
    samples = fit.get_samples()
    assert_draws_follow(flatten_draws(samples, ["z"]), states, probs)
    # lp is the scaled log density (documented): check it draw by draw
    lp_field = fit.get_extra_fields()["lp"]
    by_hand = torch.tensor([joint((int(z),)) for z in samples["z"][:20]], dtype=torch.float64)
    torch.testing.assert_close(lp_field[:20], by_hand, atol=1e-5, rtol=0)
    # the pointwise log likelihood is not scaled
    pointwise = fit.to_inference_data().log_likelihood["y"].values.reshape(-1)[:20]
    direct = dist.Normal(samples["z"][:20].double(), 1.0).log_prob(y.double())
    np.testing.assert_allclose(pointwise, direct.numpy(), atol=1e-5)


# ---------------------------------------------------------------------------- subsampling
Y_SIX = torch.tensor([0.3, -1.2, -0.1, 0.3, -0.8, -0.1])


def fixed_subsample(y):
    z = pyro.sample("z", dist.Bernoulli(0.4))
    with pyro.plate("d", 6, subsample=torch.tensor([0, 2, 5])) as i:
        pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=y[i])


def fixed_subsample_and_size(y):
    """``subsample_size`` given with a fixed ``subsample=``: Pyro uses the given indices."""
    z = pyro.sample("z", dist.Bernoulli(0.4))
    with pyro.plate("d", 6, subsample_size=3, subsample=torch.tensor([0, 2, 5])) as i:
        pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=y[i])


def conditioned_subsample(y):
    """A random subsample fixed by conditioning the plate's name (a Pyro idiom)."""
    return poutine.condition(random_subsample, data={"d": torch.tensor([0, 2, 5])})(y)


def random_subsample(y):
    z = pyro.sample("z", dist.Bernoulli(0.4))
    with pyro.plate("d", 6, subsample_size=3) as i:
        pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=y[i])


@pytest.mark.parametrize(
    "model", [fixed_subsample, fixed_subsample_and_size, conditioned_subsample]
)
def test_fixed_subsample_is_a_scaled_model(model):
    with pytest.warns(UserWarning, match="scaled"):
        fit = sample(model, Y_SIX, num_samples=2000)

    def joint(s):
        loc = 2.0 * s[0] - 1.0
        return lp(dist.Bernoulli(0.4), float(s[0])) + 2.0 * lp(
            dist.Normal(loc, 1.0), Y_SIX[[0, 2, 5]]
        )

    states, probs = enumerate_joint([2], joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), ["z"]), states, probs)


def test_random_subsample_is_a_clear_error():
    with pytest.raises(SubsamplingError, match=r"Plate 'd' draws a random subsample of 3"):
        sample(random_subsample, Y_SIX, num_samples=2)


# ---------------------------------------------- pyro.markov, masks, plates: examples/hmm.py
# model_1 .. model_3 of Pyro's examples/hmm.py (tests/infer/_pyro_hmm_examples.py), their
# continuous sites probs_* conditioned on fixed values, as after fitting them with SVI and
# AutoDelta.
SEQUENCES = torch.tensor(
    [[[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]]
)  # [sequence, time, tone]
LENGTHS = torch.tensor([3, 2])  # variable lengths: the second sequence's last step is masked
PROBS_X = torch.tensor([[0.8, 0.2], [0.3, 0.7]])
PROBS_Y = torch.tensor([[0.9, 0.2], [0.1, 0.7]])  # [state, tone]
PROBS_Y2 = torch.tensor([[[0.9, 0.3], [0.6, 0.2]], [[0.2, 0.8], [0.1, 0.5]]])  # [x, y_prev, tone]
PROBS_Y3 = torch.tensor([[[0.9, 0.1], [0.5, 0.5]], [[0.3, 0.8], [0.05, 0.95]]])  # [w, x, tone]


def hmm_args(hidden_dim=2):
    return SimpleNamespace(hidden_dim=hidden_dim, jit=False)


def test_hmm_model_1_variable_lengths():
    model = poutine.condition(model_1, data={"probs_x": PROBS_X, "probs_y": PROBS_Y})
    fit = sample(model, SEQUENCES, LENGTHS, hmm_args(), num_samples=4000)
    names = ["x_0", "x_1", "x_2"]  # each [sequence, 1]

    def joint(s):  # s = (x_0[s0], x_0[s1], x_1[s0], x_1[s1], x_2[s0], x_2[s1])
        total = 0.0
        for seq in range(2):
            prev = 0
            for t in range(3):
                state = s[2 * t + seq]
                if t < LENGTHS[seq]:
                    total += math.log(PROBS_X[prev, state])
                    total += lp(dist.Bernoulli(PROBS_Y[state]), SEQUENCES[seq, t])
                prev = state
        return total

    states, probs = enumerate_joint([2] * 6, joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)


def test_hmm_model_2_autoregressive():
    model = poutine.condition(model_2, data={"probs_x": PROBS_X, "probs_y": PROBS_Y2})
    fit = sample(model, SEQUENCES, LENGTHS, hmm_args(), num_samples=4000, seed=1)

    def joint(s):
        total = 0.0
        for seq in range(2):
            prev, y_prev = 0, torch.zeros(2, dtype=torch.long)
            for t in range(3):
                state = s[2 * t + seq]
                y = SEQUENCES[seq, t]
                if t < LENGTHS[seq]:
                    total += math.log(PROBS_X[prev, state])
                    rates = PROBS_Y2[state, y_prev, torch.arange(2)]
                    total += lp(dist.Bernoulli(rates), y)
                prev, y_prev = state, y.long()
        return total

    states, probs = enumerate_joint([2] * 6, joint)
    draws = flatten_draws(fit.get_samples(), ["x_0", "x_1", "x_2"])
    assert_draws_follow(draws, states, probs)


def test_hmm_model_3_factorial():
    model = poutine.condition(
        model_3, data={"probs_w": PROBS_X, "probs_x": PROBS_X.flip(0), "probs_y": PROBS_Y3}
    )
    sequences, lengths = SEQUENCES[:, :2], torch.tensor([2, 1])
    fit = sample(model, sequences, lengths, hmm_args(hidden_dim=4), num_samples=4000, seed=2)
    names = ["w_0", "x_0", "w_1", "x_1"]
    probs_x = PROBS_X.flip(0)

    def joint(s):  # (w_0[s0], w_0[s1], x_0[s0], x_0[s1], w_1[...], x_1[...])
        total = 0.0
        for seq in range(2):
            w_prev = x_prev = 0
            for t in range(2):
                w, x = s[4 * t + seq], s[4 * t + 2 + seq]
                if t < lengths[seq]:
                    total += math.log(PROBS_X[w_prev, w]) + math.log(probs_x[x_prev, x])
                    total += lp(dist.Bernoulli(PROBS_Y3[w, x]), sequences[seq, t])
                w_prev, x_prev = w, x
        return total

    states, probs = enumerate_joint([2] * 8, joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)


# ------------------------------------------------------------ examples/mixed_hmm (small copy)
MISSING = 1e-6


@config_enumerate
def mixed_hmm(config):
    """Pyro's examples/mixed_hmm/model.py ``model_generic``, discrete random effects."""
    N_v = config["sizes"]["random"]
    N_state = config["sizes"]["state"]
    probs_e_g = pyro.param(
        "probs_e_group", lambda: torch.randn((N_v,)).abs(), constraint=constraints.simplex
    )
    theta_g = pyro.param("theta_group", lambda: torch.randn((N_v, N_state**2)))
    N_c = config["sizes"]["group"]
    probs_e_i = pyro.param(
        "probs_e_individual",
        lambda: torch.randn((N_c, N_v)).abs(),
        constraint=constraints.simplex,
    )
    theta_i = pyro.param("theta_individual", lambda: torch.randn((N_c, N_v, N_state**2)))
    step_zi_param = pyro.param("step_zi_param", lambda: torch.ones((N_state, 2)))
    step_concentration = pyro.param(
        "step_param_concentration",
        lambda: torch.randn((N_state,)).abs(),
        constraint=constraints.positive,
    )
    step_rate = pyro.param(
        "step_param_rate", lambda: torch.randn((N_state,)).abs(), constraint=constraints.positive
    )
    angle_concentration = pyro.param(
        "angle_param_concentration",
        lambda: torch.randn((N_state,)).abs(),
        constraint=constraints.positive,
    )
    angle_loc = pyro.param("angle_param_loc", lambda: torch.randn((N_state,)).abs())
    gamma = torch.zeros((N_state**2,))
    with pyro.plate("group", N_c, dim=-1):
        e_g = pyro.sample("e_g", dist.Categorical(probs_e_g))
        eps_g = Vindex(theta_g)[..., e_g, :]
        gamma = gamma + eps_g
        N_s = config["sizes"]["individual"]
        with pyro.plate("individual", N_s, dim=-2), poutine.mask(mask=config["individual"]["mask"]):
            e_i = pyro.sample("e_i", dist.Categorical(probs_e_i))
            eps_i = Vindex(theta_i)[..., e_i, :]
            gamma = gamma + eps_i
            y = torch.tensor(0).long()
            N_t = config["sizes"]["timesteps"]
            for t in pyro.markov(range(N_t)):
                with poutine.mask(mask=config["timestep"]["mask"][..., t]):
                    gamma_t = gamma.reshape(tuple(gamma.shape[:-1]) + (N_state, N_state))
                    gamma_y = Vindex(gamma_t)[..., y, :]
                    y = pyro.sample(f"y_{t}", dist.Categorical(logits=gamma_y))
                    step_dist = dist.Gamma(
                        concentration=Vindex(step_concentration)[..., y],
                        rate=Vindex(step_rate)[..., y],
                    )
                    step_zi = Vindex(step_zi_param)[..., y, :]
                    step_zi_mask = config["observations"]["step"][..., t] == MISSING
                    pyro.sample(
                        f"step_zi_{t}",
                        dist.Categorical(logits=step_zi),
                        obs=step_zi_mask.long(),
                    )
                    step_zi_zero_dist = dist.Delta(v=torch.tensor(MISSING))
                    step_zi_dist = dist.MaskedMixture(step_zi_mask, step_dist, step_zi_zero_dist)
                    pyro.sample(
                        f"step_{t}",
                        step_zi_dist,
                        obs=config["observations"]["step"][..., t],
                    )
                    angle_dist = dist.VonMises(
                        concentration=Vindex(angle_concentration)[..., y],
                        loc=Vindex(angle_loc)[..., y],
                    )
                    pyro.sample(
                        f"angle_{t}",
                        angle_dist,
                        obs=config["observations"]["angle"][..., t],
                    )


@pytest.fixture
def mixed_hmm_config():
    pyro.clear_param_store()
    pyro.param("probs_e_group", torch.tensor([0.4, 0.6]), constraint=constraints.simplex)
    pyro.param("theta_group", torch.tensor([[1.0, -1.0, 0.5, 0.0], [-0.5, 0.5, 0.0, 1.0]]))
    pyro.param("probs_e_individual", torch.tensor([[0.7, 0.3]]), constraint=constraints.simplex)
    pyro.param("theta_individual", torch.tensor([[[0.5, 0.0, -1.0, 1.0], [0.0, 1.0, 1.0, -0.5]]]))
    pyro.param("step_zi_param", torch.tensor([[0.5, -0.5], [-1.0, 1.0]]))
    pyro.param(
        "step_param_concentration", torch.tensor([2.0, 5.0]), constraint=constraints.positive
    )
    pyro.param("step_param_rate", torch.tensor([1.0, 2.0]), constraint=constraints.positive)
    pyro.param(
        "angle_param_concentration", torch.tensor([1.0, 3.0]), constraint=constraints.positive
    )
    pyro.param("angle_param_loc", torch.tensor([0.5, 2.0]))
    step = torch.tensor([[[1.5, MISSING]], [[0.7, 2.2]]])  # [individual, group, time]
    angle = torch.tensor([[[0.3, 1.9]], [[2.5, 0.1]]])
    config = {
        "sizes": {"state": 2, "random": 2, "group": 1, "individual": 2, "timesteps": 2},
        "group": {"random": "discrete"},
        "individual": {"random": "discrete", "mask": torch.tensor([[True], [True]])},
        "timestep": {"mask": torch.tensor([[[True, True]], [[True, False]]])},
        "observations": {"step": step, "angle": angle},
    }
    yield config
    pyro.clear_param_store()


def test_mixed_hmm_example(mixed_hmm_config):
    config = mixed_hmm_config
    fit = sample(mixed_hmm, config, num_samples=4000, seed=3)
    store = {k: v.detach() for k, v in pyro.get_param_store().items()}
    step, angle = config["observations"]["step"], config["observations"]["angle"]
    tmask = config["timestep"]["mask"]

    def joint(s):  # (e_g, e_i[0], e_i[1], y_0[0], y_0[1], y_1[0], y_1[1])
        e_g, e_i, ys = s[0], s[1:3], (s[3:5], s[5:7])
        total = math.log(store["probs_e_group"][e_g])
        for i in range(2):
            total += math.log(store["probs_e_individual"][0, e_i[i]])
            gamma = (store["theta_group"][e_g] + store["theta_individual"][0, e_i[i]]).reshape(2, 2)
            prev = 0
            for t in range(2):
                y = ys[t][i]
                if tmask[i, 0, t]:
                    total += lp(dist.Categorical(logits=gamma[prev]), y)
                    missing = bool(step[i, 0, t] == MISSING)
                    total += lp(dist.Categorical(logits=store["step_zi_param"][y]), int(missing))
                    if not missing:
                        total += lp(
                            dist.Gamma(
                                store["step_param_concentration"][y], store["step_param_rate"][y]
                            ),
                            step[i, 0, t],
                        )
                    total += lp(
                        dist.VonMises(
                            store["angle_param_loc"][y], store["angle_param_concentration"][y]
                        ),
                        angle[i, 0, t],
                    )
                prev = y
        return total

    states, probs = enumerate_joint([2] * 7, joint)
    draws = flatten_draws(fit.get_samples(), ["e_g", "e_i", "y_0", "y_1"])
    assert_draws_follow(draws, states, probs)


# ---------------------------------------------------- Vindex inside nested plates, and a tree
Z_PROBS = torch.tensor([0.2, 0.5, 0.9])
LOCS = torch.tensor([[-1.0, 1.0], [0.0, 2.0], [1.0, 3.0]])  # [group type, z]
Y_NESTED = torch.tensor([[0.3, 2.1], [-0.8, 1.2]])  # [group, item]


def nested_plates(y):
    with pyro.plate("groups", 2, dim=-2):
        g = pyro.sample("g", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
        with pyro.plate("items", 2, dim=-1):
            z = pyro.sample("z", dist.Bernoulli(Vindex(Z_PROBS)[..., g]))
            pyro.sample("y", dist.Normal(Vindex(LOCS)[..., g, z.long()], 1.0), obs=y)


def test_vindex_in_nested_plates():
    fit = sample(nested_plates, Y_NESTED, num_samples=4000, seed=4)

    def joint(s):  # (g[0], g[1], z[0,0], z[0,1], z[1,0], z[1,1])
        total = 0.0
        for i in range(2):
            g = s[i]
            total += math.log([0.3, 0.3, 0.4][g])
            for j in range(2):
                z = s[2 + 2 * i + j]
                total += lp(dist.Bernoulli(Z_PROBS[g]), float(z))
                total += lp(dist.Normal(LOCS[g, z], 1.0), Y_NESTED[i, j])
        return total

    states, probs = enumerate_joint([3, 3, 2, 2, 2, 2], joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), ["g", "z"]), states, probs)


A_OBS = torch.tensor([0.9, -0.1])
B_OBS = torch.tensor([[0.2], [1.1], [0.8]])


def two_plates(a_obs, b_obs):
    c = pyro.sample("c", dist.Bernoulli(0.5))
    with pyro.plate("a", 2, dim=-1):
        x = pyro.sample("x", dist.Bernoulli(0.2 + 0.6 * c))
        pyro.sample("xa", dist.Normal(x, 0.5), obs=a_obs)
    with pyro.plate("b", 3, dim=-2):
        w = pyro.sample("w", dist.Bernoulli(0.7 - 0.4 * c))
        pyro.sample("wb", dist.Normal(w, 0.5), obs=b_obs)


def test_independent_plates_joined_by_a_global_site():
    fit = sample(two_plates, A_OBS, B_OBS, num_samples=3000, seed=5)

    def joint(s):  # (c, x[0], x[1], w[0], w[1], w[2])
        c = s[0]
        total = lp(dist.Bernoulli(0.5), float(c))
        for i in range(2):
            total += lp(dist.Bernoulli(0.2 + 0.6 * c), float(s[1 + i]))
            total += lp(dist.Normal(float(s[1 + i]), 0.5), A_OBS[i])
        for j in range(3):
            total += lp(dist.Bernoulli(0.7 - 0.4 * c), float(s[3 + j]))
            total += lp(dist.Normal(float(s[3 + j]), 0.5), B_OBS[j, 0])
        return total

    states, probs = enumerate_joint([2] * 6, joint)
    assert_draws_follow(flatten_draws(fit.get_samples(), ["c", "x", "w"]), states, probs)


# -------------------------------------------- examples/capture_recapture/cjs.py (model_1)
def cjs_model_1(capture_history, sex):
    N, T = capture_history.shape
    phi = pyro.sample("phi", dist.Uniform(0.0, 1.0))  # survival probability
    rho = pyro.sample("rho", dist.Uniform(0.0, 1.0))  # recapture probability
    with pyro.plate("animals", N, dim=-1):
        z = torch.ones(N)
        first_capture_mask = torch.zeros(N).bool()
        for t in pyro.markov(range(T)):
            with poutine.mask(mask=first_capture_mask):
                mu_z_t = first_capture_mask.float() * phi * z + (1 - first_capture_mask.float())
                z = pyro.sample(f"z_{t}", dist.Bernoulli(mu_z_t), infer={"enumerate": "parallel"})
                mu_y_t = rho * z
                pyro.sample(f"y_{t}", dist.Bernoulli(mu_y_t), obs=capture_history[:, t])
            first_capture_mask |= capture_history[:, t].bool()


CAPTURES = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_capture_recapture_cjs():
    """The example mutates its mask in place (``first_capture_mask |= ...``) after handing it
    to ``poutine.mask``; Pyro computes log densities after the model has run, so every step of
    an animal ever captured counts (with ``mu = 1`` before its first capture), and every step
    of an animal never captured is masked. ``trace.log_prob_sum()``, ``infer_discrete`` and
    NUTS all read the model this way, and so does the joint written here."""
    phi, rho = 0.7, 0.6
    model = poutine.condition(
        cjs_model_1, data={"phi": torch.tensor(phi), "rho": torch.tensor(rho)}
    )
    fit = sample(model, CAPTURES, None, num_samples=3000, seed=6)
    N, T = CAPTURES.shape

    def joint(s):  # (z_0[a0], z_0[a1], z_0[a2], z_1[a0], ...)
        total = 0.0
        for a in range(N):
            if not bool(CAPTURES[a].any()):
                continue  # the final mask is False at every step: uniform
            seen, z_prev = False, 1
            for t in range(T):
                z = s[N * t + a]
                mu = torch.tensor(phi * z_prev if seen else 1.0)
                total += lp(dist.Bernoulli(mu), float(z))
                total += lp(dist.Bernoulli(torch.tensor(rho * z)), CAPTURES[a, t])
                seen = seen or bool(CAPTURES[a, t])
                z_prev = z
        return total

    states, probs = enumerate_joint([2] * (N * T), joint)
    names = [f"z_{t}" for t in range(T)]
    assert_draws_follow(flatten_draws(fit.get_samples(), names), states, probs)


# ------------------------------------------------------------------------ pyro.deterministic
def with_deterministic(y):
    z = pyro.sample("z", dist.Categorical(torch.tensor([0.3, 0.3, 0.4])))
    pyro.deterministic("twice", 2.0 * z)
    with pyro.plate("d", 2):
        w = pyro.sample("w", dist.Bernoulli(0.5))
        pyro.deterministic("sum", w + z)
        pyro.sample("y", dist.Normal(w + z, 1.0), obs=y)


def test_deterministic_sites_are_returned_like_predictive():
    y = torch.tensor([1.5, 0.2])
    fit = sample(with_deterministic, y, num_samples=40)
    samples = fit.get_samples()
    assert list(samples) == ["z", "w", "twice", "sum"]
    torch.testing.assert_close(samples["twice"], 2.0 * samples["z"])
    torch.testing.assert_close(samples["sum"], samples["w"] + samples["z"][:, None])
    predictive = pyro.infer.Predictive(
        with_deterministic, posterior_samples={k: samples[k] for k in ("z", "w")}
    )(y)
    # the same values as Predictive (which pads 'twice', outside every plate, to [40, 1])
    for name in ("twice", "sum"):
        torch.testing.assert_close(predictive[name].reshape(samples[name].shape), samples[name])
    assert predictive["sum"].shape == samples["sum"].shape
    idata = fit.to_inference_data()
    # one chain of 40 exact draws goes to ArviZ as 2 chains of 20 (see to_inference_data)
    assert idata.posterior["sum"].shape == (2, 20, 2)
    assert set(idata.posterior.data_vars) == {"z", "w", "twice", "sum"}
    # without the discrete sites their deterministic functions go too: Predictive fed the
    # rest recomputes both, where a kept 'twice' would pair old values with new draws of z
    assert fit.get_samples(include_discrete=False) == {}


# ---------------------------------------------------------------------- the self-check
def unmasked():
    with pyro.plate("p", 2):
        pyro.sample("z", dist.Bernoulli(0.9))


def test_self_check_catches_an_oracle_for_another_density(monkeypatch):
    """What the issue's masked model gave before: an oracle that ignores the mask. Without
    ``log_normalizer()`` it is compared with ``log Z`` by elimination, or else (where none
    fits) its draws with each other."""
    wrong = EnumOracle(unmasked)
    match = "differs from the log normaliser.*NOT exact.*guide="
    with pytest.raises(SelfCheckError, match=match):
        sample(masked, oracle=RowsOnly(wrong), num_samples=200)
    with pytest.raises(SelfCheckError, match="log normaliser"):
        sample(masked, oracle=wrong, num_samples=200)
    import pyro_autospec.infer.self_check as self_check

    monkeypatch.setattr(self_check, "reference_log_normalizer", lambda *args: None)
    with pytest.raises(SelfCheckError, match="varies across draws.*NOT exact.*guide="):
        sample(masked, oracle=RowsOnly(wrong), num_samples=200)


def test_self_check_passes_and_is_reported(capsys):
    fit = sample(masked, num_samples=30)
    fit.summary()
    assert "Self-check passed" in capsys.readouterr().out
    extra = fit.get_extra_fields()
    differences = extra["lp"] - extra["oracle_log_prob"]
    assert float(differences.max() - differences.min()) < 1e-6


def test_no_warning_for_an_unscaled_model():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample(masked, num_samples=10)


def sums_over_its_plate(y):
    """Invalid under enumeration: a plated site reduced over its own plate (Pyro enumerates
    one value per plate element, so the sum sees a single element). Pyro's enumeration gets
    it silently wrong; AutoSpec refuses it before sampling."""
    with pyro.plate("p", 2):
        z = pyro.sample("z", dist.Bernoulli(0.3))
    pyro.sample("y", dist.Normal(z.sum(-1, keepdim=True), 0.5), obs=y)


def test_a_construct_enumeration_cannot_express_is_refused_before_sampling():
    with pytest.raises(IntractableEnumerationError, match=r"Site 'y' lies outside plate\(s\) 'p'"):
        sample(sums_over_its_plate, torch.tensor([2.0]), num_samples=200)
