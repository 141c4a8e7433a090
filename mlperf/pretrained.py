"""Weights a run starts from instead of the random init: what `Task.pretrained` returns.

A `Pretrained` is checked against the model's parameter shapes when it is made (before
anything is compiled, without placing a tensor on a device); `read()` then gives the
parameters as host arrays, which `mlperf/train_state.py:load_params` writes straight into
their shardings. Two kinds exist: a whole-model checkpoint (BERT from TF1 or Hugging Face,
mlperf/bert/checkpoint_import.py), whose starting point the run evaluates before the
first step, and `PretrainedModules`, some top-level modules already read into host arrays
(the detectors' ImageNet backbones), the rest of the model keeping its random init.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from input_pipeline.input_errors import InputError

PyTree = Any


class Pretrained(abc.ABC):
    """A checked starting point; `read()` gives {module: ... host arrays} to load."""

    # True: it holds every parameter, so the run evaluates it before the first step.
    whole_model: ClassVar[bool]

    @abc.abstractmethod
    def describe(self) -> str:
        """What it is and where it comes from, for the `initialised from ...` line."""

    @abc.abstractmethod
    def read(self) -> dict[str, Any]:
        """The parameters as host arrays: the whole params tree, or some of its top-level
        modules (e.g. {"backbone": ...})."""


class PretrainedModules(Pretrained):
    """Top-level modules' parameters already in host memory, e.g. an ImageNet backbone
    read from a torchvision file: {"backbone": params subtree as numpy}."""

    whole_model = False

    def __init__(self, modules: dict[str, PyTree], param_shapes: PyTree, source: str):
        problems: list[str] = []
        for name, subtree in modules.items():
            if name not in param_shapes:
                problems.append(f"{name}: not a module of the model")
            else:
                _compare(subtree, param_shapes[name], name, problems)
        if problems:
            shown = "; ".join(problems[:4])
            raise InputError(
                f"the pretrained weights do not fit the model ({len(problems)} differences): "
                f"{shown}."
            )
        self.modules, self.source = modules, source

    def describe(self) -> str:
        return self.source

    def read(self) -> dict[str, Any]:
        return self.modules


def _compare(loaded: PyTree, shapes: PyTree, path: str, problems: list[str]) -> None:
    """Collects every difference between a pretrained subtree and the model's."""
    if isinstance(loaded, dict):
        if not isinstance(shapes, dict):
            problems.append(f"{path}: the model has a single array here")
            return
        for k in sorted(set(loaded) - set(shapes), key=str):
            problems.append(f"{path}/{k}: not in the model")
        for k in sorted(set(shapes) - set(loaded), key=str):
            problems.append(f"{path}/{k}: missing from the checkpoint")
        for k in sorted(set(loaded) & set(shapes), key=str):
            _compare(loaded[k], shapes[k], f"{path}/{k}", problems)
    elif isinstance(shapes, dict):
        problems.append(f"{path}: the model has a module here, the checkpoint one array")
    elif tuple(loaded.shape) != tuple(shapes.shape):
        problems.append(f"{path}: checkpoint {tuple(loaded.shape)}, model {tuple(shapes.shape)}")
