"""Guide files: saved as plain data, loaded without running code from the file.

``torch.load(weights_only=False)`` unpickles arbitrary objects, so loading a guide file
someone sent could run any code it carries. Guides are saved as dicts, lists, tensors, str,
int, float, bool and None only, and loaded with ``weights_only=True``, which refuses
anything else before it is built.
"""

from __future__ import annotations

import numbers
import pickle
from typing import Any

import torch

__all__ = ["load_plain", "plain"]


def plain(value: Any) -> Any:
    """``value`` with NumPy scalars as Python numbers and tuples as lists (recursively).

    Examples
    --------
    >>> import numpy as np
    >>> plain({"a": (np.int64(2), np.float32(0.5)), "b": None})
    {'a': [2, 0.5], 'b': None}
    """
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, str, torch.Tensor)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and callable(value.item):  # a NumPy scalar
        return plain(value.item())
    raise TypeError(f"cannot save {type(value).__name__} in a guide file (plain data only)")


def load_plain(
    path: Any, map_location: Any, what: str, config_keys: tuple[str, ...], required=()
) -> dict:
    """``torch.load(path, weights_only=True)``, with a clear error when the file is refused.

    Parameters
    ----------
    path : str or file
    map_location : optional
        Passed to ``torch.load``.
    what : str
        The guide class, for messages.
    config_keys : tuple of str
        The keys a saved ``config`` may hold (what ``save`` writes).
    required : tuple of str
        The keys it must hold (files of earlier versions may lack the others).

    Raises
    ------
    pickle.UnpicklingError
        The file holds objects other than tensors and plain data: it was not written by
        ``what``'s ``save`` (or was changed since), and loading it could run code.
    ValueError
        The file is damaged (truncated, bytes changed) or holds other data than a guide.
    """
    not_a_guide = f"{what}.load: {path!r} is not a file written by {what}.save"
    try:
        saved = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise pickle.UnpicklingError(
            f"{what}.load refused {path!r}: the file holds objects other than tensors and "
            f"plain data (dict, list, str, int, float, bool, None), which only a file that was "
            f"not written by {what}.save can hold, and unpickling them could run code from the "
            f"file. It was loaded with torch.load(weights_only=True), which builds nothing "
            f"else. If you trust the file, re-save its weights as a plain dict. (torch: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__})"
        ) from None
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except (EOFError, OSError, RuntimeError, ValueError, UnicodeDecodeError) as error:
        # a truncated or changed file: torch's zip and pickle readers fail in many ways
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"{not_a_guide}, or it is damaged (truncated or changed since): torch.load failed "
            f"with {type(error).__name__}: {first}"
        ) from None
    if not isinstance(saved, dict) or not {"state_dict", "config"} <= set(saved):
        raise ValueError(f"{not_a_guide} (expected a dict with 'config' and 'state_dict')")
    config, state = saved["config"], saved["state_dict"]
    if (
        not isinstance(config, dict)
        or not set(required) <= set(config)
        or not set(config) <= set(config_keys)
    ):
        keys = sorted(map(str, config)) if isinstance(config, dict) else type(config).__name__
        raise ValueError(
            f"{not_a_guide}: its config holds {keys}; a guide's holds {sorted(required)} and "
            f"some of {sorted(set(config_keys) - set(required))}"
        )
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{not_a_guide}: its state_dict is not a dict of tensors")
    return saved
