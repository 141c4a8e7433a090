"""Pretrained BERT import: the TF-free TF1 checkpoint reader, parity with the logits
TensorFlow / transformers computed on the fixtures (tests/fixtures/make_bert_checkpoints.py),
vocabulary padding, export -> import, one training step against transformers' own, and
the errors for checkpoints that do not fit."""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np
import pytest
from conftest import REPO, small_bert_config, train_steps

from input_pipeline.leveldb_table import TableError, snappy_decompress
from input_pipeline.tf1_checkpoint import CheckpointError, Tf1Checkpoint
from mlperf.bert.model import PADDING_LOGIT
from mlperf.trainer import build_trainer

pytestmark = pytest.mark.xdist_group("checkpoint_import")

FIXTURES = os.path.join(REPO, "tests", "fixtures", "bert_checkpoints")
TF1 = os.path.join(FIXTURES, "tf1", "model.ckpt-5")
HF = os.path.join(FIXTURES, "hf")
VOCAB = 90  # the fixtures' vocabulary; our table has 96 rows unless a test says otherwise


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return dict(np.load(os.path.join(FIXTURES, "expected.npz")))


def fixture_config(checkpoint: str, table: int = 96, **overrides):
    """The fixtures' 2-layer BERT, the vocabulary padded to `table` rows."""
    return small_bert_config(
        **{
            "model.num_layers": 2,
            "model.vocab_size": table,
            "data.vocab_size": VOCAB,
            "model.gelu_approximate": checkpoint.startswith(TF1),
            "init.checkpoint": checkpoint,
            "train.global_batch_size": 4,
            "train.eval_batch_size": 4,
            "mesh.ici_shape": (4, 2),
            **overrides,
        }
    )


def batch_of(expected) -> dict[str, np.ndarray]:
    names = "input_ids input_mask segment_ids masked_lm_positions masked_lm_ids"
    names += " masked_lm_weights next_sentence_labels"
    return {k: expected[k] for k in names.split()}


def forward(config, batch):
    """(trainer, state, masked-LM logits, NSP logits) of the imported model."""
    trainer = build_trainer(config, prepare_data=False)
    state = trainer.init_state()
    fn = trainer.partitioner.jit(lambda p, b: trainer.layout.model(p)(b))
    mlm, nsp = jax.device_get(fn(state["params"], batch))
    return trainer, state, np.asarray(mlm), np.asarray(nsp)


# ---- the TF1 reader ----------------------------------------------------------------------


def test_tf1_reader_lists_and_reads_what_tensorflow_saved():
    ckpt = Tf1Checkpoint(os.path.dirname(TF1))  # a directory: its `checkpoint` file
    assert ckpt.prefix == TF1 and ckpt.num_shards == 1
    assert "bert/encoder/layer_1/attention/self/query/kernel" in ckpt.names()
    assert ckpt.shape("bert/embeddings/word_embeddings") == (VOCAB, 32)
    assert ckpt.read("global_step").dtype == np.int64 and ckpt.read("global_step") == 28252
    assert ckpt.read("cls/seq_relationship/output_weights").shape == (2, 32)


def test_snappy_block_with_an_overlapping_copy():
    # length 12, literal "abcd", then an 8-byte copy from 4 bytes back (overlapping).
    assert snappy_decompress(bytes([12, 0x0C]) + b"abcd" + bytes([0x11, 4])) == b"abcd" * 3


def test_corrupt_data_and_index_are_named(tmp_path):
    for name in os.listdir(os.path.dirname(TF1)):
        shutil.copy(os.path.join(os.path.dirname(TF1), name), tmp_path / name)
    data = tmp_path / "model.ckpt-5.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    entry = Tf1Checkpoint(str(tmp_path / "model.ckpt-5")).entries["bert/pooler/dense/bias"]
    raw[entry.offset] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"data-00000-of-00001: CRC mismatch in bert/pooler"):
        Tf1Checkpoint(str(tmp_path / "model.ckpt-5")).read("bert/pooler/dense/bias")
    index = tmp_path / "model.ckpt-5.index"
    raw = bytearray(index.read_bytes())
    raw[10] ^= 0xFF
    index.write_bytes(bytes(raw))
    with pytest.raises(TableError, match=r"model.ckpt-5.index: CRC mismatch in the block"):
        Tf1Checkpoint(str(tmp_path / "model.ckpt-5"))


