"""AOT compilation for TPU topologies through libtpu, on this CPU machine (JAX_PLATFORMS=cpu)."""

from __future__ import annotations

import pytest

from configs.bert import get_config
from mlperf.inspection import inspect_config
from mlperf.trainer import build_trainer
from parallel.topology import TopologyError, get_topology, topology_for_chips

pytestmark = pytest.mark.xdist_group("aot")
GiB = 1 << 30


def test_topology_describes_cores_chips_and_hbm():
    topo = get_topology("v3:4x4")
    assert len(topo.devices) == 32 and topo.chips == 16 and topo.devices_per_chip == 2
    assert topo.devices[0].device_kind == "TPU v3"
    assert topo.hbm_per_device == 16 * GiB  # 32 GiB per v3 chip, two cores
    assert len(get_topology("v3:64x64").devices) == 8192  # the v0.7 multipod, 4096 chips


def test_unknown_topology_lists_the_known_ones():
    with pytest.raises(TopologyError, match=r"unknown TPU topology 'v9:4x4'.*v3: .*64x64"):
        get_topology("v9:4x4")
    with pytest.raises(TopologyError, match=r"libtpu cannot describe.*'v3:3x3'.*v3: 2x2, 4x4"):
        get_topology("v3:3x3")


def test_mesh_that_does_not_match_the_topology_names_both():
    config = get_config("tiny")
    config.mesh.ici_shape = (8, 8)  # 64 devices; v3:4x4 has 32
    with pytest.raises(
        TopologyError, match=r"data=8,model=8 does not fit topology v3:4x4.*32 devices.*needs 64"
    ):
        inspect_config(config, topology="v3:4x4")


def test_topology_for_chips():
    assert topology_for_chips("v3", 4096) == "v3:64x64"
    assert topology_for_chips("v3", 2048) == "v3:64x32"
    assert topology_for_chips("v4", 4096) == "v4:16x16x16"


@pytest.fixture(scope="module")
def tiny_v3_4x4():
    config = get_config("tiny")
    config.mesh.ici_shape = (8, 4)
    return inspect_config(config, topology="v3:4x4", eval_step=True)


def test_tiny_bert_compiles_for_v3_4x4(tiny_v3_4x4):
    r = tiny_v3_4x4
    assert r["devices"] == 32 and r["chips"] == 16 and r["mesh"] == {"data": 8, "model": 4}
    assert r["fits"] is True and r["hbm_per_device"] == 16 * GiB
    assert 0 < r["bytes_per_device"]["total"] < r["hbm_per_device"]
    train = r["train"]
    assert train["estimated_step_s"] > 0 and train["flops_per_device"] > 0
    assert train["collectives"]["all-reduce"] + train["collectives"]["reduce-scatter"] > 0
    assert r["eval"]["flops_per_device"] > 0 and "error" not in r["eval"]


def test_a_config_that_cannot_fit_is_reported_not_raised():
    config = get_config("tiny")
    # 4M-word vocabulary x 512: 2G fp32 parameters, replicated with LAMB's two moments.
    config.model.update(vocab_size=4 << 20, hidden_size=512, num_heads=8, mlp_dim=512)
    config.mesh.ici_shape = (8, 1)
    config.parallel.weight_update_sharding = False
    r = inspect_config(config, topology="v3:2x2")
    assert r["fits"] is False
    assert r["bytes_per_device"]["total"] > 16 * GiB
    assert r["hbm_headroom_bytes"] < 0


