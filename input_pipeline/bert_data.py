"""The BERT pretraining input pipeline's entry point: config -> cached data -> host batches.

Every expensive step (writing the embedded corpus, training a vocab, building the tfds
dataset) is cached on disk under `cache_dir` and runs inside `build_bert_data`, before
training starts:

    <cache_dir>/corpus/stdlib_docstrings_py<X.Y>.txt        embedded default corpus
    <cache_dir>/vocab/wordpiece_<hash>.txt                  trained WordPiece vocab
    <cache_dir>/tfds/bert_pretraining/h<hash>/1.0.0/        array_record train/eval splits
    <cache_dir>/locks/, <cache_dir>/tfds/locks/             fcntl locks for concurrent builds

The input files (corpora, vocab.txt, TFRecords) may be local or in a bucket (`gs://`,
input_files.py); the cache is always a local folder.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from input_pipeline import (
    bert_packing,
    bert_tfds,
    bert_tfrecord,
    documents,
    grain_pipeline,
    input_files,
    pretraining_examples,
    stdlib_corpus,
    storage,
    tokenizer,
)
from input_pipeline.file_lock import file_lock
from input_pipeline.input_errors import InputError

DEFAULT_CACHE_DIR = "~/.cache/multipod"


@dataclasses.dataclass
class BertData:
    """One host's view of the BERT data: sharded training batches and padded eval batches."""

    vocab_size: int
    num_train_examples: int  # the whole train set (all hosts)
    num_eval_examples: int  # the whole eval set (all hosts), before padding
    train_source: Sequence[Any] = dataclasses.field(repr=False)
    eval_source: Sequence[Any] = dataclasses.field(repr=False)
    dtypes: dict[str, str] = dataclasses.field(repr=False)
    shard_index: int = 0
    shard_count: int = 1

    @property
    def num_host_train_examples(self) -> int:
        """Train records in this host's shard (one epoch of its train_iterator)."""
        return grain_pipeline.shard_size(
            self.num_train_examples, self.shard_index, self.shard_count
        )

    def train_iterator(
        self,
        host_batch_size: int,
        seed: int,
        worker_count: int = 0,
        read_threads: int | None = None,
    ):
        """Infinite shuffled host batches of this host's train shard (epochs repeat);
        `worker_count` and `read_threads` as in `grain_pipeline.train_loader`.

        The grain iterator is checkpointable: get_state() / set_state(state).
        """
        loader = grain_pipeline.train_loader(
            self.train_source,
            host_batch_size,
            seed,
            self.shard_index,
            self.shard_count,
            self.dtypes,
            worker_count=worker_count,
            read_threads=read_threads,
        )
        return iter(loader)

    def packed_train_iterator(
        self, host_batch_size: int, packing: bert_packing.PackingConfig, seed: int
    ) -> bert_packing.PackedTrainIterator:
        """Infinite host batches of packed rows (`bert_packing`): this host's examples in
        the same seeded random order, packed online. Checkpointable like train_iterator."""
        return bert_packing.PackedTrainIterator(
            self.train_source,
            host_batch_size,
            packing,
            seed,
            self.shard_index,
            self.shard_count,
            self.dtypes,
        )

    def eval_batches(self, global_batch_size: int) -> list[dict[str, np.ndarray]]:
        """This host's eval batches (global_batch_size // shard_count each, with a mask field)."""
        return grain_pipeline.padded_eval_batches(
            self.eval_source,
            self.num_eval_examples,
            global_batch_size,
            self.shard_index,
            self.shard_count,
            self.dtypes,
        )


def _resolve(path: str, data_dir: str) -> str:
    """A config file path under data.data_dir (local or gs://)."""
    return input_files.resolve(path, data_dir)


def _files_key(paths: Sequence[str], **extra: Any) -> str:
    """Short hash of file paths, sizes, versions and extra settings: a cache key."""
    return input_files.files_key(paths, **extra)


def _train_files(data_cfg, cache_dir: str) -> tuple[str, ...]:
    if data_cfg.corpus == "stdlib":
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        path = os.path.join(cache_dir, "corpus", f"stdlib_docstrings_py{version}.txt")
        if not os.path.isfile(path):
            logging.info("Writing the stdlib docstring corpus to %s", path)
        return (stdlib_corpus.write_stdlib_corpus(path),)
    if data_cfg.corpus != "files":
        raise InputError(f"data.corpus must be 'stdlib' or 'files', got {data_cfg.corpus!r}")
    if not data_cfg.train_files:
        raise InputError("data.corpus='files' needs data.train_files")
    files = tuple(_resolve(p, data_cfg.data_dir) for p in data_cfg.train_files)
    for path in files:
        if not storage.isfile(path):
            raise FileNotFoundError(
                f"training corpus file not found: {path!r} (config key data.train_files; "
                "relative paths are resolved against data.data_dir)"
            )
        documents.check_utf8(path, "data.train_files")
    return files


