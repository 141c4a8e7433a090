"""The translation input pipeline's entry point: config -> cached data -> host batches.

Expensive steps are cached under `cache_dir` and run before training starts:

    <cache_dir>/translation_tiny/s<seed>_<n>_<m>/{train,eval}.{en,de}   embedded tiny task
    <cache_dir>/vocab/spm_<hash>.model                                  trained vocabulary
    <cache_dir>/tfds/parallel_text/h<hash>/1.0.0/                       tokenised splits

The input files (parallel text, vocabularies, TFRecords) may be local or in a bucket
(`gs://`, input_files.py); the cache is always a local folder.

Training rows are packed (input_pipeline/packing.py) once, in a seeded order, and fed
through grain in the process-count-invariant global order of
`grain_pipeline.GlobalOrderHostRows`; eval batches are padded to whole global batches.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
from absl import logging

from input_pipeline import (
    grain_pipeline,
    input_files,
    packing,
    storage,
    translation_tfds,
    translation_tfrecord,
    translation_tiny,
    translation_vocab,
)
from input_pipeline.file_lock import file_lock
from input_pipeline.input_errors import InputError
from input_pipeline.subword_vocab import SubwordVocab

DEFAULT_CACHE_DIR = "~/.cache/multipod"
EVAL_FIELDS = ("inputs", "targets", "index")


class EvalRecords:
    """Eval pairs padded to fixed lengths, as a random-access source of numpy dicts."""

    def __init__(self, records: Sequence[dict[str, Any]], length: int):
        n = len(records)
        self.inputs = np.zeros((n, length), np.int32)
        self.targets = np.zeros((n, length), np.int32)
        self.index = np.zeros((n,), np.int32)
        for i, r in enumerate(records):
            self.inputs[i, : len(r["inputs"])] = r["inputs"]
            self.targets[i, : len(r["targets"])] = r["targets"]
            self.index[i] = int(r["index"])

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"inputs": self.inputs[i], "targets": self.targets[i], "index": self.index[i]}


@dataclasses.dataclass
class TranslationData:
    """One host's view of the translation data."""

    # sentencepiece (text format) or the reference's subword vocabulary (mlperf_tfrecord)
    vocab: spm.SentencePieceProcessor | SubwordVocab = dataclasses.field(repr=False)
    vocab_size: int
    train_rows: packing.PackedRows | None = dataclasses.field(repr=False)  # None: eval only
    eval_records: EvalRecords = dataclasses.field(repr=False)
    references: dict[int, str] = dataclasses.field(repr=False)  # line index -> target text
    eval_length: int
    num_eval_examples: int
    summaries: dict[str, dict] = dataclasses.field(repr=False)

    def decode(self, ids) -> str:
        """Text of a decoded sequence: the ids before the first EOS, padding dropped."""
        if isinstance(self.vocab, SubwordVocab):
            return self.vocab.decode_ids(ids)
        return translation_vocab.decode_ids(self.vocab, ids)

    def train_iterator(self, host_batch_size: int, seed: int, shard_index: int, shard_count: int):
        """Endless host batches of packed rows (checkpointable grain iterator)."""
        if self.train_rows is None:
            raise ValueError("this TranslationData is for evaluation only (with_train=False)")
        dtypes = {name: "int32" for name in packing.PACKED_FIELDS}
        loader = grain_pipeline.train_loader(
            self.train_rows, host_batch_size, seed, shard_index, shard_count, dtypes
        )
        return iter(loader)

    def eval_batches(
        self, global_batch_size: int, shard_index: int, shard_count: int
    ) -> list[dict[str, np.ndarray]]:
        """This host's eval batches, padded to whole global batches (field `mask`)."""
        return grain_pipeline.padded_eval_batches(
            self.eval_records,
            self.num_eval_examples,
            global_batch_size,
            shard_index,
            shard_count,
            {"inputs": "int32", "targets": "int32", "index": "int32"},
        )


