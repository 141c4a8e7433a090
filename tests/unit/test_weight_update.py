"""Weight-update sharding of parameters with no dimension the data axis divides: the
flat zero-padded view (parallel/weight_update.py), its gradients, and whole train steps
equal to the replicated update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from parallel.aot import bytes_per_device, hlo_op_stats, total_bytes
from parallel.data_parallel import GradReduction, data_parallel_value_and_grad
from parallel.mesh import build_mesh
from parallel.partition import Partitioner
from parallel.weight_update import count_flat, flat_layout, from_views, to_views

pytestmark = pytest.mark.xdist_group("weight_update")


def test_flat_layout_pads_to_the_data_size_and_round_trips():
    sizes = {"data": 8, "model": 1}
    x = np.arange(15, dtype=np.float32).reshape(5, 3) + 1
    lay = flat_layout((5, 3), P(None, None), "data", sizes)
    assert lay.view_shape == (16,) and lay.spec == P("data")
    view = np.asarray(lay.to_view(jnp.asarray(x)))
    np.testing.assert_array_equal(view[:15], x.ravel())
    assert view[15] == 0  # the padding is zero
    np.testing.assert_array_equal(np.asarray(lay.from_view(jnp.asarray(view))), x)
    assert flat_layout((30,), P(None), "data", sizes).view_shape == (32,)
    # Fewer elements than data replicas: stays replicated.
    assert flat_layout((2,), P(None), "data", sizes) is None


def test_flat_layout_keeps_model_shards_in_front():
    # [30, 46] with 46 split over model=2: each model shard's 30 x 23 elements, padded.
    sizes = {"data": 4, "model": 2}
    lay = flat_layout((30, 46), P(None, "model"), "data", sizes)
    assert lay.view_shape == (2, 4, 173) and lay.spec == P("model", "data", None)
    x = np.random.default_rng(0).normal(size=(30, 46)).astype(np.float32)
    view = np.asarray(lay.to_view(jnp.asarray(x)))
    np.testing.assert_array_equal(view[1].ravel()[:690], x[:, 23:].ravel())  # model shard 1
    np.testing.assert_array_equal(np.asarray(lay.from_view(jnp.asarray(view))), x)
    # A model split that does not divide its dimension: no flat view.
    assert flat_layout((30, 45), P(None, "model"), "data", sizes) is None


def test_a_view_of_whole_tiles_is_in_the_tpu_tile_order():
    """A 1-D view whose last two dimensions are whole float32 TPU tiles (8 x 128) lists
    the elements tile by tile, as the TPU stores the parameter; other shapes stay in
    row-major order. Both round-trip."""
    sizes = {"data": 64, "model": 1}
    x = np.arange(3 * 16 * 256, dtype=np.float32).reshape(3, 16, 256)
    lay = flat_layout(x.shape, P(), "data", sizes)
    assert lay.view_shape == (x.size,) and lay.spec == P("data")
    view = np.asarray(lay.to_view(jnp.asarray(x)))
    np.testing.assert_array_equal(view[:1024], x[0, :8, :128].ravel())  # the first tile
    np.testing.assert_array_equal(view[1024:2048], x[0, :8, 128:].ravel())  # beside it
    np.testing.assert_array_equal(view[2048:3072], x[0, 8:, :128].ravel())  # below it
    np.testing.assert_array_equal(np.asarray(lay.from_view(jnp.asarray(view))), x)
    odd = np.arange(3 * 16 * 324, dtype=np.float32).reshape(3, 16, 324)  # 324 lanes: no
    lay = flat_layout(odd.shape, P(), "data", sizes)
    view = np.asarray(lay.to_view(jnp.asarray(odd)))
    np.testing.assert_array_equal(view[: odd.size], odd.ravel())
    np.testing.assert_array_equal(np.asarray(lay.from_view(jnp.asarray(view))), odd)


def test_a_kept_stack_dimension_stays_whole_in_front_of_the_view():
    """A scanned layer stack [L, ...] keeps L as the view's first dimension, so each
    layer's elements stay apart (per-layer LAMB trust ratios), and round-trips."""
    sizes = {"data": 8, "model": 2}
    x = np.random.default_rng(0).normal(size=(3, 30, 46)).astype(np.float32)
    lay = flat_layout((3, 30, 46), P(None, None, "model"), "data", sizes, keep=(0,))
    assert lay.view_shape == (3, 2, 696) and lay.spec == P(None, "model", "data")
    view = np.asarray(lay.to_view(jnp.asarray(x)))
    for layer in range(3):  # layer l's view holds exactly layer l's elements
        np.testing.assert_allclose(np.square(view[layer]).sum(), np.square(x[layer]).sum())
    np.testing.assert_array_equal(np.asarray(lay.from_view(jnp.asarray(view))), x)
    # A stack dimension sharded over another axis cannot be kept whole.
    assert flat_layout((4, 30), P("model", None), "data", sizes, keep=(0,)) is None


