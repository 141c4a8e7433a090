"""Writes a PyTorch state_dict file (`torch.save` of an OrderedDict of tensors) from numpy
arrays; the reading side needs no torch (mlperf/checkpoint/torch_file.py), this one does."""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping

import numpy as np


def save_state_dict(tensors: Mapping[str, np.ndarray], path: str) -> str:
    """torch.save of {name: tensor} at `path`; a ValueError naming the fix when torch is
    not installed. Returns path."""
    try:
        import torch
    except ImportError:
        raise ValueError(
            f"writing {os.path.basename(path)} (a PyTorch file) needs torch: pip install torch"
        ) from None
    state = collections.OrderedDict(
        (name, torch.from_numpy(np.array(value, copy=True))) for name, value in tensors.items()
    )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(state, path)
    return path
