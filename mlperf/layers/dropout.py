"""Inverted dropout whose keep masks cost a quarter of a threefry block per element on CPU.

`jax.random.bernoulli` draws a 32-bit uniform per element, and JAX's partitionable
threefry spends a whole 2x32 block (20 rounds) on each 32-bit word. A keep decision needs
far fewer bits: 16 bits resolve a rate to 1/65536. On CPU one block here yields four
16-bit words, four elements' decisions: a quarter of the random-bit work, the largest
elementwise cost of a CPU train step with dropout (docs/design.md, "Dropout's
random bits"). The counters keep the tensor's leading axes and pack along the last, so a
mask sharded like its activation is generated where it is used, as with
`jax.random.bits`.

Every other lowering (TPU, GPU) takes one 32-bit word per element and keeps its high 16
bits (`lax.platform_dependent`): the TPU compiler fuses that draw into the kernels that
use the mask, where the four-word packing puts each quarter in its own fusion and
concatenates them, which raised BERT-large's v3 step estimate by 18%
(docs/design.md). The masks of the two forms are different draws with the same
rate; within one program every dropout of a key gets the same mask.

The rate is rounded to a multiple of 1/65536 (0.1 drops 6554/65536 = 0.100006 of the
elements); `keep_scale` scales by the rounded keep probability, so the expectation of the
output equals the input exactly.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import threefry2x32_p

from mlperf.config_error import ConfigError
from parallel.collectives import to_varying, varying_axes

_LEVELS = 1 << 16  # a keep decision compares one 16-bit word against the rate


def drop_threshold(rate: float) -> int:
    """How many of the 65536 values of a 16-bit word drop the element."""
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"dropout rate {rate} is outside [0, 1): set it to 0 to disable")
    return round(rate * _LEVELS)


def keep_scale(rate: float) -> float:
    """1 / P(keep) for the rounded rate: the inverted-dropout scaling."""
    return _LEVELS / (_LEVELS - drop_threshold(rate))


# `rows=(count, index)`: the words are rows index, index + count, index + 2 count, ... of
# the words of a tensor `count` times as long on axis 0, and equal to those rows of it.
Rows = tuple[int, int]
ALL_ROWS: Rows = (1, 0)


def _full_shape(shape: tuple[int, ...], rows: Rows) -> tuple[int, ...]:
    count, index = rows
    if not 0 <= index < count or (count > 1 and not shape):
        raise ValueError(f"rows {rows} do not select every count-th row of a tensor")
    return (shape[0] * count, *shape[1:]) if count > 1 else shape


def _words16(rng: jax.Array, shape: tuple[int, ...], rows: Rows = ALL_ROWS) -> jax.Array:
    """Uniform 16-bit words (as uint32) of `shape`: four per threefry block on CPU, one
    per 32-bit word on every other platform."""
    return lax.platform_dependent(
        rng,
        cpu=functools.partial(_packed_words16, shape=shape, rows=rows),
        default=functools.partial(_element_words16, shape=shape, rows=rows),
    )


def _element_words16(rng: jax.Array, shape: tuple[int, ...], rows: Rows = ALL_ROWS) -> jax.Array:
    """The high 16 bits of one 32-bit word per element."""
    words = jax.random.bits(rng, _full_shape(shape, rows), jnp.uint32) >> 16
    count, index = rows
    if count == 1:
        return words
    return words.reshape(shape[0], count, *shape[1:])[:, index]


def _packed_words16(rng: jax.Array, shape: tuple[int, ...], rows: Rows = ALL_ROWS) -> jax.Array:
    """Uniform 16-bit words (as uint32) of `shape`, four per threefry block."""
    full = _full_shape(shape, rows)
    *lead, last = shape if shape else (1,)
    blocks = -(-last // 4)
    if str(jax.random.key_impl(rng)) == "threefry2x32" and math.prod(full[:-1]) < 2**32:
        key = jax.random.key_data(rng)
        counter_shape = (*lead, blocks)
        # Block (i, j): i the flat index over the full tensor's leading axes, j the block
        # along the last; axis 0 counts the selected rows of the full tensor.
        row = jnp.zeros(counter_shape, jnp.uint32)
        stride = 1
        for axis in reversed(range(len(lead))):
            position = lax.broadcasted_iota(jnp.uint32, counter_shape, axis)
            if axis == 0 and rows != ALL_ROWS:
                position = position * np.uint32(rows[0]) + np.uint32(rows[1])
            row = row + position * np.uint32(stride)
            stride *= full[axis]
        column = lax.broadcasted_iota(jnp.uint32, counter_shape, len(lead))
        hi, lo = threefry2x32_p.bind(key[0], key[1], row, column)
        halves = [hi & 0xFFFF, hi >> 16, lo & 0xFFFF, lo >> 16]
    else:
        # Another key implementation (rbg), or more rows than a 32-bit counter holds:
        # the implementation's own 32-bit words, two decisions each.
        words = jax.random.bits(rng, (*full[:-1], 2 * blocks), jnp.uint32)
        if rows != ALL_ROWS:
            words = words.reshape(lead[0], rows[0], *lead[1:], 2 * blocks)[:, rows[1]]
        halves = [words & 0xFFFF, words >> 16]
    packed = jnp.concatenate(halves, axis=-1)
    if packed.shape[-1] != last:
        packed = packed[..., :last]
    # Inside a shard_map threefry2x32_p's result carries no manual-axis type although it
    # depends on the key; the platform switch needs both branches typed alike.
    return to_varying(packed.reshape(shape), sorted(varying_axes(rng)))


def dropout_keep_mask(
    shape: tuple[int, ...], rate: float, rng: jax.Array | None, rows: Rows = ALL_ROWS
) -> jax.Array | None:
    """The elements dropout keeps (True) for `rng`; None when nothing is dropped (eval or
    rate 0). One draw for every dropout form, so their masks agree for the same key.

    `rows=(count, index)` gives rows index, index + count, ... of the mask of a tensor
    `count` times as long on axis 0, bit for bit: a computation split into interleaved
    row blocks (`attention_core`) drops what the whole one would."""
    if rng is None or rate == 0.0:
        return None
    return _words16(rng, tuple(shape), rows) >= np.uint32(drop_threshold(rate))


def dropout(x: jax.Array, rate: float, rng: jax.Array | None, rows: Rows = ALL_ROWS) -> jax.Array:
    """Inverted dropout; identity when `rng` is None (eval) or rate is 0. `rows` as in
    `dropout_keep_mask`."""
    keep = dropout_keep_mask(x.shape, rate, rng, rows)
    if keep is None:
        return x
    return jnp.where(keep, x * keep_scale(rate), 0).astype(x.dtype)