def test_layer_trust_ratio_on_a_stacked_view_equals_lamb_per_layer():
    """LAMB on a stacked leaf in its flat view = optax's per-leaf trust ratio applied to
    each layer on its own."""
    from mlperf.optimizer import scale_by_layer_trust_ratio

    sizes = {"data": 8, "model": 2}
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 30, 46)).astype(np.float32) * np.array([1, 5, 0.1])[:, None, None]
    u = rng.normal(size=(3, 30, 46)).astype(np.float32)
    lay = flat_layout((3, 30, 46), P(None, None, "model"), "data", sizes, keep=(0,))
    tx = scale_by_layer_trust_ratio({"w": True})
    out, _ = tx.update({"w": lay.to_view(u)}, tx.init(None), {"w": lay.to_view(w)})
    got = np.asarray(lay.from_view(out["w"]))
    per_leaf = optax.scale_by_trust_ratio()
    for layer in range(3):
        want, _ = per_leaf.update(u[layer], per_leaf.init(None), w[layer])
        np.testing.assert_allclose(got[layer], np.asarray(want), rtol=1e-5)


def test_partitioner_picks_natural_flat_or_replicated(devices):
    part = Partitioner(build_mesh(("data", "model"), (8, 1)))
    logical = {"w": ("embed", "mlp"), "b": ("embed",), "tiny": ("classes",), "d": ("embed", None)}
    shapes = {
        "w": jax.ShapeDtypeStruct((5, 3), jnp.float32),
        "b": jax.ShapeDtypeStruct((30,), jnp.float32),
        "tiny": jax.ShapeDtypeStruct((2,), jnp.float32),
        "d": jax.ShapeDtypeStruct((16, 3), jnp.float32),
    }
    layouts = part.update_layouts(logical, shapes)
    assert layouts["w"].flat and layouts["b"].flat and count_flat(layouts) == 2
    assert layouts["d"].spec == P("data", None) and not layouts["d"].flat
    assert layouts["tiny"].spec == P(None) and not layouts["tiny"].flat
    off = Partitioner(part.mesh, weight_update_sharding=False).update_layouts(logical, shapes)
    assert count_flat(off) == 0


@pytest.mark.parametrize("algorithm", ["xla", "ring"])
def test_flat_gradients_are_reduce_scattered_model_locally(devices, algorithm):
    """Per-replica gradients of a toy loss in flat views equal jax.grad of the whole batch
    (XLA's reduce-scatter, or a ring all-reduce keeping each replica's slice); XLA's
    reduce-scatter moves only each model shard's elements."""
    part = Partitioner(build_mesh(("data", "model"), (4, 2)))
    logical = {"w": ("embed", "mlp"), "b": ("embed",)}
    rng = np.random.default_rng(1)
    params = {
        "w": rng.normal(size=(30, 46)).astype(np.float32),
        "b": rng.normal(size=(30,)).astype(np.float32),
    }
    x = rng.normal(size=(8, 30)).astype(np.float32)
    layouts = part.update_layouts(logical, jax.tree.map(jnp.asarray, params))
    assert layouts["w"].spec == P("model", "data", None) and layouts["b"].spec == P("data")

    def loss(p, batch):
        return jnp.sum(jnp.tanh((batch + p["b"]) @ p["w"]) ** 2)

    def local(p, batch, shared, key):
        value, grads = jax.value_and_grad(loss)(p, batch)
        return value, {}, grads

    fn = data_parallel_value_and_grad(local, part, layouts, GradReduction(algorithm))
    shardings = part.to_shardings(
        jax.tree.map(part.spec, logical, is_leaf=lambda t: isinstance(t, tuple))
    )
    jitted = part.jit(
        lambda p, b: fn(p, b, None, jax.random.key(0)),
        in_shardings=(shardings, NamedSharding(part.mesh, P("data"))),
    )
    value, _, grads = jitted(params, x)
    want_value, want = jax.value_and_grad(loss)(params, x)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    got = from_views(jax.tree.map(np.asarray, grads), layouts)
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    assert grads["w"].sharding.spec == P("model", "data")  # (jax drops a trailing None)
    if algorithm != "xla":
        return
    text = jitted.lower(params, x).compile().as_text()
    shapes = [line for line in text.splitlines() if " reduce-scatter(" in line]
    # [30, 46] over model=2 and data=4: each device reduces its model shard's 692
    # padded elements (4 rows of 173) into one row, never the full 2 x 692.
    assert any("f32[1,1,173]" in line for line in shapes), shapes
    assert not any("f32[2,1,173]" in line for line in shapes), shapes


