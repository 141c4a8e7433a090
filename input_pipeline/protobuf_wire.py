"""The protocol buffer wire format, decoded and encoded without generated code.

A message is a sequence of fields, each a varint key (field number << 3 | wire type)
followed by its value: a varint (wire type 0), 8 little-endian bytes (1), a varint length
and that many bytes (2: strings, sub-messages, packed repeated numbers) or 4 bytes (5).
Varints are little-endian base 128, at most 10 bytes. TensorFlow's Example records
(tf_example.py), a checkpoint's BundleEntryProto (tf1_checkpoint.py) and the LevelDB
table around it (leveldb_table.py) all read their bytes through here.
"""

from __future__ import annotations

from collections.abc import Iterator

# Wire types
VARINT, I64, LEN, I32 = 0, 1, 2, 5
_MAX_VARINT_BYTES = 10


class WireError(ValueError):
    """Bytes that are not a well-formed message; callers add which file and message."""


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at `pos`: (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 7 * _MAX_VARINT_BYTES:
            raise WireError(f"varint longer than {_MAX_VARINT_BYTES} bytes")


def fields(buf: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes | memoryview]]:
    """(field number, wire type, value) of each field of one message, in order. The value
    is an int for a varint and a slice of `buf` otherwise (the raw 4 or 8 bytes of a
    fixed-width number)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
        else:
            if wire == LEN:
                size, pos = read_varint(buf, pos)
            elif wire in (I32, I64):
                size = 4 if wire == I32 else 8
            else:
                raise WireError(f"unsupported wire type {wire}")
            if pos + size > end:
                raise WireError(f"truncated field {number}")
            value, pos = buf[pos : pos + size], pos + size
        yield number, wire, value


def fixed_int(value: bytes | memoryview) -> int:
    """A fixed-width (wire type 1 or 5) field's little-endian unsigned value."""
    return int.from_bytes(value, "little")


def encode_varint(value: int) -> bytes:
    """`value` as a varint (negative numbers as their 64-bit two's complement)."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): key, length, payload."""
    return encode_varint(number << 3 | LEN) + encode_varint(len(payload)) + payload
