"""Dropout's keep masks: four 16-bit decisions per threefry block, the rate honoured, the
expectation kept, and the same mask whether or not the tensor is sharded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlperf.layers.dropout import drop_threshold, dropout, dropout_keep_mask, keep_scale


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