def _resolve(path: str, data_dir: str) -> str:
    """A config file path under data.data_dir (local or gs://)."""
    return input_files.resolve(path, data_dir)


def _pair(files: Sequence[str], data_dir: str, key: str) -> tuple[str, str]:
    """(source, target) paths of a config key; a missing file is one line naming it."""
    if len(files) != 2:
        raise InputError(f"{key} must be (source file, target file), got {tuple(files)!r}")
    pair = _resolve(files[0], data_dir), _resolve(files[1], data_dir)
    for path in pair:
        if not storage.isfile(path):
            raise FileNotFoundError(
                f"parallel text file not found: {path!r} (config key {key}; relative paths "
                "are resolved against data.data_dir)"
            )
    return pair


def _files_key(paths: Sequence[str], **extra: Any) -> str:
    return input_files.files_key(paths, **extra)


def _vocab_file(data_cfg, train_pair: tuple[str, str], cache_dir: str) -> str:
    if data_cfg.vocab_file:
        path = _resolve(data_cfg.vocab_file, data_cfg.data_dir)
        translation_vocab.load_vocab(path)  # clear errors for a missing file or bad ids
        return path
    model_type = data_cfg.get("vocab_type", "unigram")
    key = _files_key(train_pair, vocab_size=data_cfg.vocab_size, model_type=model_type)
    path = os.path.join(cache_dir, "vocab", f"spm_{key}.model")
    with file_lock(os.path.join(cache_dir, "locks", f"spm_{key}.lock")):
        if not os.path.isfile(path):
            logging.info("Training a %d-piece sentencepiece vocab -> %s", data_cfg.vocab_size, path)
            translation_vocab.train_vocab(list(train_pair), data_cfg.vocab_size, path, model_type)
    return path


def _split_files(data_cfg, cache_dir: str) -> dict[str, tuple[str, str]]:
    """name -> (source file, target file) for train and eval."""
    if data_cfg.corpus == "tiny":
        n, m, seed = data_cfg.tiny_train_pairs, data_cfg.tiny_eval_pairs, data_cfg.seed
        out_dir = os.path.join(cache_dir, "translation_tiny", f"s{seed}_{n}_{m}")
        with file_lock(os.path.join(cache_dir, "locks", f"tiny_s{seed}_{n}_{m}.lock")):
            if not os.path.isfile(os.path.join(out_dir, "eval.de")):
                translation_tiny.write_tiny_corpus(out_dir, n, m, seed)
        return {
            "train": (os.path.join(out_dir, "train.en"), os.path.join(out_dir, "train.de")),
            "eval": (os.path.join(out_dir, "eval.en"), os.path.join(out_dir, "eval.de")),
        }
    if data_cfg.corpus != "files":
        raise InputError(f"data.corpus must be 'tiny' or 'files', got {data_cfg.corpus!r}")
    return {
        "train": _pair(data_cfg.train_files, data_cfg.data_dir, "data.train_files"),
        "eval": _pair(data_cfg.eval_files, data_cfg.data_dir, "data.eval_files"),
    }


def _from_tfrecords(vocab, rows, records: list, references: dict) -> TranslationData:
    """TranslationData over records read from the reference's TFRecords."""
    # Sorted by input length, as the text path: each eval batch's beam search ends sooner.
    records.sort(key=lambda r: (len(r["inputs"]), int(r["index"])))
    longest = max(max(len(r["inputs"]), len(r["targets"])) for r in records)
    eval_length = int(8 * math.ceil(longest / 8))
    return TranslationData(
        vocab=vocab,
        vocab_size=len(vocab),
        train_rows=rows,
        eval_records=EvalRecords(records, eval_length),
        references={int(r["index"]): references[int(r["index"])] for r in records},
        eval_length=eval_length,
        num_eval_examples=len(records),
        summaries={},
    )


