"""BERT sequence packing: a packed row computes what its sequences compute unpacked."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.bert import get_config
from input_pipeline import bert_packing
from mlperf.bert.model import BertConfig, BertForPreTraining
from mlperf.bert.task import BertTask

SEQ, PREDS, VOCAB = 32, 5, 64


def _examples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Unpacked examples of random lengths, with masked positions and NSP labels."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(5, SEQ + 1))
        ex = {
            "input_ids": np.zeros(SEQ, np.int32),
            "input_mask": np.zeros(SEQ, np.int32),
            "segment_ids": np.zeros(SEQ, np.int32),
            "masked_lm_positions": np.zeros(PREDS, np.int32),
            "masked_lm_ids": np.zeros(PREDS, np.int32),
            "masked_lm_weights": np.zeros(PREDS, np.float32),
            "next_sentence_labels": np.int32(rng.integers(0, 2)),
        }
        ex["input_ids"][:n] = rng.integers(5, VOCAB, n)
        ex["input_mask"][:n] = 1
        ex["segment_ids"][n // 2 : n] = 1
        p = min(PREDS, max(1, round(0.15 * n)))
        ex["masked_lm_positions"][:p] = np.sort(rng.choice(np.arange(1, n), p, replace=False))
        ex["masked_lm_ids"][:p] = rng.integers(5, VOCAB, p)
        ex["masked_lm_weights"][:p] = 1.0
        out.append(ex)
    return out


def _stack(examples):
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def _packing(max_sequences: int = 3) -> bert_packing.PackingConfig:
    return bert_packing.PackingConfig(SEQ, PREDS + max_sequences - 1, max_sequences, carry=4)


def _model(**overrides) -> BertForPreTraining:
    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        mlp_dim=64,
        max_position=SEQ,
        dropout_rate=0.0,
        attention_cpu_block_bytes=0,
        **overrides,
    )
    return BertForPreTraining(cfg, rngs=nnx.Rngs(0))


def _task(packing: bool = False) -> BertTask:
    c = get_config("tiny")
    c.data.packing.enabled = packing
    return BertTask(c)


def _loss_and_grads(task, model, batch):
    batch = jax.tree.map(jnp.asarray, batch)
    graphdef, params = nnx.split(model)

    def loss(p):
        value, aux = task.loss(nnx.merge(graphdef, p), batch, task.denominators(batch), None)
        return value, aux

    (value, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return value, aux, grads


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"last_layer_head_positions_only": True, "einsum_gather": False},
        {"scan_layers": True, "last_layer_head_positions_only": True},
    ],
)
def test_packed_loss_and_gradients_equal_unpacked(overrides):
    examples = _examples(12)
    packed, members = bert_packing.pack_examples(examples, _packing())
    assert len(members) < len(examples)  # something was packed
    assert sorted(i for m in members for i in m) == list(range(len(examples)))
    model, task = _model(**overrides), _task()
    loss_u, aux_u, grads_u = _loss_and_grads(task, model, _stack(examples))
    loss_p, aux_p, grads_p = _loss_and_grads(task, model, packed)
    np.testing.assert_allclose(loss_p, loss_u, rtol=2e-6)
    for name in ("mlm_loss", "nsp_loss", "mlm_accuracy"):
        np.testing.assert_allclose(aux_p[name], aux_u[name], rtol=2e-6, atol=1e-7)
    for g_p, g_u in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_u), strict=True):
        np.testing.assert_allclose(g_p, g_u, rtol=1e-4, atol=2e-6)


def test_attention_stays_within_a_packed_sequence():
    examples = _examples(6, seed=1)
    packed, members = bert_packing.pack_examples(examples, _packing())
    row = next(r for r, m in enumerate(members) if len(m) >= 2)
    model = _model()
    batch = {k: jnp.asarray(v[row : row + 1]) for k, v in packed.items()}

    def encoded(b):
        return model.encode(
            b["input_ids"],
            b["segment_ids"],
            b["input_mask"],
            positions=b["positions"],
            sequence_ids=b["sequence_ids"],
        )[0]

    before = encoded(batch)
    changed = dict(batch)
    second = np.asarray(batch["sequence_ids"][0]) == 2
    changed["input_ids"] = jnp.where(second, (batch["input_ids"] + 7) % VOCAB, batch["input_ids"])
    after = encoded(changed)
    first = np.asarray(batch["sequence_ids"][0]) == 1
    np.testing.assert_array_equal(after[first], before[first])
    assert not np.allclose(after[second], before[second])


def test_packed_rows_layout():
    examples = _examples(9, seed=2)
    cfg = _packing()
    packed, members = bert_packing.pack_examples(examples, cfg)
    for r, m in enumerate(members):
        offset = 0
        for s, i in enumerate(m):
            ex, n = examples[i], int(examples[i]["input_mask"].sum())
            tokens = slice(offset, offset + n)
            np.testing.assert_array_equal(packed["input_ids"][r, tokens], ex["input_ids"][:n])
            np.testing.assert_array_equal(packed["positions"][r, tokens], np.arange(n))
            assert (packed["sequence_ids"][r, tokens] == s + 1).all()
            assert packed["cls_positions"][r, s] == offset
            assert packed["next_sentence_labels"][r, s] == ex["next_sentence_labels"]
            offset += n
        assert (packed["sequence_ids"][r, offset:] == 0).all()
        assert packed["next_sentence_weights"][r].sum() == len(m)
    assert packed["masked_lm_weights"].sum() == sum(e["masked_lm_weights"].sum() for e in examples)


def test_step_samples_counts_original_sequences():
    examples = _examples(10, seed=3)
    packed, members = bert_packing.pack_examples(examples, _packing())
    task = _task(packing=True)
    phase = task.phases()[0]
    assert task.step_samples(packed, phase) == 10 != len(members)
    assert _task().step_samples(_stack(examples), phase) == phase.global_batch_size


def test_eval_metrics_unchanged_by_packing():
    examples = _examples(8, seed=4)
    batch = jax.tree.map(jnp.asarray, {**_stack(examples), "mask": np.ones(8, np.float32)})
    model = _model()
    on, off = _task(packing=True), _task()
    phase = on.phases()[0]
    assert on.eval_example_spec(phase) == off.eval_example_spec(phase)
    assert "sequence_ids" in on.example_spec(phase)
    sums_on = jax.device_get(on.eval_sums(model, batch))
    sums_off = jax.device_get(off.eval_sums(model, batch))
    assert on.finalize_eval(sums_on) == off.finalize_eval(sums_off)


class _Source:
    """A random-access training source of examples (what grain reads)."""

    def __init__(self, examples):
        self.examples = examples

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]

    def __repr__(self):
        return f"_Source({len(self.examples)})"


def _iterator(examples, seed=0):
    spec = {k: str(np.asarray(v).dtype) for k, v in examples[0].items()}
    return bert_packing.PackedTrainIterator(_Source(examples), 4, _packing(), seed, 0, 1, spec)


def test_packed_iterator_covers_an_epoch_in_a_seeded_order_and_resumes():
    examples = _examples(40, seed=5)
    for i, ex in enumerate(examples):
        ex["input_ids"][0] = i  # the example's index, read back from the rows
    it = _iterator(examples)
    seen = []
    while len(seen) < 30:
        batch = next(it)
        for r, slot in np.argwhere(batch["next_sentence_weights"] > 0):
            seen.append(int(batch["input_ids"][r, batch["cls_positions"][r, slot]]))
    assert len(seen) == len(set(seen))  # no example twice within the epoch
    assert seen[:8] != sorted(seen[:8])
    state = it.get_state()
    expected = next(it)
    resumed = _iterator(examples)
    resumed.set_state(json.dumps(state).encode())
    np.testing.assert_array_equal(next(resumed)["input_ids"], expected["input_ids"])
    other_seed = next(_iterator(examples, seed=1))
    assert not np.array_equal(other_seed["input_ids"], next(_iterator(examples))["input_ids"])


@pytest.mark.parametrize(
    "key, value",
    [("max_sequences", 0), ("max_predictions", -1), ("max_predictions", 2), ("carry", 0)],
)
def test_bad_packing_config_fails_before_data(key, value):
    c = get_config("tiny")
    c.data.packing.enabled = True
    c.data.packing[key] = value
    with pytest.raises(ValueError, match="data.packing"):
        BertTask(c).prepare(0, 1)


def test_packs_the_reference_tfrecords():
    from input_pipeline.bert_data import build_bert_data

    c = get_config("tiny_tfrecord")
    c.data.packing.enabled = True
    data = build_bert_data(c.data, 32, 5, 0, 1)
    cfg = bert_packing.packing_config(c.data, 32, 5)
    batch = next(data.packed_train_iterator(8, cfg, seed=0))
    assert batch["input_ids"].shape == (8, 32) and batch["cls_positions"].shape == (8, 3)
    examples = [data.train_source[i] for i in range(len(data.train_source))]
    unpacked = bert_packing.padding_fraction(examples, 32)
    assert batch["next_sentence_weights"].sum() > 8  # more sequences than rows
    assert 1.0 - batch["input_mask"].mean() < unpacked