def test_bert_large_wus_on_the_multipod_divides_optimizer_state_by_data():
    """BERT-large (mlperf_v07) on v3:64x64 at the config's own data=2048 x model=4: the
    layout alone (no compile) gives bytes per device. No dimension of BERT-large (1024,
    4096, 30,528) divides 2048, so WUS shards flat zero-padded views of every parameter
    (parallel/weight_update.py); without them the state stayed replicated (689 MB/core)."""
    from parallel.aot import bytes_per_device, total_bytes
    from parallel.weight_update import count_flat

    devices = get_topology("v3:64x64").devices
    sizes = {}
    for wus in (True, False):
        config = get_config("mlperf_v07")
        assert tuple(config.mesh.ici_shape) == (-1, 4)
        config.parallel.weight_update_sharding = wus
        trainer = build_trainer(config, devices=devices, prepare_data=False)
        opt = trainer.layout.abstract_train_state["opt_state"]
        sizes[wus] = bytes_per_device(opt)
        if wus:  # 13 with the scanned layer stack (one leaf per kind of layer parameter)
            assert count_flat(trainer.layout.update_layouts) >= 10
    total = total_bytes(opt)
    # Replicated: split over model only (LayerNorm scales and some biases are whole).
    assert total / 4 <= sizes[False] < total / 3.5
    # WUS: over data too. Leaves with fewer elements per model shard than 2048 (layer-norm
    # scales and biases, 1024 each) stay replicated: measured 361x, ~1.9 MB per core.
    assert 300 < sizes[False] / sizes[True] <= 2048
    assert sizes[True] < 2 << 20


@pytest.mark.parametrize("rows", [64, 1024])
def test_a_tpu_reduce_scatter_is_counted_in_either_form(rows):
    """libtpu may keep a reduce-scatter or rewrite it as all-reduce + dynamic-slice
    (v3:2x2, groups of 4: it kept the 128 KiB shard and rewrote the 8 KiB one). The
    stats see one reduce-scatter of the program either way, with the shard's bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from parallel.aot import compiled_stats

    mesh = Mesh(np.array(get_topology("v3:2x2").devices).reshape(4, 2), ("data", "model"))

    def scatter(x):
        return jax.lax.psum_scatter(x * 2.0, "data", scatter_dimension=0, tiled=True)

    step = jax.jit(
        jax.shard_map(scatter, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec("data"))
    )
    x = jax.ShapeDtypeStruct(
        (rows, 128), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec())
    )
    lowered = step.lower(x)
    stats = compiled_stats(lowered.compile(), lowered)
    native, sliced = stats["collectives"]["reduce-scatter"], stats["reduce_scatter_as_all_reduce"]
    assert stats["reduce_scatter_program"] == 1
    assert native + sliced == 1
    shard = rows // 4 * 128 * 4
    assert (
        stats["collective_bytes"]["reduce-scatter"] + stats["reduce_scatter_as_all_reduce_bytes"]
        == shard
    )


def test_eval_step_of_a_host_metrics_task_is_the_detection_program(devices):
    """Mask R-CNN's device sums are only an example count (mAP is computed on the
    hosts): inspect must compile the detections the evaluator runs with them, not an
    empty program."""
    from configs.maskrcnn import get_config as maskrcnn_config
    from mlperf.evaluate import eval_program
    from mlperf.steps import batch_abstract
    from parallel.aot import compiled_stats

    config = maskrcnn_config("tiny")
    config.model.num_classes = 3  # no data prepared
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    params = trainer.layout.abstract_train_state["params"]
    spec = trainer.task.eval_example_spec(trainer.phases[-1])
    batch = batch_abstract(trainer.partitioner, spec, config.train.eval_batch_size)
    step = eval_program(trainer.task, trainer.layout, trainer.partitioner, params, batch)
    lowered = step.lower(params, batch)
    stats = compiled_stats(lowered.compile(), lowered)
    # The detector's forward pass: 1.2e9 matmul FLOPs per device; the count alone has 0.
    assert stats["matmul_flops"] > 1e8


def test_flat_views_as_rows_reduce_scatter_cheaper_on_the_multipod():
    """Weight-update views with model shards in front hold a row per replica
    ([4, 2048, n], parallel/weight_update.py): the TPU compiler's estimate of
    reduce-scattering them over 2048 replicas is below that of the same views split
    along their last dimension ([4, 2048 n]), the layout they had before."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from parallel.aot import cost_analysis
    from parallel.data_parallel import _manual_spec, reduce_gradients
    from parallel.weight_update import flat_layout

    devices = np.array(get_topology("v3:64x64").devices).reshape(2048, 4)
    mesh = Mesh(devices, ("data", "model"))
    sizes = {"data": 2048, "model": 4}
    rows = flat_layout((1024, 1024), PartitionSpec(None, "model"), "data", sizes)
    assert rows.view_shape == (4, 2048, 128)
    split = dataclasses.replace(rows, rows=0, spec=PartitionSpec("model", "data"))
    assert split.view_shape == (4, 262144)

    def estimate(layout) -> float:
        layouts = [layout] * 8
        # Manual over data only: the model split stays XLA's, as in the train step.
        out = [_manual_spec(layout.spec, "data")] * len(layouts)

        def per_replica(grads):
            return reduce_gradients(grads, layouts, "data")

        step = jax.jit(
            jax.shard_map(
                per_replica,
                mesh=mesh,
                in_specs=(PartitionSpec(),),
                out_specs=out,
                axis_names={"data"},
            )
        )
        w = jax.ShapeDtypeStruct(
            (1024, 1024), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec(None, "model"))
        )
        return float(cost_analysis(step.lower([w] * 8).compile())["optimal_seconds"])

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        as_rows, as_split = estimate(rows), estimate(split)
    assert 0 < as_rows < 0.7 * as_split, (as_rows, as_split)  # measured 0.078 vs 0.137 ms


