"""A trained tiny BERT used and exported: `launch.predict fill_mask` / `next_sentence` give
the model's own argmax and probabilities (checked with the evaluator's eval step), the
stablehlo export runs without the project and gives the JAX model's logits."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from predict_helpers import PLATFORMS, run_cli, run_exported, train_tiny

from input_pipeline.tokenizer import SPECIAL_TOKENS
from launch.export_formats import export
from mlperf.batch_inference import pad_stack
from mlperf.bert.predict import BadSentenceError, MaskFiller, run_vocab_file
from mlperf.evaluate import Evaluator
from mlperf.trained_model import load_trained, read_run

pytestmark = pytest.mark.slow

WORDS = "sea claw red blue ocean crab shell water night day rock mud food king sand".split()
LINES = [
    "the red crab eats [MASK] food .",
    "[MASK] water and [MASK] sand at night .",
    "the king of the sea .\tthe [MASK] is blue .",
    "a shell on a rock .\tmud and water by day .",
    "[MASK] [MASK] [MASK] .",
]


def _corpus_and_vocab(folder) -> None:
    rng = np.random.default_rng(0)
    with open(folder / "corpus.txt", "w") as f:
        for _ in range(40):
            for _ in range(int(rng.integers(3, 7))):
                f.write(" ".join(rng.choice(WORDS, int(rng.integers(4, 10)))) + " .\n")
            f.write("\n")
    tokens = [*SPECIAL_TOKENS, ".", "the", "a", "of", "is", "and", "at", "by", "on", "eats"]
    (folder / "vocab.txt").write_text("\n".join(tokens + WORDS) + "\n")


def train(root):
    """The tiny BERT on a small corpus and vocabulary, trained a couple of steps."""
    _corpus_and_vocab(root)
    train_tiny(
        root / "run",
        "bert.py:tiny",
        "--config.data.corpus=files",
        f"--config.data.data_dir={root}",
        "--config.data.train_files=('corpus.txt',)",
        "--config.data.vocab_file=vocab.txt",
        "--config.model.vocab_size=32",  # 30 tokens and 2 padding rows, never predicted
        "--config.data.eval_fraction=0.2",
        "--config.data.dupe_factor=1",
        f"--config.data.cache_dir={root / 'cache'}",
        "--config.train.eval_batch_size=32",
        "--config.data.max_eval_examples=32",
    )
    return root / "run"


def test_bert_predict_and_export(tmp_path):
    """One test (one training): pytest-xdist would split separate tests of this module
    over its workers, each training again."""
    run = train(tmp_path)
    vocab = (tmp_path / "vocab.txt").read_text().split()
    trained = load_trained(read_run(str(run)), vocab_size=len(vocab))
    filler = MaskFiller(trained, run_vocab_file(trained.config), top_k=3)
    check_top1_is_the_evaluators_argmax_and_probabilities_the_models(trained, filler)
    check_stablehlo_export_gives_the_models_logits_without_the_project(
        run, trained, filler, tmp_path
    )
    check_cli_fill_mask(run, filler, tmp_path)


def _forward(trained, features):
    batch = pad_stack([f.example for f in features], 8)
    forward = trained.partitioner.jit(lambda p, b: trained.layout.model(p)(b))
    mlm, nsp = jax.device_get(forward(trained.params, batch))
    return batch, np.asarray(mlm), np.asarray(nsp)


def check_top1_is_the_evaluators_argmax_and_probabilities_the_models(trained, filler):
    predictions = filler.predict(LINES, 8)
    features = [filler.featurize(line) for line in LINES]
    assert [p.is_next is not None for p in predictions] == [False, False, True, True, False]
    assert [len(p.masks) for p in predictions] == [1, 2, 1, 0, 3]

    # The eval step scores predict's top-1 tokens as labels: every one is its argmax.
    batch, mlm, nsp = _forward(trained, features)
    batch["masked_lm_ids"] = np.zeros_like(batch["masked_lm_positions"])
    batch["masked_lm_weights"] = np.zeros(batch["masked_lm_positions"].shape, np.float32)
    for i, p in enumerate(predictions):
        for m, candidates in enumerate(p.masks):
            batch["masked_lm_ids"][i, m] = candidates[0].id
            batch["masked_lm_weights"][i, m] = 1.0
    batch["next_sentence_labels"] = np.argmax(nsp, -1).astype(np.int32)
    batch["mask"] = (np.arange(8) < len(LINES)).astype(np.float32)
    metrics = Evaluator(trained.task, trained.layout, trained.partitioner, [batch], 8).evaluate(
        trained.params
    )
    assert metrics["mlm_accuracy"] == 1.0 and metrics["eval_examples"] == len(LINES)

    # The 2 rows past the 30-token vocabulary are padding: never a candidate.
    assert all(c.id < 30 for p in predictions for m in p.masks for c in m)
    # Probabilities: the softmax of the model's logits, top-k in order; P(is next).
    probs = jax.nn.softmax(mlm, axis=-1)
    for i, p in enumerate(predictions):
        for m, candidates in enumerate(p.masks):
            expected = np.sort(np.asarray(probs[i, m]))[::-1][:3]
            got = [c.probability for c in candidates]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
            assert [c.token for c in candidates] == [
                filler.tokenizer.id_to_token(c.id) for c in candidates
            ]
        if p.is_next is not None:
            assert p.is_next == pytest.approx(float(jax.nn.softmax(nsp[i])[0]), abs=1e-6)
    assert "[MASK]" not in predictions[0].filled and predictions[0].filled.startswith("the red")


def check_stablehlo_export_gives_the_models_logits_without_the_project(
    run, trained, filler, tmp_path
):
    folder = tmp_path / "stablehlo"
    export(
        str(run),
        "stablehlo",
        output=str(folder),
        batch_size=8,
        trained=trained,
        platforms=PLATFORMS,
    )
    assert (folder / "vocab.txt").read_text() == (run.parent / "vocab.txt").read_text()
    batch, mlm, nsp = _forward(trained, [filler.featurize(line) for line in LINES])
    out = run_exported(folder, batch, tmp_path, PLATFORMS)
    np.testing.assert_allclose(out["mlm_logits"], mlm, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out["nsp_logits"], nsp, atol=1e-5, rtol=1e-5)


def check_cli_fill_mask(run, filler, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(LINES[:3]) + "\n")
    proc = run_cli("launch.predict", "fill_mask", f"--workdir={run}", f"--input={lines}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    expected = filler.predict(LINES[:3], 8)
    assert [r["text"] for r in records] == LINES[:3]
    for record, p in zip(records, expected, strict=True):
        assert len(record["masks"]) == len(p.masks)
        assert all(len(candidates) == 5 for candidates in record["masks"])  # --top_k
        assert [m[0]["id"] for m in record["masks"]] == [m[0].id for m in p.masks]
        assert record["filled"] == p.filled
    assert records[2]["is_next"] == pytest.approx(expected[2].is_next, abs=1e-6)
    # Lines the model cannot take are named before anything runs.
    with pytest.raises(BadSentenceError, match=r"9 \[MASK\] tokens, more than the model's 5"):
        filler.featurize(" ".join(["[MASK]"] * 9))
    with pytest.raises(BadSentenceError, match="more than the model's sequence length 32"):
        filler.featurize("sea " * 40 + "[MASK]")
