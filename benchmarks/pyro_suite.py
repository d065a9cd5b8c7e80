"""Pyro's own test-suite and example models through AutoSpec: ran exactly, refused, or crashed.

The catalogue (``tests/infer/_pyro_suite_models.py``) holds models copied from Pyro's
``tests/infer/test_enum.py``, ``test_discrete.py``, ``test_valid_models.py`` and
``examples/hmm.py``. For every model and sampler (``auto``: forward filtering, backward
sampling where it fits; ``engine``: the enumeration oracle and autospeculation), this script
runs ``AutoSpec(model).run(...)`` and reports one of

* ``exact``: ran, and the draws pass a chi-square test (p > 2e-5, bins of >= 30 expected
  draws) against brute force over every assignment, or against Pyro's
  ``TraceEnum_ELBO.compute_marginals`` on a few sites for the larger models;
* ``inexact``: ran, and a test failed;
* ``ran``: ran, no reference law (``--no-check``, or Pyro's own enumeration fails on it);
* ``refused``: an ``AutoSpecModelError`` whose message names a site or plate of the model;
* ``unclear``: a refusal that names nothing of the model or asks to be reported;
* ``model-error``: the model fails in a plain run of Pyro too (no enumeration), and AutoSpec
  passed the model's own error on unchanged;
* ``crashed``: any other exception (a raw torch, einsum or assertion error).

Continuous latent sites are fixed to one prior draw (the case is then discrete-only).

Usage: ``python benchmarks/pyro_suite.py`` (all models, both samplers, 2000 draws each),
``--smoke`` (a dozen models, 400 draws, seconds), ``--only NAME...``, ``--samplers auto``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from tests.infer._pyro_suite_models import CASES, run_case  # noqa: E402

SMOKE = (
    "plate_smoke",
    "distribution_masked",
    "gmm_batch_model",
    "elbo_enumerate_plate_7[scale=10]",
    "elbo_enumerate_plates_6[plate_plate]",
    "compute_marginals_single[OneHotCategorical]",
    "enum_in_model_diamond[vindex=True]",
    "enum_discrete_non_enumerated_plate",
    "enum_discrete_iplate_single",
    "markov_history[1]",
    "hmm.model_1",
    "hmm.model_6",
)
ORDER = ("exact", "ran", "refused", "model-error", "unclear", "inexact", "crashed")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a dozen models, 400 draws")
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--samplers", nargs="*", default=["auto", "engine"])
    parser.add_argument("--num-samples", type=int, default=None)
    parser.add_argument("--no-check", action="store_true", help="run, test nothing")
    parser.add_argument("--width", type=int, default=110, help="detail column width")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cases = CASES
    if args.smoke:
        cases = [c for c in CASES if c.name in SMOKE]
    if args.only:
        cases = [c for c in CASES if c.name in args.only]
    num_samples = args.num_samples or (400 if args.smoke else 2000)

    print(f"{len(cases)} models, samplers {', '.join(args.samplers)}, {num_samples} draws each")
    print(f"| model | Pyro source | {' | '.join(args.samplers)} | detail |")
    print("|---|---|" + "---|" * len(args.samplers) + "---|")
    counts = Counter()
    worst_counts = Counter()
    start = time.perf_counter()
    for case in cases:
        outcomes = [
            run_case(case, sampler=s, num_samples=num_samples, check=not args.no_check)
            for s in args.samplers
        ]
        for s, o in zip(args.samplers, outcomes):
            counts[s, o.status] += 1
        worst = max(outcomes, key=lambda o: ORDER.index(o.status))
        worst_counts[worst.status] += 1
        details = [o.detail for o in outcomes if o.detail]
        detail = details[0] if len(set(details)) == 1 else " / ".join(details)
        detail = detail.replace("|", "/")[: args.width]
        source = case.source.split("::")[-1]
        cells = " | ".join(o.status for o in outcomes)
        print(f"| {case.name} | {source} | {cells} | {detail} |", flush=True)
    print()
    for s in args.samplers:
        parts = ", ".join(f"{counts[s, k]} {k}" for k in ORDER if counts[s, k])
        print(f"sampler {s}: {parts}")
    parts = ", ".join(f"{worst_counts[k]} {k}" for k in ORDER if worst_counts[k])
    print(f"per model (worst of the samplers): {parts}; {time.perf_counter() - start:.0f} s")
    bad = worst_counts["crashed"] + worst_counts["inexact"] + worst_counts["unclear"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