def _train(config, batches):
    run = train_steps(config, batches)
    trainer, step = run.trainer, run.compiled
    opt = trainer.layout.abstract_train_state["opt_state"]
    return {
        "losses": run.losses,
        "params": run.params(),
        "opt_per_device": bytes_per_device(opt),
        "opt_total": total_bytes(opt),
        "flat": count_flat(trainer.layout.update_layouts),
        "ops": hlo_op_stats(step.as_text())["collectives"],
    }


# hidden 30, 5 heads of 6, MLP 45: kernels (30, 45), (30, 5, 6), biases (30,), (5, 6),
# (45,) - no dimension divisible by the data axis of 8.
ODD = {"model.hidden_size": 30, "model.num_heads": 5, "model.mlp_dim": 45}


@pytest.fixture(scope="module")
def odd_runs(devices):
    batches = [synthetic_bert_batch(16, seed=s) for s in (0, 1, 0)]
    return {
        wus: _train(
            small_bert_config(
                **ODD, **{"mesh.ici_shape": (8, 1), "parallel.weight_update_sharding": wus}
            ),
            batches,
        )
        for wus in (True, False)
    }


def test_odd_shapes_shard_their_optimizer_state_over_data(odd_runs):
    wus, replicated = odd_runs[True], odd_runs[False]
    assert wus["flat"] >= 20 and replicated["flat"] == 0
    assert replicated["opt_per_device"] == replicated["opt_total"]
    # 1/8 of the padded total, plus LAMB's counters and the replicated 2-class NSP bias.
    assert wus["opt_total"] / 8 <= wus["opt_per_device"] <= wus["opt_total"] / 8 + 128
    assert wus["opt_total"] < 1.01 * replicated["opt_total"]  # padding: under 1%
    assert wus["ops"]["reduce-scatter"] >= 20 and replicated["ops"]["reduce-scatter"] == 0


def test_odd_shapes_train_like_the_replicated_update(odd_runs):
    """Same losses and parameters (float32 rounding: reduce-scatter sums in another
    order than all-reduce)."""
    wus, replicated = odd_runs[True], odd_runs[False]
    assert wus["losses"][2] < wus["losses"][0]  # training on batch 0 again lowers its loss
    np.testing.assert_allclose(wus["losses"], replicated["losses"], rtol=2e-5)
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(wus["params"]),
        jax.tree.leaves(replicated["params"]),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_views_round_trip_a_params_tree(devices):
    part = Partitioner(build_mesh(("data", "model"), (8, 1)))
    params = {"a": jnp.ones((5, 3)), "b": jnp.arange(30.0), "c": jnp.zeros((16, 2))}
    logical = {"a": (None, None), "b": (None,), "c": (None, None)}
    layouts = part.update_layouts(logical, params)
    views = to_views(params, layouts)
    assert views["a"].shape == (16,) and views["c"].shape == (16, 2)
    back = from_views(views, layouts)
    for name in params:
        np.testing.assert_array_equal(back[name], params[name])
    # LAMB on the view leaves the padding at zero (zero gradient, moments and weight).
    tx = optax.lamb(1e-2, weight_decay=0.1)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(to_views(grads, layouts), tx.init(views), views)
    assert float(jnp.abs(updates["a"][15:]).max()) == 0.0


def test_without_axes_drops_mesh_axes_from_every_entry():
    from parallel.weight_update import without_axes

    spec = P(("data", "model"), "data", None, ("model", "data", "pipe"))
    assert without_axes(spec, ("data",)) == P("model", None, None, ("model", "pipe"))
    assert without_axes(spec, {"data", "model"}) == P(None, None, None, "pipe")
    assert without_axes(spec, ()) == spec


@pytest.mark.parametrize("wus", [True, False])
def test_xla_cpu_keeps_one_collective_per_sharded_parameter(devices, wus):
    """docs/performance.md ("One CPU device"): on XLA:CPU, weight-update sharding costs a
    reduce-scatter and an all-gather per parameter, and LAMB two all-reduces per
    parameter (the trust ratio's norms of the sharded parameter and update). Nothing
    combines them. Without it, a data-only mesh's step has the two explicit
    all-reduces only."""
    from mlperf.trainer import build_trainer

    config = small_bert_config(
        **{
            "mesh.ici_shape": (2, 1),
            "mesh.num_devices": 2,
            "parallel.weight_update_sharding": wus,
        }
    )
    assert config.optimizer.name == "lamb"
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    stats = hlo_op_stats(trainer.lower_train_step(trainer.phases[0]).compile().as_text())
    leaves = len(jax.tree.leaves(trainer.layout.abstract_train_state["params"]))
    collectives = {op: n for op, n in stats["collectives"].items() if n}
    if wus:
        expected = {"reduce-scatter": leaves, "all-gather": leaves, "all-reduce": 2 * leaves + 2}
    else:
        expected = {"all-reduce": 2}
    assert collectives == expected, (leaves, collectives)
