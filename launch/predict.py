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

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence

from absl import app, flags, logging

from launch.cli import parse_flags, usage_error

VERBS = {
    "translate": ("transformer",),
    "fill_mask": ("bert",),
    "next_sentence": ("bert",),
    "detect": ("ssd", "maskrcnn"),
}

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


def read_lines(path: str) -> list[str]:
    """The input's lines ('-': stdin); a ValueError for an unreadable or empty input."""
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.buffer.read().decode("utf-8")
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not UTF-8 text") from None
    except OSError as e:
        raise ValueError(f"cannot read {name}: {e.strerror or e}") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise ValueError(f"{name} is empty: nothing to predict")
    return lines


def check_lines(lines: Sequence[str], verb: str, name: str) -> None:
    """BERT verbs: every line has what its verb needs (a [MASK]; a tab-separated pair)."""
    from mlperf.bert.predict import MASK

    for number, line in enumerate(lines, 1):
        if verb == "fill_mask" and MASK not in line:
            raise ValueError(f"{name} line {number}: no {MASK} token to fill")
        if verb == "next_sentence" and line.count("\t") != 1:
            raise ValueError(f"{name} line {number}: give two sentences separated by one tab")


def progress_bar(total: int, unit: str, batch: int) -> Callable[[int], None] | None:
    """A progress bar on stderr when the input takes more than one batch."""
    if total <= batch:
        return None
    from tqdm import tqdm

    bar = tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True)
    return bar.update


def write_text(path: str, lines: Sequence[str]) -> None:
    """Lines to `path` ('' or '-': stdout)."""
    text = "".join(line + "\n" for line in lines)
    if path in ("", "-"):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def translate(trained, lines: list[str]) -> list[str]:
    from mlperf.transformer.predict import Translator, run_vocabulary

    translator = Translator(
        trained, run_vocabulary(trained.config), _BEAM_SIZE.value, _LENGTH_PENALTY.value
    )
    rows = translator.runner.batch_size(_BATCH_SIZE.value)
    results = translator.translate(lines, rows, progress_bar(len(lines), "line", rows))
    if _OUTPUT_FORMAT.value == "text":
        return [r.text for r in results]
    return [
        json.dumps({"source": r.source, "translation": r.text, "tokens": list(r.tokens)})
        for r in results
    ]


def fill_mask(trained, vocab_file: str, lines: list[str], verb: str) -> list[str]:
    from mlperf.bert.predict import MaskFiller

    filler = MaskFiller(trained, vocab_file, _TOP_K.value)
    for number, line in enumerate(lines, 1):  # every line checked before anything runs
        try:
            filler.featurize(line)
        except ValueError as e:
            raise ValueError(f"{_input_name()} line {number}: {e}") from None
    rows = filler.runner.batch_size(_BATCH_SIZE.value)
    results = filler.predict(lines, rows, progress_bar(len(lines), "line", rows))
    out = []
    for r in results:
        record: dict = {"text": r.text}
        if verb == "fill_mask":
            record["filled"] = r.filled
            record["masks"] = [[dataclasses.asdict(c) for c in m] for m in r.masks]
        if r.is_next is not None:
            record["is_next"] = r.is_next
        out.append(json.dumps(record, ensure_ascii=False))
    return out


def detect(trained, images, output: str) -> list[str]:
    from mlperf import detection_predict as dp

    if trained.run.benchmark == "ssd":
        from mlperf.ssd.predict import SsdDetector as Detector
    else:
        from mlperf.maskrcnn.predict import MaskRcnnDetector as Detector
    labels, source = dp.run_label_map(trained.task, dp.num_classes(trained))
    print(f"categories: {source}", file=sys.stderr)
    detector = Detector(trained)
    rows = detector.runner.batch_size(_BATCH_SIZE.value)
    found = detector.detect(images, rows, progress_bar(len(images), "image", rows))
    return dp.write_outputs(output, found, labels, _THRESHOLD.value)


def _input_name() -> str:
    return "stdin" if _INPUT.value == "-" else _INPUT.value


def predict(verb: str, inputs: Sequence[str]) -> None:
    """Runs one verb (see the module docstring); ValueError / FileNotFoundError for bad
    input, raised before any model is built where the input alone shows it."""
    from mlperf.trained_model import read_run

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
            check_lines(lines, verb, _input_name())
    run = read_run(_WORKDIR.value, _STEP.value, _CHECKPOINT_DIR.value, VERBS[verb], verb)

    from mlperf import compilation_cache
    from mlperf.trained_model import load_trained

    compilation_cache.enable(compilation_cache.default_directory())
    vocab_file, vocab_size = "", 0
    if run.benchmark == "bert":  # the tokenizer says which rows of the table are real
        from mlperf.bert.predict import run_vocab_file, vocab_size_of

        vocab_file = _VOCAB_FILE.value or run_vocab_file(run.config)
        vocab_size = vocab_size_of(vocab_file, bool(run.config.data.lowercase))
    trained = load_trained(run, [int(n) for n in _ICI_SHAPE.value], vocab_size)
    if verb == "detect":
        output = _OUTPUT.value or os.path.join(_WORKDIR.value, f"detections_step{run.step}")
        paths = detect(trained, images, output)
        print(f"wrote {paths[0]}, {paths[1]} and {len(paths) - 2} pictures", file=sys.stderr)
        return
    if verb == "translate":
        out = translate(trained, lines)
    else:
        out = fill_mask(trained, vocab_file, lines, verb)
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
    except (ValueError, FileNotFoundError) as e:
        usage_error(str(e))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
