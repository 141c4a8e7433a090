"""Attention normalised after the product with the values
(`model.attention_normalize_after_values`, Google's v0.7 BERT formulation): the same
outputs, gradients and training losses as the softmax-then-dropout form, up to rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps
from flax import nnx

from configs.bert import get_config
from mlperf.layers.attention import SelfAttention

X = jax.random.normal(jax.random.key(0), (2, 16, 32))
# The second row's last six keys are padding.
MASK = jnp.ones((2, 16)).at[1, 10:].set(0)


def _attention(normalize_after_values: bool) -> SelfAttention:
    return SelfAttention(
        32, 4, rngs=nnx.Rngs(1), dropout_rate=0.25, normalize_after_values=normalize_after_values
    )


@pytest.mark.parametrize("with_dropout", [False, True], ids=["eval", "dropout"])
def test_outputs_and_gradients_equal_the_softmax_form(with_dropout):
    rng = jax.random.key(3) if with_dropout else None

    def loss(module):
        return jnp.sum(module(X, MASK, rng) ** 2)

    reference, late = _attention(False), _attention(True)
    np.testing.assert_allclose(late(X, MASK, rng), reference(X, MASK, rng), rtol=1e-5, atol=1e-7)
    want = jax.tree.leaves(nnx.state(nnx.grad(loss)(reference)))
    got = jax.tree.leaves(nnx.state(nnx.grad(loss)(late)))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-7)
    if with_dropout:
        # The same keep mask: without dropout the outputs differ.
        assert not np.allclose(late(X, MASK, rng), late(X, MASK, None), atol=1e-4)


def test_padded_keys_get_no_weight():
    late = _attention(True)
    changed = X.at[1, 12].add(100.0)  # a padded key of row 1
    out, out_changed = late(X, MASK, None), late(changed, MASK, None)
    np.testing.assert_allclose(out_changed[1, :10], out[1, :10], rtol=1e-5, atol=1e-6)


BATCHES = [synthetic_bert_batch(16, seed=s % 2) for s in range(6)]


def test_training_losses_equal_the_softmax_form(devices):
    base = {"mesh.ici_shape": (4, 2), "model.dropout_rate": 0.1}
    reference = train_steps(small_bert_config(**base), BATCHES, devices).losses
    late = train_steps(
        small_bert_config(**base, **{"model.attention_normalize_after_values": True}),
        BATCHES,
        devices,
    ).losses
    assert reference[-1] < reference[1], "the reference run must learn (same batch)"
    np.testing.assert_allclose(late, reference, rtol=1e-5)


def test_the_mlperf_v07_config_uses_it():
    assert get_config("mlperf_v07").model.attention_normalize_after_values
    assert not get_config("tiny").model.attention_normalize_after_values
