"""The MLPerf BERT and WMT TFRecords read in place from a bucket (a real GCS-protocol
server: the `gcs` fixture) give exactly the batches the local files give, per host as
one process of 8 devices (1x8) and as two processes of 4 (2x4) read them."""

from __future__ import annotations

import collections
import os
import shutil

import numpy as np
import pytest
from bucket_helpers import BUCKET, upload_tree
from conftest import REPO

from input_pipeline import packing, storage, tfrecord
from input_pipeline.bert_data import build_bert_data
from input_pipeline.translation_data import build_translation_data

BERT_FIXTURE = os.path.join(REPO, "tests", "fixtures", "bert_tfrecord")
WMT_FIXTURE = os.path.join(REPO, "tests", "fixtures", "wmt_tfrecord")
SEED, STEPS = 3, 8
HOSTS = {"1x8": 1, "2x4": 2}


def _bert_config(data_dir: str, cache_dir: str):
    from configs.bert import get_config

    c = get_config("tiny_tfrecord").data
    c.update(data_dir=data_dir, cache_dir=cache_dir, vocab_file="vocab.txt")
    return c


def _bert_host_batches(data_dir: str, cache_dir: str, hosts: int) -> tuple[list, list]:
    """(train batches, eval batches) of every host, host by host, as each would read."""
    train, evals = [], []
    for h in range(hosts):
        data = build_bert_data(_bert_config(data_dir, cache_dir), 32, 5, h, hosts)
        it = data.train_iterator(16 // hosts, SEED)
        train.append([next(it) for _ in range(STEPS)])
        evals.append(data.eval_batches(16))
    return train, evals


def _assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for name in w:
            np.testing.assert_array_equal(g[name], w[name], err_msg=name)


@pytest.fixture
def bert_folder(tmp_path) -> str:
    """The committed BERT fixture plus a 128-token vocab.txt (data.vocab_file)."""
    folder = tmp_path / "bert"
    shutil.copytree(BERT_FIXTURE, folder)
    (folder / "vocab.txt").write_text("".join(f"[tok{i}]\n" for i in range(128)))
    return str(folder)


@pytest.mark.parametrize("mesh", sorted(HOSTS))
def test_bert_tfrecords_in_a_bucket_give_the_local_batches(
    gcs, bert_folder, tmp_path, monkeypatch, mesh
):
    url = upload_tree(bert_folder, f"{BUCKET}/bert")
    cache = str(tmp_path / "cache")
    copies = tmp_path / "copies"
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(copies))
    hosts = HOSTS[mesh]
    local_train, local_eval = _bert_host_batches(bert_folder, cache, hosts)
    gs_train, gs_eval = _bert_host_batches(url, cache, hosts)
    for h in range(hosts):
        _assert_same_batches(gs_train[h], local_train[h])
        _assert_same_batches(gs_eval[h], local_eval[h])
    # Hosts read disjoint rows: together, one global batch holds 16 different records.
    rows = np.concatenate([gs_train[h][0]["input_ids"] for h in range(hosts)])
    assert len({r.tobytes() for r in rows}) == 16
    # One shared cache_dir: each shard has two offset indexes (local, bucket) of one name.
    index = os.listdir(os.path.join(cache, "tfrecord_index"))
    names = collections.Counter(name.split(".")[0] for name in index)
    assert names == {n: 2 for n in [f"part-{i:05d}-of-00004" for i in range(4)] + ["eval_tiny"]}
    # Read in place: nothing was copied out of the bucket.
    assert not copies.exists()


def test_object_records_read_in_order_and_at_random_are_the_file_bytes(gcs, tmp_path):
    name = "part-00001-of-00004"
    url = f"{BUCKET}/bert/{name}"
    storage.upload(os.path.join(BERT_FIXTURE, name), url)
    want = [data for _, data in tfrecord.iter_records(os.path.join(BERT_FIXTURE, name))]
    assert [data for _, data in tfrecord.iter_records(url)] == want
    source = tfrecord.TFRecordSource([url], lambda data, where: data, str(tmp_path))
    order = np.random.default_rng(0).permutation(len(want))
    assert [source[int(i)] for i in order] == [want[i] for i in order]
    assert [source[i] for i in range(len(want))] == want  # read ahead, in order


def _wmt_config(data_dir: str, cache_dir: str):
    from configs.transformer import get_config

    c = get_config("tiny_tfrecord").data
    c.update(data_dir=data_dir, cache_dir=cache_dir)
    return c


def test_wmt_tfrecords_in_a_bucket_give_the_local_rows_and_eval(gcs, tmp_path):
    url = upload_tree(WMT_FIXTURE, f"{BUCKET}/wmt")
    cache = str(tmp_path / "cache")
    local = build_translation_data(_wmt_config(WMT_FIXTURE, cache))
    remote = build_translation_data(_wmt_config(url, cache))
    assert isinstance(remote.train_rows, tfrecord.TFRecordSource)
    assert remote.train_rows.files[0].startswith(f"{url}/translate_ende_wmt32k_packed-train-")
    for hosts in HOSTS.values():
        for h in range(hosts):
            want = local.train_iterator(8 // hosts, SEED, h, hosts)
            got = remote.train_iterator(8 // hosts, SEED, h, hosts)
            _assert_same_batches(
                [next(got) for _ in range(STEPS)], [next(want) for _ in range(STEPS)]
            )
            _assert_same_batches(remote.eval_batches(8, h, hosts), local.eval_batches(8, h, hosts))
    assert remote.references == local.references and len(local.references) == 24
    assert set(packing.PACKED_FIELDS) <= set(remote.train_rows[0])


def test_a_corrupt_or_truncated_object_names_its_url_and_the_offset(gcs):
    local = os.path.join(BERT_FIXTURE, "part-00002-of-00004")
    blob = bytearray(storage.read_bytes(local))
    second = [offset for offset, _ in tfrecord.iter_records(local)][1]
    blob[second + 12 + 5] ^= 0x01  # one bit of the second record's data
    url = f"{BUCKET}/bad/part-00002-of-00004"
    storage.write_bytes(url, bytes(blob))
    source = tfrecord.TFRecordSource([url], lambda data, where: data)
    source[0]  # noqa: B018 - the first record is intact
    with pytest.raises(
        tfrecord.TFRecordError,
        match=f"^{url}: bad data checksum .* offset {second} \\(corrupt file\\)$",
    ):
        source[1]  # noqa: B018
    storage.write_bytes(url, bytes(blob[:-3]))
    with pytest.raises(tfrecord.TFRecordError, match=f"^{url}: record at byte offset .*truncated"):
        tfrecord.index_file(url)
