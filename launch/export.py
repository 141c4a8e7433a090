"""Export a run's trained model to the formats other tools load.

    python -m launch.export --workdir W --format FORMAT [--step N] [--output DIR]

Reads checkpoint N (default: the newest) of W/checkpoints (or --checkpoint_dir), on any
process and device count, and writes:

    --format safetensors  BERT: DIR/model.safetensors + config.json under Hugging Face
                          `BertForPreTraining` names (default DIR: W/hf_step<N>)
    --format torch        BERT: the same; Transformer: DIR/transformer.pt, a state_dict of
                          the torch.nn.Transformer peer (launch/torch_transformer.py) and
                          its config.json; SSD and Mask R-CNN: DIR/backbone.pth (a
                          torchvision ResNet state_dict), heads.safetensors and
                          heads_mapping.json (default DIR: W/torch_step<N>)
    --format stablehlo    every model: the inference function serialized with jax.export
                          for --platforms (cpu, cuda, tpu) with its parameters, runnable
                          with JAX alone (default DIR: W/stablehlo_step<N>); static shapes:
                          --batch_size, and --input_length for the Transformer

Mappings and layouts: mlperf/bert/hf_export.py, mlperf/transformer/torch_export.py,
mlperf/detection_export.py, mlperf/stablehlo_export.py.
"""

from __future__ import annotations

import sys

from absl import app, flags

from launch.cli import EXIT_BAD_INPUT, parse_flags
from launch.export_formats import FORMATS, export

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's work directory.", required=True)
_FORMAT = flags.DEFINE_enum("format", "safetensors", FORMATS, "Output format.")
_OUTPUT = flags.DEFINE_string("output", "", "Output directory (default: W/<format>_step<N>).")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step to export (-1: the newest).")
_CHECKPOINT_DIR = flags.DEFINE_string(
    "checkpoint_dir", "", "Checkpoint directory (default: W/checkpoints)."
)
_PLATFORMS = flags.DEFINE_list(
    "platforms", ["cpu"], "stablehlo: platforms to lower for (cpu, cuda, tpu)."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "stablehlo: the program's batch size.")
_INPUT_LENGTH = flags.DEFINE_integer(
    "input_length", 0, "stablehlo, Transformer: source tokens per row (0: data.eval_max_length)."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        paths = export(
            _WORKDIR.value,
            _FORMAT.value,
            _OUTPUT.value,
            _STEP.value,
            _CHECKPOINT_DIR.value,
            _PLATFORMS.value,
            _BATCH_SIZE.value,
            _INPUT_LENGTH.value,
        )
    except (ValueError, OSError) as e:  # OSError: unreadable files, a bucket not reached
        print(f"multipod: error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    print("wrote " + ", ".join(paths))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
