"""The TF-free TFRecord / tf.train.Example reader against what TensorFlow decoded from the
committed fixtures (tests/fixtures/make_bert_tfrecords.py), and its errors on bad files."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest

from input_pipeline import bert_tfrecord, grain_pipeline, tf_example, tfrecord
from input_pipeline.bert_data import build_bert_data

FIXTURES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "bert_tfrecord"
)
SHARDS = [f"part-{i:05d}-of-00004" for i in range(4)]
FEATURES = (
    "input_ids input_mask segment_ids masked_lm_positions masked_lm_ids masked_lm_weights "
    "next_sentence_labels"
).split()


@pytest.fixture(scope="module")
def expected():
    with np.load(os.path.join(FIXTURES, "expected.npz")) as z:
        return {k: z[k] for k in z.files}


def _rows(expected, names):
    """TF's decoding of the files `names`, concatenated in order: {feature: [n, ...]}."""
    return {f: np.concatenate([expected[f"{n}/{f}"] for n in names]) for f in FEATURES}


def _source(names, cache_dir=None):
    files = [os.path.join(FIXTURES, n) for n in names]
    return tfrecord.TFRecordSource(files, bert_tfrecord.BertRecordParser(32, 5, 128), cache_dir)


def _assert_record_equal(record, rows, i):
    for f in FEATURES:
        want = rows[f][i].reshape(record[f].shape)
        np.testing.assert_array_equal(record[f], want, err_msg=f"{f} of record {i}")
        assert record[f].dtype == (np.float32 if f == "masked_lm_weights" else np.int32)


@pytest.mark.parametrize("name", [*SHARDS, "eval_tiny"])
def test_every_record_matches_what_tensorflow_decoded(expected, name):
    source = _source([name])
    rows = _rows(expected, [name])
    assert len(source) == len(rows["input_ids"]) > 0
    for i in range(len(source)):
        _assert_record_equal(source[i], rows, i)


def test_a_sharded_set_reads_in_file_order(expected, tmp_path):
    source = _source(SHARDS, cache_dir=str(tmp_path))
    rows = _rows(expected, SHARDS)
    assert len(source) == 50 == len(rows["input_ids"])
    for i in range(len(source)):
        _assert_record_equal(source[i], rows, i)
    # The offsets were cached, and a second source reads the same records from the cache.
    assert len(os.listdir(tmp_path)) == len(SHARDS)
    again = _source(SHARDS, cache_dir=str(tmp_path))
    _assert_record_equal(again[49], rows, 49)


def test_sequential_and_random_access_agree():
    path = os.path.join(FIXTURES, SHARDS[1])
    offsets = [offset for offset, _ in tfrecord.iter_records(path)]
    np.testing.assert_array_equal(tfrecord.index_file(path), offsets)
    source = _source([SHARDS[1]])
    assert [source.read(i) for i in range(len(source))] == [
        data for _, data in tfrecord.iter_records(path)
    ]


def _data_cfg(**extra):
    from configs.bert import get_config

    c = get_config("tiny_tfrecord").data
    c.data_dir = FIXTURES
    c.update(extra)
    return c


