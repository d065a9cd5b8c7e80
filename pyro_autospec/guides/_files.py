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


def load_plain(path: Any, map_location: Any, what: str) -> dict:
    """``torch.load(path, weights_only=True)``, with a clear error when the file is refused.

    Raises
    ------
    pickle.UnpicklingError
        The file holds objects other than tensors and plain data: it was not written by
        ``what``'s ``save`` (or was changed since), and loading it could run code.
    """
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
    if not isinstance(saved, dict) or "state_dict" not in saved or "config" not in saved:
        raise ValueError(
            f"{what}.load: {path!r} is not a file written by {what}.save (expected a dict with "
            f"'config' and 'state_dict')"
        )
    return saved
