"""Values that lose the draws' batch dimension get a clear error, not a wrong log joint."""

import math
import sys

import pyro
import pyro.distributions as dist
import pytest
import torch

from pyro_autospec.model import (
    AutoSpecModelError,
    MixedDrawsError,
    PlainRun,
    discover_sites,
    evaluate,
    log_joint,
)


def chain_without_keepdim(y):
    with pyro.plate("sites", 4):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    spins = 2 * s - 1
    pyro.factor("coupling", 0.7 * (spins[..., 1:] * spins[..., :-1]).sum(-1))  # no keepdim
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


def chain_with_keepdim(y):
    with pyro.plate("sites", 4):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    spins = 2 * s - 1
    pyro.factor("coupling", 0.7 * (spins[..., 1:] * spins[..., :-1]).sum(-1, keepdim=True))
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


def test_mixing_draws_is_an_error():
    y = torch.tensor(0.3)
    layout = discover_sites(chain_without_keepdim, (y,), {})
    values = {"s": torch.tensor([[0.0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0]])}
    with pytest.raises(AutoSpecModelError, match="keepdim=True"):
        log_joint(chain_without_keepdim, (y,), {}, layout, values)


def test_keepdim_model_matches_per_draw_values():
    y = torch.tensor(0.3)
    layout = discover_sites(chain_with_keepdim, (y,), {})
    values = {"s": torch.tensor([[0.0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0]])}
    batched = log_joint(chain_with_keepdim, (y,), {}, layout, values)
    alone = torch.cat(
        [log_joint(chain_with_keepdim, (y,), {}, layout, {"s": v[None]}) for v in values["s"]]
    )
    torch.testing.assert_close(batched, alone)


def _alone_traces(monkeypatch) -> list:
    """Records the draws traced alone by the mixing check (``_check_alone``)."""
    module = sys.modules["pyro_autospec.model.log_joint"]
    traced, check_alone = [], module._check_alone

    def recording(job, values, batched, row, size):
        traced.append(row)
        return check_alone(job, values, batched, row, size)

    monkeypatch.setattr(module, "_check_alone", recording)
    return traced


def reads_its_value(y):
    with pyro.plate("sites", 4):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    if float(s.sum()) > 100:  # a Python number: the model cannot run under vmap
        raise AssertionError("unreachable")
    pyro.factor("coupling", 0.7 * (s[..., 1:] * s[..., :-1]).sum(-1, keepdim=True))
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


def mixes_through_a_python_number(y):
    with pyro.plate("sites", 4):
        s = pyro.sample("s", dist.Bernoulli(0.5))
    total = float(s.sum())  # over every draw of the batch
    pyro.factor("coupling", 0.1 * total * s.sum(-1, keepdim=True))
    pyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


VALUES = {"s": torch.tensor([[0.0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0]])}


def test_vmap_settles_the_mixing_check_in_one_run(monkeypatch):
    """Of the draws the mixing check compares, the first and the one most unlike it are
    traced alone; the others are scored in one run of the
    model under ``torch.func.vmap``, each in its own shapes, and where that is the batch's
    score their traces are spared."""
    traced = _alone_traces(monkeypatch)
    y = torch.tensor(0.3)
    layout = discover_sites(chain_with_keepdim, (y,), {})
    log_joint(chain_with_keepdim, (y,), {}, layout, VALUES)
    assert traced == [0, 2]  # the first, and the one most unlike it


LOCS = torch.tensor([-3.0, 0.0, 3.0])


def catches_the_error_of_a_batch(data):
    """``int(z)`` fails on a batch of draws and under vmap alike; this model catches it and
    takes one branch in both, where a draw alone takes another (an outside review's case)."""
    z = pyro.sample("z", dist.Categorical(torch.ones(3) / 3))
    try:
        loc = LOCS[int(z)]
    except Exception:  # not one number: the default component
        loc = LOCS[0]
    with pyro.plate("data", len(data)):
        pyro.sample("y", dist.Normal(loc, 1.0), obs=data)


