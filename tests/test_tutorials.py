"""Every tutorial notebook runs top to bottom in smoke mode (CI=true); committed notebooks carry
their full outputs, executed at the current API; the tool that executes them works."""

import importlib.util
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.ipynb"))


def load_tool():
    """``tools/execute_tutorials.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "execute_tutorials", ROOT / "tools" / "execute_tutorials.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_tutorial_runs(path, monkeypatch):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert 'SMOKE_TEST = "CI" in os.environ' in first.source, (
        "the first code cell must set SMOKE_TEST"
    )
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors
    assert os.environ["CI"] == "true"


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.name for p in TUTORIALS])
def test_committed_notebook_is_executed_and_current(path):
    problems = load_tool().check(path)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_execute_tutorials_tool(tmp_path, monkeypatch):
    """The tool runs in full mode with figures and stamps the API; the checks catch each fault."""
    tool = load_tool()
    monkeypatch.setenv("CI", "true")  # the tool must switch SMOKE_TEST off even under CI
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# A tiny tutorial"),
        nbformat.v4.new_code_cell('import os\n\nSMOKE_TEST = "CI" in os.environ\nSMOKE_TEST'),
        nbformat.v4.new_code_cell(""),
        nbformat.v4.new_code_cell(
            "import matplotlib.pyplot as plt\n\nplt.plot([0, 1], [1, 0])\nplt.show()"
        ),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / "tiny.ipynb"
    nbformat.write(notebook, path)
    assert any("no outputs" in p for p in tool.check(path))
    assert any("fingerprint" in p for p in tool.check(path))

    tool.execute(path, timeout=120)
    assert os.environ["CI"] == "true"  # restored after the run
    assert tool.check(path) == []
    executed = nbformat.read(path, as_version=4)
    smoke = executed.cells[1].outputs[0]["data"]["text/plain"]
    assert smoke == "False", "the notebook ran in smoke mode"
    assert "image/png" in executed.cells[3].outputs[0]["data"]
    assert executed.metadata["pyro_autospec"]["api_fingerprint"] == tool.public_api.fingerprint()

    def problems_after(change):
        copy = nbformat.read(path, as_version=4)
        change(copy)
        broken = tmp_path / "broken.ipynb"
        nbformat.write(copy, broken)
        return " | ".join(tool.check(broken))

    def stale(nb):
        nb.metadata["pyro_autospec"]["api_fingerprint"] = "0" * 16

    def reordered(nb):
        nb.cells[1].execution_count, nb.cells[3].execution_count = 2, 1

    def failed(nb):
        nb.cells[3].outputs.append(
            nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[])
        )

    def figure_lost(nb):
        nb.cells[3].outputs = []

    def smoke_mode(nb):
        nb.metadata["pyro_autospec"]["smoke_test"] = True

    assert "stale" in problems_after(stale)
    assert "not executed in order" in problems_after(reordered)
    assert "ValueError: boom" in problems_after(failed)
    assert "no image" in problems_after(figure_lost)
    assert "smoke mode" in problems_after(smoke_mode)
