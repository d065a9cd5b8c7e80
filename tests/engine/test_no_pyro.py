"""The engine and the structured oracles import and sample without Pyro (in a subprocess)."""

import subprocess
import sys
import textwrap


def test_engine_runs_without_pyro():
    code = textwrap.dedent(
        """
        import sys

        class BlockPyro:
            def find_spec(self, name, path=None, target=None):
                if name == "pyro" or name.startswith("pyro."):
                    raise ImportError("pyro is blocked in this test")
                return None

        sys.meta_path.insert(0, BlockPyro())
        import torch
        import pyro_autospec.engine as engine
        from pyro_autospec.oracles.markov import MarkovChainOracle
        from pyro_autospec.oracles.tabular import TabularOracle
        stay = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
        chain = MarkovChainOracle(torch.tensor([0.5, 0.5]), stay, 32)
        result = engine.sample_any_order(chain, 4, seed=0)
        assert result.samples.shape == (4, 32)
        import pyro_autospec  # the top-level package must not pull Pyro in either
        loaded = [m for m in sys.modules if m == "pyro" or m.startswith("pyro.")]
        assert not loaded, "pyro was imported"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
