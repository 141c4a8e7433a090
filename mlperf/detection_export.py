"""SSD and Mask R-CNN weights for PyTorch.

    backbone.pth         the ResNet as a torchvision state_dict (mlperf/layers/resnet_export.py;
                         re-imported by mlperf/layers/resnet_import.py unchanged)
    heads.safetensors    every other parameter (SSD: C4 projection, extra layers, box and
                         class convs; Mask R-CNN: FPN, RPN, box head, mask head) under our
                         parameter path, in torch's layouts:
                           <path>.kernel (conv, HWIO)      -> <path>.weight  [out, in, kh, kw]
                           <path>.kernel (deconv, 2x2/2)   -> <path>.weight  [in, out, kh, kw]
                                                              (ConvTranspose2d, stride 2)
                           <path>.kernel (dense, [in, out...]) -> <path>.weight [out, in]
                                                              (outputs flattened in C order)
                           <path>.scale / .mean / .var     -> .weight / .running_mean /
                                                              .running_var (batch norm)
                           <path>.bias                     -> <path>.bias (flattened)
    heads_mapping.json   one entry per tensor: torch name, our path, both shapes and the
                         transform, so each can be checked or mapped back

One caveat for a torch port of Mask R-CNN's box head: `box_head.fc1` reads the ROI crop
flattened as (y, x, channel), where torch's `flatten` of an NCHW crop gives
(channel, y, x).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from mlperf.layers.resnet import ResNetConfig
from mlperf.layers.resnet_export import resnet_to_torchvision
from mlperf.stablehlo_export import flat_params
from mlperf.torch_save import save_state_dict

_NORM = {"scale": "weight", "mean": "running_mean", "var": "running_var"}


@dataclasses.dataclass(frozen=True)
class TorchTensor:
    """One head tensor in torch's layout and how it was made from ours."""

    name: str
    ours: str
    value: np.ndarray
    our_shape: tuple[int, ...]
    transform: str


def torch_tensor(path: str, value: np.ndarray) -> TorchTensor:
    """Our parameter at `path` ("mask_head.deconv.kernel") in torch's name and layout."""
    value = np.asarray(value, np.float32)
    module, _, leaf = path.rpartition(".")
    prefix = f"{module}." if module else ""
    if leaf == "kernel" and value.ndim == 4 and module.endswith("deconv"):
        out, how = np.transpose(value, (2, 3, 0, 1)), "ConvTranspose2d: kernel.permute(2, 3, 0, 1)"
    elif leaf == "kernel" and value.ndim == 4:
        out, how = np.transpose(value, (3, 2, 0, 1)), "Conv2d: kernel.permute(3, 2, 0, 1)"
    elif leaf == "kernel":
        out = value.reshape(value.shape[0], -1).T
        how = "Linear: kernel.reshape(in, -1).T"
    elif leaf in _NORM:
        return TorchTensor(f"{prefix}{_NORM[leaf]}", path, value, value.shape, "as is")
    else:
        out, how = value.reshape(-1), "flattened"
    name = f"{prefix}{'weight' if leaf == 'kernel' else leaf}"
    return TorchTensor(name, path, np.ascontiguousarray(out), value.shape, how)


def head_tensors(params: dict[str, Any]) -> list[TorchTensor]:
    """Every parameter outside the backbone, in torch's layout."""
    heads = {k: v for k, v in params.items() if k != "backbone"}
    return [torch_tensor(path, v) for path, v in flat_params(heads).items()]


def export_detector(params: dict[str, Any], backbone: ResNetConfig, output_dir: str) -> list[str]:
    """Writes backbone.pth, heads.safetensors and heads_mapping.json; returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    backbone_path = save_state_dict(
        resnet_to_torchvision(params["backbone"], backbone),
        os.path.join(output_dir, "backbone.pth"),
    )
    tensors = head_tensors(params)
    heads_path = os.path.join(output_dir, "heads.safetensors")
    save_file({t.name: t.value for t in tensors}, heads_path, metadata={"format": "pt"})
    mapping_path = os.path.join(output_dir, "heads_mapping.json")
    mapping = [
        {
            "torch": t.name,
            "ours": t.ours,
            "torch_shape": list(t.value.shape),
            "our_shape": list(t.our_shape),
            "transform": t.transform,
        }
        for t in tensors
    ]
    with open(mapping_path, "w") as f:
        json.dump(mapping, f, indent=1)
    return [backbone_path, heads_path, mapping_path]