def test_per_host_split_is_the_global_batch_whatever_the_host_count(expected, tmp_path):
    """1, 2 and 4 hosts: the hosts' rows of each global batch, stacked, are the 1-host
    batch, and every row is the record TF decoded at that position of the global order."""
    rows = _rows(expected, SHARDS)
    global_batch, seed, steps = 8, 3, 9  # 72 rows: past the 50-record epoch
    batches = {}
    for hosts in (1, 2, 4):
        per_host = []
        for h in range(hosts):
            data = build_bert_data(_data_cfg(cache_dir=str(tmp_path)), 32, 5, h, hosts)
            assert data.num_train_examples == 50 and data.vocab_size == 128
            it = data.train_iterator(global_batch // hosts, seed)
            per_host.append([next(it) for _ in range(steps)])
        batches[hosts] = [
            {f: np.concatenate([per_host[h][b][f] for h in range(hosts)]) for f in FEATURES}
            for b in range(steps)
        ]
    order = grain_pipeline.GlobalOrderHostRows(list(range(50)), global_batch, 0, 1, seed)
    for b in range(steps):
        for f in FEATURES:
            np.testing.assert_array_equal(batches[2][b][f], batches[1][b][f])
            np.testing.assert_array_equal(batches[4][b][f], batches[1][b][f])
        for r in range(global_batch):
            record = {f: batches[1][b][f][r] for f in FEATURES}
            _assert_record_equal(record, rows, order.record_index(b * global_batch + r))


def test_eval_batches_cover_the_eval_file_once(expected, tmp_path):
    rows = _rows(expected, ["eval_tiny"])
    seen = []
    for h in range(2):
        data = build_bert_data(_data_cfg(cache_dir=str(tmp_path)), 32, 5, h, 2)
        assert data.num_eval_examples == 24
        for batch in data.eval_batches(16):  # 2 global batches, 8 padding rows
            seen += [ids for ids, m in zip(batch["input_ids"], batch["mask"], strict=True) if m]
    assert len(seen) == 24
    assert sorted(map(tuple, seen)) == sorted(map(tuple, rows["input_ids"].astype(np.int32)))


def test_odd_examples_decode_as_tensorflow_parsed_them():
    with open(os.path.join(FIXTURES, "odd_expected.json")) as f:
        want = json.load(f)
    records = [data for _, data in tfrecord.iter_records(os.path.join(FIXTURES, "odd_examples"))]
    assert len(records) == len(want) == 3
    for data, expected_features in zip(records, want, strict=True):
        got = tf_example.parse_example(data)
        assert sorted(got) == sorted(expected_features)
        for name, (kind, values) in expected_features.items():
            got_kind, got_values = got[name]
            assert got_kind == kind, name
            if kind == "bytes_list":
                assert [v.hex() for v in got_values] == values
            elif kind == "float_list":
                np.testing.assert_array_equal(got_values, np.asarray(values, np.float32))
            else:
                assert got_values.tolist() == values


def test_encoded_examples_round_trip():
    features = {
        "a": np.asarray([0, 1, 127, 128, 30521, -7, 2**62], np.int64),
        "w": np.asarray([0.0, 1.0, -3.5], np.float32),
        "s": [b"x", b""],
        "empty": np.zeros(0, np.int64),
    }
    got = tf_example.parse_example(tf_example.encode_example(features))
    assert got["a"][1].tolist() == features["a"].tolist()
    np.testing.assert_array_equal(got["w"][1], features["w"])
    assert got["s"] == ("bytes_list", [b"x", b""])
    assert got["empty"][0] == "int64_list" and got["empty"][1].size == 0


# ---- bad input ----------------------------------------------------------------------------
def _copy(tmp_path, name=SHARDS[0]):
    path = tmp_path / name
    shutil.copy(os.path.join(FIXTURES, name), path)
    return path


def _second_record_offset(path):
    return [offset for offset, _ in tfrecord.iter_records(str(path))][1]


def test_a_bad_data_checksum_names_the_file_and_offset(tmp_path):
    path = _copy(tmp_path)
    offset = _second_record_offset(path)
    blob = bytearray(path.read_bytes())
    blob[offset + 12 + 5] ^= 0x01  # one bit of the second record's data
    path.write_bytes(bytes(blob))
    with pytest.raises(tfrecord.TFRecordError, match=f"{path}: bad data checksum.*offset {offset}"):
        list(tfrecord.iter_records(str(path)))
    source = _source([str(path)])  # indexing reads headers only
    source[0]  # noqa: B018 - the first record is intact
    with pytest.raises(tfrecord.TFRecordError, match=f"bad data checksum.*offset {offset}"):
        source[1]  # noqa: B018


def test_a_bad_length_names_the_file_and_offset(tmp_path):
    path = _copy(tmp_path)
    offset = _second_record_offset(path)
    blob = bytearray(path.read_bytes())
    blob[offset : offset + 8] = struct.pack("<Q", 10**9)
    path.write_bytes(bytes(blob))
    with pytest.raises(
        tfrecord.TFRecordError, match=f"{path}: bad length checksum.*offset {offset}"
    ):
        tfrecord.index_file(str(path))


def test_a_truncated_file_names_the_file_and_offset(tmp_path):
    path = _copy(tmp_path)
    blob = path.read_bytes()
    last = [offset for offset, _ in tfrecord.iter_records(str(path))][-1]
    path.write_bytes(blob[:-3])
    with pytest.raises(tfrecord.TFRecordError, match=f"offset {last} claims .*truncated file"):
        tfrecord.index_file(str(path))
    path.write_bytes(blob + b"\x01\x02")  # trailing garbage after the last record
    with pytest.raises(
        tfrecord.TFRecordError, match=f"truncated record header at byte offset {len(blob)}"
    ):
        tfrecord.index_file(str(path))


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"input_ids": ((64,), "int32")}, "'input_ids' has 32 values, expected int64_list of 64"),
        (
            {"masked_lm_weights": ((5,), "int32")},
            "'masked_lm_weights' is a float_list, expected int64_list",
        ),
        ({"input_ids": ((32,), "float32")}, "'input_ids' is a int64_list, expected float_list"),
        (
            {"next_sentence_label": ((), "int32")},
            "'next_sentence_label' missing .*'next_sentence_labels'",
        ),
    ],
)
def test_a_wrong_feature_names_it_and_the_expected_one(spec, message):
    path = os.path.join(FIXTURES, SHARDS[2])
    data = next(tfrecord.iter_records(path))[1]
    with pytest.raises(tf_example.ExampleError, match=f"^where: feature {message}"):
        tf_example.parse_features(data, spec, "where")


def test_a_config_that_does_not_fit_the_files_fails_before_training(tmp_path):
    cache = str(tmp_path)
    with pytest.raises(
        tf_example.ExampleError,
        match="part-00000-of-00004 at byte offset 0: feature 'input_ids' has 32 values, "
        "expected int64_list of 128",
    ):
        build_bert_data(_data_cfg(cache_dir=cache), 128, 5, 0, 1)
    with pytest.raises(tf_example.ExampleError, match="outside the vocabulary of 64"):
        build_bert_data(_data_cfg(cache_dir=cache, vocab_size=64), 32, 5, 0, 1)
    with pytest.raises(
        FileNotFoundError, match="no TFRecord file matches .*part-\\*-of-00500.*data.train_files"
    ):
        build_bert_data(_data_cfg(cache_dir=cache, train_files=("part-*-of-00500",)), 32, 5, 0, 1)
    with pytest.raises(ValueError, match="needs data.eval_files"):
        build_bert_data(_data_cfg(cache_dir=cache, eval_files=()), 32, 5, 0, 1)
