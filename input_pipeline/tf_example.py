"""`tf.train.Example` protocol buffers without TensorFlow or generated code.

The messages (tensorflow/core/example/{example,feature}.proto):

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }     # map entry: key = 1, value = 2
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                            Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Repeated numbers are read packed or unpacked (the wire format allows both). Packed int64
varints are decoded with numpy, a whole list at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from input_pipeline.protobuf_wire import (
    I32,
    LEN,
    VARINT,
    WireError,
    encode_varint,
    fields,
    len_field,
)

BYTES, FLOAT, INT64 = "bytes_list", "float_list", "int64_list"
_KINDS = {1: BYTES, 2: FLOAT, 3: INT64}
_FIELD_OF_KIND = {v: k for k, v in _KINDS.items()}


class ExampleError(ValueError):
    """A malformed Example, or a feature missing / of the wrong type or length."""


def _fields(buf: bytes, where: str) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field; value is an int or a bytes slice."""
    try:
        yield from fields(buf)
    except WireError as e:
        raise ExampleError(f"{where}: {e} in the Example protobuf") from None


def decode_packed_varints(payload: bytes, where: str = "") -> np.ndarray:
    """Packed int64 varints -> int64 array (two's complement for negatives, as protobuf)."""
    buf = np.frombuffer(payload, np.uint8)
    if buf.size == 0:
        return np.zeros(0, np.int64)
    if buf[-1] >= 0x80:
        raise ExampleError(f"{where}: truncated packed int64 list in the Example protobuf")
    if not (buf >= 0x80).any():  # every value fits one byte (small ids): the common case
        return buf.astype(np.int64)
    ends = np.flatnonzero(buf < 0x80)
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise ExampleError(f"{where}: varint longer than 10 bytes in the Example protobuf")
    shift = (np.arange(buf.size) - np.repeat(starts, lengths)) * 7
    parts = (buf & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.bitwise_or.reduceat(parts, starts).view(np.int64)


def _feature(buf: bytes, where: str) -> tuple[str, Any]:
    """(kind, values) of one Feature message; values is a list of bytes or an ndarray."""
    kind, values = None, None
    for number, wire, value in _fields(buf, where):
        if number not in _KINDS or wire != LEN:
            continue  # unknown fields are ignored, as protobuf parsers do
        kind = _KINDS[number]
        ints, floats, strings = [], [], []
        for n, w, v in _fields(value, where):
            if n != 1:
                continue
            if kind == BYTES and w == LEN:
                strings.append(bytes(v))
            elif kind == INT64 and w == LEN:
                ints.append(decode_packed_varints(v, where))
            elif kind == INT64 and w == VARINT:
                ints.append(np.asarray([v], np.uint64).view(np.int64))
            elif kind == FLOAT and w == LEN:
                if len(v) % 4:
                    raise ExampleError(f"{where}: packed float list of {len(v)} bytes")
                floats.append(np.frombuffer(v, "<f4"))
            elif kind == FLOAT and w == I32:
                floats.append(np.frombuffer(v, "<f4"))
            else:
                raise ExampleError(f"{where}: wire type {w} in a {kind} of the Example protobuf")
        if kind == BYTES:
            values = strings
        elif kind == INT64:
            values = np.concatenate(ints) if ints else np.zeros(0, np.int64)
        else:
            values = np.concatenate(floats) if floats else np.zeros(0, np.float32)
    return kind or INT64, values if values is not None else np.zeros(0, np.int64)


def parse_example(data: bytes, where: str = "record") -> dict[str, tuple[str, Any]]:
    """A serialized tf.train.Example -> {feature name: (kind, values)}.

    kind is "bytes_list", "float_list" or "int64_list"; values a list of bytes or a 1-D
    int64 / float32 array. A feature with no kind set reads as an empty int64_list.
    """
    features: dict[str, tuple[str, Any]] = {}
    for number, wire, value in _fields(data, where):
        if number != 1 or wire != LEN:
            continue
        for n, w, entry in _fields(value, where):
            if n != 1 or w != LEN:
                continue
            name, feature = "", b""
            for en, ew, ev in _fields(entry, where):
                if en == 1 and ew == LEN:
                    name = bytes(ev).decode("utf-8")
                elif en == 2 and ew == LEN:
                    feature = ev
            features[name] = _feature(feature, where)
    return features


def parse_features(
    data: bytes, spec: Mapping[str, tuple[tuple[int, ...], str]], where: str = "record"
) -> dict[str, np.ndarray]:
    """Decodes the features in spec ({name: (shape, numpy dtype)}) and checks each one.

    Integer dtypes need an int64_list, float dtypes a float_list, and exactly prod(shape)
    values; anything else raises ExampleError naming the feature, what the file holds and
    what was expected. Features outside spec are ignored.
    """
    features = parse_example(data, where)
    out = {}
    for name, (shape, dtype) in spec.items():
        dtype = np.dtype(dtype)
        want_kind = FLOAT if dtype.kind == "f" else INT64
        want = f"{want_kind} of {math.prod(shape)} values"
        if name not in features:
            raise ExampleError(
                f"{where}: feature {name!r} missing (expected {want}); the record has "
                f"{sorted(features)}"
            )
        kind, values = features[name]
        if kind != want_kind:
            raise ExampleError(f"{where}: feature {name!r} is a {kind}, expected {want}")
        if values.size != math.prod(shape):
            raise ExampleError(
                f"{where}: feature {name!r} has {values.size} values, expected {want}"
            )
        out[name] = values.astype(dtype, copy=False).reshape(shape)
    return out


# ---- encoding (test files, benchmarks) ----------------------------------------------------
def encode_example(features: Mapping[str, Any]) -> bytes:
    """A serialized tf.train.Example: int arrays -> int64_list, float -> float_list,
    bytes / list of bytes -> bytes_list (numbers packed, as TensorFlow writes them)."""
    entries = []
    for name, values in features.items():
        if isinstance(values, bytes) or (
            isinstance(values, list | tuple) and values and isinstance(values[0], bytes)
        ):
            items = [values] if isinstance(values, bytes) else list(values)
            body = len_field(_FIELD_OF_KIND[BYTES], b"".join(len_field(1, v) for v in items))
        else:
            arr = np.asarray(values).reshape(-1)
            if arr.dtype.kind == "f":
                packed = arr.astype("<f4").tobytes()
                kind = FLOAT
            else:
                packed = b"".join(encode_varint(int(v)) for v in arr)
                kind = INT64
            body = len_field(_FIELD_OF_KIND[kind], len_field(1, packed) if arr.size else b"")
        entry = len_field(1, name.encode("utf-8")) + len_field(2, body)
        entries.append(len_field(1, entry))
    return len_field(1, b"".join(entries))
