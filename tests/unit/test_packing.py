"""Sequence packing: every pair lands once, intact; attention never crosses segments, so
packed and unpacked batches give the same per-example loss."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from input_pipeline.packing import PACKED_FIELDS, pack_pairs, unpacked_rows
from mlperf.transformer.model import Transformer, TransformerConfig
from mlperf.transformer.task import smoothed_cross_entropy

LENGTH = 24


def _pairs(n: int, seed: int = 0, vocab: int = 50):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(3, vocab, size=rng.integers(2, 10)).astype(np.int32) for _ in range(n)]
    targets = [rng.integers(3, vocab, size=rng.integers(2, 10)).astype(np.int32) for _ in range(n)]
    for seq in (*inputs, *targets):
        seq[-1] = 1  # EOS
    return inputs, targets


def _unpack(packed: dict[str, np.ndarray], side: str) -> list[tuple[int, ...]]:
    out = []
    for tokens, segments in zip(packed[side], packed[f"{side}_segmentation"], strict=True):
        for s in range(1, segments.max() + 1):
            out.append(tuple(tokens[segments == s]))
    return out


def test_every_pair_is_packed_once_with_its_own_positions():
    inputs, targets = _pairs(40)
    packed = pack_pairs(inputs, targets, LENGTH, seed=3)
    assert set(packed) == set(PACKED_FIELDS)
    rows = len(packed["inputs"])
    assert rows < 40  # several pairs share rows
    got = sorted(zip(_unpack(packed, "inputs"), _unpack(packed, "targets"), strict=True))
    want = sorted((tuple(s), tuple(t)) for s, t in zip(inputs, targets, strict=True))
    assert got == want
    for side in ("inputs", "targets"):
        seg, pos = packed[f"{side}_segmentation"], packed[f"{side}_position"]
        assert np.all(packed[side][seg == 0] == 0)  # padding is zeros
        for r in range(rows):
            for s in range(1, seg[r].max() + 1):
                np.testing.assert_array_equal(pos[r][seg[r] == s], np.arange((seg[r] == s).sum()))


def test_packing_is_deterministic_and_rejects_overlong_pairs():
    inputs, targets = _pairs(30)
    a = pack_pairs(inputs, targets, LENGTH, seed=1)
    b = pack_pairs(inputs, targets, LENGTH, seed=1)
    for k in PACKED_FIELDS:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(ValueError, match="must be in"):
        pack_pairs([np.ones(LENGTH + 1, np.int32)], [np.ones(3, np.int32)], LENGTH)


def _per_example_loss(model, batch) -> list[float]:
    logits = model({k: jnp.asarray(v) for k, v in batch.items()})
    loss, _, _ = smoothed_cross_entropy(logits, jnp.asarray(batch["targets"]), 0.1)
    loss = np.asarray(loss)
    seg = batch["targets_segmentation"]
    out = []
    for r in range(len(seg)):
        for s in range(1, seg[r].max() + 1):
            out.append(float(loss[r][seg[r] == s].sum()))
    return out


def test_packed_and_unpacked_batches_give_the_same_per_example_loss():
    inputs, targets = _pairs(12, seed=5)
    cfg = TransformerConfig(
        vocab_size=64,
        emb_dim=32,
        num_heads=4,
        num_layers=2,
        mlp_dim=64,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    )
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    packed = pack_pairs(inputs, targets, LENGTH, seed=0)
    assert packed["inputs_segmentation"].max() > 1  # rows really hold several pairs
    unpacked = unpacked_rows(inputs, targets, LENGTH)
    # Map each packed segment back to its pair to compare in the same order.
    order = {(tuple(s), tuple(t)): i for i, (s, t) in enumerate(zip(inputs, targets, strict=True))}
    keys = list(zip(_unpack(packed, "inputs"), _unpack(packed, "targets"), strict=True))
    packed_loss = _per_example_loss(model, packed)
    unpacked_loss = _per_example_loss(model, unpacked)
    assert len(packed_loss) == len(unpacked_loss) == 12
    for key, value in zip(keys, packed_loss, strict=True):
        np.testing.assert_allclose(value, unpacked_loss[order[key]], rtol=2e-5, atol=2e-5)
    # And the loss really depends on the inputs (the comparison is not vacuous).
    shuffled = dict(unpacked, inputs=np.roll(unpacked["inputs"], 1, axis=0))
    assert not np.allclose(_per_example_loss(model, shuffled), unpacked_loss, atol=1e-3)
