"""Logical rules -> PartitionSpecs, mesh construction and its errors, DataLayout."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from parallel.mesh import MeshShapeError, build_mesh, resolve_shape, select_devices
from parallel.partition import Partitioner
from parallel.rules import DEFAULT_RULES, SPATIAL_RULES, logical_to_spec, rules_from_config


def test_default_rules_map_tensor_parallel_axes_to_model():
    assert logical_to_spec(("batch", "length", "embed")) == P("data", None, None)
    assert logical_to_spec(("embed", "heads", "kv")) == P(None, "model", None)
    assert logical_to_spec(("embed", "mlp")) == P(None, "model")
    assert logical_to_spec(("vocab", "embed")) == P("model", None)
    assert logical_to_spec(("batch", "height", "width", "channels"), SPATIAL_RULES) == P(
        "data", "model", None, None
    )


def test_a_mesh_axis_shards_one_dimension_only():
    # heads and mlp both map to `model`: the second use falls back to replication.
    assert logical_to_spec(("heads", "mlp")) == P("model", None)


def test_unknown_logical_axis_is_a_clear_error():
    with pytest.raises(KeyError, match="logical axis 'bogus' has no rule"):
        logical_to_spec(("bogus",))


def test_config_rules_take_precedence():
    rules = rules_from_config([("embed", "model")])
    assert logical_to_spec(("embed", "mlp"), rules) == P("model", None)
    assert rules[len(rules) - len(DEFAULT_RULES) :] == DEFAULT_RULES


def test_resolve_shape_fills_one_minus_one():
    assert resolve_shape((-1, 4), 8) == (2, 4)
    assert resolve_shape((2, -1), 8) == (2, 4)


@pytest.mark.parametrize(
    "shape, message",
    [
        ((3, -1), "the known sizes multiply to 3, which does not divide the 8 devices"),
        ((2, 2), r"needs 4 devices but 8 are available"),
        ((-1, -1), "more than one -1"),
    ],
)
def test_bad_mesh_shapes_name_both_numbers(shape, message):
    with pytest.raises(MeshShapeError, match=message):
        resolve_shape(shape, 8)


def test_build_mesh_uses_every_device_with_auto_axes(devices):
    mesh = build_mesh(("data", "model"), (-1, 4))
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_multislice_shape_needs_slices():
    with pytest.raises(MeshShapeError, match="dcn_shape"):
        build_mesh(("data", "model"), (-1, 4), dcn_shape=(2, 1))


def test_data_layout_and_host_to_global(devices):
    partitioner = Partitioner(build_mesh(("data", "model"), (2, 4)))
    layout = partitioner.data_layout(16)
    # One process holds every device: its slice is the whole batch.
    assert (layout.host_batch_size, layout.shard_index, layout.shard_count) == (16, 0, 1)
    host = {"x": np.arange(16 * 3).reshape(16, 3).astype(np.int32)}
    arrays = partitioner.host_to_global(host, layout)
    assert arrays["x"].sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(arrays["x"]), host["x"])
    with pytest.raises(ValueError, match="has 8 rows, expected 16"):
        partitioner.host_to_global({"x": host["x"][:8]}, layout)


def test_an_image_split_over_model_sends_each_device_its_own_rows_of_pixels(devices):
    image_axes = {"image": ("height", "width", "channels")}
    part = Partitioner(build_mesh(("data", "model"), (2, 4)), SPATIAL_RULES, input_axes=image_axes)
    layout = part.data_layout(16)
    rng = np.random.default_rng(0)
    host = {
        "image": rng.integers(0, 255, (16, 8, 6, 3)).astype(np.uint8),
        "label": np.arange(16, dtype=np.int32),
    }
    arrays = part.host_to_global(host, layout)
    assert arrays["image"].sharding.spec == P("data", "model", None, None)
    assert arrays["label"].sharding.spec == P("data")
    for shard in arrays["image"].addressable_shards:
        assert shard.data.shape == (8, 2, 6, 3)  # half the rows, a quarter of the height
        np.testing.assert_array_equal(np.asarray(shard.data), host["image"][shard.index])
    np.testing.assert_array_equal(np.asarray(arrays["image"]), host["image"])
    back = part.global_to_host(arrays, layout)
    np.testing.assert_array_equal(back["image"], host["image"])
    # Several steps stacked first: each step's image split the same way.
    stacked = np.stack([host["image"], 255 - host["image"], host["image"] // 2])
    steps = part.host_steps_to_global({"image": stacked}, layout)["image"]
    assert steps.sharding.spec == P(None, "data", "model", None, None)
    np.testing.assert_array_equal(np.asarray(steps), stacked)
    # A height that the model axis does not divide goes whole.
    odd = part.host_to_global({"image": host["image"][:, :6]}, layout)["image"]
    assert odd.sharding.spec == P("data", None, None, None)
    np.testing.assert_array_equal(np.asarray(odd), host["image"][:, :6])
    # Without spatial rules the same field goes whole: the rules decide, not the task.
    plain = Partitioner(build_mesh(("data", "model"), (2, 4)), input_axes=image_axes)
    assert plain.host_to_global(host, layout)["image"].sharding.spec == P("data", None, None, None)
    with pytest.raises(ValueError, match="input field 'image' has 2 dimensions per example"):
        part.batch_spec(3, "image")


@pytest.mark.parametrize("shape, shards", [((2, 4), 2), ((8, 1), 8), ((1, 8), 1)])
def test_batch_shards_is_the_data_axis_size(devices, shape, shards):
    assert Partitioner(build_mesh(("data", "model"), shape)).batch_shards() == shards


def test_weight_update_sharding_adds_the_data_axis(devices):
    partitioner = Partitioner(build_mesh(("data", "model"), (2, 4)))
    # A free dimension divisible by the data size takes the data axis.
    assert partitioner._add_data_axis(P(None, "model"), (32, 64)) == P("data", "model")
    # No free dimension: shares the model-sharded one, data-major.
    assert partitioner._add_data_axis(P("model"), (64,)) == P(("data", "model"))
    # Nothing divisible: stays as it was (replicated over data).
    assert partitioner._add_data_axis(P(None), (3,)) == P(None)


@pytest.mark.parametrize("shape", [(2, 4), (8, 1), (1, 8)])
def test_global_to_host_inverts_host_to_global(devices, shape):
    # Per-example eval outputs (decoded tokens, detections) come back to the host that fed them.
    part = Partitioner(build_mesh(("data", "model"), shape, (1, 1), devices))
    layout = part.data_layout(16)
    rng = np.random.default_rng(0)
    host = {
        "tokens": rng.integers(0, 99, (16, 5)).astype(np.int32),
        "w": rng.random(16).astype(np.float32),
    }
    back = part.global_to_host(part.host_to_global(host, layout), layout)
    assert set(back) == {"tokens", "w"}
    np.testing.assert_array_equal(back["tokens"], host["tokens"])
    np.testing.assert_array_equal(back["w"], host["w"])
    doubled = jax.jit(lambda x: x * 2)(part.host_to_global(host, layout)["tokens"])
    np.testing.assert_array_equal(
        part.global_to_host({"t": doubled}, layout)["t"], host["tokens"] * 2
    )


def test_gather_host_stats_stacks_one_entry_per_data_shard(devices):
    part = Partitioner(build_mesh(("data", "model"), (2, 4), (1, 1), devices))
    layout = part.data_layout(8)
    stats = part.gather_host_stats({"matches": np.array([3, 1]), "n": np.int64(7)}, layout)
    # One process holds every shard here: a leading axis of one entry, values untouched.
    assert stats["matches"].shape == (1, 2) and stats["n"].shape == (1,)
    np.testing.assert_array_equal(stats["matches"].sum(0), [3, 1])


def test_config_mesh_sizes_are_the_sizes_of_the_built_mesh(devices):
    """mlperf.validate checks a config's mesh with the resolution build_mesh uses."""
    from configs.bert import get_config
    from mlperf.validate import mesh_sizes

    c = get_config("tiny")
    c.mesh.ici_shape = (-1, 2)
    mesh = build_mesh(c.mesh.axes, c.mesh.ici_shape, c.mesh.dcn_shape, devices)
    assert mesh_sizes(c, len(devices)) == dict(mesh.shape) == {"data": 4, "model": 2}


def test_select_devices_takes_all_or_the_first_n(devices):
    assert select_devices(devices, 0) == list(devices)
    assert select_devices(devices, 8) == list(devices)
    assert select_devices(devices, 2) == list(devices[:2])
    for bad in (-1, 9):
        with pytest.raises(MeshShapeError, match=f"mesh.num_devices={bad}, but 8 devices"):
            select_devices(devices, bad)


def test_a_trainer_with_num_devices_builds_its_mesh_on_those_devices(devices):
    from conftest import small_bert_config

    from mlperf.trainer import build_trainer
    from mlperf.validate import ConfigError

    config = small_bert_config(**{"mesh.ici_shape": (-1, 1), "mesh.num_devices": 1})
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    assert dict(trainer.partitioner.mesh.shape) == {"data": 1, "model": 1}
    assert list(trainer.partitioner.mesh.devices.flat) == [devices[0]]
    config = small_bert_config(**{"mesh.num_devices": 16})
    with pytest.raises(ConfigError, match="mesh.num_devices=16, but 8 devices are available"):
        build_trainer(config, devices=devices, prepare_data=False)
