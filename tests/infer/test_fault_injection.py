"""Fault injection: an oracle or a model that raises at its k-th call, on every path.

For each k up to the number of calls a clean run makes (so every fault fires), on the AutoSpec
path (a user ``oracle=``, and the model itself), the engine path (``sample_any_order``) and the
kernel path (``AutoSpecKernel`` inside ``MCMC``), with an ordinary exception and with
``KeyboardInterrupt``:

* the fault propagates (never swallowed, never turned into draws): ``KeyboardInterrupt``
  unchanged, an ordinary exception itself or as the cause of the library's error (model
  errors during tracing are explained as a structure problem, with the original chained; a
  mixed model's batched evaluation after sampling retries one draw at a time, with a warning
  that quotes the error);
* no partial results are left: ``get_samples()`` raises after the failed run;
* no global state is left behind (grad and inference mode, Pyro's handler stack);
* the next run with the same seed is bit-identical to a clean run.
"""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.poutine.runtime import _PYRO_STACK

from pyro_autospec.engine import Schedule, sample_any_order
from pyro_autospec.infer import AutoSpec, AutoSpecKernel
from pyro_autospec.model.enum import EnumOracle

DATA = torch.tensor([0.4, -1.1, 0.9, 0.2, -0.3, 1.4])
FAULTS = [RuntimeError, KeyboardInterrupt]


class Injected(RuntimeError):
    """The ordinary exception a fault raises (a subclass, so no library error is mistaken
    for it)."""


def _raise(kind, k):
    if kind is KeyboardInterrupt:
        raise KeyboardInterrupt(f"injected at call {k}")
    raise Injected(f"injected at call {k}")


def _check_fault(error, kind, k):
    """``error`` is the fault injected at call ``k``: KeyboardInterrupt itself, an ordinary
    fault itself or anywhere in the chain of causes of what was raised."""
    message = f"injected at call {k}"
    if kind is KeyboardInterrupt:
        assert type(error) is KeyboardInterrupt and str(error) == message, repr(error)
        return
    assert isinstance(error, Exception), repr(error)
    chain = error
    while chain is not None and not isinstance(chain, Injected):
        chain = chain.__cause__
    assert chain is not None and str(chain).startswith(message), repr(error)


class _raises:
    """Like ``pytest.raises``, for the fault injected at call ``k`` (:func:`_check_fault`)."""

    def __init__(self, kind, k):
        self.kind, self.k = kind, k

    def __enter__(self):
        return self

    def __exit__(self, exc_type, error, tb):
        assert error is not None, f"the fault at call {self.k} was swallowed"
        _check_fault(error, self.kind, self.k)
        return True


class Faults:
    """Counts calls; the ``fail_at``-th raises ``kind`` (``None``: never).

    A call under ``torch.func.vmap`` is not counted: it is the mixing check's probe, which
    spares traces of single draws and, on any error, leaves each draw to its own trace (the
    model's errors are raised there; ``test_an_error_under_vmap_leaves_each_draw_to_its_trace``).
    """

    def __init__(self):
        self.calls = 0
        self.fail_at = None
        self.kind = Injected

    def arm(self, fail_at, kind):
        self.calls, self.fail_at, self.kind = 0, fail_at, kind

    def tick(self):
        if torch._C._functorch.maybe_current_level() is not None:  # under vmap
            return
        self.calls += 1
        if self.calls == self.fail_at:
            self.fail_at = None  # one fault per armed run
            _raise(self.kind, self.calls)


MODEL_FAULTS = Faults()


def model(data):
    MODEL_FAULTS.tick()
    with pyro.plate("p", len(data)):
        z = pyro.sample("z", dist.Bernoulli(0.4))
        pyro.sample("y", dist.Normal(2.0 * z - 1.0, 1.0), obs=data)


class FaultyOracle:
    """The exact oracle of ``model`` whose ``log_marginals`` fails at its k-th call."""

    def __init__(self):
        self.inner = EnumOracle(model, (DATA,))
        self.num_coords, self.num_values = self.inner.num_coords, self.inner.num_values
        self.faults = Faults()

    def log_marginals(self, values, mask):
        self.faults.tick()
        return self.inner.log_marginals(values, mask)


ORACLE = FaultyOracle()


def _clean_state():
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert not _PYRO_STACK, "a Pyro handler was left on the stack"


def _calls_of(faults, run):
    faults.arm(None, Injected)
    result = run()
    return faults.calls, result


