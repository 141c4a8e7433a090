"""softmax_cross_entropy: values and gradients equal autodiff of log_softmax, top-1 equals
argmax, with label smoothing, padded vocabulary rows and a vocabulary sharded over devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlperf.layers.cross_entropy import softmax_cross_entropy


def _reference(logits, labels, smoothing):
    """The textbook form: log-probabilities, then the soft targets' cross-entropy."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    vocab = logits.shape[-1]
    one_hot = jax.nn.one_hot(labels, vocab)
    soft = one_hot * (1.0 - smoothing) + (1.0 - one_hot) * smoothing / (vocab - 1)
    return -jnp.sum(soft * log_probs, -1), -jnp.sum(one_hot * log_probs, -1)


def _inputs(vocab=512, padded=12):
    logits = jax.random.normal(jax.random.key(0), (16, 10, vocab)) * 3.0
    # Padded vocabulary rows, as BERT's head writes them, never win and take no mass.
    logits = logits.at[..., vocab - padded :].set(-1e9)
    labels = jax.random.randint(jax.random.key(1), (16, 10), 0, vocab - padded)
    # About half the labels are their row's maximum, so top-1 sees both outcomes.
    labels = jnp.where(jnp.arange(10)[None, :] % 2 == 0, jnp.argmax(logits, -1), labels)
    return logits, labels


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_values_and_gradients_equal_autodiff_of_log_softmax(smoothing):
    logits, labels = _inputs()
    weights = jax.random.uniform(jax.random.key(2), labels.shape)

    def ours(x):
        loss, nll, _ = softmax_cross_entropy(x, labels, smoothing)
        return jnp.sum(loss * weights) + 0.3 * jnp.sum(nll)

    def reference(x):
        loss, nll = _reference(x, labels, smoothing)
        return jnp.sum(loss * weights) + 0.3 * jnp.sum(nll)

    loss, nll, top1 = softmax_cross_entropy(logits, labels, smoothing)
    ref_loss, ref_nll = _reference(logits, labels, smoothing)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nll, ref_nll, rtol=1e-5, atol=1e-5)
    expected_top1 = np.asarray(jnp.argmax(logits, -1) == labels)
    assert 0.3 < expected_top1.mean() < 0.7
    np.testing.assert_array_equal(top1, expected_top1)
    np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits), atol=1e-6)


def test_bfloat16_logits_give_fp32_losses_and_bfloat16_gradients():
    logits, labels = _inputs()
    loss, _, _ = softmax_cross_entropy(logits.astype(jnp.bfloat16), labels)
    assert loss.dtype == jnp.float32
    grad = jax.grad(lambda x: jnp.sum(softmax_cross_entropy(x, labels)[0]))(
        logits.astype(jnp.bfloat16)
    )
    assert grad.dtype == jnp.bfloat16


def test_a_vocabulary_sharded_over_devices_gives_the_same_loss_and_gradient():
    logits, labels = _inputs(vocab=512, padded=0)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    spec = NamedSharding(mesh, PartitionSpec("data", None, "model"))

    def total(x):
        loss, _, top1 = softmax_cross_entropy(x, labels, 0.1)
        return jnp.sum(loss), jnp.sum(top1)

    (value, hits), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(
        jax.device_put(logits, spec)
    )
    (ref_value, ref_hits), ref_grad = jax.value_and_grad(total, has_aux=True)(logits)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    assert int(hits) == int(ref_hits)
    # Sums over the sharded vocabulary add in another order: float rounding only.
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-6)
