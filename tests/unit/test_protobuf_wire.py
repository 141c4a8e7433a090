"""The shared protobuf wire-format decoder: varints, fields, and malformed bytes."""

from __future__ import annotations

import pytest

from input_pipeline.protobuf_wire import (
    I32,
    I64,
    LEN,
    VARINT,
    WireError,
    encode_varint,
    fields,
    fixed_int,
    len_field,
    read_varint,
)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**35 + 7, 2**64 - 1])
def test_varints_round_trip(value):
    data = b"\xff" + encode_varint(value)
    assert read_varint(data, 1) == (value, len(data))


def test_negative_numbers_are_ten_byte_twos_complement():
    data = encode_varint(-1)
    assert len(data) == 10 and read_varint(data, 0)[0] == 2**64 - 1


def test_fields_of_every_wire_type_in_order():
    message = (
        encode_varint(1 << 3 | VARINT)
        + encode_varint(150)
        + len_field(2, b"abc")
        + encode_varint(3 << 3 | I32)
        + (7).to_bytes(4, "little")
        + encode_varint(4 << 3 | I64)
        + (2**40).to_bytes(8, "little")
    )
    got = list(fields(message))
    assert [(n, w) for n, w, _ in got] == [(1, VARINT), (2, LEN), (3, I32), (4, I64)]
    assert got[0][2] == 150 and bytes(got[1][2]) == b"abc"
    assert fixed_int(got[2][2]) == 7 and fixed_int(got[3][2]) == 2**40


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x08", "truncated varint"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "varint longer than 10 bytes"),
        (len_field(2, b"abc")[:-1], "truncated field 2"),
        (encode_varint(5 << 3 | I64) + b"1234", "truncated field 5"),
        (encode_varint(1 << 3 | 3), "unsupported wire type 3"),
    ],
)
def test_malformed_bytes_say_what_is_wrong(data, message):
    with pytest.raises(WireError, match=f"^{message}$"):
        list(fields(data))