def test_a_model_that_catches_the_error_under_vmap_is_refused():
    data = torch.tensor([2.8, 3.1, 3.3])
    layout = discover_sites(catches_the_error_of_a_batch, (data,), {})
    values = {"z": torch.tensor([0, 2, 1, 2])}
    with pytest.raises(MixedDrawsError):
        log_joint(catches_the_error_of_a_batch, (data,), {}, layout, values)


def test_a_model_vmap_cannot_run_is_traced_alone(monkeypatch):
    """A model that reads a Python number from its values cannot run under vmap: each draw
    is traced alone, as without vmap, and a model that mixes the draws so is refused."""
    traced = _alone_traces(monkeypatch)
    y = torch.tensor(0.3)
    layout = discover_sites(reads_its_value, (y,), {})
    log_joint(reads_its_value, (y,), {}, layout, VALUES)
    assert sorted(traced) == [0, 1, 2, 3]  # the first, the most different and spread rows
    layout = discover_sites(mixes_through_a_python_number, (y,), {})
    with pytest.raises(MixedDrawsError):
        log_joint(mixes_through_a_python_number, (y,), {}, layout, VALUES)


def _evaluate(model, data, values, plain_runs):
    layout = discover_sites(model, (data,), {})
    shapes = layout.latent_shapes()
    return evaluate(
        model, (data,), {}, values, shapes, layout.max_plate_nesting, plain_runs=plain_runs
    )


def test_plain_runs_join_the_first_batch_and_leave_the_outputs(monkeypatch):
    """Site discovery's structure traces are plain runs of the model: rows ahead of the draws
    in the first batch, compared with their own log joint, and not among the outputs."""
    traced = _alone_traces(monkeypatch)
    y = torch.tensor(0.3)
    runs = discover_sites(chain_with_keepdim, (y,), {}).plain_runs
    assert len(runs) == 2 and all(math.isfinite(run.log_joint) for run in runs)
    with_runs = _evaluate(chain_with_keepdim, y, VALUES, runs)
    assert traced == [2, 4]  # the first draw and the one most unlike it, after the plain runs
    traced.clear()
    without = _evaluate(chain_with_keepdim, y, VALUES, ())
    assert traced == [0, 2]
    torch.testing.assert_close(with_runs.total, without.total, rtol=0, atol=1e-12)
    assert with_runs.total.shape == (4,) and with_runs.magnitude.shape == (4,)


def test_a_stale_plain_run_costs_a_trace_and_raises_nothing(monkeypatch):
    """A plain run whose log joint is not the batch's (another model's, other data) is traced
    alone again: a model that does not mix draws passes."""
    traced = _alone_traces(monkeypatch)
    y = torch.tensor(0.3)
    run = discover_sites(chain_with_keepdim, (y,), {}).plain_runs[0]
    stale = PlainRun(run.values, run.log_joint + 0.5)
    out = _evaluate(chain_with_keepdim, y, VALUES, [stale, PlainRun(run.values, -math.inf)])
    assert traced == [0, 1, 2, 4] and out.total.shape == (4,)


PRIOR = torch.tensor([0.1, 0.1, 0.4, 0.4])


def special_case_in_try(special: int):
    """``int(k)`` fails on a batch and under vmap: this model gives one value a bonus only
    when it runs on one draw (an outside review's case)."""

    def model():
        k = pyro.sample("k", dist.Categorical(PRIOR))
        try:
            bonus = 3.0 if int(k) == special else 0.0
        except Exception:  # noqa: BLE001 - not one number: no bonus
            bonus = 0.0
        pyro.factor("bonus", torch.tensor(bonus))

    return model


@pytest.mark.parametrize("special", [0, 1, 2, 3])
def test_a_value_special_alone_is_found_by_a_draw_or_a_plain_run(special):
    """The draws traced alone (the first and the one most unlike it) see values 0 and 1 here,
    the plain runs values 2 and 3: every special value is found."""
    model = special_case_in_try(special)
    runs = discover_sites(model).plain_runs
    assert sorted(int(run.values["k"]) for run in runs) == [2, 3]
    values = {"k": torch.tensor([0, 1, 2, 3])}
    with pytest.raises(MixedDrawsError):
        evaluate(model, (), {}, values, {"k": ((), ())}, 0, plain_runs=runs)
