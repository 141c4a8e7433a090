"""What the SSD and Mask R-CNN predict/export tests share: the eval split's images as
files, the evaluator's own detections of them, our backbone's features, and a plain-torch
ResNet with torchvision's module names (torchvision itself is not installed beside the
pinned torch: the same layers, named as torchvision names them, are built here)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from mlperf.detection_predict import read_images
from mlperf.evaluate import Evaluator
from mlperf.layers.resnet import ResNet, ResNetConfig


def write_eval_images(task, folder, count: int):
    """The first `count` eval images written as <image id>.png (their stored bytes);
    returns them read back as predict reads inputs."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        record = task.data.coco.eval[i]
        path = folder / f"{int(record['image_id'])}.png"
        path.write_bytes(bytes(np.asarray(record["image_bytes"], np.uint8)))
        paths.append(str(path))
    return read_images(paths)


def evaluator_sums(trained, batch_size: int):
    """(task with its data, the evaluator's gathered per-image outputs) on the eval set."""
    task = trained.task.with_data(trained.task.prepare(0, 1))
    layout = trained.partitioner.data_layout(batch_size)
    batches = task.eval_data(batch_size, layout.shard_index, layout.shard_count)
    evaluator = Evaluator(task, trained.layout, trained.partitioner, batches, batch_size)
    return task, evaluator.run_pass(trained.params)


def our_features(params, cfg: ResNetConfig, images: np.ndarray) -> dict[str, np.ndarray]:
    """Our ResNet's eval-mode feature maps (NHWC) with `params` (its nested dict)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: ResNet(cfg, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, jax.tree.map(np.asarray, params))

    @jax.jit
    def forward(state, images):
        return nnx.merge(graphdef, state)(images, train=False)

    return {k: np.asarray(v) for k, v in forward(state, images).items()}


def torch_resnet(cfg: ResNetConfig):
    """A torchvision-layout ResNet of cfg's blocks, width, stages and strides (torch.nn
    only): conv1, bn1, maxpool, layer1..layerN of BasicBlock/Bottleneck with conv{k},
    bn{k} and downsample.0/1. forward(x NCHW) returns the stages' outputs."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride):
        return nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, bias=False), nn.BatchNorm2d(cout)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            mid = cout // 4 if cfg.block == "bottleneck" else cout
            if cfg.block == "bottleneck":
                shapes = [(cin, mid, 1, 1), (mid, mid, 3, stride), (mid, cout, 1, 1)]
            else:
                shapes = [(cin, cout, 3, stride), (cout, cout, 3, 1)]
            for k, shape in enumerate(shapes, 1):
                conv, bn = conv_bn(*shape)
                setattr(self, f"conv{k}", conv)
                setattr(self, f"bn{k}", bn)
            self.convs = len(shapes)
            self.downsample = (
                nn.Sequential(*conv_bn(cin, cout, 1, stride))
                if stride != 1 or cin != cout
                else None
            )

        def forward(self, x):
            y = x
            for k in range(1, self.convs + 1):
                y = getattr(self, f"bn{k}")(getattr(self, f"conv{k}")(y))
                if k < self.convs:
                    y = torch.relu(y)
            shortcut = x if self.downsample is None else self.downsample(x)
            return torch.relu(y + shortcut)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(3, cfg.width, 7, 2)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin = cfg.width
            for i in range(cfg.num_stages):
                cout = cfg.stage_channels(i)
                blocks = []
                for j in range(cfg.stage_sizes[i]):
                    blocks.append(Block(cin, cout, cfg.stage_strides[i] if j == 0 else 1))
                    cin = cout
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))

        def forward(self, x):
            x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
            out = []
            for i in range(cfg.num_stages):
                x = getattr(self, f"layer{i + 1}")(x)
                out.append(x)
            return out

    return Net().eval()


def check_backbone_export(backbone_path, params, cfg: ResNetConfig) -> None:
    """The exported backbone: re-imported by our importer it is the same params; loaded
    in a torchvision-named torch ResNet it gives our features (1e-4)."""
    import torch

    from mlperf.layers.resnet_import import load_torchvision_resnet

    again = load_torchvision_resnet(str(backbone_path), cfg)
    ours = jax.tree_util.tree_flatten_with_path(jax.tree.map(np.asarray, params))[0]
    back = dict(jax.tree_util.tree_flatten_with_path(again)[0])
    assert len(back) == len(ours)
    for path, value in ours:
        np.testing.assert_array_equal(back[path], value, err_msg=jax.tree_util.keystr(path))

    net = torch_resnet(cfg)
    state = torch.load(str(backbone_path))
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    images = np.random.default_rng(0).normal(size=(2, 64, 64, 3)).astype(np.float32)
    with torch.no_grad():
        theirs = net(torch.from_numpy(images.transpose(0, 3, 1, 2)))
    features = our_features(params, cfg, images)
    for i, t in enumerate(theirs):
        expected = features[f"C{i + 2}"]
        np.testing.assert_allclose(t.numpy().transpose(0, 2, 3, 1), expected, atol=1e-4, rtol=1e-4)
