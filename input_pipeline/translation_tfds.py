"""A TF-free tensorflow-datasets builder over line-aligned parallel text files.

Each split is a pair of files (source, target) with one sentence per line. Lines are
encoded with the shared sentencepiece vocabulary (EOS appended) and stored as
variable-length int32 records {inputs, targets, index} in array_record files, read with
`as_data_source()`. `index` is the line number, so a host can find the reference text
of an eval example for BLEU without shipping strings through the device batch.

Bad input: files with different line counts are an error naming both files and
counts; empty lines and (train) pairs longer than max_length are skipped and counted,
and the counts are logged and kept next to the dataset (filter_summary.json).
The builder's name hashes every parameter and the files' sizes and versions (mtimes;
generations of objects in a bucket: the files may be `gs://` URLs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from input_pipeline import storage, translation_vocab
from input_pipeline.file_lock import file_lock
from input_pipeline.input_errors import InputError

TRAIN_SPLIT = "train"


def read_parallel(src_path: str, tgt_path: str) -> tuple[list[str], list[str]]:
    """Lines of two line-aligned files; a count mismatch is an error naming both."""
    for path in (src_path, tgt_path):
        if not storage.isfile(path):
            raise FileNotFoundError(
                f"parallel text file not found: {path!r} (relative paths are resolved "
                "against data.data_dir)"
            )
    with storage.open_file(src_path, "r", encoding="utf-8") as f:
        src = f.read().splitlines()
    with storage.open_file(tgt_path, "r", encoding="utf-8") as f:
        tgt = f.read().splitlines()
    if len(src) != len(tgt):
        raise InputError(
            f"misaligned parallel files: {src_path!r} has {len(src)} lines but {tgt_path!r} "
            f"has {len(tgt)}; line i of one must translate line i of the other."
        )
    return src, tgt


@dataclasses.dataclass
class FilterSummary:
    """What filtering did to one split."""

    total: int = 0
    kept: int = 0
    empty: int = 0
    too_long: int = 0  # train: skipped; eval: truncated

    def line(self, split: str, max_length: int, truncate: bool) -> str:
        action = "truncated" if truncate else "skipped"
        return (
            f"{split}: kept {self.kept} of {self.total} pairs; skipped {self.empty} with an "
            f"empty side; {action} {self.too_long} longer than {max_length} tokens"
        )


def filter_pairs(
    src_ids: list[list[int]], tgt_ids: list[list[int]], max_length: int, truncate: bool
) -> tuple[list[tuple[int, list[int], list[int]]], FilterSummary]:
    """(index, inputs, targets) of the usable pairs and the counts of what was dropped.

    A side is empty when it holds only EOS. Over-long pairs are skipped (training) or cut
    to max_length with EOS kept last (eval: every reference stays in the BLEU set).
    """
    summary = FilterSummary(total=len(src_ids))
    kept = []
    for i, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        if len(s) <= 1 or len(t) <= 1:
            summary.empty += 1
            continue
        if len(s) > max_length or len(t) > max_length:
            summary.too_long += 1
            if not truncate:
                continue
            s = s[: max_length - 1] + [translation_vocab.EOS_ID] if len(s) > max_length else s
            t = t[: max_length - 1] + [translation_vocab.EOS_ID] if len(t) > max_length else t
        kept.append((i, s, t))
    summary.kept = len(kept)
    return kept, summary


@dataclasses.dataclass(frozen=True)
class TranslationParams:
    """Everything that determines the dataset; its hash names the cached build."""

    splits: tuple[tuple[str, str, str], ...]  # (name, source file, target file)
    vocab_file: str
    max_length: int  # train pairs longer than this (either side, with EOS) are skipped
    eval_max_length: int  # other splits are truncated to this

    def fingerprint(self) -> str:
        files = {}
        for _, src, tgt in self.splits:
            for path in (src, tgt):
                files[storage.resolve(path)] = storage.file_version(path)
        files[self.vocab_file] = storage.file_version(self.vocab_file)
        blob = json.dumps({"params": dataclasses.asdict(self), "files": files}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass(eq=False)
class TranslationConfig(tfds.core.BuilderConfig):
    params: TranslationParams | None = None


class ParallelText(tfds.core.GeneratorBasedBuilder):
    """Tokenised translation pairs from line-aligned text files."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS: list[TranslationConfig] = []  # made at run time

    @property
    def params(self) -> TranslationParams:
        return self.builder_config.params

    def _info(self) -> tfds.core.DatasetInfo:
        features = {
            "inputs": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            "targets": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            "index": tfds.features.Tensor(shape=(), dtype=np.int64),
        }
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager) -> dict[str, Iterator]:
        del dl_manager  # local files only
        p = self.params
        sp = translation_vocab.load_vocab(p.vocab_file)
        generators, summaries = {}, {}
        for name, src_path, tgt_path in p.splits:
            src, tgt = read_parallel(src_path, tgt_path)
            train = name == TRAIN_SPLIT
            limit = p.max_length if train else p.eval_max_length
            pairs, summary = filter_pairs(
                translation_vocab.encode_lines(sp, src),
                translation_vocab.encode_lines(sp, tgt),
                limit,
                truncate=not train,
            )
            if not pairs:
                raise InputError(
                    f"split {name!r} ({src_path!r}, {tgt_path!r}) has no usable pairs: "
                    + summary.line(name, limit, not train)
                )
            message = summary.line(name, limit, not train)
            (logging.warning if summary.empty or summary.too_long else logging.info)(message)
            summaries[name] = {**dataclasses.asdict(summary), "message": message}
            generators[name] = self._generate_examples(pairs)
        os.makedirs(self.data_dir, exist_ok=True)
        with open(os.path.join(self.data_dir, "filter_summary.json"), "w") as f:
            json.dump(summaries, f, indent=1)
        return generators

    def _generate_examples(self, pairs) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        for k, (index, s, t) in enumerate(pairs):
            yield (
                k,
                {
                    "inputs": np.asarray(s, np.int32),
                    "targets": np.asarray(t, np.int32),
                    "index": np.int64(index),
                },
            )


def prepare(params: TranslationParams, data_dir: str) -> ParallelText:
    """Builds the dataset unless cached (safe when several processes build at once)."""
    name = f"h{params.fingerprint()}"

    def make() -> ParallelText:
        config = TranslationConfig(name=name, version=ParallelText.VERSION, params=params)
        return ParallelText(config=config, data_dir=data_dir, file_format="array_record")

    with file_lock(os.path.join(data_dir, "locks", f"{name}.lock")):
        builder = make()
        if not builder.is_prepared():
            logging.info("Building the translation tfds dataset in %s", builder.data_dir)
            builder.download_and_prepare(file_format="array_record")
    return builder


def filter_summaries(builder: ParallelText) -> dict[str, dict]:
    """The per-split filter counts written when the dataset was built."""
    path = os.path.join(builder.data_dir, "filter_summary.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)
