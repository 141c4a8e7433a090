"""The backbone export (mlperf/layers/resnet_export.py) is the import run backwards: a
torchvision file imported and exported again is that file, and the exported weights in a
torchvision-named torch ResNet give the features torchvision itself computed (the
fixtures of test_backbone_import.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from detector_helpers import torch_resnet

from mlperf.checkpoint.torch_file import load_state_dict
from mlperf.layers.resnet import resnet34, resnet50
from mlperf.layers.resnet_export import resnet_to_torchvision
from mlperf.layers.resnet_import import load_torchvision_resnet

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "torchvision")
FILES = {34: "resnet34_w4.pth", 50: "resnet50_w4.pth"}  # torchvision ResNets of width 4
CONFIGS = {34: resnet34(width=4), 50: resnet50(width=4)}
SSD = resnet34(width=4, num_stages=3, stage_strides=(1, 2, 1))  # SSD's: C4, layer3 stride 1


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(os.path.join(FIXTURES, "features.npz")) as f:
        return dict(f)


@pytest.mark.parametrize("depth", [34, 50])
def test_an_imported_torchvision_file_exports_back_to_itself(depth):
    path = os.path.join(FIXTURES, FILES[depth])
    original = load_state_dict(path)
    exported = resnet_to_torchvision(load_torchvision_resnet(path, CONFIGS[depth]), CONFIGS[depth])
    assert set(exported) == {k for k in original if not k.startswith("fc.")}
    for name, value in exported.items():
        assert value.dtype == original[name].dtype, name
        if not name.endswith("num_batches_tracked"):  # a training counter, written as 0
            np.testing.assert_array_equal(value, original[name], err_msg=name)


@pytest.mark.parametrize("depth", [34, 50, "ssd"])
def test_exported_weights_give_torchvisions_features_in_torch(depth, expected, tmp_path):
    torch = pytest.importorskip("torch")
    from mlperf.torch_save import save_state_dict

    cfg = SSD if depth == "ssd" else CONFIGS[depth]
    source = os.path.join(FIXTURES, FILES[34 if depth == "ssd" else depth])
    path = save_state_dict(
        resnet_to_torchvision(load_torchvision_resnet(source, cfg), cfg), str(tmp_path / "b.pth")
    )
    again = load_torchvision_resnet(path, cfg)  # our importer reads our export (3 stages too)
    assert set(again) == {"stem", "stages"} and len(again["stages"]) == cfg.num_stages
    net = torch_resnet(cfg)
    missing, unexpected = net.load_state_dict(torch.load(path), strict=False)
    assert not missing and not unexpected
    with torch.no_grad():
        features = net(torch.from_numpy(expected["input"].transpose(0, 3, 1, 2)))
    names = ["resnet34_ssd_C4"] if depth == "ssd" else [f"resnet{depth}_C{i}" for i in (2, 3, 4, 5)]
    outputs = features[-1:] if depth == "ssd" else features
    for name, out in zip(names, outputs, strict=True):
        theirs = expected[name]
        scale = float(np.max(np.abs(theirs)))
        ours = out.numpy().transpose(0, 2, 3, 1)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale, err_msg=name)
