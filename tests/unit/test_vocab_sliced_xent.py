"""`vocab_sliced_cross_entropy`: the softmax cross-entropy of `h @ table.T + bias` made a
vocabulary slice at a time gives the whole-logits form's losses, top-1 and gradients (any
slice size, smoothing, padding columns), holds no [N, V] array, and BERT trains alike with
`model.train_head_vocab_slice` on a 4 x 2 mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch, train_steps

from mlperf.layers.cross_entropy import softmax_cross_entropy
from mlperf.layers.vocab_sliced_xent import PADDING_LOGIT, vocab_sliced_cross_entropy

ROWS, WIDTH, VOCAB = 24, 16, 300


def _inputs(seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 5)
    h = jax.random.normal(keys[0], (ROWS, WIDTH))
    table = jax.random.normal(keys[1], (VOCAB, WIDTH)) * 0.5
    bias = jax.random.normal(keys[2], (VOCAB,)) * 0.1
    labels = jax.random.randint(keys[3], (ROWS,), 0, VOCAB)
    # Half the labels are the row's argmax, so top-1 has both answers.
    labels = jnp.where(jnp.arange(ROWS) % 2 == 0, jnp.argmax(h @ table.T + bias, -1), labels)
    weights = jax.random.uniform(keys[4], (2, ROWS))
    return h, table, bias, labels, weights


def _whole(h, table, bias, labels, smoothing, valid_vocab):
    logits = h @ table.T + bias
    if valid_vocab is not None:
        logits = jnp.where(jnp.arange(VOCAB) < valid_vocab, logits, PADDING_LOGIT)
    return softmax_cross_entropy(logits, labels, smoothing)


def _value_and_grads(head, h, table, bias, labels, weights):
    """Weighted loss + weighted nll (both cotangents used), the top-1 count, and gradients
    with respect to h, table and bias."""

    def objective(h, table, bias):
        loss, nll, top1 = head(h, table, bias, labels)
        return jnp.sum(loss * weights[0]) + jnp.sum(nll * weights[1]), (loss, nll, top1)

    fn = jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2), has_aux=True))
    return fn(h, table, bias)


@pytest.mark.parametrize(
    ("slice_size", "smoothing", "valid_vocab"),
    [(100, 0.0, None), (64, 0.0, None), (64, 0.1, None), (128, 0.0, 290), (1000, 0.1, 250)],
)
def test_sliced_head_equals_the_whole_logits_form(slice_size, smoothing, valid_vocab):
    h, table, bias, labels, weights = _inputs()
    (value, (loss, nll, top1)), grads = _value_and_grads(
        lambda *a: vocab_sliced_cross_entropy(
            *a, slice_size, smoothing=smoothing, valid_vocab=valid_vocab
        ),
        h,
        table,
        bias,
        labels,
        weights,
    )
    (ref_value, (ref_loss, ref_nll, ref_top1)), ref_grads = _value_and_grads(
        lambda *a: _whole(*a, smoothing, valid_vocab), h, table, bias, labels, weights
    )
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nll, ref_nll, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(top1, ref_top1)
    assert 0 < int(top1.sum()) < ROWS
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    if valid_vocab is not None:  # padding columns learn nothing
        assert not np.any(grads[1][valid_vocab:]) and not np.any(grads[2][valid_vocab:])
        assert np.any(grads[1][:valid_vocab])


def test_bfloat16_matmuls_stay_close_to_float32_and_keep_the_parameters_dtypes():
    h, table, bias, labels, weights = _inputs(1)
    (value, _), grads = _value_and_grads(
        lambda *a: vocab_sliced_cross_entropy(*a, 128, compute_dtype=jnp.bfloat16),
        h,
        table,
        bias,
        labels,
        weights,
    )
    (ref_value, _), ref_grads = _value_and_grads(
        lambda *a: _whole(*a, 0.0, None), h, table, bias, labels, weights
    )
    assert [g.dtype for g in grads] == [jnp.float32] * 3
    np.testing.assert_allclose(value, ref_value, rtol=2e-2)
    for got, want in zip(grads, ref_grads, strict=True):
        scale = float(jnp.max(jnp.abs(want)))
        assert float(jnp.max(jnp.abs(got - want))) < 3e-2 * scale
    assert float(jnp.max(jnp.abs(grads[1] - ref_grads[1]))) > 0, "bf16 had no effect"


def _largest_array(jaxpr) -> int:
    """Elements of the largest value any equation makes, sub-jaxprs (scan bodies) included."""
    largest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            largest = max(largest, int(np.prod(getattr(var.aval, "shape", ()))))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    largest = max(largest, _largest_array(inner))
    return largest


def test_no_array_of_the_whole_logits_is_made():
    h, table, bias, labels, weights = _inputs()

    def largest(head):
        def objective(h, table, bias):
            loss, _, _ = head(h, table, bias, labels)
            return jnp.sum(loss * weights[0])

        return _largest_array(jax.make_jaxpr(jax.grad(objective, (0, 1, 2)))(h, table, bias).jaxpr)

    assert largest(lambda *a: _whole(*a, 0.0, None)) >= ROWS * VOCAB
    # The largest value is the table (or its gradient): [300, 16] < [24, 300].
    assert largest(lambda *a: vocab_sliced_cross_entropy(*a, 64)) == VOCAB * WIDTH < ROWS * VOCAB


def test_bad_shapes_and_slice_sizes_are_named():
    h, table, bias, labels, _ = _inputs()
    with pytest.raises(ValueError, match="slice size 0 must be >= 1"):
        vocab_sliced_cross_entropy(h, table, bias, labels, 0)
    with pytest.raises(ValueError, match="shapes do not fit"):
        vocab_sliced_cross_entropy(h, table[:, :8], bias, labels, 64)


BATCHES = [synthetic_bert_batch(16, seed=s % 2) for s in range(6)]
MESH = {"mesh.ici_shape": (4, 2)}


def test_bert_trains_alike_with_the_sliced_head(devices):
    """The train step (inside the data-parallel shard_map) with the head in slices of 40
    columns (96 = 2 x 40 + 16) follows the whole-logits run; in bfloat16 it stays close."""
    whole = train_steps(small_bert_config(**MESH), BATCHES, devices)
    sliced = train_steps(
        small_bert_config(**MESH, **{"model.train_head_vocab_slice": 40}), BATCHES, devices
    )
    bf16 = train_steps(
        small_bert_config(
            **MESH,
            **{"model.train_head_vocab_slice": 40, "model.train_head_dtype": "bfloat16"},
        ),
        BATCHES,
        devices,
    )
    assert whole.losses[-1] < whole.losses[1], "the reference run must learn (same batch)"
    np.testing.assert_allclose(sliced.losses, whole.losses, rtol=1e-4)
    np.testing.assert_allclose(bf16.losses, whole.losses, rtol=2e-2)
    assert not np.array_equal(bf16.losses, whole.losses), "the head dtype had no effect"
