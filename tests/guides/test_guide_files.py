"""A loaded guide is the saved one or an error: a checksum over the file's contents, the model a
guide reads its data through, the saved dtypes and every config key a file must hold."""

from __future__ import annotations

import pytest
import torch

from pyro_autospec.guides import AnyOrderGuide, DiffusionGuide
from pyro_autospec.guides._files import checksum
from pyro_autospec.model import discover_sites
from tests.catalogue.guide_models import ising_chain, mixed_sites
from tests.catalogue.models import conjugate_model

DATA = torch.tensor([1.0, -0.5, 0.2, 0.9])
Y = torch.tensor([[0.3, -1.0, 0.4], [0.8, -0.6, 0.1], [0.1, -1.2, 0.7]])
GUIDES = ["graph", "mlp", "bare", "diffusion"]


def _guide(kind):
    """A guide of each kind ("bare": no model; "diffusion"; else an AnyOrderGuide
    architecture), trained a little (its weights are its own), and its loader."""
    torch.manual_seed(0)
    if kind == "diffusion":
        guide = DiffusionGuide(conjugate_model, (Y,), hidden_dim=8, num_steps=16)
        guide.fit_simulation(64, num_iterations=3, batch_size=16, seed=0, disable_progbar=True)
        return guide, lambda path: DiffusionGuide.load(path, conjugate_model, (Y,))
    if kind == "bare":
        guide = AnyOrderGuide(num_coords=4, num_values=2, hidden_dim=8)
        guide.fit_to_samples(torch.randint(0, 2, (32, 4)), num_steps=3, disable_progbar=True)
        return guide, AnyOrderGuide.load
    guide = AnyOrderGuide(ising_chain, (DATA,), architecture=kind, hidden_dim=8)
    guide.fit_to_samples(torch.randint(0, 2, (32, 4)), num_steps=3, disable_progbar=True)
    return guide, lambda path: AnyOrderGuide.load(path, ising_chain, (DATA,))


def _assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        assert torch.equal(sa[name], sb[name]), name


def _flip_a_weight_byte(path, weight):
    """Change one byte inside ``weight``'s data in the file (torch's reader checks no CRC)."""
    raw = bytearray(path.read_bytes())
    data = weight.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    at = bytes(raw).find(data)
    assert at >= 0 and bytes(raw).find(data, at + 1) < 0
    raw[at + len(data) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def _largest_weight(guide):
    return max(guide.state_dict().values(), key=lambda v: (v.is_floating_point(), v.numel()))


@pytest.mark.parametrize("kind", GUIDES)
def test_a_byte_changed_inside_the_weights_is_refused(kind, tmp_path):
    """Before the checksum, the file loaded as a different network, silently."""
    guide, load = _guide(kind)
    path = tmp_path / "guide.pt"
    guide.save(path)
    _assert_same_state(load(path), guide)  # intact: the same parameters, bit for bit
    _flip_a_weight_byte(path, _largest_weight(guide))
    with pytest.raises(ValueError, match=r"not a file written by .*damaged.*checksum"):
        load(path)


@pytest.mark.parametrize("kind", GUIDES)
def test_a_file_without_a_checksum_is_refused_and_can_be_saved_again(kind, tmp_path):
    """Such a file loaded unchecked: deleting the entry turned the check off. The way out the
    message gives (the weights into a guide built alike, then save) gives the same guide."""
    guide, load = _guide(kind)
    path = tmp_path / "guide.pt"
    guide.save(path)
    saved = torch.load(path, weights_only=True)
    assert saved.pop("checksum") == checksum(saved)
    torch.save(saved, path)  # the same entries, no checksum
    with pytest.raises(ValueError, match="damaged: it holds no 'checksum' entry.*guide.save"):
        load(path)
    twin, _ = _guide(kind)  # built with the same arguments (trained from another start)
    twin.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    twin.loss_history = list(guide.loss_history)
    twin.save(path)
    copy = load(path)
    _assert_same_state(copy, guide)
    assert copy.loss_history == guide.loss_history


def test_the_checksum_covers_the_config_edges_and_loss(tmp_path):
    """A config value that changes no shape (num_heads), fewer edges: other networks that
    loaded silently; the checksum entry itself must match too."""
    path = tmp_path / "guide.pt"
    changed = []
    for kind in ("transformer", "graph"):
        guide, load = _guide(kind)
        guide.save(path)
        saved = torch.load(path, weights_only=True)
        if kind == "transformer":
            changed.append(({**saved, "config": {**saved["config"], "num_heads": 2}}, load))
        else:
            changed.append(({**saved, "edges": saved["edges"][:-1]}, load))
            changed.append(({**saved, "loss": saved["loss"][:-1]}, load))
            changed.append(({**saved, "checksum": "sha256:" + "0" * 64}, load))
            changed.append(({**saved, "checksum": 7}, load))
    for content, load in changed:
        torch.save(content, path)
        with pytest.raises(ValueError, match="checksum"):
            load(path)


@pytest.mark.parametrize("architecture", ["mlp", "transformer", "graph"])
def test_a_guide_saved_with_a_model_needs_it_to_load(architecture, tmp_path):
    """An "mlp" guide loaded without its model answered with zero potentials (for no data),
    silently; the "graph" guide raised from its constructor."""
    guide, _ = _guide(architecture)
    path = tmp_path / "guide.pt"
    guide.save(path)
    with pytest.raises(ValueError, match=r"built from a Pyro model.*Pass the model"):
        AnyOrderGuide.load(path)
    copy = AnyOrderGuide.load(path, ising_chain, (DATA,))
    values, mask = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool)
    assert torch.equal(copy.log_marginals(values, mask), guide.log_marginals(values, mask))


