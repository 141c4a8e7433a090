"""BERT pretraining data from the MLPerf reference's preprocessed TFRecord files.

`data.format=mlperf_tfrecord`: the training shards (`part-00000-of-00500` ...) and the
10,000-example eval file hold one tf.train.Example per sequence:

    input_ids, input_mask, segment_ids           int64_list [seq_length]
    masked_lm_positions, masked_lm_ids           int64_list [max_predictions]
    masked_lm_weights                            float_list [max_predictions]
    next_sentence_labels                         int64_list [1]

The files are read in place at run time (no conversion), from a local folder or a bucket
(`gs://`, ranged reads: tfrecord.py): each host indexes the files once (offsets cached
under the local `<cache_dir>/tfrecord_index/`) and reads only the records of its rows of
each global batch, in the same process-count-invariant order as every other BERT source
(grain_pipeline.GlobalOrderHostRows over all records of all files, in sorted file order).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from absl import logging

from input_pipeline import input_files, pretraining_examples, storage, tf_example, tfrecord
from input_pipeline.input_errors import InputError

FORMAT = "mlperf_tfrecord"
EVAL_SET_SIZE = 10_000  # the reference's fixed eval set


class BertRecordParser:
    """Serialized Example -> the pipeline's feature dict (checked names, types, lengths)."""

    def __init__(self, seq_length: int, max_predictions: int, vocab_size: int):
        self.spec = pretraining_examples.feature_spec(seq_length, max_predictions)
        self.vocab_size = vocab_size

    def __call__(self, data: bytes, where: str) -> dict[str, np.ndarray]:
        features = tf_example.parse_features(data, self.spec, where)
        for name in ("input_ids", "masked_lm_ids"):
            ids = features[name]
            if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
                raise tf_example.ExampleError(
                    f"{where}: feature {name!r} holds id {int(ids.max())} outside the "
                    f"vocabulary of {self.vocab_size} (data.vocab_size / data.vocab_file)"
                )
        return features


def resolve_files(patterns: Sequence[str], data_dir: str, config_key: str) -> tuple[str, ...]:
    """Sorted files matching the glob patterns (relative ones under data_dir); a pattern
    that matches nothing is an error naming it and the config key."""
    files: list[str] = []
    for pattern in patterns:
        path = input_files.resolve(pattern, data_dir)
        matches = [p for p in storage.glob(path) if storage.isfile(p)]
        if not matches:
            raise FileNotFoundError(
                f"no TFRecord file matches {path!r} (config key {config_key}; relative "
                "paths are resolved against data.data_dir)"
            )
        files.extend(storage.resolve(p) for p in matches)
    if len(set(files)) != len(files):
        raise InputError(f"{config_key} names some files twice: {list(patterns)}")
    return tuple(files)


def vocab_size_of(data_cfg) -> int:
    """Lines of data.vocab_file when set, else data.vocab_size."""
    if data_cfg.vocab_file:
        path = input_files.resolve(data_cfg.vocab_file, data_cfg.data_dir)
        if not storage.isfile(path):
            raise FileNotFoundError(f"vocabulary file not found: {path!r} (data.vocab_file)")
        with storage.open_file(path, "r", encoding="utf-8") as f:
            return sum(1 for _ in f)
    return int(data_cfg.vocab_size)


def tfrecord_sources(
    data_cfg,
    seq_length: int,
    max_predictions: int,
    shard_index: int,
    shard_count: int,
    cache_dir: str,
) -> tuple[tfrecord.TFRecordSource, tfrecord.TFRecordSource, int]:
    """(train source, eval source, vocab size) over the reference TFRecords.

    The first record of each set is decoded here, so a file of the wrong layout fails
    before anything is compiled.
    """
    if not data_cfg.train_files:
        raise InputError(
            "data.format=mlperf_tfrecord needs data.train_files (e.g. 'part-*-of-00500' "
            "with data.data_dir set to the folder of the reference's TFRecords)"
        )
    if not data_cfg.eval_files:
        raise InputError(
            "data.format=mlperf_tfrecord needs data.eval_files (the reference's "
            "10,000-example eval TFRecord file)"
        )
    vocab_size = vocab_size_of(data_cfg)
    parse = BertRecordParser(seq_length, max_predictions, vocab_size)
    train_files = resolve_files(data_cfg.train_files, data_cfg.data_dir, "data.train_files")
    eval_files = resolve_files(data_cfg.eval_files, data_cfg.data_dir, "data.eval_files")
    index_dir = os.path.join(cache_dir, "tfrecord_index")  # local, whatever the inputs
    # Hosts start indexing at different files: with a shared cache_dir each walks about
    # 1/shard_count of them and loads the others' indexes.
    first = shard_index * len(train_files) // shard_count
    train = tfrecord.TFRecordSource(train_files, parse, index_dir, first_file=first)
    evals = tfrecord.TFRecordSource(eval_files, parse, index_dir)
    for name, source in (("training", train), ("eval", evals)):
        if len(source) == 0:
            raise InputError(f"the {name} TFRecord files hold no records: {source.files}")
        source[0]  # noqa: B018 - decodes (and checks) one record of each set up front
    if len(evals) != EVAL_SET_SIZE:
        logging.warning(
            "the eval TFRecords hold %d examples; the MLPerf reference's eval set has %d",
            len(evals),
            EVAL_SET_SIZE,
        )
    logging.info(
        "BERT TFRecords: %d training records in %d files, %d eval records",
        len(train),
        len(train_files),
        len(evals),
    )
    return train, evals, vocab_size