def _ks(total):
    """Every call of a short run; a spread of them for a longer one."""
    ks = list(range(1, total + 1))
    return ks if total <= 8 else sorted({1, 2, 3, total // 2, total - 1, total})


# ---------------------------------------------------------------------------- AutoSpec path
def _autospec(oracle="enum"):
    return AutoSpec(
        model, num_samples=6, num_chains=2, oracle=oracle, seed=11, disable_progbar=True
    )


def _draws(fit):
    return {k: v.clone() for k, v in fit.get_samples(group_by_chain=True).items()}


def _same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("source", ["oracle", "model"])
def test_autospec_path(source, kind):
    faults = ORACLE.faults if source == "oracle" else MODEL_FAULTS
    oracle = ORACLE if source == "oracle" else "enum"
    fit = _autospec(oracle)
    total, _ = _calls_of(faults, lambda: fit.run(DATA))
    clean = _draws(fit)
    extra = fit.get_extra_fields(group_by_chain=True)
    assert total >= 2
    for k in _ks(total):
        faults.arm(k, kind)
        with _raises(kind, k):
            fit.run(DATA)
        _clean_state()
        with pytest.raises(RuntimeError, match="last AutoSpec.run\\(\\) failed"):
            fit.get_samples()
        faults.arm(None, kind)
        fit.run(DATA)
        _same(_draws(fit), clean)
        _same(fit.get_extra_fields(group_by_chain=True), extra)


# -------------------------------------------------------------- AutoSpec path, mixed model
MIXED_FAULTS = Faults()


def mixed(data):
    """A continuous site (NUTS, Pyro's RNG) and discrete ones (the engine) in one run."""
    MIXED_FAULTS.tick()
    loc = pyro.sample("loc", dist.Normal(0.0, 2.0))
    with pyro.plate("p", len(data)):
        z = pyro.sample("z", dist.Bernoulli(0.4))
        pyro.sample("y", dist.Normal(loc * (2.0 * z - 1.0), 1.0), obs=data)


@pytest.mark.parametrize("kind", FAULTS)
def test_mixed_path(kind):
    fit = AutoSpec(
        mixed,
        num_samples=3,
        warmup_steps=3,
        seed=1,
        disable_progbar=True,
        nuts_kwargs={"max_tree_depth": 2},
    )
    total, _ = _calls_of(MIXED_FAULTS, lambda: fit.run(DATA[:4]))
    clean = _draws(fit)
    # NUTS calls the model many times: before, during and after sampling (a few runs only)
    ks = [1, total // 2, total] if kind is RuntimeError else [total // 2]
    for k in ks:
        MIXED_FAULTS.arm(k, kind)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fit.run(DATA[:4])
            except BaseException as error:
                _check_fault(error, kind, k)
            else:
                # The one exception: the batched evaluation after sampling falls back to one
                # trace per draw, with a warning that quotes the error; the fault is then
                # retried, not swallowed, and the draws are those of a clean run.
                assert kind is not KeyboardInterrupt
                assert any(f"injected at call {k}" in str(w.message) for w in caught), k
                _same(_draws(fit), clean)
                continue
        _clean_state()
        with pytest.raises(RuntimeError, match="last AutoSpec.run\\(\\) failed"):
            fit.get_samples()
        MIXED_FAULTS.arm(None, kind)
        fit.run(DATA[:4])
        _same(_draws(fit), clean)


# ------------------------------------------------------------------------------ engine path
@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_engine_path(engine, kind):
    def run():  # continuous batching: draws start and finish at different calls
        return sample_any_order(
            ORACLE, 12, seed=5, engine=engine, schedule=Schedule(max_concurrent_draws=3)
        )

    total, clean = _calls_of(ORACLE.faults, run)
    assert total >= 2
    for k in _ks(total):
        ORACLE.faults.arm(k, kind)
        with _raises(kind, k):
            run()
        _clean_state()
        ORACLE.faults.arm(None, kind)
        again = run()
        for field in ("samples", "log_prob", "orders", "sample_rounds"):
            assert torch.equal(getattr(again, field), getattr(clean, field)), field
        assert (again.rounds, again.oracle_rows) == (clean.rounds, clean.oracle_rows)


# ------------------------------------------------------------------------------ kernel path
def _mcmc(oracle):
    kernel = AutoSpecKernel(model, oracle=oracle, seed=3, draws_per_run=4)
    return MCMC(kernel, num_samples=8, warmup_steps=0, num_chains=1, disable_progbar=True)


@pytest.mark.parametrize("kind", FAULTS)
@pytest.mark.parametrize("source", ["oracle", "model"])
def test_kernel_path(source, kind):
    faults = ORACLE.faults if source == "oracle" else MODEL_FAULTS
    oracle = ORACLE if source == "oracle" else "enum"
    clean_mcmc = _mcmc(oracle)
    total, _ = _calls_of(faults, lambda: clean_mcmc.run(DATA))
    clean = clean_mcmc.get_samples()
    assert total >= 2
    for k in _ks(total):
        failed = _mcmc(oracle)
        faults.arm(k, kind)
        with _raises(kind, k):
            failed.run(DATA)
        _clean_state()
        faults.arm(None, kind)
        again = _mcmc(oracle)
        again.run(DATA)
        _same(again.get_samples(), clean)


def test_an_error_under_vmap_leaves_each_draw_to_its_trace():
    """The mixing check first scores its draws in one run of the model under vmap; an
    ordinary error there (torch's vmap raises many of its own, a dim it cannot place among
    them) sends each draw to a trace of its own, which raises the model's own errors: the run
    is the clean run's, draw for draw."""
    calls = {"vmap": 0}

    def fails_under_vmap(data):
        if torch._C._functorch.maybe_current_level() is not None:
            calls["vmap"] += 1
            raise Injected("only under vmap")
        model(data)

    options = {"num_samples": 6, "num_chains": 2, "seed": 11, "disable_progbar": True}
    clean = AutoSpec(model, **options).run(DATA)
    fit = AutoSpec(fails_under_vmap, **options).run(DATA)
    assert calls["vmap"] == 1
    _same(_draws(fit), _draws(clean))
    _same(fit.get_extra_fields(group_by_chain=True), clean.get_extra_fields(group_by_chain=True))
