"""Guide files are loaded with ``torch.load(weights_only=True)``: a file that carries a pickled
callable is refused and its payload never runs; the library's own files load."""

from __future__ import annotations

import ast
import io
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import pyro
import pytest
import torch

from pyro_autospec import AutoSpec
from pyro_autospec.guides import AnyOrderGuide, DiffusionGuide
from pyro_autospec.guides._files import checksum
from tests.catalogue.guide_models import ising_chain

PAYLOAD_RAN = []


def _payload(tag):
    """What a malicious file would run when unpickled (here: it only records that it ran)."""
    PAYLOAD_RAN.append(tag)
    return {}


class _Callable:
    def __reduce__(self):
        return (_payload, ("ran",))


def _poisoned(path, config):
    torch.save({"config": config, "state_dict": {}, "loss": [], "extra": _Callable()}, path)


def test_the_payload_would_run_under_a_plain_torch_load(tmp_path):
    """The test file is a real attack: unrestricted unpickling runs it."""
    _poisoned(tmp_path / "evil.pt", {})
    PAYLOAD_RAN.clear()
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert PAYLOAD_RAN == ["ran"]
    PAYLOAD_RAN.clear()


def test_any_order_guide_refuses_a_pickled_callable(tmp_path):
    guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
    path = tmp_path / "evil.pt"
    _poisoned(path, guide.config)
    PAYLOAD_RAN.clear()
    with pytest.raises(pickle.UnpicklingError, match=r"AnyOrderGuide.load refused .*run code"):
        AnyOrderGuide.load(path)
    assert PAYLOAD_RAN == []


def test_diffusion_guide_refuses_a_pickled_callable(tmp_path):
    path = tmp_path / "evil.pt"
    _poisoned(path, {"hidden_dim": 8})
    PAYLOAD_RAN.clear()
    with pytest.raises(pickle.UnpicklingError, match=r"DiffusionGuide.load refused"):
        DiffusionGuide.load(str(path), lambda: None)
    assert PAYLOAD_RAN == []


def test_the_library_files_load_with_weights_only(tmp_path):
    data = torch.tensor([1.0, -0.5, 0.2, 0.9])
    guide = AnyOrderGuide(ising_chain, (data,), architecture="graph", hidden_dim=8)
    guide.fit_to_samples(torch.randint(0, 2, (16, 4)), num_steps=2, disable_progbar=True)
    guide.save(tmp_path / "guide.pt")
    saved = torch.load(tmp_path / "guide.pt", weights_only=True)
    assert set(saved) == {"config", "edges", "state_dict", "loss", "sites", "shapes", "checksum"}
    assert saved["sites"] == [["z", False], ["coupling", True], ["y", True]]
    assert saved["shapes"] == {"z": [[4], []]}
    assert isinstance(saved["checksum"], str) and saved["checksum"].startswith("sha256:")
    assert all(isinstance(x, float) for x in saved["loss"])
    copy = AnyOrderGuide.load(tmp_path / "guide.pt", ising_chain, (data,))
    assert copy.config == guide.config and copy.loss_history == guide.loss_history


def test_a_file_that_is_not_a_guide_is_named(tmp_path):
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match="not a file written by AnyOrderGuide.save"):
        AnyOrderGuide.load(tmp_path / "list.pt")


