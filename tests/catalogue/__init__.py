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
``oracle_reference``
    Slow, obviously correct references of the oracle tests: enumeration of ``[q]^n``
    (``enumerate_joint``, ``tabular_reference``), row-by-row conditionals and chains, random
    queries, exact samples, and ``Wrapper``, the base of test wrappers of an oracle.
``user_oracles``
    Oracles as users write them, against the protocol only (``RandomNADE``, ``ProductMixture``,
    ``HandChain``, ``NoAdjacentZeros``); also read by ``benchmarks/user_oracles.py``.
``conformance``
    ``CONFORMANCE``: one line per marginal oracle the library ships (and per user oracle of
    ``user_oracles``), each built small, for the conformance suite
    ``tests/oracles/test_conformance.py``; ``MEAN_CONFORMANCE``: one line per mean oracle
    (denoiser), for ``tests/oracles/test_mean_conformance.py``. A new oracle is tested by adding
    one line there (both suites fail while an oracle ``pyro_autospec.oracles`` exports has none).
``brute_force``
    Enumeration of a joint written by hand and the chi-square test of draws against it
    (``enumerate_joint``, ``flatten_draws``, ``assert_draws_follow``, ``marginal_means``,
    ``lp``), without pyro_autospec.
``models``
    Pyro models shared by test modules: the exactness ``CASES`` (model, arguments, number of
    draws) and the conjugate continuous model of the diffusion guide.
``guide_models``
    Small enumerable Pyro models of the guide tests and of others (``ising_chain``,
    ``ising_cycle``, ``potts_triangle``, ``mixed_sites``, ``generative_pairs``).
``fingerprints``
    Hashes of the draws of every sampler on every catalogued oracle, the diffusions and
    ``AutoSpec`` (``tests/test_draws_unchanged.py`` compares them with
    ``draw_fingerprints.json``; ``python -m tests.catalogue.fingerprints --write`` records them).
``distributed``
    Spawning gloo ranks (``run_ranks``, ``attempt``, ``WORLD``) and the small oracles and
    comparisons of the distributed tests.

Helpers used by the tests of one folder only stay beside them as underscore modules
(``tests/infer/_mixed_models.py``, ``_pyro_hmm_examples.py``, ``_pyro_suite_models.py``), and
``tests/stats.py`` holds the chi-square checks.
"""
