"""Transformer task: the 2x4-mesh train step matches one device, the einsum path compiles
without gather/scatter, and bad input (misaligned files, empty / over-long pairs, a
vocabulary without the special ids) gets clear handling."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sentencepiece as spm
from conftest import train_steps

from configs.transformer import get_config
from input_pipeline import translation_tfds, translation_vocab
from input_pipeline.packing import pack_pairs
from mlperf.trainer import build_trainer
from parallel.aot import hlo_op_stats

pytestmark = pytest.mark.xdist_group("transformer")

LENGTH = 16
VOCAB = 100  # the model rounds it up to 128


def small_config(**overrides):
    c = get_config("tiny")
    c.model.update(emb_dim=32, num_heads=4, num_layers=1, mlp_dim=64)
    c.data.update(vocab_size=VOCAB, max_length=LENGTH)
    c.optimizer.update(learning_rate=1e-2, warmup_steps=2)
    c.train.update(global_batch_size=8, steps=10, eval_batch_size=8)
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def packed_batches(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    pairs = 120
    inputs = [rng.integers(3, VOCAB, rng.integers(2, 7)).astype(np.int32) for _ in range(pairs)]
    targets = [rng.integers(3, VOCAB, rng.integers(2, 7)).astype(np.int32) for _ in range(pairs)]
    rows = pack_pairs(inputs, targets, LENGTH, seed=0)
    return [{k: v[8 * i : 8 * i + 8] for k, v in rows.items()} for i in range(n)]


def run_steps(config, devices, batches, compiled_text: list | None = None):
    run = train_steps(config, batches, devices)
    if compiled_text is not None:
        compiled_text.append(run.compiled.as_text())
    return run.losses, run.params()


@pytest.fixture(scope="module")
def mesh_run(devices):
    text: list = []
    batches = packed_batches(2) * 2
    losses, params = run_steps(small_config(), devices, batches, text)
    return losses, params, text[0]


def test_2x4_mesh_training_matches_one_device(devices, mesh_run):
    losses_8, params_8, _ = mesh_run
    batches = packed_batches(2) * 2
    config = small_config(**{"mesh.ici_shape": (1, 1)})
    losses_1, params_1 = run_steps(config, devices[:1], batches)
    assert losses_1[2] < losses_1[0], "training on a batch again should lower its loss"
    np.testing.assert_allclose(losses_8, losses_1, rtol=2e-5)
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(params_8), jax.tree.leaves(params_1), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_einsum_gather_train_step_has_no_gather_or_scatter(devices, mesh_run):
    _, _, text = mesh_run
    assert hlo_op_stats(text)["gather_scatter"] == 0
    # The counter does see the gather path's lookups (lowered only: no compile needed).
    trainer = build_trainer(small_config(einsum_gather=False), devices, prepare_data=False)
    lowered = trainer.lower_train_step(trainer.phases[0]).as_text()
    assert "gather" in lowered


# ---- bad input -----------------------------------------------------------------------------
def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_misaligned_files_name_both_files_and_counts(tmp_path):
    src = _write(tmp_path / "a.en", ["one", "two", "three"])
    tgt = _write(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(ValueError) as err:
        translation_tfds.read_parallel(src, tgt)
    message = str(err.value)
    assert src in message and tgt in message and "3 lines" in message and "has 2" in message


def test_empty_and_overlong_pairs_are_counted_and_skipped():
    eos = translation_vocab.EOS_ID
    src = [[5, 6, eos], [eos], [5, 6, 7, 8, 9, eos], [7, eos], [8, eos]]
    tgt = [[5, eos], [6, eos], [5, eos], [eos], [9, 9, eos]]
    kept, summary = translation_tfds.filter_pairs(src, tgt, max_length=4, truncate=False)
    assert [k[0] for k in kept] == [0, 4]
    assert (summary.total, summary.kept, summary.empty, summary.too_long) == (5, 2, 2, 1)
    assert "kept 2 of 5" in summary.line("train", 4, False)
    # Eval keeps every reference: over-long inputs are cut, EOS last.
    kept, summary = translation_tfds.filter_pairs(src, tgt, max_length=4, truncate=True)
    assert [k[0] for k in kept] == [0, 2, 4] and summary.too_long == 1
    assert kept[1][1] == [5, 6, 7, eos]


def test_vocabulary_without_the_special_ids_is_a_clear_error(tmp_path):
    text = _write(tmp_path / "t.txt", [f"word{i} and more words here" for i in range(200)])
    prefix = str(tmp_path / "default")
    # sentencepiece's own defaults: unk=0, bos=1, eos=2, no pad.
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=prefix, vocab_size=40, minloglevel=2, hard_vocab_limit=False
    )
    with pytest.raises(ValueError, match="pad_id=0 eos_id=1 unk_id=2"):
        translation_vocab.load_vocab(prefix + ".model")
    good = translation_vocab.train_vocab([text], 40, str(tmp_path / "good.model"))
    sp = translation_vocab.load_vocab(good)
    assert (sp.pad_id(), sp.eos_id(), sp.unk_id()) == (0, 1, 2)
    assert translation_vocab.decode_ids(sp, sp.encode("word7 and more") + [1, 9, 9]) == (
        "word7 and more"
    )


def test_rsqrt_schedule_warms_up_linearly_then_decays_as_rsqrt():
    from mlperf.transformer.schedule import rsqrt_schedule
    from mlperf.transformer.task import TransformerTask

    c = get_config("mlperf_v07")
    schedule = TransformerTask(c).schedule()
    base, warmup, hidden = 3.3092157691415953, 664, 1024
    peak = base / np.sqrt(warmup) / np.sqrt(hidden)
    # t is the update count, as in Google's v0.7 code: 0 (rate 0) at the first update.
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(schedule(warmup), peak, rtol=1e-6)
    np.testing.assert_allclose(peak, 4.0132e-3, rtol=1e-4)
    np.testing.assert_allclose(schedule(warmup // 2), peak / 2, rtol=1e-6)
    np.testing.assert_allclose(schedule(4 * warmup), peak / 2, rtol=1e-6)
    assert float(rsqrt_schedule(1.0, 100)(100)) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup_steps"):
        rsqrt_schedule(1.0, 0)


def test_final_bleu_records_accumulate_per_set_and_unknown_sets_are_named(tmp_path):
    import json

    from mlperf.transformer import final_bleu
    from mlperf.transformer.task import TransformerTask

    (tmp_path / "result.json").write_text(json.dumps({"benchmark": "transformer"}))
    final_bleu.record(str(tmp_path), 241, {"test": {"bleu": 20.5}})
    final_bleu.record(str(tmp_path), 241, {"val": {"bleu": 21.0}})
    saved = json.loads((tmp_path / "final_bleu.json").read_text())
    assert saved == {"step": 241, "test": {"bleu": 20.5}, "val": {"bleu": 21.0}}
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["set"]) for x in lines] == [("final_eval", "test"), ("final_eval", "val")]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["final_eval"]["val"]["bleu"] == 21.0 and result["benchmark"] == "transformer"

    c = get_config("multi30k")
    assert set(c.eval.final_sets) == {"val", "test_2016_flickr"}
    with pytest.raises(ValueError, match="unknown final eval sets.*test_2017"):
        final_bleu.evaluate_sets(TransformerTask(c), None, None, None, ["test_2017"])
