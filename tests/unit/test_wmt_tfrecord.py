"""The Transformer's official inputs: the reference's WMT TFRecords (packed and unpacked),
its subword vocabulary and its BLEU, against what TensorFlow / tensor2tensor wrote and
computed (tests/fixtures/make_wmt_tfrecords.py; no TensorFlow here)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import REPO
from ml_collections import ConfigDict

from input_pipeline import packing, tf_example, tfrecord, translation_tfrecord
from input_pipeline.subword_vocab import SubwordVocab, VocabFileError
from mlperf.transformer import bleu_mlperf

FIXTURE = os.path.join(REPO, "tests", "fixtures", "wmt_tfrecord")
VOCAB = os.path.join(FIXTURE, "vocab.translate_ende_wmt32k.32768.subwords")
PACKED_TRAIN = "translate_ende_wmt32k_packed-train-*"


@pytest.fixture(scope="module")
def records():
    with open(os.path.join(FIXTURE, "expected_records.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def text():
    with open(os.path.join(FIXTURE, "expected_text.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def vocab():
    return SubwordVocab(VOCAB)


def data_config(tmp_path, **overrides) -> ConfigDict:
    from configs.transformer import get_config

    c = get_config("tiny_tfrecord").data
    c.data_dir = FIXTURE
    c.cache_dir = str(tmp_path / "cache")
    c.update(overrides)
    return c


def parse(vocab_size):
    return lambda data, where: translation_tfrecord.parse_pair_record(data, where, vocab_size)


def test_reader_returns_what_tensorflow_decoded(records, vocab, tmp_path):
    assert len(records) == 8
    for name, expected in records.items():
        source = tfrecord.TFRecordSource([os.path.join(FIXTURE, name)], parse(len(vocab)))
        assert len(source) == len(expected), name
        for i, want in enumerate(expected):
            got = source[i]
            assert sorted(got) == sorted(want), (name, i)
            for feature, values in want.items():
                np.testing.assert_array_equal(got[feature], values, err_msg=f"{name}[{i}]")


def test_packed_shards_are_rows_in_file_order_and_hosts_split_them(records, tmp_path):
    from input_pipeline.translation_data import build_translation_data

    data = build_translation_data(data_config(tmp_path))
    shards = sorted(k for k in records if k.startswith("translate_ende_wmt32k_packed-train"))
    assert len(shards) == 3
    expected = [r for name in shards for r in records[name]]
    rows = data.train_rows
    assert isinstance(rows, tfrecord.TFRecordSource) and len(rows) == len(expected)
    for i, want in enumerate(expected):  # each record, padded to max_length (48)
        row = rows[i]
        for feature in packing.PACKED_FIELDS:
            n = len(want[feature])
            np.testing.assert_array_equal(row[feature][:n], want[feature])
            assert not row[feature][n:].any()
    # The global batch order does not depend on the number of hosts.
    one = next(data.train_iterator(8, seed=3, shard_index=0, shard_count=1))
    halves = [next(data.train_iterator(4, 3, h, 2)) for h in range(2)]
    for field in packing.PACKED_FIELDS:
        np.testing.assert_array_equal(one[field], np.concatenate([h[field] for h in halves]))
    assert one["inputs"].shape == (8, 48)


def test_unpacked_reference_layout_packs_every_pair(records, tmp_path):
    from input_pipeline.translation_data import build_translation_data

    c = data_config(
        tmp_path,
        train_files=("wmt32k-encoded-train-*",),
        eval_files=("wmt32k-encoded-dev-*",),
    )
    data = build_translation_data(c)
    pairs = [r for k in sorted(records) if k.startswith("wmt32k-encoded-train") for r in records[k]]
    rows = data.train_rows
    assert isinstance(rows, packing.PackedRows)
    got = sorted(
        (
            tuple(row["inputs"][row["inputs_segmentation"] == s]),
            tuple(row["targets"][row["targets_segmentation"] == s]),
        )
        for row in (rows[i] for i in range(len(rows)))
        for s in range(1, int(row["inputs_segmentation"].max()) + 1)
    )
    assert got == sorted((tuple(p["inputs"]), tuple(p["targets"])) for p in pairs)


def test_eval_pairs_and_references_from_packed_and_unpacked_dev(text, tmp_path):
    from input_pipeline.translation_data import build_translation_data

    dev = text["dev_pairs"]
    for pattern in ("translate_ende_wmt32k-dev-*", "translate_ende_wmt32k_packed-dev-*"):
        data = build_translation_data(
            data_config(tmp_path, eval_files=(pattern,)), with_train=False
        )
        assert data.num_eval_examples == len(dev) == 24
        # Packing reorders pairs: compare (source, reference) pairs, not line numbers.
        ev = data.eval_records
        got = sorted(
            (data.decode(ev[i]["inputs"]), data.references[int(ev[i]["index"])])
            for i in range(len(ev))
        )
        assert got == sorted(map(tuple, dev)), pattern
        if "packed" not in pattern:
            assert data.references == {i: de for i, (_, de) in enumerate(dev)}


def test_subword_decoder_reproduces_t2t(text, vocab):
    assert len(vocab) == text["vocab_size"] and vocab.subwords[:2] == ["<pad>_", "<EOS>_"]
    assert len(text["decodes"]) == 24 + 5
    for case in text["decodes"]:
        assert vocab.decode(case["ids"]) == case["text"], case["ids"]
    # decode_ids stops at EOS and drops padding (model outputs)
    ids = text["decodes"][0]["ids"]
    assert vocab.decode_ids([*ids, 1, 0, 5, 6]) == text["decodes"][0]["text"]
    assert vocab.decode_ids([0, *ids[:1], 0, *ids[1:]]) == text["decodes"][0]["text"]


def test_subword_encoder_reproduces_t2t(text, vocab):
    assert len(text["encodes"]) == 2 * 24 + 4
    for case in text["encodes"]:
        assert vocab.encode(case["text"]) == case["ids"], case["text"]


def test_eval_on_text_files_as_the_reference_scores_newstest(text, tmp_path):
    from input_pipeline.translation_data import build_translation_data

    dev = text["dev_pairs"]
    for i, lang in enumerate(("en", "de")):
        (tmp_path / f"dev.{lang}").write_text("\n".join(p[i] for p in dev) + "\n", "utf-8")
    c = data_config(tmp_path, eval_text_files=(str(tmp_path / "dev.en"), str(tmp_path / "dev.de")))
    data = build_translation_data(c, with_train=False)
    assert data.references == {i: de for i, (_, de) in enumerate(dev)}
    from_records = build_translation_data(data_config(tmp_path), with_train=False)
    for field in ("inputs", "targets", "index"):  # encoded as t2t encoded the TFRecords
        np.testing.assert_array_equal(
            getattr(data.eval_records, field), getattr(from_records.eval_records, field)
        )


def test_reference_bleu_reproduces_bleu_hook(text):
    for case in text["bleu_tokenize"]:
        assert bleu_mlperf.tokenize(case["text"]) == case["tokens"]
    assert len(text["bleu"]) == 6
    for case in text["bleu"]:
        hyps, refs = case["hypotheses"], case["references"]
        for cased, key in ((False, "bleu_uncased"), (True, "bleu_cased")):
            score = bleu_mlperf.bleu_from_stats(bleu_mlperf.bleu_stats(hyps, refs, cased))
            # bleu_hook returns float32
            assert score["bleu"] == pytest.approx(case[key], rel=1e-6, abs=1e-5), (case, key)
        # Summed per-host statistics give the same score as the whole set.
        parts = [bleu_mlperf.bleu_stats(hyps[i : i + 1], refs[i : i + 1]) for i in range(len(hyps))]
        assert bleu_mlperf.bleu_from_stats(np.stack(parts))["bleu"] == pytest.approx(
            case["bleu_uncased"], rel=1e-6, abs=1e-5
        )
    assert text["bleu"][0]["bleu_uncased"] == pytest.approx(100.0)
    assert 0 < text["bleu"][1]["bleu_uncased"] < 100


# ---- bad input ----------------------------------------------------------------------------
def _write(tmp_path, name, examples):
    path = str(tmp_path / name)
    tfrecord.write_records(path, [tf_example.encode_example(e) for e in examples])
    return path


def test_wrong_feature_name_or_type_names_it_and_the_expected_one(tmp_path):
    ok = np.array([5, 6, 1], np.int64)
    path = _write(tmp_path, "bad_name", [{"input": ok, "targets": ok}])
    want = (
        r"bad_name at byte offset 0: feature 'inputs' missing \(expected int64_list of "
        r"subword ids\); the record has \['input', 'targets'\]"
    )
    with pytest.raises(tf_example.ExampleError, match=want):
        tfrecord.TFRecordSource([path], parse(100))[0]
    path = _write(tmp_path, "bad_type", [{"inputs": ok, "targets": ok.astype(np.float32)}])
    with pytest.raises(
        tf_example.ExampleError,
        match="feature 'targets' is a float_list, expected int64_list of subword ids",
    ):
        tfrecord.TFRecordSource([path], parse(100))[0]
    path = _write(tmp_path, "bad_pack", [{"inputs": ok, "targets": ok, "inputs_segmentation": ok}])
    with pytest.raises(tf_example.ExampleError, match="feature 'inputs_position' missing"):
        tfrecord.TFRecordSource([path], parse(100))[0]
    path = _write(tmp_path, "bad_id", [{"inputs": ok, "targets": np.array([500, 1])}])
    with pytest.raises(
        tf_example.ExampleError,
        match="feature 'targets' holds id 500 outside the vocabulary of 100",
    ):
        tfrecord.TFRecordSource([path], parse(100))[0]


def test_training_on_a_bad_file_fails_before_anything_is_built(tmp_path):
    from input_pipeline.translation_data import build_translation_data

    ok = np.array([5, 6, 1], np.int64)
    _write(tmp_path, "train-0", [{"inputs": ok, "wrong": ok}])
    c = data_config(
        tmp_path,
        data_dir=str(tmp_path),
        train_files=("train-*",),
        eval_files=(os.path.join(FIXTURE, "translate_ende_wmt32k-dev-*"),),
        vocab_file=VOCAB,
    )
    with pytest.raises(
        tf_example.ExampleError, match="train-0 at byte offset 0: feature 'targets' missing"
    ):
        build_translation_data(c)
    with pytest.raises(ValueError, match="needs data.vocab_file"):
        build_translation_data(data_config(tmp_path, vocab_file=""))


def test_malformed_vocab_file_names_file_and_line(tmp_path):
    bad = tmp_path / "vocab.subwords"
    bad.write_text("'<pad>'\n'<EOS>'\nhello_\n'x'\n", encoding="utf-8")
    with pytest.raises(
        VocabFileError,
        match=r"vocab.subwords, line 3: expected one subword in quotes .*got 'hello_'",
    ):
        SubwordVocab(str(bad))
    bad.write_bytes(b"'<pad>'\n'<EOS>'\n'ok'\n'\xff'\n")
    with pytest.raises(VocabFileError, match="vocab.subwords, line 4: not UTF-8"):
        SubwordVocab(str(bad))
    with pytest.raises(FileNotFoundError, match="data.vocab_file"):
        SubwordVocab(str(tmp_path / "missing"))


def test_configs_pick_the_reference_inputs_and_bleu():
    from configs.transformer import VARIANTS, get_config

    c = get_config("mlperf_v07")
    assert c.data.format == "mlperf_tfrecord" and c.eval.bleu == "mlperf_v07"
    assert c.data.train_files == ("translate_ende_wmt32k_packed-train-*",)
    assert c.data.eval_text_files == ("newstest2014.en", "newstest2014.de")
    assert c.data.vocab_file == "vocab.translate_ende_wmt32k.32768.subwords"
    for variant in set(VARIANTS) - {"mlperf_v07", "tiny_tfrecord"}:
        assert get_config(variant).eval.bleu == "sacrebleu", variant
        assert get_config(variant).data.format == "text", variant
