"""The eval's masked-LM head: `argmax_hits` is argmax's test (first of tied maxima wins)
and `chunked_eval_stats` gives one pass's nll and hits in any number of batch groups, on
one device and with the batch sharded over eight; BERT's eval sums do not depend on
`model.eval_head_chunks`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_bert_config, synthetic_bert_batch
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mlperf.layers.cross_entropy import argmax_hits, chunked_eval_stats
from mlperf.trainer import build_trainer


def test_argmax_hits_follow_argmax_with_its_tie_rule():
    # Rows of ties: all equal, a tie before / after / at the label, bf16-rounded logits.
    rows = jnp.array(
        [
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [1.0, 3.0, 3.0, 0.0],
            [1.0, 3.0, 3.0, 0.0],
            [3.0, 1.0, 2.0, 3.0],
            [-1e9, 2.0, 1.0, -1e9],
        ]
    )
    labels = jnp.array([0, 2, 1, 2, 3, 1])
    np.testing.assert_array_equal(argmax_hits(rows, labels), jnp.argmax(rows, -1) == labels)
    assert argmax_hits(rows, labels).tolist() == [True, False, True, False, False, True]
    coarse = (jax.random.normal(jax.random.key(0), (64, 300)) * 2).astype(jnp.bfloat16)
    labels = jnp.where(
        jnp.arange(64) % 2 == 0,
        jnp.argmax(coarse, -1),
        jax.random.randint(jax.random.key(1), (64,), 0, 300),
    )
    expected = jnp.argmax(coarse, -1) == labels
    assert 0.3 < float(expected.mean()) < 0.8
    np.testing.assert_array_equal(argmax_hits(coarse, labels), expected)


def _head(batch=16, preds=5, hidden=8, vocab=200):
    keys = jax.random.split(jax.random.key(3), 3)
    h = jax.random.normal(keys[0], (batch, preds, hidden))
    table = jax.random.normal(keys[1], (vocab, hidden)) * 2.0
    labels = jax.random.randint(keys[2], (batch, preds), 0, vocab)
    # Half the labels are their row's argmax, so the hit count sees both outcomes.
    labels = jnp.where(jnp.arange(preds) % 2 == 0, jnp.argmax(h @ table.T, -1), labels)
    return h, table, labels


def _one_pass(h, table, labels):
    logits = h @ table.T
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[..., None], -1)[..., 0]
    return nll, jnp.argmax(logits, -1) == labels


@pytest.mark.parametrize("chunks", [1, 2, 8, 16])
def test_chunked_stats_equal_one_pass(chunks):
    h, table, labels = _head()
    nll, hits = jax.jit(lambda h, y: chunked_eval_stats(h, y, lambda x: x @ table.T, chunks))(
        h, labels
    )
    ref_nll, ref_hits = _one_pass(h, table, labels)
    assert nll.shape == hits.shape == labels.shape
    np.testing.assert_allclose(nll, ref_nll, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(hits, ref_hits)
    assert 0.3 < float(hits.mean()) < 0.9


@pytest.mark.parametrize("chunks", [0, 3])
def test_chunks_that_do_not_divide_the_batch_are_refused(chunks):
    h, table, labels = _head()
    with pytest.raises(ValueError, match=f"eval head chunks {chunks} must be >= 1 and divide"):
        chunked_eval_stats(h, labels, lambda x: x @ table.T, chunks)


def test_a_batch_sharded_over_eight_devices_gives_the_same_stats():
    h, table, labels = _head(batch=32)
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    fn = jax.jit(lambda h, y: chunked_eval_stats(h, y, lambda x: x @ table.T, 4))
    nll, hits = fn(jax.device_put(h, rows), jax.device_put(labels, rows))
    ref_nll, ref_hits = _one_pass(h, table, labels)
    np.testing.assert_allclose(nll, ref_nll, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(hits, ref_hits)


def _bert_eval(chunks: int, host: dict):
    """(eval sums, full masked-LM logits) of a fresh small BERT on the 2 x 4 mesh."""
    config = small_bert_config(**{"model.eval_head_chunks": chunks})
    trainer = build_trainer(config, prepare_data=False)
    params = trainer.init_state()["params"]
    partitioner = trainer.partitioner
    batch = partitioner.host_to_global(host, partitioner.data_layout(16))
    task, model_of = trainer.task, trainer.layout.model
    sums = jax.jit(lambda p, b: task.eval_sums(model_of(p), b))(params, batch)
    logits, _ = jax.jit(lambda p, b: model_of(p)(b))(params, batch)
    return sums, np.asarray(logits)


def test_bert_eval_sums_do_not_depend_on_the_head_chunks():
    host = synthetic_bert_batch(16)
    host["mask"] = (np.arange(16) < 13).astype(np.int32)  # three padded examples
    weights = host["masked_lm_weights"] * host["mask"][:, None]
    # Half the labels become the model's own argmax, so the hit count is not zero.
    _, logits = _bert_eval(1, host)
    even = np.arange(host["masked_lm_ids"].shape[1]) % 2 == 0
    host["masked_lm_ids"] = np.where(even, np.argmax(logits, -1), host["masked_lm_ids"])
    sums = {}
    for chunks in (1, 4):
        sums[chunks], logits = _bert_eval(chunks, host)
        # The same count as argmax over the model's full logits.
        argmax_correct = (np.argmax(logits, -1) == host["masked_lm_ids"]) * weights
        assert int(sums[chunks]["mlm_correct"]) == int(argmax_correct.sum()) >= 16
    assert int(sums[1]["mlm_count"]) == int(sums[4]["mlm_count"]) > 0
    assert int(sums[1]["mlm_correct"]) == int(sums[4]["mlm_correct"])
    np.testing.assert_allclose(sums[1]["mlm_loss_sum"], sums[4]["mlm_loss_sum"], rtol=1e-5)
