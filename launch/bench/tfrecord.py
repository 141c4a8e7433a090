"""Reading the reference's BERT TFRecords in place against converting them to array_record,
and in place from a bucket against a local file.

    python -m launch.bench.tfrecord [--records 20000] [--reads 5000] [--dir /tmp/x]
    python -m launch.bench.tfrecord --fake_gcs      # or --url gs://BUCKET/FOLDER

Writes one shard of reference-shaped records (seq 512, 76 predictions, random ids of a
30,522-word vocabulary, random lengths) and measures, in one run:

    in place:   startup = indexing the shard (headers only); random reads + decode
    converted:  startup = reading every record (CRCs checked) and writing array_record;
                random reads + decode

Random reads follow a random permutation, as the training order does; "decode" is the
pipeline's own Example parser in both cases. Prints per-record costs and the ratios.

With --url (a folder in a bucket) or --fake_gcs (a fake-gcs-server on 127.0.0.1 started
for the run, the `test` extra's; bucket `bench`), the shard is uploaded there and read in
place from the object and from the local file alike (the table in docs/results/storage.md):
indexing (start-up), random reads + decode in one thread and in READ_THREADS threads
(grain's reader threads), and reads in order (an eval set's) + decode.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import time

import numpy as np
from absl import flags

from input_pipeline import bert_tfrecord, storage, tf_example, tfrecord
from launch.bench.common import run

_RECORDS = flags.DEFINE_integer("records", 20000, "Records in the generated shard.")
_READS = flags.DEFINE_integer("reads", 5000, "Random reads timed per reader.")
_DIR = flags.DEFINE_string("dir", "", "Folder for the files (default: a temporary one).")
_URL = flags.DEFINE_string(
    "url", "", "A folder in a bucket (gs://BUCKET/FOLDER): read the shard from there too."
)
_FAKE_GCS = flags.DEFINE_bool(
    "fake_gcs", False, "Read from a fake-gcs-server on 127.0.0.1 started for the run."
)

SEQ, PREDS, VOCAB = 512, 76, 30522
READ_THREADS = 16  # grain's default reader threads per process


def reference_like_example(rng: np.random.Generator) -> bytes:
    n = int(rng.integers(SEQ // 4, SEQ + 1))
    ids = np.zeros(SEQ, np.int64)
    ids[:n] = rng.integers(999, VOCAB, n)
    num_pred = min(PREDS, max(1, round(n * 0.15)))
    positions = np.zeros(PREDS, np.int64)
    positions[:num_pred] = np.sort(rng.choice(n, num_pred, replace=False))
    weights = np.zeros(PREDS, np.float32)
    weights[:num_pred] = 1.0
    return tf_example.encode_example(
        {
            "input_ids": ids,
            "input_mask": (np.arange(SEQ) < n).astype(np.int64),
            "segment_ids": ((np.arange(SEQ) >= n // 2) & (np.arange(SEQ) < n)).astype(np.int64),
            "masked_lm_positions": positions,
            "masked_lm_ids": np.where(weights > 0, rng.integers(999, VOCAB, PREDS), 0),
            "masked_lm_weights": weights,
            "next_sentence_labels": np.asarray([rng.integers(0, 2)], np.int64),
        }
    )


def _crc32c_pure_python(data: bytes) -> int:
    """Table-driven CRC-32C in plain Python: the baseline for google-crc32c."""
    table = _CRC_TABLE
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def _read_rate(read, n: int, reads: int, seed: int) -> float:
    order = np.random.default_rng(seed).permutation(n)[:reads]
    read(int(order[0]))  # warm-up (file open)
    start = time.perf_counter()
    for i in order:
        read(int(i))
    return reads / (time.perf_counter() - start)


def _threaded_rate(read, n: int, reads: int, seed: int) -> float:
    order = np.random.default_rng(seed).permutation(n)[:reads]
    with concurrent.futures.ThreadPoolExecutor(READ_THREADS) as pool:
        read(int(order[0]))
        start = time.perf_counter()
        for _ in pool.map(read, (int(i) for i in order)):
            pass
        return reads / (time.perf_counter() - start)


def _in_order_rate(read, reads: int) -> float:
    start = time.perf_counter()
    for i in range(reads):
        read(i)
    return reads / (time.perf_counter() - start)


def source_rates(path: str, parse, n: int, reads: int) -> dict[str, float]:
    """Start-up (indexing, no cache) and read + decode rates of one shard."""
    start = time.perf_counter()
    source = tfrecord.TFRecordSource([path], parse)
    index_s = time.perf_counter() - start
    return {
        "index_s": index_s,
        "in_order": _in_order_rate(source.__getitem__, reads),
        "random": _read_rate(source.__getitem__, n, reads, seed=1),
        "random_threads": _threaded_rate(source.__getitem__, n, reads, seed=2),
    }


def bucket_table(shard: str, url: str, parse, n: int, reads: int) -> str:
    """The shard read from the local file and from its copy at url, as a markdown table."""
    remote = storage.join(url, storage.basename(shard))
    start = time.perf_counter()
    storage.upload(shard, remote)
    upload_s = time.perf_counter() - start
    rows = [
        "| source | index (start-up) | in order + decode | random + decode | "
        f"random + decode, {READ_THREADS} threads |",
        "|---|---|---|---|---|",
    ]
    for name, path in (("local file", shard), (remote, remote)):
        r = source_rates(path, parse, n, reads)
        rows.append(
            f"| {name} | {r['index_s']:.2f} s ({r['index_s'] / n * 1e6:.1f} us/record) | "
            f"{r['in_order']:,.0f} records/s | {r['random']:,.0f} records/s | "
            f"{r['random_threads']:,.0f} records/s |"
        )
    size = storage.size(remote)
    rows.append(f"\nupload of the {size / 2**20:.1f} MiB shard: {upload_s:.2f} s")
    return "\n".join(rows)


def _fake_gcs():
    """A fake-gcs-server on 127.0.0.1 with an empty bucket `bench` (objects in a new
    temporary folder), this process pointed at it."""
    from launch.gcs_emulator import GcsServer

    server = GcsServer(os.path.join(tempfile.mkdtemp(prefix="bench_gcs_"), "objects"))
    server.start()
    os.environ.update(server.env())
    server.create_bucket("bench")
    return server


def main(argv: list[str]) -> None:
    from array_record.python import array_record_data_source, array_record_module

    folder = _DIR.value or tempfile.mkdtemp(prefix="bench_tfrecord_")
    os.makedirs(folder, exist_ok=True)
    shard = os.path.join(folder, "part-00000-of-00001")
    rng = np.random.default_rng(0)
    tfrecord.write_records(shard, [reference_like_example(rng) for _ in range(_RECORDS.value)])
    size = os.path.getsize(shard)
    n = _RECORDS.value
    parse = bert_tfrecord.BertRecordParser(SEQ, PREDS, VOCAB)
    print(f"shard: {n} records, {size / 2**20:.1f} MiB ({size / n:.0f} B/record)")
    if _URL.value or _FAKE_GCS.value:
        server = _fake_gcs() if _FAKE_GCS.value else None
        try:
            url = _URL.value or "gs://bench/tfrecord"
            print(bucket_table(shard, url, parse, n, _READS.value))
        finally:
            if server is not None:
                server.stop()
                shutil.rmtree(os.path.dirname(server.root), ignore_errors=True)
        return

    start = time.perf_counter()
    source = tfrecord.TFRecordSource([shard], parse)
    index_s = time.perf_counter() - start
    in_place = _read_rate(source.__getitem__, n, _READS.value, seed=1)

    converted = os.path.join(folder, "part-00000-of-00001.array_record")
    start = time.perf_counter()
    writer = array_record_module.ArrayRecordWriter(converted, "group_size:1")
    for _, data in tfrecord.iter_records(shard):
        writer.write(data)
    writer.close()
    convert_s = time.perf_counter() - start
    start = time.perf_counter()
    arrays = array_record_data_source.ArrayRecordDataSource([converted])
    open_s = time.perf_counter() - start
    where = "array_record"
    converted_rate = _read_rate(lambda i: parse(arrays[i], where), n, _READS.value, seed=1)

    decode_only = _read_rate(lambda i: parse(source.read(0), where), n, _READS.value, seed=1)
    print(
        f"in place:  startup {index_s:.3f} s ({index_s / n * 1e6:.1f} us/record index), "
        f"random read+decode {in_place:.0f} records/s"
    )
    print(
        f"converted: startup {convert_s + open_s:.3f} s "
        f"({(convert_s + open_s) / n * 1e6:.1f} us/record), "
        f"random read+decode {converted_rate:.0f} records/s"
    )
    print(f"one record read+decoded over and over (page cache): {decode_only:.0f} records/s")
    import google_crc32c

    data = source.read(0)
    assert _crc32c_pure_python(data) == google_crc32c.value(data)
    rates = []
    for crc in (_crc32c_pure_python, google_crc32c.value):
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < 1.0:
            crc(data)
            count += 1
        rates.append(count * len(data) / (time.perf_counter() - start) / 2**20)
    print(
        f"CRC-32C: pure Python {rates[0]:.1f} MiB/s, google-crc32c {rates[1]:.0f} MiB/s "
        f"({rates[1] / rates[0]:.0f}x)"
    )
    print(
        f"ratios: startup converted/in-place {(convert_s + open_s) / index_s:.1f}x; "
        f"read rate in-place/converted {in_place / converted_rate:.2f}x"
    )


if __name__ == "__main__":
    run(main, keep_memory=False)