# ---- parity with the reference implementations -----------------------------------------


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
@pytest.mark.parametrize("source", ["tf1", "hf"])
def test_imported_bert_reproduces_reference_logits(expected, source, scan):
    path = TF1 if source == "tf1" else HF
    config = fixture_config(path, **{"model.scan_layers": scan})
    _, _, mlm, nsp = forward(config, batch_of(expected))
    np.testing.assert_allclose(mlm[..., :VOCAB], expected[f"{source}_mlm_logits"], atol=1e-4)
    np.testing.assert_allclose(nsp, expected[f"{source}_nsp_logits"], atol=1e-4)
    assert np.all(mlm[..., VOCAB:] == PADDING_LOGIT)  # padding rows are never predicted


def test_vocabulary_padding_changes_no_prediction(expected):
    batch = batch_of(expected)
    exact, _, mlm90, nsp90 = forward(fixture_config(HF, table=VOCAB), batch)
    padded, state, mlm96, nsp96 = forward(fixture_config(HF, table=96), batch)
    assert exact.task.model_config().valid_vocab_size == 0
    assert padded.task.model_config().valid_vocab_size == VOCAB
    np.testing.assert_allclose(mlm96[..., :VOCAB], mlm90, atol=1e-5)
    np.testing.assert_allclose(nsp96, nsp90, atol=1e-5)
    np.testing.assert_array_equal(mlm96.argmax(-1), mlm90.argmax(-1))
    table = np.asarray(jax.device_get(state["params"]["word_embeddings"]["embedding"]))
    assert table.shape == (96, 32) and not table[VOCAB:].any()  # zero rows from the import


# ---- export and import -------------------------------------------------------------------


def test_export_then_import_gives_identical_logits(expected, tmp_path):
    from mlperf.bert.hf_export import export_safetensors

    batch = batch_of(expected)
    trainer, state, mlm, nsp = forward(fixture_config(TF1), batch)
    params = jax.device_get(state["params"])
    paths = export_safetensors(params, trainer.task.model_config(), str(tmp_path / "hf"))
    assert paths[0].endswith("model.safetensors")
    config = fixture_config(str(tmp_path / "hf"), **{"model.gelu_approximate": True})
    _, _, mlm2, nsp2 = forward(config, batch)
    np.testing.assert_array_equal(mlm2, mlm)
    np.testing.assert_array_equal(nsp2, nsp)


