"""WMT En-De from the MLPerf Transformer's preprocessed TFRecord files (no TensorFlow).

`data.format=mlperf_tfrecord`: every record is a tf.train.Example with variable-length
int64_list features `inputs` and `targets` (subword ids of data.vocab_file, each sequence
ending in EOS = 1). Two layouts exist and both are read:

  * unpacked, one pair a record: the MLPerf reference's `wmt32k-encoded-{train,dev}-*`
    and t2t's `translate_ende_wmt32k-{train,dev}-*`;
  * packed (t2t's `translate_ende_wmt32k_packed-*`, the TPU submissions' data): several
    pairs a record, with `inputs_segmentation`, `inputs_position`, `targets_segmentation`,
    `targets_position` (segment 1, 2, ... per pair, 0 = padding; positions restart at 0).

Training files of packed records are read in place at random positions (records indexed
once, offsets cached under `<cache_dir>/tfrecord_index/`), each record padded to
data.max_length; a pair (segment) that does not fit is dropped from its row, as the
reference drops pairs longer than its maximum length. Unpacked training files are read
whole at start-up, pairs longer than data.max_length skipped (counted in the log) and the
rest packed like the text path (data.pack). Either way the rows are fed in the
process-count-invariant global order of grain_pipeline.GlobalOrderHostRows.

The eval files are read whole (packed records are split back into their pairs); the
references for BLEU are the eval targets decoded with the subword vocabulary. With
data.eval_text_files = (source, reference) text files the eval is the reference's own:
the source lines are encoded with the vocabulary and scored against the reference lines.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from absl import logging

from input_pipeline import input_files, packing, tf_example, tfrecord
from input_pipeline.bert_tfrecord import resolve_files
from input_pipeline.input_errors import InputError
from input_pipeline.subword_vocab import EOS_ID, SubwordVocab

FORMAT = "mlperf_tfrecord"
SIDES = ("inputs", "targets")
PACKING_FEATURES = tuple(f"{s}_{k}" for s in SIDES for k in ("segmentation", "position"))


def parse_pair_record(data: bytes, where: str, vocab_size: int) -> dict[str, np.ndarray]:
    """A serialized Example -> {inputs, targets[, the four packing features]} (int32).

    Checks names and types (one line naming the feature, what the record holds and what
    was expected), that packing features come all together with their side's length, and
    that ids are inside the vocabulary.
    """
    features = tf_example.parse_example(data, where)
    packed = [name for name in PACKING_FEATURES if name in features]
    names = SIDES + (PACKING_FEATURES if packed else ())
    out = {}
    for name in names:
        want = "int64_list of subword ids" if name in SIDES else "int64_list"
        if name not in features:
            extra = " (a packed record holds all four packing features)" if packed else ""
            raise tf_example.ExampleError(
                f"{where}: feature {name!r} missing (expected {want}){extra}; the record has "
                f"{sorted(features)}"
            )
        kind, values = features[name]
        if kind != tf_example.INT64:
            raise tf_example.ExampleError(f"{where}: feature {name!r} is a {kind}, expected {want}")
        out[name] = np.asarray(values, np.int64)
    for side in SIDES:
        ids = out[side]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            bad = int(ids.max()) if ids.max() >= vocab_size else int(ids.min())
            raise tf_example.ExampleError(
                f"{where}: feature {side!r} holds id {bad} outside the vocabulary of "
                f"{vocab_size} subwords (data.vocab_file)"
            )
        for kind in ("segmentation", "position") if packed else ():
            name = f"{side}_{kind}"
            if out[name].size != ids.size:
                raise tf_example.ExampleError(
                    f"{where}: feature {name!r} has {out[name].size} values, expected one per "
                    f"id of {side!r} ({ids.size})"
                )
    return {k: v.astype(np.int32) for k, v in out.items()}


def record_pairs(record: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (inputs, targets) pairs of a record: one when unpacked, one per segment when
    packed (segment ids 1, 2, ...; 0 is padding)."""
    if "inputs_segmentation" not in record:
        return [(record["inputs"], record["targets"])]
    pairs = []
    in_seg, tg_seg = record["inputs_segmentation"], record["targets_segmentation"]
    for seg in np.unique(np.concatenate([in_seg, tg_seg])):
        if seg > 0:
            pairs.append((record["inputs"][in_seg == seg], record["targets"][tg_seg == seg]))
    return pairs


class PackedRecordRows:
    """Serialized packed (or unpacked) Example -> one training row of `length` tokens
    (packing.PACKED_FIELDS). Segments that do not fit in `length` are dropped."""

    def __init__(self, length: int, vocab_size: int):
        self.length = length
        self.vocab_size = vocab_size

    def __call__(self, data: bytes, where: str) -> dict[str, np.ndarray]:
        pairs = record_pairs(parse_pair_record(data, where, self.vocab_size))
        row = {name: np.zeros(self.length, np.int32) for name in packing.PACKED_FIELDS}
        used = {"inputs": 0, "targets": 0}
        segment = 0
        for src, tgt in pairs:
            if used["inputs"] + len(src) > self.length or used["targets"] + len(tgt) > self.length:
                continue
            segment += 1
            for side, seq in (("inputs", src), ("targets", tgt)):
                start, n = used[side], len(seq)
                row[side][start : start + n] = seq
                row[f"{side}_segmentation"][start : start + n] = segment
                row[f"{side}_position"][start : start + n] = np.arange(n)
                used[side] += n
        return row


def _read_pairs(source: tfrecord.TFRecordSource) -> list[tuple[np.ndarray, np.ndarray]]:
    pairs = []
    for i in range(len(source)):
        pairs.extend(record_pairs(source[i]))
    return pairs


