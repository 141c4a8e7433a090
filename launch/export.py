"""Export a run's BERT parameters for Hugging Face transformers.

    python -m launch.export --workdir W --format safetensors [--output DIR] [--step N]

Reads checkpoint N (default: the newest) of W/checkpoints (or --checkpoint_dir) and
writes DIR/model.safetensors + DIR/config.json (default DIR: W/hf_step<N>), loadable
with `transformers.BertForPreTraining.from_pretrained(DIR)`.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import ConfigDict

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's work directory.", required=True)
_FORMAT = flags.DEFINE_enum("format", "safetensors", ["safetensors"], "Output format.")
_OUTPUT = flags.DEFINE_string("output", "", "Output directory (default: W/hf_step<N>).")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step to export (-1: the newest).")
_CHECKPOINT_DIR = flags.DEFINE_string(
    "checkpoint_dir", "", "Checkpoint directory (default: W/checkpoints)."
)


def export(workdir: str, output: str = "", step: int = -1, checkpoint_dir: str = "") -> list[str]:
    """Restores one checkpoint's parameters and writes them in HF layout; returns paths."""
    import jax

    from mlperf.bert.hf_export import export_safetensors
    from mlperf.checkpoint import CheckpointConfig, Checkpointer, checkpoint_metadata
    from mlperf.trainer import build_trainer

    directory = os.path.abspath(checkpoint_dir or os.path.join(workdir, "checkpoints"))
    step, meta = checkpoint_metadata(directory, step, workdir)
    config = ConfigDict(meta["config"])
    if config.benchmark != "bert":
        raise ValueError(f"--format safetensors exports BERT; this run is {config.benchmark!r}")
    # The vocabulary size comes from the checkpoint (no data preparation), and the
    # parameters are gathered on this host's devices whatever mesh wrote them.
    vocab_shape = meta["shapes"]["['params']['word_embeddings']['embedding']"][0]
    config.model.vocab_size = vocab_shape[0]
    config.mesh.ici_shape = (-1,) + (1,) * (len(config.mesh.axes) - 1)
    config.mesh.dcn_shape = (1,) * len(config.mesh.axes)
    trainer = build_trainer(config, prepare_data=False)
    checkpointer = Checkpointer(
        CheckpointConfig(directory), trainer.task.target_metric, read_only=True
    )
    restored = checkpointer.restore_step(step, trainer.layout.abstract_train_state)
    checkpointer.close()
    params = jax.device_get(restored.state["params"])
    output = output or os.path.join(workdir, f"hf_step{step}")
    return export_safetensors(params, trainer.task.model_config(), output)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        paths = export(_WORKDIR.value, _OUTPUT.value, _STEP.value, _CHECKPOINT_DIR.value)
    except (ValueError, FileNotFoundError) as e:
        print(f"multipod: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print("wrote " + ", ".join(paths))


if __name__ == "__main__":
    app.run(main)
