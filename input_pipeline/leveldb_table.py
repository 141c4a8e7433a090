"""Read-only reader of LevelDB-format sorted tables (what a TF checkpoint's `.index` is).

The layout (leveldb/doc/table_format.md, which TensorFlow's `core/lib/io/table` keeps):
data blocks of prefix-compressed key/value entries, a metaindex block, an index block
mapping the last key of each data block to that block's handle, and a 48-byte footer
holding the metaindex and index handles plus a magic number. Each block is followed
by a 1-byte compression type (0 none, 1 snappy) and a masked CRC32C of block + type.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import google_crc32c

from input_pipeline.protobuf_wire import WireError, read_varint

_MAGIC = 0xDB4775248B80FB57
_FOOTER_BYTES = 48
_NO_COMPRESSION, _SNAPPY = 0, 1
_CRC_MASK_DELTA = 0xA282EAD8


class TableError(ValueError):
    """A table file that is truncated, corrupt or not a table at all."""


def unmask_crc(masked: int) -> int:
    """The CRC32C that LevelDB/TensorFlow stored in masked form."""
    rot = (masked - _CRC_MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def snappy_decompress(data: bytes) -> bytes:
    """Raw snappy block format: a varint length, then literals and back-references."""
    length, pos = read_varint(data, 0)
    out = bytearray()
    while pos < len(data):
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal; lengths over 60 follow in 1-4 bytes
            n = tag >> 2
            if n >= 60:
                extra = n - 59
                n = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            n += 1
            out += data[pos : pos + n]
            pos += n
            continue
        if kind == 1:
            n = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        elif kind == 2:
            n = 1 + (tag >> 2)
            offset = int.from_bytes(data[pos : pos + 2], "little")
            pos += 2
        else:
            n = 1 + (tag >> 2)
            offset = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        if offset == 0 or offset > len(out):
            raise TableError(f"snappy back-reference offset {offset} outside {len(out)} bytes")
        start = len(out) - offset
        for i in range(n):  # byte by byte: a copy may overlap what it writes
            out.append(out[start + i])
    if len(out) != length:
        raise TableError(f"snappy block decodes to {len(out)} bytes, header says {length}")
    return bytes(out)


def _handle(buf: bytes | memoryview, pos: int) -> tuple[tuple[int, int], int]:
    offset, pos = read_varint(buf, pos)
    size, pos = read_varint(buf, pos)
    return (offset, size), pos


def _block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) pairs of one block; keys share prefixes with their predecessor."""
    if len(block) < 4:
        raise TableError("block shorter than its restart count")
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * num_restarts
    if end < 0:
        raise TableError(f"block of {len(block)} bytes cannot hold {num_restarts} restarts")
    pos, key = 0, b""
    while pos < end:
        shared, pos = read_varint(block, pos)
        unshared, pos = read_varint(block, pos)
        value_len, pos = read_varint(block, pos)
        if shared > len(key) or pos + unshared + value_len > end:
            raise TableError(f"corrupt block entry at byte {pos}")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + value_len]
        pos += value_len


class Table:
    """All entries of one table file, read once (index files are small)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self._data = f.read()
        if len(self._data) < _FOOTER_BYTES:
            raise TableError(f"{path}: {len(self._data)} bytes is too short for a table")
        footer = self._data[-_FOOTER_BYTES:]
        (magic,) = struct.unpack_from("<Q", footer, 40)
        if magic != _MAGIC:
            raise TableError(f"{path}: no table magic number at the end (not a checkpoint index)")
        self._entries: dict[bytes, bytes] = {}
        try:
            _, pos = _handle(footer, 0)  # the metaindex (filters) is not needed
            index_handle, _ = _handle(footer, pos)
            for _, value in _block_entries(self._block(index_handle)):
                handle, _ = _handle(value, 0)
                self._entries.update(_block_entries(self._block(handle)))
        except WireError as e:
            raise TableError(f"{path}: {e} in a block handle or entry") from None

    def _block(self, handle: tuple[int, int]) -> bytes:
        offset, size = handle
        if offset + size + 5 > len(self._data):
            raise TableError(f"{self.path}: block at {offset} (+{size}) runs past the file end")
        contents = self._data[offset : offset + size]
        kind = self._data[offset + size]
        (masked,) = struct.unpack_from("<I", self._data, offset + size + 1)
        actual = google_crc32c.value(self._data[offset : offset + size + 1])
        if unmask_crc(masked) != actual:
            raise TableError(f"{self.path}: CRC mismatch in the block at byte {offset}")
        if kind == _NO_COMPRESSION:
            return contents
        if kind == _SNAPPY:
            return snappy_decompress(contents)
        raise TableError(f"{self.path}: block at byte {offset} has unknown compression {kind}")

    def items(self) -> dict[bytes, bytes]:
        """Every key -> value of the table."""
        return dict(self._entries)