def _vocab_file(data_cfg, train_files: tuple[str, ...], cache_dir: str) -> str:
    if data_cfg.vocab_file:
        path = _resolve(data_cfg.vocab_file, data_cfg.data_dir)
        tokenizer.check_vocab_file(path)  # names data.vocab_file and what it lacks
        return path
    key = _files_key(train_files, vocab_size=data_cfg.vocab_size, lowercase=data_cfg.lowercase)
    path = os.path.join(cache_dir, "vocab", f"wordpiece_{key}.txt")
    # Under a lock: WordPiece training is not bit-reproducible (huggingface/tokenizers#1794:
    # hash-map order breaks ties), and two processes must not build datasets on two vocabs.
    with file_lock(os.path.join(cache_dir, "locks", f"vocab_{key}.lock")):
        if not os.path.isfile(path):
            logging.info("Training a %d-token WordPiece vocab -> %s", data_cfg.vocab_size, path)
            logging.warning(
                "Trained WordPiece vocabs differ slightly from run to run; on a multi-host run "
                "share data.cache_dir between hosts or set data.vocab_file."
            )
            tokenizer.train_wordpiece(
                list(train_files), data_cfg.vocab_size, path, data_cfg.lowercase
            )
    return path


def _tfrecord_data(
    data_cfg,
    seq_length: int,
    max_predictions: int,
    shard_index: int,
    shard_count: int,
    cache_dir: str,
) -> BertData:
    """BertData over the MLPerf reference's preprocessed TFRecords (read in place)."""
    train, evals, vocab_size = bert_tfrecord.tfrecord_sources(
        data_cfg, seq_length, max_predictions, shard_index, shard_count, cache_dir
    )
    num_eval = len(evals)
    if data_cfg.max_eval_examples:
        num_eval = min(num_eval, int(data_cfg.max_eval_examples))
    spec = pretraining_examples.feature_spec(seq_length, max_predictions)
    data = BertData(
        vocab_size=vocab_size,
        num_train_examples=len(train),
        num_eval_examples=num_eval,
        train_source=train,
        eval_source=evals,
        dtypes={name: dtype for name, (_, dtype) in spec.items()},
        shard_index=shard_index,
        shard_count=shard_count,
    )
    logging.info("BERT data: %s (host %d of %d)", data, shard_index, shard_count)
    return data


def build_bert_data(
    data_cfg, seq_length: int, max_predictions: int, shard_index: int, shard_count: int
) -> BertData:
    """Prepares (or reuses) the cached BERT data and returns this host's view of it.

    data_cfg is the config's `data` ConfigDict (format, corpus, train_files, eval_files, data_dir,
    vocab_file, vocab_size, lowercase, cache_dir, masked_lm_prob, dupe_factor,
    short_seq_prob, seed, eval_fraction, max_eval_examples).
    """
    cache_dir = input_files.local_cache_dir(data_cfg.cache_dir, DEFAULT_CACHE_DIR)
    data_format = data_cfg.get("format", "text")
    if data_format == bert_tfrecord.FORMAT:
        return _tfrecord_data(
            data_cfg, seq_length, max_predictions, shard_index, shard_count, cache_dir
        )
    if data_format != "text":
        raise InputError(
            f"data.format must be 'text' or {bert_tfrecord.FORMAT!r}, got {data_format!r}"
        )
    if data_cfg.vocab_file:  # a bad vocab fails before the corpus is written
        tokenizer.check_vocab_file(_resolve(data_cfg.vocab_file, data_cfg.data_dir))
    train_files = _train_files(data_cfg, cache_dir)
    eval_files = tuple(_resolve(p, data_cfg.data_dir) for p in (data_cfg.eval_files or ()))
    for path in eval_files:
        if not storage.isfile(path):
            raise FileNotFoundError(
                f"eval corpus file not found: {path!r} (config key data.eval_files; "
                "relative paths are resolved against data.data_dir)"
            )
        documents.check_utf8(path, "data.eval_files")
    train_files = _train_files(data_cfg, cache_dir)
    vocab_file = _vocab_file(data_cfg, train_files, cache_dir)
    params = bert_tfds.BertExamplesParams(
        train_files=train_files,
        eval_files=eval_files,
        vocab_file=vocab_file,
        lowercase=bool(data_cfg.lowercase),
        seq_length=int(seq_length),
        max_predictions=int(max_predictions),
        masked_lm_prob=float(data_cfg.masked_lm_prob),
        dupe_factor=int(data_cfg.dupe_factor),
        short_seq_prob=float(data_cfg.short_seq_prob),
        seed=int(data_cfg.seed),
        eval_fraction=float(data_cfg.eval_fraction),
    )
    builder = bert_tfds.prepare(params, os.path.join(cache_dir, "tfds"))
    sources = bert_tfds.data_sources(builder)
    train_source, eval_source = sources[bert_tfds.TRAIN_SPLIT], sources[bert_tfds.EVAL_SPLIT]
    num_eval = len(eval_source)
    if data_cfg.max_eval_examples:
        num_eval = min(num_eval, int(data_cfg.max_eval_examples))
    spec = pretraining_examples.feature_spec(seq_length, max_predictions)
    data = BertData(
        vocab_size=tokenizer.load_wordpiece(vocab_file, params.lowercase).get_vocab_size(),
        num_train_examples=len(train_source),
        num_eval_examples=num_eval,
        train_source=train_source,
        eval_source=eval_source,
        dtypes={name: dtype for name, (_, dtype) in spec.items()},
        shard_index=shard_index,
        shard_count=shard_count,
    )
    logging.info("BERT data: %s (host %d of %d)", data, shard_index, shard_count)
    return data
