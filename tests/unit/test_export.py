"""HF export round trip: a checkpointed BERT exported with `launch.export` loads in
transformers' BertForPreTraining and gives our masked-LM and next-sentence logits."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, cpu_env, small_bert_config, synthetic_bert_batch

from mlperf.checkpoint import CheckpointConfig, Checkpointer
from mlperf.trainer import build_trainer

pytestmark = pytest.mark.xdist_group("export")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A 2-layer BERT with every parameter perturbed (no zero biases or unit scales that
    would hide a wrong mapping), checkpointed on the 2x4 mesh and exported."""
    workdir = tmp_path_factory.mktemp("export")
    config = small_bert_config(**{"model.num_layers": 2})
    trainer = build_trainer(config, prepare_data=False)
    state = trainer.init_state()
    leaves, treedef = jax.tree.flatten(state["params"])
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    state["params"] = jax.device_put(
        jax.tree.unflatten(treedef, noisy), trainer.layout.state_shardings["params"]
    )
    checkpointer = Checkpointer(CheckpointConfig(str(workdir / "checkpoints")), "mlm_accuracy")
    meta = {"config": json.loads(config.to_json_best_effort())}
    checkpointer.save(7, state, meta, b"{}")
    checkpointer.close()
    proc = subprocess.run(
        [sys.executable, "-m", "launch.export", "--workdir", str(workdir)]
        + ["--format", "safetensors"],
        cwd=REPO,
        env=cpu_env(1),  # another device count than the writer's: params are gathered
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir / "hf_step7", trainer, state["params"]


def test_export_writes_safetensors_and_config(exported):
    out, trainer, _ = exported
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 32
    assert config["vocab_size"] == 96 and config["hidden_act"] == "gelu"
    assert (out / "model.safetensors").stat().st_size > 0


def test_transformers_loads_it_and_matches_our_logits(exported):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out, trainer, params = exported
    model, info = transformers.BertForPreTraining.from_pretrained(
        str(out), output_loading_info=True
    )
    # Nothing left at random init: every HF tensor came from the file (or is tied to one).
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert set(info["missing_keys"]) <= tied and not info["unexpected_keys"], info
    model.eval()
    batch = synthetic_bert_batch(8, seq=16, preds=4, vocab=96, seed=3)
    forward = trainer.partitioner.jit(lambda p, b: trainer.layout.model(p)(b))
    ours_mlm, ours_nsp = jax.device_get(forward(params, batch))
    with torch.no_grad():
        theirs = model(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
            token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
        )
    logits = theirs.prediction_logits.numpy()  # [B, L, V]: every position
    positions = batch["masked_lm_positions"]
    theirs_mlm = np.take_along_axis(logits, positions[..., None], axis=1)
    np.testing.assert_allclose(ours_mlm, theirs_mlm, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(
        ours_nsp, theirs.seq_relationship_logits.numpy(), atol=1e-4, rtol=1e-4
    )
