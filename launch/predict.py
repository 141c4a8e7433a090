"""Use a trained model: predictions from a run's checkpoint on the devices present.

    python -m launch.predict translate --workdir W [--input FILE] [--output FILE]
        [--beam_size K] [--length_penalty A] [--output_format text|jsonl]
    python -m launch.predict fill_mask --workdir W [--input FILE] [--top_k 5]
    python -m launch.predict next_sentence --workdir W [--input FILE]
    python -m launch.predict detect --workdir W [--output DIR] [--threshold 0.5] IMAGE|DIR...

Every verb takes --step N (default: the newest checkpoint), --checkpoint_dir,
--batch_size and --ici_shape (the mesh, default every device on `data`).

- translate (Transformer): one source line in, one translation out (stdin and stdout by
  default), with the evaluator's beam search and detokenised as the BLEU eval reads it.
- fill_mask (BERT): lines with [MASK] tokens (a tab-separated pair is scored as one
  example); JSON lines with the top-k tokens and probabilities at each mask.
- next_sentence (BERT): `first<TAB>second` lines; JSON lines with P(second follows first).
- detect (SSD, Mask R-CNN): image files (or folders of them); DIR/detections.json (COCO
  results: boxes, scores, categories, RLE masks), DIR/images.json (their COCO images and
  categories) and an annotated DIR/<image>.png each (default DIR: W/detections_step<N>).

Bad input (an empty or unreadable file, an image that is not one, a line the model
cannot take, a checkpoint of another benchmark) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags, logging

from launch.cli import parse_flags, usage_error
from launch.predict_verbs import (
    VERBS,
    check_lines,
    detect,
    fill_mask,
    read_lines,
    translate,
    write_text,
)

_WORKDIR = flags.DEFINE_string("workdir", None, "The run's work directory.")
_STEP = flags.DEFINE_integer("step", -1, "Checkpoint step (-1: the newest).")
_CHECKPOINT_DIR = flags.DEFINE_string("checkpoint_dir", "", "Default: W/checkpoints.")
_INPUT = flags.DEFINE_string("input", "-", "Text verbs: the input file ('-': stdin).")
_OUTPUT = flags.DEFINE_string(
    "output", "", "Text verbs: output file (default stdout); detect: output directory."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Examples per device batch.")
_ICI_SHAPE = flags.DEFINE_list("ici_shape", [], "Mesh shape, e.g. 2,4 (default: -1,1).")
_BEAM_SIZE = flags.DEFINE_integer("beam_size", 0, "translate: beam size (0: the eval's).")
_LENGTH_PENALTY = flags.DEFINE_float(
    "length_penalty", None, "translate: length penalty alpha (default: the eval's)."
)
_OUTPUT_FORMAT = flags.DEFINE_enum(
    "output_format", "text", ["text", "jsonl"], "translate: plain lines or JSON lines."
)
_TOP_K = flags.DEFINE_integer("top_k", 5, "fill_mask: candidates per [MASK].")
_VOCAB_FILE = flags.DEFINE_string(
    "vocab_file", "", "BERT: the run's vocab.txt (default: found from the run's config)."
)
_THRESHOLD = flags.DEFINE_float(
    "threshold", 0.5, "detect: the lowest score drawn in the pictures (the JSON has all)."
)


def predict(verb: str, inputs: Sequence[str]) -> None:
    """Runs one verb with the flags' values (see the module docstring); ValueError or
    FileNotFoundError for bad input, raised before any model is built (before jax is
    imported) where the input alone shows it."""
    input_name = "stdin" if _INPUT.value == "-" else _INPUT.value
    try:
        ici_shape = [int(n) for n in _ICI_SHAPE.value]
    except ValueError:
        raise ValueError(
            f"--ici_shape {','.join(_ICI_SHAPE.value)}: give sizes, e.g. 2,4"
        ) from None
    if verb == "detect":
        from mlperf.detection_predict import image_files, read_images

        if not inputs:
            raise ValueError("detect needs image files or folders after the flags")
        paths = image_files(inputs)
        if not paths:
            raise ValueError(f"no images in {', '.join(inputs)}")
        images = read_images(paths)
    else:
        if inputs:
            raise ValueError(f"unexpected arguments {list(inputs)}: give the text with --input")
        lines = read_lines(_INPUT.value)
        if verb != "translate":
            check_lines(lines, verb, input_name)

    from mlperf import compilation_cache
    from mlperf.trained_model import default_output, load_trained, read_run

    run = read_run(_WORKDIR.value, _STEP.value, _CHECKPOINT_DIR.value, VERBS[verb], verb)
    compilation_cache.enable(compilation_cache.default_directory())
    vocab_file, vocab_size = "", 0
    if run.benchmark == "bert":  # the tokenizer says which rows of the table are real
        from mlperf.bert.predict import run_vocab_file, vocab_size_of

        vocab_file = _VOCAB_FILE.value or run_vocab_file(run.config)
        vocab_size = vocab_size_of(vocab_file, bool(run.config.data.lowercase))
    trained = load_trained(run, ici_shape, vocab_size)
    batch = _BATCH_SIZE.value
    if verb == "detect":
        output = _OUTPUT.value or default_output(_WORKDIR.value, "detections", run.step)
        _, paths = detect(trained, images, output, batch, _THRESHOLD.value)
        print(f"wrote {paths[0]}, {paths[1]} and {len(paths) - 2} pictures", file=sys.stderr)
        return
    if verb == "translate":
        out = translate(
            trained, lines, batch, _BEAM_SIZE.value, _LENGTH_PENALTY.value, _OUTPUT_FORMAT.value
        )
    else:
        out = fill_mask(trained, vocab_file, lines, verb, batch, _TOP_K.value, input_name)
    write_text(_OUTPUT.value, out)


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.ERROR)  # orbax's and tfds' notes on reading: not for users
    if len(argv) < 2 or argv[1] not in VERBS:
        usage_error(f"give a verb first: {', '.join(VERBS)} (then --workdir W ...)")
    if not _WORKDIR.value:
        usage_error("--workdir (the run's work directory) is required")
    if _BATCH_SIZE.value < 1:
        usage_error(f"--batch_size {_BATCH_SIZE.value}: give at least 1")
    try:
        predict(argv[1], argv[2:])
    except (ValueError, OSError) as e:  # OSError: unreadable files, a bucket not reached
        usage_error(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
