"""TFRecord files without TensorFlow: record framing, CRC checks, an offset index, random access.

A TFRecord file is a sequence of records, each

    uint64 length (little endian) | uint32 masked_crc32c(length bytes)
    data[length]                  | uint32 masked_crc32c(data)

Both checksums are verified; a bad one, a truncated record or trailing garbage raises
`TFRecordError` naming the file and the record's byte offset. Nothing is skipped.

Random access (`TFRecordSource`) needs each record's offset: `index_file` walks the
headers once (12 bytes read per record, the data is skipped) and the index can be cached
on disk, keyed by the file's path, size and version (`storage.file_version`).

A file may be an object in a bucket (`gs://...`, through input_pipeline.storage). It is
read in place: indexing streams it once in large blocks (only the headers are kept), and
a record is one ranged read of its bytes, whose extent the index gives; records read in
order (an eval set) come READ_AHEAD_BYTES at a time. Nothing is downloaded to disk.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import google_crc32c
import numpy as np

from input_pipeline import storage
from input_pipeline.input_errors import InputError

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
# An object is scanned (indexed, or read whole in order) in blocks of this size: one
# request per block instead of one per record header.
SCAN_BLOCK_BYTES = 8 << 20
# Records read one after another from an object are fetched this many bytes at a time.
READ_AHEAD_BYTES = 4 << 20


class TFRecordError(ValueError):
    """A corrupt or truncated TFRecord file (the message names the file and byte offset)."""


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant (mod 2^32)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def encode_record(data: bytes) -> bytes:
    """One framed record (for writing test files and converted shards)."""
    length = struct.pack("<Q", len(data))
    return length + _FOOTER.pack(masked_crc32c(length)) + data + _FOOTER.pack(masked_crc32c(data))


def write_records(path: str, payloads: Sequence[bytes]) -> None:
    """Writes payloads as a TFRecord file (uncompressed), atomically."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        for data in payloads:
            f.write(encode_record(data))
    os.replace(tmp, path)


def _read_header(f, path: str, offset: int, file_size: int) -> int:
    """The data length of the record at offset, read from f at its position."""
    return _parse_header(f.read(_HEADER.size), path, offset, file_size)


def _parse_header(header: bytes, path: str, offset: int, file_size: int) -> int:
    """The data length in a record header (length CRC checked)."""
    if len(header) < _HEADER.size:
        raise TFRecordError(
            f"{path}: truncated record header at byte offset {offset} "
            f"({len(header)} of {_HEADER.size} bytes; file size {file_size})"
        )
    length, length_crc = _HEADER.unpack(header)
    if masked_crc32c(header[:8]) != length_crc:
        raise TFRecordError(
            f"{path}: bad length checksum in the record at byte offset {offset} "
            "(corrupt file, or not a TFRecord file; compressed TFRecords are not supported)"
        )
    if offset + _HEADER.size + length + _FOOTER.size > file_size:
        raise TFRecordError(
            f"{path}: record at byte offset {offset} claims {length} data bytes but the "
            f"file ends at {file_size} (truncated file)"
        )
    return length


def _check_data(path: str, offset: int, data: bytes, footer: bytes, length: int) -> None:
    if len(data) != length or len(footer) != _FOOTER.size:
        raise TFRecordError(f"{path}: truncated record data at byte offset {offset}")
    if masked_crc32c(data) != _FOOTER.unpack(footer)[0]:
        raise TFRecordError(
            f"{path}: bad data checksum in the record at byte offset {offset} (corrupt file)"
        )