def build_translation_data(
    data_cfg, eval_split: str = "eval", with_train: bool = True
) -> TranslationData:
    """Prepares (or reuses) the cached data and returns it (all hosts build the same);
    with_train=False skips packing the training rows (evaluation only).

    data.format=mlperf_tfrecord reads the MLPerf reference's TFRecords instead
    (input_pipeline/translation_tfrecord.py).

    data_cfg keys: format (text/mlperf_tfrecord), corpus (tiny/files), data_dir, train_files,
    eval_files, vocab_file, vocab_size, vocab_type, max_length, eval_max_length, pack, seed,
    cache_dir, max_eval_examples, tiny_train_pairs, tiny_eval_pairs.
    """
    cache_dir = input_files.local_cache_dir(data_cfg.cache_dir, DEFAULT_CACHE_DIR)
    data_format = data_cfg.get("format", "text")
    if data_format == translation_tfrecord.FORMAT:
        return _from_tfrecords(*translation_tfrecord.read(data_cfg, cache_dir, with_train))
    if data_format != "text":
        raise InputError(
            f"data.format must be 'text' or {translation_tfrecord.FORMAT!r}, got {data_format!r}"
        )
    files = _split_files(data_cfg, cache_dir)
    vocab_file = _vocab_file(data_cfg, files["train"], cache_dir)
    params = translation_tfds.TranslationParams(
        splits=tuple((name, src, tgt) for name, (src, tgt) in sorted(files.items())),
        vocab_file=vocab_file,
        max_length=int(data_cfg.max_length),
        eval_max_length=int(data_cfg.eval_max_length),
    )
    builder = translation_tfds.prepare(params, os.path.join(cache_dir, "tfds"))
    summaries = translation_tfds.filter_summaries(builder)
    for summary in summaries.values():
        logging.info("translation data: %s", summary["message"])
    sources = builder.as_data_source()

    rows = None
    if with_train:
        train_source = sources[translation_tfds.TRAIN_SPLIT]
        train = [train_source[i] for i in range(len(train_source))]
        pairs = ([r["inputs"] for r in train], [r["targets"] for r in train])
        if data_cfg.pack:
            arrays = packing.pack_pairs(*pairs, int(data_cfg.max_length), seed=int(data_cfg.seed))
        else:
            arrays = packing.unpacked_rows(*pairs, int(data_cfg.max_length))
        rows = packing.PackedRows(arrays, f"{builder.builder_config.name}/pack={data_cfg.pack}")
        logging.info(
            "translation train: %d pairs in %d rows of %d tokens (%.0f%% of target slots used)",
            len(train),
            len(rows),
            data_cfg.max_length,
            100 * rows.efficiency(),
        )

    eval_source = sources[eval_split]
    records = [eval_source[i] for i in range(len(eval_source))]
    if data_cfg.max_eval_examples:  # a fixed subset: the first N lines of the eval files
        records = records[: int(data_cfg.max_eval_examples)]
    # Sorted by input length, so that each eval batch holds sentences of similar length and
    # its beam search stops when they are done instead of waiting for one long sentence.
    # BLEU does not depend on the order (references are looked up by line index).
    records.sort(key=lambda r: (len(r["inputs"]), int(r["index"])))
    # Eval inputs are padded to the longest one, rounded up to 8 (static shapes).
    longest = max(max(len(r["inputs"]), len(r["targets"])) for r in records)
    eval_length = int(8 * math.ceil(longest / 8))
    with storage.open_file(files[eval_split][1], "r", encoding="utf-8") as f:
        target_lines = f.read().splitlines()
    references = {int(r["index"]): target_lines[int(r["index"])] for r in records}
    vocab = translation_vocab.load_vocab(vocab_file)
    return TranslationData(
        vocab=vocab,
        vocab_size=vocab.get_piece_size(),
        train_rows=rows,
        eval_records=EvalRecords(records, eval_length),
        references=references,
        eval_length=eval_length,
        num_eval_examples=len(records),
        summaries=summaries,
    )
