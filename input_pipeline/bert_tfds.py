"""A TF-free tensorflow-datasets builder of BERT pretraining examples (array_record files).

The builder config's name is a hash of every parameter and of the input files' sizes and
versions (mtimes; generations of objects in a bucket): a changed parameter or edited
corpus builds a new dataset, an unchanged one reuses the cache. Read it with
`as_data_source()` (tfds.load/as_dataset would need TensorFlow).
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

from input_pipeline import documents as documents_lib
from input_pipeline import pretraining_examples, storage, tokenizer
from input_pipeline.file_lock import file_lock
from input_pipeline.input_errors import InputError

TRAIN_SPLIT = "train"
EVAL_SPLIT = "eval"
_EVAL_SEED_OFFSET = 1_000_003  # eval masks differ from train masks for the same seed


@dataclasses.dataclass(frozen=True)
class BertExamplesParams:
    """Everything that determines the examples; its hash names the cached dataset."""

    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]  # empty: hold out eval_fraction of the train documents
    vocab_file: str
    lowercase: bool = True
    seq_length: int = 128
    max_predictions: int = 20
    masked_lm_prob: float = 0.15
    dupe_factor: int = 1
    short_seq_prob: float = 0.1
    seed: int = 0
    eval_fraction: float = 0.05
    corpus_format: str = "auto"

    def fingerprint(self) -> str:
        """Short hash of the parameters and of the input files' sizes and versions (local
        mtimes, object generations)."""
        files = {}
        for path in (*self.train_files, *self.eval_files, self.vocab_file):
            files[storage.resolve(path)] = storage.file_version(path)
        blob = json.dumps({"params": dataclasses.asdict(self), "files": files}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclasses.dataclass(eq=False)
class BertPretrainingConfig(tfds.core.BuilderConfig):
    """A builder config carrying the example parameters."""

    params: BertExamplesParams | None = None


def split_documents(
    docs: list[list[str]], eval_fraction: float, seed: int
) -> tuple[list[list[str]], list[list[str]]]:
    """Deterministic (train, eval) split of documents; eval gets eval_fraction of them (>= 1)."""
    if not 0.0 < eval_fraction < 1.0:
        raise InputError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if len(docs) < 2:
        raise InputError("need at least 2 documents to hold out an eval set")
    num_eval = min(len(docs) - 1, max(1, round(len(docs) * eval_fraction)))
    held_out = set(np.random.default_rng(seed).permutation(len(docs))[:num_eval].tolist())
    train = [d for i, d in enumerate(docs) if i not in held_out]
    evals = [d for i, d in enumerate(docs) if i in held_out]
    return train, evals


class BertPretraining(tfds.core.GeneratorBasedBuilder):
    """BERT masked-LM + next-sentence examples from plain-text corpora."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS: list[BertPretrainingConfig] = []  # configs are made at run time

    @property
    def params(self) -> BertExamplesParams:
        return self.builder_config.params

    def _info(self) -> tfds.core.DatasetInfo:
        spec = pretraining_examples.feature_spec(
            self.params.seq_length, self.params.max_predictions
        )
        features = {
            name: tfds.features.Tensor(shape=shape, dtype=np.dtype(dtype))
            for name, (shape, dtype) in spec.items()
        }
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Iterator]:
        del dl_manager  # local files only
        p = self.params
        train_docs = documents_lib.read_documents(
            p.train_files, p.corpus_format, config_key="data.train_files"
        )
        if p.eval_files:
            eval_docs = documents_lib.read_documents(
                p.eval_files, p.corpus_format, config_key="data.eval_files"
            )
        else:
            train_docs, eval_docs = split_documents(train_docs, p.eval_fraction, p.seed)
        return {
            TRAIN_SPLIT: self._generate_examples(train_docs, p.dupe_factor, p.seed),
            # One pass for eval: a fixed set of masks, evaluated once each.
            EVAL_SPLIT: self._generate_examples(eval_docs, 1, p.seed + _EVAL_SEED_OFFSET),
        }

    def _generate_examples(
        self, docs: list[list[str]], dupe_factor: int, seed: int
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        p = self.params
        tok = tokenizer.load_wordpiece(p.vocab_file, p.lowercase)
        sentences = [s for doc in docs for s in doc]
        ids = tokenizer.tokenize_lines(tok, sentences)
        tokenised, start = [], 0
        for doc in docs:
            tokenised.append(ids[start : start + len(doc)])
            start += len(doc)
        cfg = pretraining_examples.MaskingConfig(
            seq_length=p.seq_length,
            max_predictions=p.max_predictions,
            masked_lm_prob=p.masked_lm_prob,
            short_seq_prob=p.short_seq_prob,
            dupe_factor=dupe_factor,
        )
        examples = pretraining_examples.create_examples(
            tokenised, cfg, tokenizer.special_ids(tok), tok.get_vocab_size(), seed
        )
        logging.info("BERT examples: %d from %d documents", len(examples), len(docs))
        yield from enumerate(examples)


def make_builder(params: BertExamplesParams, data_dir: str) -> BertPretraining:
    """The builder for params; its dataset lives under data_dir/bert_pretraining/<hash>/."""
    config = BertPretrainingConfig(
        name=f"h{params.fingerprint()}",
        version=BertPretraining.VERSION,
        description=json.dumps(dataclasses.asdict(params), sort_keys=True),
        params=params,
    )
    return BertPretraining(config=config, data_dir=data_dir, file_format="array_record")


def prepare(params: BertExamplesParams, data_dir: str) -> BertPretraining:
    """Builds the dataset unless it is cached (safe when processes build it at once)."""
    name = make_builder(params, data_dir).builder_config.name
    with file_lock(os.path.join(data_dir, "locks", f"{name}.lock")):
        # Made under the lock: a builder made while another process is mid-build would
        # hold dataset info without the splits. download_and_prepare is a no-op when the
        # dataset is complete.
        builder = make_builder(params, data_dir)
        if not builder.is_prepared():
            logging.info("Building BERT tfds dataset in %s", builder.data_dir)
            builder.download_and_prepare(file_format="array_record")
    return builder


def data_sources(builder: BertPretraining) -> dict[str, object]:
    """Split name -> random-access data source (len() and [i] give numpy dicts)."""
    return builder.as_data_source()