def test_a_damaged_file_or_a_foreign_config_is_named(tmp_path):
    """Truncated, emptied or with another config, a file gave EOFError, 'negative seek value',
    UnicodeDecodeError or KeyError from deep inside the loader."""
    guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
    guide.save(tmp_path / "guide.pt")
    whole = (tmp_path / "guide.pt").read_bytes()
    for name, content in {"half": whole[: len(whole) // 2], "empty": b""}.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match="damaged"):
            AnyOrderGuide.load(tmp_path / name)
    for config in ({}, "x", {"num_coords": 3}, {**guide.config, "colour": "red"}):
        foreign = {"config": config, "state_dict": {}}
        torch.save({**foreign, "checksum": checksum(foreign)}, tmp_path / "foreign.pt")
        with pytest.raises(ValueError, match="its config holds"):
            AnyOrderGuide.load(tmp_path / "foreign.pt")
    with pytest.raises(FileNotFoundError):
        AnyOrderGuide.load(tmp_path / "missing.pt")


def test_no_unrestricted_torch_load_in_the_package():
    """Every torch.load in pyro_autospec passes weights_only=True."""
    root = Path(__file__).resolve().parents[2] / "pyro_autospec"
    found = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
            ):
                flag = [k for k in node.keywords if k.arg == "weights_only"]
                ok = flag and isinstance(flag[0].value, ast.Constant) and flag[0].value.value
                found.append((path.name, node.lineno, bool(ok)))
    assert found and all(ok for _, _, ok in found), found


def test_a_guide_file_loaded_for_a_model_with_other_sites_is_refused(tmp_path):
    """A saved graph guide reused its edges for any model of the same sizes: a factor added
    to the model was never seen (found outside the project). The file names the model's
    sites; a model with others is refused, naming what differs."""
    data = torch.tensor([1.0, -0.5, 0.2, 0.9])
    guide = AnyOrderGuide(ising_chain, (data,), architecture="graph", hidden_dim=8)
    guide.save(tmp_path / "guide.pt")

    def extended(data):
        ising_chain(data)
        pyro.factor("ends", torch.zeros(()))

    with pytest.raises(ValueError, match=r"other sample sites.*this model has ends"):
        AnyOrderGuide.load(tmp_path / "guide.pt", extended, (data,))
    AnyOrderGuide.load(tmp_path / "guide.pt", ising_chain, (data,))  # its own model loads


@pytest.mark.parametrize("load", ["any_order", "diffusion"])
def test_a_file_that_is_not_a_torch_file_is_named(tmp_path, load):
    """Text, CSV or JSON gave KeyError, IndexError, or an UnpicklingError about code in the
    file (found outside the project)."""
    for content in (b"hello, not a guide", b"a,b\n1,2\n", b'{"config": {}}'):
        path = tmp_path / "junk.pt"
        path.write_bytes(content)
        with pytest.raises(ValueError, match="not a file written by torch.save"):
            if load == "any_order":
                AnyOrderGuide.load(path)
            else:
                DiffusionGuide.load(path, lambda: None)
        with pytest.raises(ValueError, match="not a file written by torch.save"):
            AnyOrderGuide.load(io.BytesIO(content))


def test_a_chunk_size_below_one_is_refused():
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        AnyOrderGuide(num_coords=3, num_values=2, chunk_size=0)


def test_a_guide_file_loaded_for_sites_of_other_shapes_or_fewer_sites_is_refused(tmp_path):
    """Saved for 4 coordinates of the chain, a guide loaded for 5 failed with 'edges must
    index coordinates', and one for a model with fewer sites too; the same number of
    coordinates in another shape loaded silently (found outside the project)."""
    data = torch.tensor([1.0, -0.5, 0.2, 0.9])
    guide = AnyOrderGuide(ising_chain, (data,), architecture="graph", hidden_dim=8)
    guide.save(tmp_path / "guide.pt")
    with pytest.raises(ValueError, match=r"site 'z' of batch shape \(4,\).*has batch shape \(5,\)"):
        AnyOrderGuide.load(tmp_path / "guide.pt", ising_chain, (torch.zeros(5),))

    def without_coupling(data):
        with pyro.plate("sites", len(data)):
            z = pyro.sample("z", pyro.distributions.Bernoulli(0.5))
        with pyro.plate("obs", len(data)):
            pyro.sample("y", pyro.distributions.Normal(2.0 * z - 1.0, 1.0), obs=data)

    with pytest.raises(ValueError, match=r"other sample sites.*the saved model had"):
        AnyOrderGuide.load(tmp_path / "guide.pt", without_coupling, (data,))


def test_a_file_with_a_changed_pickle_opcode_is_named_damaged(tmp_path):
    """torch's weights-only unpickler raised a bare IndexError (pop from empty list) on a
    file whose first pickle byte was changed (found outside the project)."""
    guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
    guide.save(tmp_path / "guide.pt")
    raw = bytearray((tmp_path / "guide.pt").read_bytes())
    with zipfile.ZipFile(tmp_path / "guide.pt") as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
    name_length, extra_length = struct.unpack(
        "<HH", raw[info.header_offset + 26 : info.header_offset + 30]
    )
    raw[info.header_offset + 30 + name_length + extra_length] ^= 0x01  # PROTO 0x80 -> 0x81
    (tmp_path / "damaged.pt").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="damaged"):
        AnyOrderGuide.load(tmp_path / "damaged.pt")


def test_loading_on_a_torch_with_the_known_weights_only_hole_warns(tmp_path, monkeypatch):
    guide = AnyOrderGuide(num_coords=3, num_values=2, hidden_dim=8)
    guide.save(tmp_path / "guide.pt")
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    with pytest.warns(UserWarning, match=r"torch 2.5.1\+cpu.*CVE-2025-32434") as caught:
        AnyOrderGuide.load(tmp_path / "guide.pt")
    assert caught[0].filename == __file__
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AnyOrderGuide.load(tmp_path / "guide.pt")


def grid(y):
    rows, columns = y.shape
    with pyro.plate("c", columns, dim=-1), pyro.plate("r", rows, dim=-2):
        s = 2 * pyro.sample("z", pyro.distributions.Bernoulli(0.5)) - 1
        pyro.sample("y", pyro.distributions.Normal(s, 1.0), obs=y)
    across = (s[..., :, 1:] * s[..., :, :-1]).sum((-1, -2), keepdim=True)
    down = (s[..., 1:, :] * s[..., :-1, :]).sum((-1, -2), keepdim=True)
    pyro.factor("h", 0.8 * (across + down))


def test_a_guide_asked_for_data_of_a_transposed_shape_names_the_shapes(tmp_path):
    """The same sites and coordinates in another shape: a saved guide loaded silently with
    its old factor graph, guide.oracle blamed the model's batch dims, and AutoSpec printed
    two identical descriptions (found outside the project)."""
    wide, tall = torch.randn(2, 5), torch.randn(5, 2)
    guide = AnyOrderGuide(grid, (wide,), hidden_dim=8)
    guide.save(tmp_path / "guide.pt")
    shapes = r"batch shape \(5, 2\).*batch shape \(2, 5\)"
    with pytest.raises(ValueError, match=r"site 'z' of batch shape \(2, 5\).*has batch shape"):
        AnyOrderGuide.load(tmp_path / "guide.pt", grid, (tall,))
    with pytest.raises(ValueError, match=shapes):
        guide.oracle(tall)
    with pytest.raises(ValueError, match=r"batch shapes 'z' \(2, 5\).*batch shapes 'z' \(5, 2\)"):
        AutoSpec(grid, 10, guide=guide, correction="imh", disable_progbar=True).run(tall)
