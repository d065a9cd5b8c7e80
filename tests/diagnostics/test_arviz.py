"""The ArviZ version shim."""

import arviz as az
import numpy as np
import torch

from pyro_autospec.diagnostics import arviz_major_version, to_inference_data


def test_version_is_read():
    assert arviz_major_version() == int(az.__version__.split(".")[0])


def test_groups_shapes_and_tensors():
    idata = to_inference_data(
        {"z": torch.zeros(2, 5, 3, dtype=torch.long)},
        sample_stats={"lp": np.zeros((2, 5)), "diverging": np.zeros((2, 5), dtype=bool)},
        log_likelihood={"y": np.zeros((2, 5, 3))},
        observed_data={"y": torch.ones(3)},
        dims={"z": ["obs"], "y": ["obs"]},
        coords={"obs": ["a", "b", "c"]},
    )
    assert idata.posterior["z"].dims == ("chain", "draw", "obs")
    assert list(idata.posterior["obs"].values) == ["a", "b", "c"]
    assert idata.log_likelihood["y"].shape == (2, 5, 3)
    assert idata.observed_data["y"].shape == (3,)
    assert idata.sample_stats["lp"].shape == (2, 5)


def test_empty_groups_are_left_out():
    idata = to_inference_data({"z": np.zeros((1, 4))}, log_likelihood={})
    groups = idata.groups() if hasattr(idata, "groups") else list(idata.children)
    assert "posterior" in groups and "log_likelihood" not in groups
