"""How much of a BERT config's training rows is padding, unpacked and packed
(input_pipeline/bert_packing.py): one JSON line.

    python -m launch.bench.packing_stats --config configs/bert.py:wikitext \\
        --config.data.data_dir=DIR [--host_batch 32]

Unpacked, each example fills its own `seq_length` row. Packed, the examples of one
epoch go through the training iterator (`PackedTrainIterator`, the seeded order and
rows of `--host_batch`); the line gives the padding fraction of both, the sequences
per packed row (the packed step's sequences per row), and the rows an epoch takes.
"""

from __future__ import annotations

import json

import numpy as np
from absl import app, flags

from input_pipeline import bert_packing
from input_pipeline.bert_data import build_bert_data
from launch.cli import usage_error
from launch.config_flag import CONFIG
from mlperf.validate import ConfigError, check_data_dir

_HOST_BATCH = flags.DEFINE_integer("host_batch", 32, "Packed rows per batch.")


def packing_stats(config, host_batch: int) -> dict:
    """Padding fractions of the first phase's training rows, unpacked and packed."""
    data_cfg = config.data
    seq, preds = int(data_cfg.seq_length), int(data_cfg.max_predictions)
    packing = bert_packing.packing_config(data_cfg, seq, preds)
    if packing is None:  # measure the default packing of a config that has it off
        data_cfg = data_cfg.copy_and_resolve_references()
        data_cfg.packing.enabled = True
        packing = bert_packing.packing_config(data_cfg, seq, preds)
    data = build_bert_data(data_cfg, seq, preds, 0, 1)
    source = data.train_source
    lengths = np.array([np.count_nonzero(source[i]["input_mask"]) for i in range(len(source))])
    iterator = data.packed_train_iterator(host_batch, packing, seed=int(config.seed))
    rows = sequences = tokens = 0
    while sequences < len(lengths):
        batch = next(iterator)
        rows += len(batch["input_ids"])
        sequences += int(batch["next_sentence_weights"].sum())
        tokens += int(batch["input_mask"].sum())
    return {
        "config": f"{config.benchmark}:{config.variant}",
        "train_examples": len(lengths),
        "seq_length": seq,
        "mean_tokens": float(lengths.mean()),
        "padding_unpacked": 1.0 - float(lengths.sum()) / (len(lengths) * seq),
        "padding_packed": 1.0 - tokens / (rows * seq),
        "sequences_per_row": sequences / rows,
        "max_sequences": packing.max_sequences,
        "max_predictions_per_row": packing.max_predictions,
        "host_batch": host_batch,
        "packed_rows_per_epoch": rows,
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        usage_error(f"unexpected arguments: {argv[1:]}")
    config = CONFIG.value
    if config is None or config.benchmark != "bert":
        usage_error("give a BERT config, e.g. --config configs/bert.py:wikitext")
    try:
        check_data_dir(config)
        print(json.dumps(packing_stats(config, _HOST_BATCH.value)), flush=True)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        usage_error(str(e))


if __name__ == "__main__":
    app.run(main)
