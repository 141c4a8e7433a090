"""A torchvision ResNet state_dict (resnet34-*.pth, resnet50-*.pth) as our ResNet's params.

torchvision names one to one onto mlperf/layers/resnet.py:

    conv1.weight, bn1.*                  -> stem.conv.kernel, stem.bn.*
    layer{i}.{j}.conv{k}.weight, bn{k}.* -> stages[i-1][j].conv{k}.conv.kernel, .bn.*
    layer{i}.{j}.downsample.0/1          -> stages[i-1][j].proj.conv.kernel, .bn.*

Convolution kernels go from torch's OIHW to our HWIO; batch norm's weight, bias,
running_mean and running_var become scale, bias, mean and var (torch's running_var is
the unbiased batch variance, what its eval mode divides by, and so does ours). The
classifier (fc.*), num_batches_tracked and stages past the model's last (SSD stops at
C4) are not used; any other name is an error, as is a file of another depth or width. A
file holding only the stages the model builds (mlperf/layers/resnet_export.py's export of
SSD's backbone) imports too.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from input_pipeline import storage
from mlperf.checkpoint.torch_file import TorchFileError, load_state_dict
from mlperf.layers.resnet import ResNetConfig

_BN = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}
_DEPTHS = {
    ("basic", (2, 2, 2, 2)): 18,
    ("basic", (3, 4, 6, 3)): 34,
    ("bottleneck", (3, 4, 6, 3)): 50,
    ("bottleneck", (3, 4, 23, 3)): 101,
    ("bottleneck", (3, 8, 36, 3)): 152,
}
_BLOCK_KEY = re.compile(r"^layer(\d+)\.(\d+)\.")


def describe(block: str, stage_sizes: tuple[int, ...]) -> str:
    """'ResNet-50 (bottleneck blocks 3-4-6-3)', or without the name for other shapes."""
    sizes = "-".join(str(n) for n in stage_sizes)
    depth = _DEPTHS.get((block, tuple(stage_sizes)))
    name = f"ResNet-{depth}" if depth else "a ResNet"
    return f"{name} ({block} blocks {sizes})"


def file_architecture(state: dict[str, np.ndarray]) -> tuple[str, tuple[int, ...], int]:
    """(block kind, blocks per stage, stem width) of a torchvision ResNet state_dict."""
    if "conv1.weight" not in state:
        raise TorchFileError("no conv1.weight: not a torchvision ResNet state_dict.")
    counts: dict[int, int] = {}
    for name in state:
        m = _BLOCK_KEY.match(name)
        if m:
            stage, block = int(m.group(1)), int(m.group(2))
            counts[stage] = max(counts.get(stage, 0), block + 1)
    if not counts or sorted(counts) != list(range(1, len(counts) + 1)):
        raise TorchFileError(
            f"stages layer1..layerN expected, found {sorted(counts)}: not a torchvision ResNet."
        )
    kind = "bottleneck" if "layer1.0.conv3.weight" in state else "basic"
    return kind, tuple(counts[i] for i in sorted(counts)), int(state["conv1.weight"].shape[0])


def _kernel(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(w, (2, 3, 1, 0)))  # OIHW -> HWIO


def _conv_bn(state, conv: str, bn: str, used: set[str]) -> dict[str, Any]:
    names = [f"{conv}.weight"] + [f"{bn}.{k}" for k in _BN]
    missing = [n for n in names if n not in state]
    if missing:
        raise TorchFileError(f"missing {missing[:4]}: an incomplete ResNet state_dict.")
    used.update(names)
    return {
        "conv": {"kernel": _kernel(state[f"{conv}.weight"])},
        "bn": {ours: np.asarray(state[f"{bn}.{theirs}"]) for theirs, ours in _BN.items()},
    }


def torchvision_to_resnet(state: dict[str, np.ndarray], cfg: ResNetConfig) -> dict[str, Any]:
    """The params (nested dict, our names and layouts) of ResNet(cfg) from a torchvision
    state_dict; raises TorchFileError naming the mismatch if the file is another net."""
    kind, sizes, width = file_architecture(state)
    want_sizes = tuple(cfg.stage_sizes)
    # A file of fewer stages (a detector's own export: SSD's stops at C4) serves a model
    # that builds no more than it has.
    enough = len(sizes) >= min(cfg.num_stages, len(want_sizes))
    if kind != cfg.block or sizes != want_sizes[: len(sizes)] or not enough:
        raise TorchFileError(
            f"the file holds {describe(kind, sizes)}, but the model's backbone is "
            f"{describe(cfg.block, want_sizes)}; point the backbone checkpoint at a file of "
            "that depth."
        )
    if width != cfg.width:
        raise TorchFileError(
            f"the file's ResNet has a {width}-channel stem, the model's backbone {cfg.width} "
            "(model width); use a file of the model's width."
        )
    used: set[str] = set()
    params: dict[str, Any] = {"stem": _conv_bn(state, "conv1", "bn1", used), "stages": {}}
    for i in range(cfg.num_stages):
        stage = {}
        for j in range(cfg.stage_sizes[i]):
            p = f"layer{i + 1}.{j}"
            convs = 3 if cfg.block == "bottleneck" else 2
            block = {
                f"conv{k}": _conv_bn(state, f"{p}.conv{k}", f"{p}.bn{k}", used)
                for k in range(1, convs + 1)
            }
            if f"{p}.downsample.0.weight" in state:
                block["proj"] = _conv_bn(state, f"{p}.downsample.0", f"{p}.downsample.1", used)
            stage[j] = block
        params["stages"][i] = stage
    unused_stages = tuple(f"layer{i}." for i in range(cfg.num_stages + 1, len(sizes) + 1))
    unknown = [
        n
        for n in state
        if n not in used
        and not n.startswith(("fc.", *unused_stages))
        and not n.endswith(".num_batches_tracked")
    ]
    if unknown:
        raise TorchFileError(
            f"{len(unknown)} entries are not part of a torchvision ResNet, e.g. {unknown[:4]}."
        )
    return params


def load_torchvision_resnet(path: str, cfg: ResNetConfig) -> dict[str, Any]:
    """Reads a torchvision ResNet .pth (no torch needed) as ResNet(cfg) params; errors
    name the file."""
    try:
        # A file in a bucket is read from a cached local copy (storage.local_copy).
        return torchvision_to_resnet(load_state_dict(storage.local_copy(path)), cfg)
    except TorchFileError as e:
        msg = str(e)
        raise TorchFileError(msg if path in msg else f"{path}: {msg}") from None


def check_backbone_checkpoint(config) -> None:
    """A set `init.backbone_checkpoint` must be an existing file: said in one line when
    the task is made, before any data or model is built."""
    path = config.get("init", {}).get("backbone_checkpoint", "")
    if path and not storage.isfile(path):
        raise FileNotFoundError(
            f"init.backbone_checkpoint={path!r} is not a file; point it at a torchvision "
            "ImageNet state_dict (resnet34-*.pth for SSD, resnet50-*.pth for Mask R-CNN)."
        )