def vocab_of(data_cfg) -> SubwordVocab:
    """The subword vocabulary of data.vocab_file (relative to data.data_dir)."""
    if not data_cfg.vocab_file:
        raise InputError(
            "data.format=mlperf_tfrecord needs data.vocab_file, the subword vocabulary the "
            "TFRecords were encoded with (vocab.translate_ende_wmt32k.32768.subwords)"
        )
    return SubwordVocab(input_files.resolve(data_cfg.vocab_file, data_cfg.data_dir))


def train_rows(data_cfg, files: Sequence[str], vocab_size: int, index_dir: str):
    """Training rows: records in place (packed files) or pairs packed at start-up."""
    length = int(data_cfg.max_length)
    probe = tfrecord.TFRecordSource(
        files, lambda d, w: parse_pair_record(d, w, vocab_size), index_dir
    )
    if len(probe) == 0:
        raise InputError(f"the training TFRecord files hold no records: {list(files)}")
    if "inputs_segmentation" in probe[0]:  # packed: random access, nothing held in memory
        rows = tfrecord.TFRecordSource(files, PackedRecordRows(length, vocab_size), index_dir)
        logging.info("WMT TFRecords: %d packed training rows in %d files", len(rows), len(files))
        return rows
    pairs = _read_pairs(probe)
    kept = [(s, t) for s, t in pairs if len(s) <= length and len(t) <= length]
    skipped = len(pairs) - len(kept)
    (logging.warning if skipped else logging.info)(
        "WMT TFRecords: %d training pairs in %d files; skipped %d longer than %d tokens",
        len(pairs),
        len(files),
        skipped,
        length,
    )
    if not kept:
        raise InputError(f"no training pair of {list(files)} fits data.max_length={length}")
    inputs, targets = [s for s, _ in kept], [t for _, t in kept]
    if data_cfg.pack:
        arrays = packing.pack_pairs(inputs, targets, length, seed=int(data_cfg.seed))
    else:
        arrays = packing.unpacked_rows(inputs, targets, length)
    return packing.PackedRows(arrays, f"tfrecord/{len(kept)}pairs/pack={data_cfg.pack}")


def eval_pairs(
    files: Sequence[str], vocab: SubwordVocab, max_length: int, index_dir: str
) -> tuple[list[dict[str, np.ndarray]], dict[int, str]]:
    """(eval records {inputs, targets, index}, references {index: text}) of every pair of
    the eval files in order; sequences longer than max_length are cut (EOS kept last), the
    references are the whole decoded targets."""
    size = len(vocab)
    source = tfrecord.TFRecordSource(files, lambda d, w: parse_pair_record(d, w, size), index_dir)
    records, references = [], {}
    for index, (src, tgt) in enumerate(_read_pairs(source)):
        references[index] = vocab.decode_ids(tgt)
        cut = [
            s if len(s) <= max_length else np.append(s[: max_length - 1], EOS_ID)
            for s in (src, tgt)
        ]
        records.append({"inputs": cut[0], "targets": cut[1], "index": index})
    if not records:
        raise InputError(f"the eval TFRecord files hold no records: {list(files)}")
    return records, references


def text_eval_pairs(
    files: Sequence[str], data_dir: str, vocab: SubwordVocab, max_length: int
) -> tuple[list[dict[str, np.ndarray]], dict[int, str]]:
    """Eval records and references from (source, reference) text files, as the reference
    evaluates newstest2014: source lines encoded with the vocabulary (EOS appended, cut to
    max_length), references the reference lines as they are."""
    from input_pipeline.translation_tfds import read_parallel

    if len(files) != 2:
        raise InputError(
            f"data.eval_text_files must be (source file, reference file), got {tuple(files)!r}"
        )
    paths = [input_files.resolve(path, data_dir) for path in files]
    sources, refs = read_parallel(*paths)
    records, references = [], {}
    for index, (src, ref) in enumerate(zip(sources, refs, strict=True)):
        ids = [np.asarray(vocab.encode(line) + [EOS_ID], np.int32) for line in (src, ref)]
        ids = [s if len(s) <= max_length else np.append(s[: max_length - 1], EOS_ID) for s in ids]
        records.append({"inputs": ids[0], "targets": ids[1], "index": index})
        references[index] = ref
    if not records:
        raise InputError(f"the eval text files are empty: {paths}")
    return records, references


def read(data_cfg, cache_dir: str, with_train: bool):
    """The reference's TFRecords (data.format=mlperf_tfrecord) as (vocabulary, training
    rows or None, eval records, references by index); translation_data assembles them."""
    vocab = vocab_of(data_cfg)
    index_dir = os.path.join(cache_dir, "tfrecord_index")  # local, whatever the inputs
    for key in ("train_files", "eval_files"):
        if not data_cfg[key]:
            raise InputError(f"data.format=mlperf_tfrecord needs data.{key} (glob patterns)")
    text_files = tuple(data_cfg.get("eval_text_files", ()) or ())
    if not text_files:
        eval_files = resolve_files(data_cfg.eval_files, data_cfg.data_dir, "data.eval_files")
    rows = None
    if with_train:
        train_files = resolve_files(data_cfg.train_files, data_cfg.data_dir, "data.train_files")
        rows = train_rows(data_cfg, train_files, len(vocab), index_dir)
        rows[0]  # noqa: B018 - decodes (and checks) one row up front
    max_length = int(data_cfg.eval_max_length)
    if text_files:
        records, references = text_eval_pairs(text_files, data_cfg.data_dir, vocab, max_length)
    else:
        records, references = eval_pairs(eval_files, vocab, max_length, index_dir)
    if data_cfg.max_eval_examples:
        records = records[: int(data_cfg.max_eval_examples)]
    logging.info("WMT eval: %d pairs from %s", len(records), text_files or eval_files)
    return vocab, rows, records, references
