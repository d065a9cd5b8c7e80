"""The test suite, laid out like the package: ``tests/<part>/`` tests ``pyro_autospec/<part>/``.

* ``engine/`` (``reference/`` for the reference engine), ``oracles/``, ``distributions/``,
  ``model/``, ``diagnostics/``, ``guides/``, ``infer/``, ``parallel/``: one folder per
  subpackage. ``oracles/test_conformance.py`` checks the oracle protocol on every oracle.
* ``test_*.py`` at the top: the package as a whole (architecture, public API, command line,
  documentation, snippets, tutorials, wheel, browser).
* ``catalogue/``: what test modules of more than one folder share (targets, oracle factories
  and the conformance catalogues, brute-force references, user oracles, shared models,
  distributed helpers). No test module imports another (``test_test_layout.py``); underscore
  modules beside the tests (``infer/_mixed_models.py``, ...) serve their own folder only.
* ``stats.py``: the chi-square checks of the exactness tests; ``conftest.py``: seeds, one
  torch thread, the shared documentation build.
"""