class _ObjectScan:
    """An object read from start to end (seek moves forward within it) in ranged reads of
    SCAN_BLOCK_BYTES: one request per block, however small the records."""

    def __init__(self, path: str):
        self._path = path
        self._size = storage.size(path)
        self._pos = self._start = 0
        self._block = b""

    def __enter__(self) -> _ObjectScan:
        return self

    def __exit__(self, *exc) -> None:
        self._block = b""

    def seek(self, pos: int) -> None:
        self._pos = pos

    def read(self, n: int) -> bytes:
        parts = []
        while n > 0 and self._pos < self._size:
            at = self._pos - self._start
            if not 0 <= at < len(self._block):
                length = min(SCAN_BLOCK_BYTES, self._size - self._pos)
                self._block = storage.read_range(self._path, self._pos, length)
                self._start, at = self._pos, 0
                if not self._block:  # the object ended early: the caller sees a short read
                    break
            part = self._block[at : at + n]
            parts.append(part)
            self._pos += len(part)
            n -= len(part)
        return b"".join(parts)


def _open_for_scan(path: str, buffering: int = -1):
    """A local file as before; an object in SCAN_BLOCK_BYTES ranged reads."""
    if storage.is_url(path):
        return _ObjectScan(path)
    return open(path, "rb", buffering=buffering)  # noqa: SIM115 - the caller closes it


def iter_records(path: str) -> Iterator[tuple[int, bytes]]:
    """(byte offset, data) of every record in order, both checksums verified."""
    size = storage.size(path)
    with _open_for_scan(path) as f:
        offset = 0
        while offset < size:
            length = _read_header(f, path, offset, size)
            data = f.read(length)
            _check_data(path, offset, data, f.read(_FOOTER.size), length)
            yield offset, data
            offset += _HEADER.size + length + _FOOTER.size


def index_file(path: str) -> np.ndarray:
    """Byte offsets of every record (int64), from the headers alone (length CRCs checked)."""
    size = storage.size(path)
    offsets = []
    with _open_for_scan(path, buffering=0) as f:
        offset = 0
        while offset < size:
            f.seek(offset)
            length = _read_header(f, path, offset, size)
            offsets.append(offset)
            offset += _HEADER.size + length + _FOOTER.size
    return np.asarray(offsets, np.int64)


def _index_cache_path(path: str, cache_dir: str) -> str:
    """The index file of `path` in the local cache_dir: keyed by the resolved path (an
    object's URL never equals a local path), the size and the version."""
    size, version = storage.file_version(path)
    key = f"{storage.resolve(path)}|{size}|{version}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return os.path.join(cache_dir, f"{storage.basename(path)}.{digest}.idx.npy")


def cached_index(path: str, cache_dir: str | None) -> np.ndarray:
    """index_file(path), read from / written to cache_dir when given (atomic writes)."""
    if not cache_dir:
        return index_file(path)
    cache = _index_cache_path(path, cache_dir)
    if os.path.isfile(cache):
        return np.load(cache)
    offsets = index_file(path)
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{cache}.tmp{os.getpid()}.npy"
    np.save(tmp, offsets)
    os.replace(tmp, cache)
    return offsets


class _ObjectReads:
    """Ranged reads of whole framed records from objects; thread safe. A record read
    right after its predecessor in the same file (by the same thread: an eval set read in
    order) fetches the records that follow it too, up to READ_AHEAD_BYTES, and the next
    reads are served from them; any other read is one request for the record alone (the
    training order is random)."""

    def __init__(self):
        self._local = threading.local()

    def __reduce__(self):
        return (_ObjectReads, ())  # a fresh one: the buffers stay with their threads

    def framed(self, path: str, offsets: np.ndarray, file_size: int, k: int) -> bytes:
        start = int(offsets[k])
        end = int(offsets[k + 1]) if k + 1 < len(offsets) else file_size
        last = getattr(self._local, "last", None)  # (path, record, buffer start, buffer)
        sequential = False
        if last is not None and last[0] == path:
            _, last_k, buf_start, buf = last
            if buf_start <= start and end <= buf_start + len(buf):
                self._local.last = (path, k, buf_start, buf)
                return buf[start - buf_start : end - buf_start]
            sequential = k == last_k + 1
        fetch_end = end
        if sequential:  # through the last record that starts within the read-ahead
            after = int(np.searchsorted(offsets, min(start + READ_AHEAD_BYTES, file_size)))
            fetch_end = int(offsets[after]) if after < len(offsets) else file_size
            fetch_end = max(fetch_end, end)
        buf = storage.read_range(path, start, fetch_end - start)
        self._local.last = (path, k, start, buf)
        return buf[: end - start]


