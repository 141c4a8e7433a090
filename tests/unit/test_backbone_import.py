"""torchvision ResNet state_dicts -> our ResNet: same features as torchvision, clear errors.

The fixtures (tests/fixtures/torchvision/, written by make_torchvision_backbones.py with
torch and torchvision, which these tests do not need) are narrow ResNet-34 / ResNet-50
state_dicts of torchvision's own ResNet class and torchvision's features on a fixed input.
"""

from __future__ import annotations

import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mlperf.checkpoint.torch_file import TorchFileError, load_state_dict
from mlperf.layers.resnet import ResNet, resnet34, resnet50
from mlperf.layers.resnet_import import load_torchvision_resnet

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "torchvision")
R34 = os.path.join(FIXTURES, "resnet34_w4.pth")  # legacy (pre-zip) torch.save format
R50 = os.path.join(FIXTURES, "resnet50_w4.pth")  # zip format
WIDTH = 4


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(os.path.join(FIXTURES, "features.npz")) as f:
        return dict(f)


def _loaded(cfg, path: str) -> ResNet:
    model = ResNet(cfg, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    nnx.replace_by_pure_dict(state, load_torchvision_resnet(path, cfg))
    nnx.update(model, state)
    return model


def _features(cfg, path: str, images: np.ndarray, train: bool = False) -> dict:
    model = _loaded(cfg, path)
    return {k: np.asarray(v) for k, v in model(jnp.asarray(images), train=train).items()}


def _assert_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    scale = float(np.max(np.abs(theirs)))
    assert scale > 0.1  # the fixture's activations are not vanishing
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("depth", [34, 50])
def test_features_match_torchvision(depth, expected):
    cfg = (resnet34 if depth == 34 else resnet50)(width=WIDTH)
    ours = _features(cfg, R34 if depth == 34 else R50, expected["input"])
    for name in ("C2", "C3", "C4", "C5"):
        _assert_close(ours[name], expected[f"resnet{depth}_{name}"])


def test_ssd_backbone_matches_torchvision_with_layer3_at_stride_1(expected):
    # The MLPerf SSD backbone: C4 of a ResNet-34 whose third stage keeps stride 1.
    cfg = resnet34(width=WIDTH, num_stages=3, stage_strides=(1, 2, 1))
    ours = _features(cfg, R34, expected["input"])
    _assert_close(ours["C4"], expected["resnet34_ssd_C4"])


def test_frozen_batch_norm_uses_the_imported_statistics_in_training(expected):
    cfg = resnet50(width=WIDTH, freeze_at=2, frozen_bn=True)
    ours = _features(cfg, R50, expected["input"], train=True)
    _assert_close(ours["C5"], expected["resnet50_C5"])


def test_both_torch_formats_read_to_the_same_kind_of_state_dict():
    legacy, zipped = load_state_dict(R34), load_state_dict(R50)
    for sd in (legacy, zipped):
        assert sd["conv1.weight"].shape == (WIDTH, 3, 7, 7)
        assert sd["conv1.weight"].dtype == np.float32
        assert sd["bn1.num_batches_tracked"].dtype == np.int64
    assert "layer4.2.conv3.weight" in zipped and "layer4.2.conv3.weight" not in legacy


def test_wrong_depth_names_the_depth_the_file_holds():
    with pytest.raises(TorchFileError) as err:
        load_torchvision_resnet(R50, resnet34(width=WIDTH))
    msg = str(err.value)
    assert "ResNet-50 (bottleneck blocks 3-4-6-3)" in msg
    assert "ResNet-34 (basic blocks 3-4-6-3)" in msg and R50 in msg
    with pytest.raises(TorchFileError, match="holds ResNet-34"):
        load_torchvision_resnet(R34, resnet50(width=WIDTH))


def test_wrong_width_is_named():
    with pytest.raises(TorchFileError, match="4-channel stem.*64"):
        load_torchvision_resnet(R34, resnet34())


def test_a_file_holding_code_is_refused_not_run(tmp_path):
    # A legacy-format header followed by a pickle of a callable (os.system).
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        for header in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
            pickle.dump(header, f)
        pickle.dump(os.system, f)
    with pytest.raises(TorchFileError, match="posix.system|nt.system"):
        load_state_dict(str(path))
    not_torch = tmp_path / "plain.pth"
    not_torch.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(TorchFileError, match="not a torch.save file"):
        load_state_dict(str(not_torch))


def test_frozen_stages_get_no_gradient(expected):
    cfg = resnet50(width=WIDTH, freeze_at=2, frozen_bn=True)
    # The imported weights: a random init's zero last-BN scales would stop the gradient.
    graphdef, params, rest = nnx.split(_loaded(cfg, R50), nnx.Param, ...)

    def loss(p):
        m = nnx.merge(graphdef, p, rest)
        return jnp.sum(m(jnp.asarray(expected["input"]), train=True)["C5"] ** 2)

    grads = jax.grad(loss)(params)
    paths = {
        tuple(str(getattr(k, "key", k)) for k in path)
        for path, _ in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads))
    }
    # Stem and C2 hold no trainable parameter; the later stages' convolution kernels
    # train (non-zero gradients), their frozen batch norms hold no trainable parameter.
    assert paths and not any(p[0] == "stem" or p[:2] == ("stages", "0") for p in paths)
    assert all(p[-1] == "kernel" for p in paths)
    c3 = nnx.to_pure_dict(grads)["stages"][1][0]["conv1"]["conv"]["kernel"]
    assert float(jnp.abs(c3).sum()) > 0
