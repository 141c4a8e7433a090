"""Our ResNet's params as a torchvision ResNet state_dict: the reverse of resnet_import.

    stem.conv.kernel, stem.bn.*                  -> conv1.weight, bn1.*
    stages[i-1][j].conv{k}.conv.kernel, .bn.*    -> layer{i}.{j}.conv{k}.weight, bn{k}.*
    stages[i-1][j].proj.conv.kernel, .bn.*       -> layer{i}.{j}.downsample.0/1

HWIO kernels become torch's OIHW; batch norm's scale, bias, mean and var become weight,
bias, running_mean and running_var (both divide by the same variance in eval mode), and
every batch norm gets the `num_batches_tracked` counter torchvision's modules carry (0).
There is no classifier (`fc.*`: the detectors drop it), and stages the model does not have
are absent (SSD's backbone stops at C4, `layer3`), so a torchvision net loads it with
`load_state_dict(sd, strict=False)`, reporting exactly those as missing. Strides are not
part of a state_dict: SSD's layer3 runs at stride 1 (the MLPerf SSD backbone), which a
torchvision resnet34 gets by setting `layer3[0].conv1.stride` and
`layer3[0].downsample[0].stride` to (1, 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mlperf.layers.resnet import ResNetConfig

_BN = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}


def _conv_bn(params: dict[str, Any], conv: str, bn: str, out: dict[str, np.ndarray]) -> None:
    kernel = np.asarray(params["conv"]["kernel"], np.float32)
    out[f"{conv}.weight"] = np.ascontiguousarray(np.transpose(kernel, (3, 2, 0, 1)))
    for ours, theirs in _BN.items():
        out[f"{bn}.{theirs}"] = np.asarray(params["bn"][ours], np.float32)
    out[f"{bn}.num_batches_tracked"] = np.zeros((), np.int64)


def _child(node: dict, key: int) -> Any:
    """node[key] for list-like dicts whose keys may be ints or their strings."""
    return node[key] if key in node else node[str(key)]


def resnet_to_torchvision(params: dict[str, Any], cfg: ResNetConfig) -> dict[str, np.ndarray]:
    """A torchvision state_dict (numpy arrays) of ResNet(cfg)'s params (a nested dict
    of host arrays, as our model and resnet_import hold them)."""
    out: dict[str, np.ndarray] = {}
    _conv_bn(params["stem"], "conv1", "bn1", out)
    convs = 3 if cfg.block == "bottleneck" else 2
    for i in range(cfg.num_stages):
        stage = _child(params["stages"], i)
        for j in range(cfg.stage_sizes[i]):
            block, prefix = _child(stage, j), f"layer{i + 1}.{j}"
            for k in range(1, convs + 1):
                _conv_bn(block[f"conv{k}"], f"{prefix}.conv{k}", f"{prefix}.bn{k}", out)
            if block.get("proj") is not None:
                _conv_bn(block["proj"], f"{prefix}.downsample.0", f"{prefix}.downsample.1", out)
    return out