def test_tile_ordered_views_need_no_relayout_copies_on_a_tpu():
    """Weight-update views of whole-tile parameters list elements in the TPU's tile
    order (parallel/weight_update.py): the compiled gradient reduce-scatter, update and
    parameter all-gather of SSD's [3, 3, 256, 256] kernels over its 1024 replicas
    (v3:32x64) copy nothing, where the row-major order copies each gradient and
    parameter."""
    import dataclasses
    import re

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from parallel.aot import cost_analysis
    from parallel.data_parallel import _manual_spec, reduce_gradients
    from parallel.mesh import build_mesh
    from parallel.weight_update import flat_layout

    mesh = build_mesh(("data", "model"), (-1, 4), devices=get_topology("v3:32x64").devices)
    shapes = [(3, 3, 256, 256)] * 4
    tiled = [flat_layout(s, PartitionSpec(), "data", dict(mesh.shape)) for s in shapes]
    assert tiled[0].view_shape == (589824,) and tiled[0].perm == (0, 1, 2, 4, 3, 5)
    row_major = [
        dataclasses.replace(t, split=s, perm=(0, 1, 2, 3), local_dims=s)
        for t, s in zip(tiled, shapes, strict=True)
    ]

    def compile_update(layouts) -> tuple[int, float]:
        out = [_manual_spec(lay.spec, "data") for lay in layouts]
        reduce = jax.shard_map(
            lambda g: reduce_gradients(g, layouts, "data"),
            mesh=mesh,
            in_specs=(PartitionSpec(),),
            out_specs=out,
            axis_names={"data"},
        )

        def step(params, grads):
            views = [
                lay.to_view(p) - 0.5 * g
                for lay, p, g in zip(layouts, params, reduce(grads), strict=True)
            ]
            views = [
                jax.lax.with_sharding_constraint(v, NamedSharding(mesh, lay.spec))
                for lay, v in zip(layouts, views, strict=True)
            ]
            full = NamedSharding(mesh, PartitionSpec())
            return [
                jax.lax.with_sharding_constraint(lay.from_view(v), full)
                for lay, v in zip(layouts, views, strict=True)
            ]

        w = [
            jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
            for s in shapes
        ]
        compiled = jax.jit(step).lower(w, w).compile()
        copies = len(re.findall(r" copy\(", compiled.as_text()))
        return copies, float(cost_analysis(compiled)["optimal_seconds"])

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        (tiled_copies, tiled_s), (row_copies, row_s) = (
            compile_update(tiled),
            compile_update(row_major),
        )
    assert tiled_copies == 0 and row_copies >= len(shapes), (tiled_copies, row_copies)
    assert tiled_s < row_s, (tiled_s, row_s)