def test_one_training_step_matches_transformers(expected):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    batch = batch_of(expected)
    opt = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
    opt.update({"optimizer.warmup_steps": 0, "optimizer.weight_decay": 0.01})
    run = train_steps(fixture_config(HF, **opt), [batch, batch])

    model = transformers.BertForPreTraining.from_pretrained(HF).train()
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if all(p is not q for q in no_decay)]
    c = run.trainer.config.optimizer
    torch_opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": c.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=c.learning_rate,
        betas=(c.b1, c.b2),
        eps=c.eps,
    )
    labels = np.full(batch["input_ids"].shape, -100)
    np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], axis=1)
    inputs = {
        "input_ids": torch.tensor(batch["input_ids"], dtype=torch.long),
        "attention_mask": torch.tensor(batch["input_mask"], dtype=torch.long),
        "token_type_ids": torch.tensor(batch["segment_ids"], dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "next_sentence_label": torch.tensor(batch["next_sentence_labels"], dtype=torch.long),
    }
    losses = []
    for _ in range(2):
        torch_opt.zero_grad()
        loss = model(**inputs).loss
        losses.append(float(loss))
        loss.backward()
        torch_opt.step()
    # Step 1: the imported weights; step 2: after one AdamW update on each side.
    np.testing.assert_allclose(run.losses, losses, rtol=2e-5)
    assert abs(losses[1] - losses[0]) > 1e-3  # the step changed the loss measurably


# ---- checkpoints that do not fit ---------------------------------------------------------


def _copy_without_config(tmp_path) -> str:
    src = os.path.dirname(TF1)
    for name in os.listdir(src):
        if name != "bert_config.json":
            shutil.copy(os.path.join(src, name), tmp_path / name)
    return str(tmp_path / "model.ckpt-5")


def test_shape_mismatch_names_the_variable_and_both_shapes(tmp_path):
    config = fixture_config(_copy_without_config(tmp_path), **{"model.hidden_size": 64})
    trainer = build_trainer(config, prepare_data=False)
    with pytest.raises(ValueError) as e:
        trainer.pretrained()
    message = str(e.value)
    assert "does not match the model config" in message
    assert "bert/embeddings/word_embeddings is (90, 32) in the checkpoint" in message
    assert "the config needs (96, 64)" in message


def test_missing_layer_is_named(tmp_path):
    config = fixture_config(_copy_without_config(tmp_path), **{"model.num_layers": 3})
    with pytest.raises(ValueError, match=r"lacks \d+ variable.*bert/encoder/layer_2/attention"):
        build_trainer(config, prepare_data=False).pretrained()


def test_disagreeing_bert_config_names_the_keys():
    config = fixture_config(
        TF1, **{"model.num_heads": 2, "model.mlp_dim": 128, "model.gelu_approximate": False}
    )
    with pytest.raises(ValueError) as e:
        build_trainer(config, prepare_data=False).pretrained()
    message = str(e.value)
    assert "bert_config.json disagrees with the model config" in message
    assert "num_attention_heads=4 (config: model.num_heads=2)" in message
    assert "intermediate_size=64 (config: model.mlp_dim=128)" in message
    assert "model.gelu_approximate=False" in message


def test_missing_checkpoint_is_one_clear_error(tmp_path):
    config = fixture_config(str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="init.checkpoint=.*does not exist"):
        build_trainer(config, prepare_data=False).pretrained()


# ---- a run from a checkpoint -------------------------------------------------------------


@pytest.mark.slow
def test_run_from_checkpoint_logs_its_starting_eval(tmp_path):
    import json

    from mlperf.train import run

    rng = np.random.default_rng(0)
    words = "the of and to in is for that with as on by be this are it from or an if".split()
    with open(tmp_path / "corpus.txt", "w") as f:
        for _ in range(40):
            for _ in range(int(rng.integers(3, 8))):
                f.write(" ".join(rng.choice(words, int(rng.integers(5, 12)))) + " .\n")
            f.write("\n")
    config = fixture_config(TF1)
    config.data.update(
        corpus="files",
        train_files=(str(tmp_path / "corpus.txt"),),
        vocab_file=os.path.join(FIXTURES, "tf1", "vocab.txt"),
        eval_fraction=0.2,
        cache_dir=str(tmp_path / "cache"),
    )
    config.train.update(steps=2, eval_every_samples=8, log_every_steps=1)
    config.checkpoint.enabled = False
    workdir = tmp_path / "run"
    result = run(config, str(workdir))
    assert result["steps"] == 2
    lines = (workdir / "mllog.txt").read_text().splitlines()
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in lines]
    accuracy = [e for e in events if e["key"] == "eval_accuracy"]
    assert accuracy[0]["metadata"]["epoch_num"] == 0
    order = [e["key"] for e in events]
    assert order.index("run_start") < order.index("eval_accuracy") < order.index("block_start")
    metrics = (workdir / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(x) for x in metrics if '"kind": "eval"' in x]
    assert evals[0]["samples"] == 0 and evals[0]["step"] == 0
    assert evals[0]["mlm_accuracy"] == accuracy[0]["value"]