class TFRecordSource:
    """Random access over the records of several TFRecord files, in file order.

    source[i] is parse(data, where) for global record i, where `where` names the file and
    byte offset (for error messages). Works as a grain data source: len() and [i]; it
    pickles without its open file handles (each worker process opens its own).
    """

    def __init__(
        self,
        files: Sequence[str],
        parse: Callable[[bytes, str], Any],
        cache_dir: str | None = None,
        first_file: int = 0,
    ):
        """Indexes every file (cached in cache_dir). Files are indexed starting at
        `first_file` (round robin): hosts sharing cache_dir start at different files and
        mostly load each other's indexes instead of all walking every file."""
        if not files:
            raise InputError("TFRecordSource needs at least one file")
        self.files = tuple(files)
        self._parse = parse
        n = len(self.files)
        offsets: list[np.ndarray | None] = [None] * n
        self._sizes = [storage.size(p) for p in self.files]
        for k in range(n):
            i = (first_file + k) % n
            index = cached_index(self.files[i], cache_dir)
            # 4 bytes a record where the file allows (hundreds of millions of records).
            offsets[i] = index.astype(np.uint32) if self._sizes[i] < 2**32 else index
        self._offsets = offsets
        counts = np.asarray([len(o) for o in offsets], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._handles: dict[int, int] = {}  # file number -> descriptor
        self._open_lock = threading.Lock()
        self._objects = _ObjectReads()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        return f"TFRecordSource(files={len(self.files)}, records={len(self)})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = {}
        del state["_open_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_lock = threading.Lock()

    def locate(self, index: int) -> tuple[int, int]:
        """(file number, byte offset) of global record index."""
        if not 0 <= index < len(self):
            raise IndexError(f"record {index} out of range [0, {len(self)})")
        file_no = int(np.searchsorted(self._starts, index, side="right")) - 1
        return file_no, int(self._offsets[file_no][index - self._starts[file_no]])

    def read(self, index: int) -> bytes:
        """The raw data of global record index (data CRC checked). Thread safe: positioned
        reads (pread) on one descriptor per file, no shared file position."""
        file_no, offset = self.locate(index)
        path = self.files[file_no]
        if storage.is_url(path):
            return self._read_object(file_no, index - int(self._starts[file_no]), offset)
        fd = self._handles.get(file_no)
        if fd is None:
            with self._open_lock:
                fd = self._handles.get(file_no)
                if fd is None:
                    fd = self._handles[file_no] = os.open(path, os.O_RDONLY)
        header = os.pread(fd, _HEADER.size, offset)
        length = _parse_header(header, path, offset, self._sizes[file_no])
        blob = os.pread(fd, length + _FOOTER.size, offset + _HEADER.size)
        _check_data(path, offset, blob[:length], blob[length:], length)
        return blob[:length]

    def _read_object(self, file_no: int, k: int, offset: int) -> bytes:
        """Record k of an object: its framed bytes in one ranged read (the index gives
        where the next record starts), both checksums verified."""
        path, size = self.files[file_no], self._sizes[file_no]
        framed = self._objects.framed(path, self._offsets[file_no], size, k)
        length = _parse_header(framed[: _HEADER.size], path, offset, size)
        data = framed[_HEADER.size : _HEADER.size + length]
        _check_data(path, offset, data, framed[_HEADER.size + length :], length)
        return data

    def __getitem__(self, index: int) -> Any:
        file_no, offset = self.locate(int(index))
        return self._parse(self.read(int(index)), f"{self.files[file_no]} at byte offset {offset}")

    def close(self) -> None:
        for fd in self._handles.values():
            os.close(fd)
        self._handles.clear()
