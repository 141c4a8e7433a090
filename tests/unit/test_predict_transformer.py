"""A trained tiny Transformer used and exported: `launch.predict translate` decodes as the
evaluator does (token for token), the torch export loads in the peer model and gives our
logits, the stablehlo export runs without the project, bad inputs are one line each."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from predict_helpers import assert_one_line_error, run_cli, run_exported, train_tiny

from launch.export_formats import export
from mlperf.evaluate import Evaluator
from mlperf.trained_model import load_trained, read_run
from mlperf.transformer.predict import Translator, encode, run_vocabulary, until_eos

pytestmark = pytest.mark.slow

EVAL_PAIRS, EVAL_BATCH = 16, 16


def train(root):
    """The tiny Transformer trained a couple of steps in root/run."""
    train_tiny(
        root / "run",
        "transformer.py:tiny",
        f"--config.data.cache_dir={root / 'cache'}",
        "--config.data.tiny_train_pairs=500",
        f"--config.data.tiny_eval_pairs={EVAL_PAIRS}",
        f"--config.train.eval_batch_size={EVAL_BATCH}",
        "--config.eval.max_extra_length=8",  # short decodes
    )
    return root / "run"


def test_transformer_predict_and_export(tmp_path):
    """One test (one training): pytest-xdist would split separate tests of this module
    over its workers, each training again."""
    run = train(tmp_path)
    trained = load_trained(read_run(str(run)))
    translator = Translator(trained, run_vocabulary(trained.config))
    check_translations_equal_the_evaluators_token_for_token(trained, translator)
    check_torch_export_loads_in_the_peer_model_and_gives_our_logits(run, trained, tmp_path)
    check_stablehlo_export_runs_without_the_project(run, translator, tmp_path)
    check_cli_translates_stdin_and_bad_inputs_are_one_line(run, translator, tmp_path)


def _source_lines(config) -> list[str]:
    d = config.data
    folder = f"s{d.seed}_{d.tiny_train_pairs}_{d.tiny_eval_pairs}"
    path = os.path.join(d.cache_dir, "translation_tiny", folder, "eval.en")
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def check_translations_equal_the_evaluators_token_for_token(trained, translator):
    task = trained.task.with_data(trained.task.prepare(0, 1))
    partitioner = trained.partitioner
    layout = partitioner.data_layout(EVAL_BATCH)
    batches = task.eval_data(EVAL_BATCH, layout.shard_index, layout.shard_count)
    evaluator = Evaluator(task, trained.layout, partitioner, batches, EVAL_BATCH)
    outputs = []  # the evaluator's own compiled program, its per-example outputs kept
    for host_batch in batches:
        _, rows = evaluator.compiled(trained.params, partitioner.host_to_global(host_batch, layout))
        outputs.append(partitioner.global_to_host(rows, layout))
    hyps, _ = task.translations(outputs, batches)
    expected = {}
    for out, batch in zip(outputs, batches, strict=True):
        for tokens, index, mask in zip(out["tokens"], batch["index"], batch["mask"], strict=True):
            if mask > 0:
                expected[int(index)] = until_eos(tokens)

    lines = _source_lines(trained.config)
    got = translator.translate(lines, EVAL_BATCH)
    assert len(got) == len(lines) == len(expected) == EVAL_PAIRS
    for i, translation in enumerate(got):
        assert translation.tokens == expected[i], i
    by_index = sorted(expected)
    assert sorted(hyps) == sorted(got[i].text for i in by_index)
    assert all(t.tokens[-1] == 1 for t in got)  # every decode ends with EOS


def check_torch_export_loads_in_the_peer_model_and_gives_our_logits(run, trained, tmp_path):
    import torch

    from launch.bench.peers import TransformerSize, synthetic_translation_batch
    from launch.torch_transformer import TorchTransformer

    paths = export(str(run), "torch", output=str(tmp_path / "torch"))  # restores it itself
    config = json.loads((tmp_path / "torch" / "config.json").read_text())
    peer = TorchTransformer(**config).eval()
    state = torch.load(paths[0])
    assert set(state) == set(peer.state_dict())  # every tensor of the peer, nothing else
    peer.load_state_dict(state, strict=True)

    size = TransformerSize("t", config["vocab_size"], 64, 4, 2, 256, 16, 8, 0.0)
    batch = synthetic_translation_batch(size, seed=3)
    forward = trained.partitioner.jit(lambda p, b: trained.layout.model(p)(b))
    ours = np.asarray(jax.device_get(forward(trained.params, batch)))
    with torch.no_grad():
        theirs = peer(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()})
    real = batch["targets_segmentation"] > 0
    np.testing.assert_allclose(ours[real], theirs.numpy()[real], atol=1e-4, rtol=1e-4)


def check_stablehlo_export_runs_without_the_project(run, translator, tmp_path):
    lines = _source_lines(translator.runner.trained.config)[:8]
    expected = translator.translate(lines, 8)
    encoded = [encode(translator.vocab, line, translator.max_length) for line in lines]
    width = 8 * -(-max(len(ids) for ids in encoded) // 8)  # as translate pads them
    inputs = np.zeros((8, width), np.int32)
    for i, ids in enumerate(encoded):
        inputs[i, : len(ids)] = ids
    folder = tmp_path / "stablehlo"
    trained = translator.runner.trained
    export(
        str(run),
        "stablehlo",
        str(folder),
        batch_size=8,
        input_length=width,
        trained=trained,
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["inputs"]["inputs"] == {"shape": [8, width], "dtype": "int32"}
    assert (folder / "vocab.model").stat().st_size > 0
    out = run_exported(folder, {"inputs": inputs}, tmp_path)
    assert out["tokens"].shape == (8, width + 8)
    for row, t in zip(out["tokens"], expected, strict=True):
        assert until_eos(row) == t.tokens


def check_cli_translates_stdin_and_bad_inputs_are_one_line(run, translator, tmp_path):
    lines = _source_lines(translator.runner.trained.config)[:3]
    proc = run_cli("launch.predict", "translate", f"--workdir={run}", stdin="\n".join(lines))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [t.text for t in translator.translate(lines, 8)]

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    proc = run_cli("launch.predict", "translate", f"--workdir={run}", f"--input={empty}")
    assert_one_line_error(proc, "is empty: nothing to predict")
    not_image = tmp_path / "photo.jpg"
    not_image.write_text("these are words, not pixels")
    proc = run_cli("launch.predict", "detect", f"--workdir={run}", str(not_image))
    assert_one_line_error(proc, "photo.jpg is not an image")
    masks = tmp_path / "masks.txt"
    masks.write_text("the [MASK] sat on the mat.\n")
    proc = run_cli("launch.predict", "fill_mask", f"--workdir={run}", f"--input={masks}")
    assert_one_line_error(proc, "is a transformer checkpoint; `fill_mask` needs a bert run")
