"""Dropout's keep masks: four 16-bit decisions per threefry block, the rate honoured, the
expectation kept, and the same mask whether or not the tensor is sharded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlperf.layers.dropout import (
    _element_words16,
    _packed_words16,
    drop_threshold,
    dropout,
    dropout_keep_mask,
    keep_scale,
)


def test_the_rate_is_rounded_to_sixteen_bits_and_the_scale_follows_it():
    assert drop_threshold(0.1) == 6554
    assert keep_scale(0.1) == 65536 / (65536 - 6554)
    assert keep_scale(0.0) == 1.0
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="outside"):
            drop_threshold(bad)


def test_the_keep_fraction_matches_the_rate_in_every_packed_quarter():
    keep = np.asarray(dropout_keep_mask((64, 1000), 0.1, jax.random.key(0)))
    assert abs(keep.mean() - 0.9) < 0.006
    # The last axis packs the four 16-bit words of each block as four quarters.
    quarters = keep.reshape(64, 4, 250)
    for q in range(4):
        assert abs(quarters[:, q].mean() - 0.9) < 0.012
    assert not np.array_equal(quarters[:, 0], quarters[:, 1])
    assert not np.array_equal(quarters[:, 2], quarters[:, 3])


def test_the_same_key_gives_the_same_mask_and_another_key_another():
    a = dropout_keep_mask((8, 33), 0.25, jax.random.key(1))
    b = dropout_keep_mask((8, 33), 0.25, jax.random.key(1))
    c = dropout_keep_mask((8, 33), 0.25, jax.random.key(2))
    assert a.shape == (8, 33)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_kept_elements_are_scaled_so_the_mean_is_kept():
    x = jnp.ones((256, 512))
    y = np.asarray(dropout(x, 0.1, jax.random.key(3)))
    assert set(np.unique(y)) == {0.0, np.float32(keep_scale(0.1))}
    assert abs(y.mean() - 1.0) < 0.01
    np.testing.assert_array_equal(dropout(x, 0.1, None), x)
    np.testing.assert_array_equal(dropout(x, 0.0, jax.random.key(3)), x)


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 6)])
def test_odd_shapes(shape):
    keep = dropout_keep_mask(shape, 0.5, jax.random.key(4))
    assert keep.shape == shape and keep.dtype == jnp.bool_


def test_an_rbg_key_draws_its_own_words():
    keep = np.asarray(dropout_keep_mask((32, 1000), 0.1, jax.random.key(5, impl="rbg")))
    assert abs(keep.mean() - 0.9) < 0.01


def test_a_sharded_mask_equals_the_unsharded_one():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    shape = (8, 4, 16, 64)
    key = jax.random.key(6)
    whole = jax.jit(lambda k: dropout_keep_mask(shape, 0.1, k))(key)
    sharded = jax.jit(
        lambda k: dropout_keep_mask(shape, 0.1, k),
        out_shardings=NamedSharding(mesh, PartitionSpec("a", "b")),
    )(key)
    assert len(sharded.addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(whole))


def test_cpu_lowerings_pack_four_words_per_block_and_others_take_one_per_element():
    """The packing is for XLA:CPU; on TPU it splits each quarter into its own fusion and
    concatenates them (BERT-large's v3 step estimate +18%), so TPU and GPU lowerings draw
    one 32-bit word per element and keep its high 16 bits."""
    masks = jax.jit(lambda k: dropout_keep_mask((4, 8, 64), 0.1, k))
    key = jax.random.key(7)
    assert "stablehlo.concatenate" in masks.trace(key).lower(lowering_platforms=("cpu",)).as_text()
    for platform in ("tpu", "cuda"):
        text = masks.trace(key).lower(lowering_platforms=(platform,)).as_text()
        assert "stablehlo.concatenate" not in text, platform
    words = np.asarray(jax.jit(lambda k: _element_words16(k, (64, 1000)))(jax.random.key(8)))
    assert words.max() < 65536 and abs(words.mean() / 65535 - 0.5) < 0.01
    keep = words >= drop_threshold(0.1)
    assert abs(keep.mean() - 0.9) < 0.006


def test_a_sharded_per_element_mask_equals_the_unsharded_one():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    shape = (8, 4, 16, 64)
    key = jax.random.key(9)
    whole = jax.jit(lambda k: _element_words16(k, shape))(key)
    sharded = jax.jit(
        lambda k: _element_words16(k, shape),
        out_shardings=NamedSharding(mesh, PartitionSpec("a", "b")),
    )(key)
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(whole))


def test_inside_shard_map_both_forms_vary_with_the_key():
    """threefry2x32_p's result carries no manual-axis type; the CPU form is typed as
    varying like its key, so the platform switch traces inside shard_map."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def per_shard(keys, x):
        return dropout(x, 0.1, keys[0])

    run = jax.jit(
        jax.shard_map(
            per_shard,
            mesh=mesh,
            in_specs=(PartitionSpec("data"), PartitionSpec("data")),
            out_specs=PartitionSpec("data"),
        )
    )
    keys, x = jax.random.split(jax.random.key(10), 2), jnp.ones((8, 256))
    for platform in ("cpu", "tpu"):
        assert "stablehlo" in run.trace(keys, x).lower(lowering_platforms=(platform,)).as_text()
    y = np.asarray(run(keys, x))
    assert not np.array_equal(y[:4], y[4:])  # each data shard its own key
    assert abs((y != 0).mean() - 0.9) < 0.02


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_interleaved_row_blocks_equal_those_rows_of_the_whole_mask(impl):
    """`rows=(count, index)`: rows index, index + count, ... of the whole mask, bit for
    bit, for the CPU packing and the per-element draw (`attention_core`'s blocks)."""
    shape, count = (8, 3, 16, 24), 4
    key = jax.random.key(10, impl=impl)
    block_shape = (shape[0] // count, *shape[1:])
    for words in (_packed_words16, _element_words16):
        whole = np.asarray(jax.jit(lambda k, w=words: w(k, shape))(key))
        for index in range(count):
            block = jax.jit(lambda k, w=words, i=index: w(k, block_shape, rows=(count, i)))(key)
            np.testing.assert_array_equal(np.asarray(block), whole[index::count])
    keep = dropout_keep_mask(shape, 0.1, key)
    block = dropout_keep_mask(block_shape, 0.1, key, rows=(count, 1))
    np.testing.assert_array_equal(np.asarray(block), np.asarray(keep)[1::count])


def test_rows_that_select_no_block_are_refused():
    with pytest.raises(ValueError, match="count-th row"):
        dropout_keep_mask((4, 8), 0.1, jax.random.key(0), rows=(2, 2))
