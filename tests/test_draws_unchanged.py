"""The draws are bitwise unchanged: every sampler on every catalogued oracle, the diffusion
samplers and ``AutoSpec`` on Pyro models give the recorded draws
(``tests/catalogue/fingerprints.py``). A refactor must pass this unchanged; a change that
moves draws on purpose records them again (``python -m tests.catalogue.fingerprints --write``)
and says why in its commit."""

import json

import torch

from tests.catalogue.fingerprints import (
    RECORDED,
    compare,
    digest,
    discrete_fingerprints,
    fingerprints,
)


def test_draws_match_the_recorded_fingerprints():
    moved = compare(fingerprints(), json.loads(RECORDED.read_text()))
    assert not moved, (
        "draws changed (python -m tests.catalogue.fingerprints lists them; if on purpose, "
        "record them with --write and say why in the commit):\n" + "\n".join(moved)
    )


def test_a_fingerprint_sees_one_changed_value_and_ignores_the_last_bits():
    samples = torch.arange(12).reshape(3, 4)
    log_prob = torch.tensor([-1.5, -2.25, -0.125], dtype=torch.float64)
    base = digest(samples, log_prob, 5)
    moved = samples.clone()
    moved[2, 3] = 0
    assert digest(moved, log_prob, 5) != base
    assert digest(samples, log_prob, 6) != base
    assert digest(samples, log_prob * (1 + 1e-15), 5) == base  # rounding noise
    assert digest(samples, log_prob * (1 + 1e-6), 5) != base


def test_draws_do_not_depend_on_the_thread_count():
    """Same seed and schedule, same draws, with one torch thread or two (a network's float32
    rows differ in their last bits between the two; the draws do not)."""
    recorded = json.loads(RECORDED.read_text())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        moved = compare(discrete_fingerprints(), recorded)
    finally:
        torch.set_num_threads(before)
    assert not [line for line in moved if not line.startswith("gone: ")], moved
