"""The work behind `python -m launch.predict` (launch/predict.py), callable without the
command line: reading and checking the inputs, and each verb's outputs from a restored
model (mlperf.trained_model.TrainedModel).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence

# Each verb and the benchmarks whose checkpoints it takes.
VERBS = {
    "translate": ("transformer",),
    "fill_mask": ("bert",),
    "next_sentence": ("bert",),
    "detect": ("ssd", "maskrcnn"),
}


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


MASK = "[MASK]"  # BERT's mask token (input_pipeline.tokenizer.SPECIAL_TOKENS)


def check_lines(lines: Sequence[str], verb: str, name: str) -> None:
    """BERT verbs: every line has what its verb needs (a [MASK]; a tab-separated pair)."""
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


def translate(
    trained,
    lines: list[str],
    batch_size: int,
    beam_size: int = 0,
    length_penalty: float | None = None,
    output_format: str = "text",
) -> list[str]:
    """Output lines of `translate`: the translations, or JSON lines with their tokens."""
    from mlperf.transformer.predict import Translator, run_vocabulary

    vocab = run_vocabulary(trained.config)
    translator = Translator(trained, vocab, beam_size, length_penalty)
    rows = translator.runner.batch_size(batch_size)
    results = translator.translate(lines, rows, progress_bar(len(lines), "line", rows))
    if output_format == "text":
        return [r.text for r in results]
    return [
        json.dumps({"source": r.source, "translation": r.text, "tokens": list(r.tokens)})
        for r in results
    ]


def fill_mask(
    trained,
    vocab_file: str,
    lines: list[str],
    verb: str,
    batch_size: int,
    top_k: int = 5,
    input_name: str = "the input",
) -> list[str]:
    """JSON output lines of `fill_mask` (top-k per [MASK]) or `next_sentence` (is_next)."""
    from mlperf.bert.predict import MaskFiller

    filler = MaskFiller(trained, vocab_file, top_k)
    for number, line in enumerate(lines, 1):  # every line checked before anything runs
        try:
            filler.featurize(line)
        except ValueError as e:
            raise ValueError(f"{input_name} line {number}: {e}") from None
    rows = filler.runner.batch_size(batch_size)
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


def detect(
    trained, images, output: str, batch_size: int, threshold: float = 0.5
) -> tuple[list, list[str]]:
    """Every image's detections (mlperf.detection_predict.Detections), written into
    `output` (mlperf.detection_predict.write_outputs); returns them and the paths."""
    from mlperf import detection_predict as dp

    if trained.run.benchmark == "ssd":
        from mlperf.ssd.predict import SsdDetector as Detector
    else:
        from mlperf.maskrcnn.predict import MaskRcnnDetector as Detector
    labels, source = dp.run_label_map(trained.task, dp.num_classes(trained))
    print(f"categories: {source}", file=sys.stderr)
    detector = Detector(trained)
    rows = detector.runner.batch_size(batch_size)
    found = detector.detect(images, rows, progress_bar(len(images), "image", rows))
    return found, dp.write_outputs(output, found, labels, threshold)
