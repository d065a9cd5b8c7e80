"""Pyro's own test-suite and example models: AutoSpec samples each exactly or refuses it clearly.

The catalogue is ``tests/infer/_pyro_suite_models.py`` (models copied from Pyro, Apache-2.0);
``benchmarks/pyro_suite.py`` runs the same catalogue with more draws and prints a table.

* Every model, with both samplers (``auto``: forward filtering, backward sampling; ``engine``:
  the enumeration oracle and autospeculation): a few draws, or a refusal that is an
  ``AutoSpecModelError`` naming a site or plate of the model and the cause listed in
  ``REFUSALS``; a model that fails in a plain run of Pyro itself gets its own error back.
  No raw torch, einsum or assertion error, and no refusal of a model that should run.
* Every model that runs, with the default sampler: 1000 draws against brute force over every
  assignment (Pyro's own ``trace.log_prob_sum()``) or Pyro's ``compute_marginals``, by a
  chi-square test (p > 2e-5, bins of >= 30 expected draws, fixed seed).
* A subset with the engine: the same test.
"""

import pytest
import torch

from tests.infer._pyro_suite_models import CASES, run_case

RUN = [c for c in CASES if not (c.refusal or c.model_error)]
ENGINE_EXACT = (
    "distribution_3",
    "gmm_batch_model",
    "elbo_plate_plate",
    "elbo_enumerate_plate_3[masked,scale=10]",
    "elbo_enumerate_plates_7[plate_plate]",
    "elbo_enumerate_plates_8[plate_iplate]",
    "mixture_of_diag_normals[hand_model]",
    "compute_marginals_single[OneHotCategorical]",
    "backwardsample_posterior_smoke[None,None]",
    "enum_in_model_plate_ok",
    "enum_recycling_grid[vindex=True]",
    "markov_history[2]",
    "hmm.model_1",
    "hmm.model_6",
)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_catalogue_is_large_and_named_uniquely():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) and len(names) >= 60
    assert all(c.source.startswith(("tests/infer/", "examples/")) for c in CASES)
    assert set(ENGINE_EXACT) <= {c.name for c in RUN}


@pytest.mark.parametrize("sampler", ["auto", "engine"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_runs_or_refuses_clearly(case, sampler):
    outcome = run_case(case, sampler=sampler, num_samples=8, check=False)
    if case.model_error:  # fails in a plain Pyro run too: the model's own error, unchanged
        assert outcome.status == "model-error", outcome.detail
        assert outcome.detail.startswith(case.model_error)
    elif case.refusal:
        assert outcome.status == "refused", outcome.detail
        assert case.refusal in outcome.detail or case.refusal in outcome.message, outcome.message
        assert "_autospec" not in outcome.message and "einsum" not in outcome.message
    else:
        assert outcome.status == "ran", outcome.detail


@pytest.mark.parametrize("case", RUN, ids=lambda c: c.name)
def test_draws_are_exact(case):
    outcome = run_case(case, num_samples=1000, seed=1)
    assert outcome.status == "exact", outcome.detail


@pytest.mark.parametrize("name", ENGINE_EXACT)
def test_engine_draws_are_exact(name):
    (case,) = [c for c in CASES if c.name == name]
    outcome = run_case(case, sampler="engine", num_samples=1000, seed=2)
    assert outcome.status == "exact", outcome.detail