def test_a_guide_saved_without_a_model_loads_without_one(tmp_path):
    guide, load = _guide("bare")
    guide.save(tmp_path / "guide.pt")
    _assert_same_state(load(tmp_path / "guide.pt"), guide)
    # A SiteLayout with unequal supports puts -inf in the potentials: the layout is needed.
    layout = discover_sites(mixed_sites, (), {})
    guide = AnyOrderGuide(layout, architecture="mlp", hidden_dim=8)
    guide.save(tmp_path / "layout.pt")
    with pytest.raises(ValueError, match="SiteLayout"):
        AnyOrderGuide.load(tmp_path / "layout.pt")
    copy = AnyOrderGuide.load(tmp_path / "layout.pt", layout)
    values, mask = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.bool)
    assert torch.equal(copy.log_marginals(values, mask), guide.log_marginals(values, mask))


@pytest.mark.parametrize("kind", GUIDES)
def test_a_float64_guide_loads_in_float64(kind, tmp_path):
    """load_state_dict casts into the new guide's dtype: a float64 guide loaded as float32."""
    guide, load = _guide(kind)
    guide = guide.double()
    path = tmp_path / "guide.pt"
    guide.save(path)
    copy = load(path)
    _assert_same_state(copy, guide)
    if kind == "diffusion":
        t, x = torch.rand(5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
        assert torch.equal(copy.oracle()(t, x), guide.oracle()(t, x))
    else:
        values = torch.randint(0, 2, (8, 4))
        mask = torch.rand(8, 4) < 0.5
        out = copy.log_marginals(values, mask)
        assert out.dtype == torch.float64
        assert torch.equal(out, guide.log_marginals(values, mask))


def _saved_unchecked(guide, path) -> dict:
    """What ``guide.save(path)`` writes, without its checksum (to change by hand, then write
    with :func:`_save_checked`, as a crafted file would be)."""
    guide.save(path)
    saved = torch.load(path, weights_only=True)
    saved.pop("checksum", None)
    return saved


def _save_checked(content: dict, path) -> None:
    """``content`` written with a checksum that matches it: a crafted file, whose other
    checks must catch it."""
    torch.save({**content, "checksum": checksum(content)}, path)


def test_a_tensor_of_another_kind_is_refused(tmp_path):
    guide, load = _guide("diffusion")
    path = tmp_path / "guide.pt"
    saved = _saved_unchecked(guide, path)
    saved["state_dict"]["standardized"] = torch.tensor(0.5)  # a bool buffer, as a float
    _save_checked(saved, path)
    with pytest.raises(ValueError, match="its standardized is torch.float32"):
        load(path)


def test_a_graph_file_without_its_edges_is_named(tmp_path):
    """It raised KeyError: 'edges'."""
    guide, load = _guide("graph")
    path = tmp_path / "guide.pt"
    saved = _saved_unchecked(guide, path)
    del saved["edges"]
    _save_checked(saved, path)
    with pytest.raises(ValueError, match="not a file written by AnyOrderGuide.save.*edges"):
        load(path)


def test_a_diffusion_file_must_hold_every_config_key(tmp_path):
    """A config without num_steps loaded with the default schedule, silently."""
    guide = DiffusionGuide(conjugate_model, (Y,), hidden_dim=8, num_steps=16)
    path = tmp_path / "guide.pt"
    saved = _saved_unchecked(guide, path)
    del saved["config"]["num_steps"]
    _save_checked(saved, path)
    with pytest.raises(ValueError, match="its config holds"):
        DiffusionGuide.load(path, conjugate_model, (Y,))


def test_a_loss_history_that_is_not_numbers_is_refused(tmp_path):
    guide, load = _guide("bare")
    path = tmp_path / "guide.pt"
    saved = _saved_unchecked(guide, path)
    for loss in ("abc", [1.0, "x"], {"a": 1.0}):
        _save_checked({**saved, "loss": loss}, path)
        with pytest.raises(ValueError, match="loss history"):
            load(path)
