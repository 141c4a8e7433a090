"""TensorFlow checkpoints (the TF1 `Saver` / TF2 tensor-bundle format) without TensorFlow.

A checkpoint `PREFIX` is `PREFIX.index`, a LevelDB-format table (leveldb_table.py), plus
`PREFIX.data-NNNNN-of-MMMMM` files of raw tensor bytes. The index maps the empty key
to a `BundleHeaderProto` (shard count, endianness) and each variable name to a
`BundleEntryProto` (dtype, shape, shard, offset, size, masked CRC32C of the bytes);
both are decoded here from the protobuf wire format directly (a handful of fields).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re

import google_crc32c
import numpy as np

from input_pipeline.leveldb_table import Table, unmask_crc
from input_pipeline.protobuf_wire import LEN, VARINT, WireError, fields, fixed_int

# tensorflow/core/framework/types.proto DataType -> numpy (string and resource types are
# never model weights and are not read).
_DTYPES = {
    1: np.float32,
    2: np.float64,
    3: np.int32,
    4: np.uint8,
    5: np.int16,
    6: np.int8,
    9: np.int64,
    10: np.bool_,
    17: np.uint16,
    19: np.float16,
    22: np.uint32,
    23: np.uint64,
}
_BFLOAT16 = 14


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message names the file and what is wrong."""


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """Protobuf wire format -> [(field number, varint / fixed int / bytes)]."""
    out = []
    for number, wire, value in fields(buf):
        if wire == LEN:
            value = bytes(value)
        elif wire != VARINT:
            value = fixed_int(value)
        out.append((number, value))
    return out


@dataclasses.dataclass(frozen=True)
class Entry:
    """Where one variable lives: a BundleEntryProto."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    sliced: bool


def _entry(value: bytes) -> Entry:
    f = dict(dtype=1, shape=(), shard_id=0, offset=0, size=0, crc32c=None, sliced=False)
    for number, v in _fields(value):
        if number == 1:
            f["dtype"] = v
        elif number == 2:  # TensorShapeProto: repeated Dim dim = 2 {int64 size = 1}
            dims = [dict(_fields(d)).get(1, 0) for n, d in _fields(v) if n == 2]
            f["shape"] = tuple(int(d) for d in dims)
        elif number == 3:
            f["shard_id"] = v
        elif number == 4:
            f["offset"] = v
        elif number == 5:
            f["size"] = v
        elif number == 6:
            f["crc32c"] = v
        elif number == 7:
            f["sliced"] = True
    return Entry(**f)


def resolve_prefix(path: str) -> str:
    """A checkpoint prefix from `PREFIX`, `PREFIX.index`, `PREFIX.data-*` or a directory
    (its `checkpoint` file's model_checkpoint_path, else its only `*.index`)."""
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        state = os.path.join(path, "checkpoint")
        if os.path.exists(state):
            with open(state) as f:
                m = re.search(r'^model_checkpoint_path:\s*"(.*)"', f.read(), re.M)
            if m:
                prefix = os.path.join(path, m.group(1))
                # A moved checkpoint directory: its `checkpoint` file keeps the old path.
                moved = os.path.join(path, os.path.basename(prefix))
                return prefix if os.path.exists(prefix + ".index") else moved
        indexes = sorted(glob.glob(os.path.join(path, "*.index")))
        if len(indexes) != 1:
            found = ", ".join(os.path.basename(i) for i in indexes) or "none"
            raise CheckpointError(
                f"{path}: expected one TF checkpoint (*.index) in the directory, found "
                f"{found}; pass the checkpoint prefix, e.g. {path}/model.ckpt-28252"
            )
        return indexes[0][: -len(".index")]
    if path.endswith(".index"):
        return path[: -len(".index")]
    m = re.match(r"(.*)\.data-\d{5}-of-\d{5}$", path)
    return m.group(1) if m else path


def is_tf1_checkpoint(path: str) -> bool:
    """Whether `path` names a TensorFlow checkpoint (prefix, index, data file or dir)."""
    try:
        return os.path.exists(resolve_prefix(path) + ".index")
    except CheckpointError:
        return False


class Tf1Checkpoint:
    """Variable names, shapes and values of a TensorFlow checkpoint."""

    def __init__(self, path: str):
        self.prefix = resolve_prefix(path)
        index = self.prefix + ".index"
        if not os.path.exists(index):
            raise CheckpointError(f"{path}: no TensorFlow checkpoint index {index}")
        items = Table(index).items()
        try:
            header = dict(_fields(items.pop(b"", b"")))
            self.entries = {k.decode(): _entry(v) for k, v in items.items()}
        except WireError as e:
            raise CheckpointError(f"{index}: {e} in a BundleEntryProto") from None
        self.num_shards = int(header.get(1, 1))
        if header.get(2, 0) != 0:
            raise CheckpointError(f"{index}: big-endian checkpoints are not supported")

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._get(name).shape

    def _get(self, name: str) -> Entry:
        if name not in self.entries:
            raise CheckpointError(f"{self.prefix}: no variable {name!r}")
        return self.entries[name]

    def data_file(self, shard_id: int) -> str:
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def read(self, name: str) -> np.ndarray:
        """The variable's value, its bytes checked against the index's CRC32C."""
        e = self._get(name)
        if e.sliced:
            raise CheckpointError(f"{self.prefix}: {name} is a partitioned variable (slices)")
        if e.dtype == _BFLOAT16:
            import ml_dtypes  # a jax dependency

            dtype = np.dtype(ml_dtypes.bfloat16)
        elif e.dtype in _DTYPES:
            dtype = np.dtype(_DTYPES[e.dtype])
        else:
            raise CheckpointError(f"{self.prefix}: {name} has TF dtype {e.dtype}, not numeric")
        expected = int(np.prod(e.shape, dtype=np.int64)) * dtype.itemsize
        if e.size != expected:
            raise CheckpointError(
                f"{self.prefix}: {name} holds {e.size} bytes, shape {e.shape} needs {expected}"
            )
        path = self.data_file(e.shard_id)
        if not os.path.exists(path):
            raise CheckpointError(f"{path} is missing (holds {name})")
        with open(path, "rb") as f:
            f.seek(e.offset)
            raw = f.read(e.size)
        if len(raw) != e.size:
            raise CheckpointError(f"{path}: truncated at {name} (offset {e.offset})")
        if e.crc32c is not None and unmask_crc(e.crc32c) != google_crc32c.value(raw):
            raise CheckpointError(f"{path}: CRC mismatch in {name} (offset {e.offset})")
        return np.frombuffer(raw, dtype).reshape(e.shape)
