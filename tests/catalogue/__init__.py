"""The tests' shared catalogue: everything more than one test module needs, in one place.

No test module imports another test module (``tests/test_test_layout.py`` checks it); what
tests share lives here, one module per kind of thing:

``targets``
    Small tabular targets (``TARGETS``: name -> log-weight table) for the engine's tests.
``references``
    Slow, obviously correct log probabilities of the structured oracles' laws
    (``chain_log_prob``, ``hmm_log_prob``, ``pairwise_chain_log_prob``, ``potts_log_prob``,
    ``dpp_log_prob``, ``spanning_tree_log_prob``, ``curie_weiss_log_prob``) and of a Pyro
    model's posterior (``posterior_log_prob``), functions of a tuple of values.
``oracles``
    Factories of random oracles and their parameters (``random_hmm``, ``random_forest``,
    ``random_kernel``), Pyro-free.
``conformance``
    ``CONFORMANCE``: one line per oracle the library ships (and per user oracle of
    ``tests/engine/_user_oracles.py``), each built small, for the conformance suite
    ``tests/oracles/test_conformance.py``. A new oracle is tested by adding one line there.
``models``
    Pyro models shared by test modules: the exactness ``CASES`` (model, arguments, number of
    draws) and the conjugate continuous model of the diffusion guide.
``fingerprints``
    Hashes of the draws of every sampler on every catalogued oracle, the diffusions and
    ``AutoSpec`` (``tests/test_draws_unchanged.py`` compares them with
    ``draw_fingerprints.json``; ``python -m tests.catalogue.fingerprints --write`` records them).
``distributed``
    Spawning gloo ranks (``run_ranks``, ``attempt``, ``WORLD``) and the small oracles and
    comparisons of the distributed tests.

Helpers used by the tests of one folder only stay beside them as underscore modules
(``tests/oracles/_oracle_reference.py``: enumeration and row-by-row references;
``tests/engine/_user_oracles.py``; ``tests/infer/_brute_force.py``, ``_mixed_models.py``, ...;
``tests/guides/_models.py``), and ``tests/stats.py`` holds the chi-square checks.
"""
