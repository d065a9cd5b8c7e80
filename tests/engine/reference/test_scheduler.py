"""The scheduler: batches of threads, index-ordered acceptance, cancellation, round counting."""

import math

import pytest

from pyro_autospec.engine.reference.scheduler import Call, FirstAccepted, Scheduler


def run_race(rho, accept, delays):
    """One race whose thread i takes delays(i) rounds and accepts iff accept(i)."""
    launched, finished_order = [], []

    def thread(index):
        launched.append(index)
        for _ in range(delays(index)):
            yield Call(payload=index, rows=1, sample=0)
        finished_order.append(index)
        return accept(index), index

    def root():
        return (yield FirstAccepted(thread, rho))

    scheduler = Scheduler(dispatch=lambda payloads: [None] * len(payloads))
    (winner,) = scheduler.run([root()])
    return winner, launched, scheduler.stats


@pytest.mark.parametrize("rho", [1e-9, 0.3, 1.0, 3.0])
def test_batches_follow_the_geometric_schedule(rho):
    winner, launched, _ = run_race(rho, accept=lambda i: i == 10, delays=lambda i: 1)
    assert winner == 10
    # threads are launched in batches [ceil((1+rho)^r), ceil((1+rho)^(r+1)))
    if rho < 1e-6:  # ceil((1+rho)^r) creeps up by one: one thread per batch
        assert launched == list(range(1, 11))
        return
    bounds = sorted({math.ceil((1 + rho) ** r) for r in range(200)} | {1})
    last = next(b for b in bounds if b > 10)
    assert launched == list(range(1, last))


def test_smallest_accepted_index_wins_not_the_first_to_finish():
    # thread 3 accepts at once; thread 2 accepts too but takes 5 rounds: 2 must win
    winner, _, stats = run_race(
        rho=3.0, accept=lambda i: i in (2, 3), delays=lambda i: 5 if i == 2 else 1
    )
    assert winner == 2
    assert stats.rounds == 5


def test_cancelled_threads_stop_querying():
    # thread 1 accepts after 2 rounds; threads 2..3 would run 100 rounds
    winner, launched, stats = run_race(
        rho=3.0, accept=lambda i: True, delays=lambda i: 2 if i == 1 else 100
    )
    assert winner == 1 and launched == [1, 2, 3]
    assert stats.rounds == 2 and stats.oracle_rows == 6


def test_row_cap_queues_calls():
    def sampler(k):
        yield Call(payload=k, rows=3, sample=k)
        return k

    scheduler = Scheduler(lambda p: [None] * len(p), max_rows_per_round=5)
    assert scheduler.run([sampler(k) for k in range(4)]) == [0, 1, 2, 3]
    assert scheduler.stats.rounds == 4 and scheduler.stats.oracle_rows == 12
    assert scheduler.stats.sample_rounds == [1, 1, 1, 1]
