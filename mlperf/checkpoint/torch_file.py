"""Reads a PyTorch `torch.save` file of tensors (a state_dict) into numpy, without torch.

Two layouts exist. Since torch 1.6 a .pth is a zip: `<name>/data.pkl` is a pickle whose
tensors refer to storages by key, and `<name>/data/<key>` holds each storage's raw
little-endian bytes. Older files (torchvision's resnet34-333f7ec4.pth, 2017) are a run of
pickles: a magic number, a protocol version, system info, the object pickle, the list of
storage keys, then each storage as an int64 element count followed by its bytes.

The unpickler here resolves only the names a state_dict needs (OrderedDict, the tensor
rebuild functions, the typed storage classes), so a file holding anything else (a whole
pickled module, arbitrary code) is refused with a message instead of being executed.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from typing import Any

import ml_dtypes
import numpy as np

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class TorchFileError(ValueError):
    """The file is not a torch.save file of tensors this reader understands."""


class _StorageType:
    """Stands in for torch.<X>Storage in the pickle: only its element dtype matters."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


class _PendingStorage:
    """A legacy-format storage whose bytes come after the object pickle."""

    def __init__(self, key: str, dtype: np.dtype, view: tuple[int, int] | None = None):
        self.key, self.dtype, self.view = key, dtype, view


class _PendingTensor:
    """A tensor over a _PendingStorage, rebuilt once the storages are read."""

    def __init__(self, storage: _PendingStorage, args: tuple):
        self.storage, self.args = storage, args


def _strided(storage: np.ndarray, offset: int, size, stride) -> np.ndarray:
    size, stride = tuple(size), tuple(stride)
    if not size:
        return np.array(storage[offset])
    needed = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if min(size) > 0 and needed > storage.size:
        raise TorchFileError(f"a tensor of shape {size} reaches past its storage; corrupt file?")
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=tuple(s * itemsize for s in stride)
    )
    return np.ascontiguousarray(view)


def _rebuild_tensor(storage, offset: int, size, stride, *_rest):
    """torch._utils._rebuild_tensor(_v2): a strided view of a flat storage, copied."""
    if isinstance(storage, _PendingStorage):
        return _PendingTensor(storage, (offset, size, stride))
    return _strided(storage, offset, size, stride)


def _rebuild_parameter(data: np.ndarray, *_rest) -> np.ndarray:
    """torch._utils._rebuild_parameter: an nn.Parameter is its data here."""
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Resolves only state_dict names; storages come from `load_storage(key, dtype, n)`."""

    def __init__(self, data: io.BufferedIOBase, path: str, load_storage):
        super().__init__(data)
        self._path = path
        self._load_storage = load_storage

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        raise TorchFileError(
            f"{self._path} holds a pickled {module}.{name}, not just tensors: save the "
            "model's state_dict() (torch.save(model.state_dict(), path)) and point at that."
        )

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise TorchFileError(f"{self._path}: unknown persistent id {pid!r:.80}.")
        storage_type, key = pid[1], str(pid[2])
        if not isinstance(storage_type, _StorageType):
            raise TorchFileError(f"{self._path}: storage of unknown type {storage_type!r:.80}.")
        view = None
        if len(pid) >= 6 and pid[5] is not None:  # legacy view: (view key, offset, size)
            _, offset, size = pid[5]
            view = (int(offset), int(size))
        return self._load_storage(key, storage_type.dtype, view)


def _load_zip(path: str) -> Any:
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if not pkl:
            raise TorchFileError(f"{path} is a zip but has no data.pkl: not a torch.save file.")
        prefix = pkl[0][: -len("data.pkl")]
        order = z.read(prefix + "byteorder").decode() if prefix + "byteorder" in names else "little"
        if order != "little":
            raise TorchFileError(f"{path} was saved big-endian; re-save it little-endian.")
        cache: dict[str, np.ndarray] = {}

        def storage(key: str, dtype: np.dtype, view=None) -> np.ndarray:
            del view  # the zip format has no storage views
            if key not in cache:
                cache[key] = np.frombuffer(z.read(f"{prefix}data/{key}"), dtype=dtype)
            return cache[key]

        with z.open(pkl[0]) as f:
            return _Unpickler(io.BytesIO(f.read()), path, storage).load()


def _load_legacy(path: str) -> Any:
    with open(path, "rb") as f:
        try:
            magic = pickle.load(f)
        except Exception as e:
            raise TorchFileError(f"{path} is not a torch.save file ({type(e).__name__}).") from e
        if magic != _LEGACY_MAGIC:
            raise TorchFileError(f"{path} is not a torch.save file (no torch magic number).")
        pickle.load(f)  # protocol version
        sys_info = pickle.load(f)
        if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
            raise TorchFileError(f"{path} was saved big-endian; re-save it little-endian.")
        pending: dict[str, np.dtype] = {}

        def storage(key: str, dtype: np.dtype, view=None) -> _PendingStorage:
            pending[key] = dtype
            return _PendingStorage(key, dtype, view)

        obj = _Unpickler(f, path, storage).load()
        keys = pickle.load(f)
        arrays: dict[str, np.ndarray] = {}
        for key in keys:
            (count,) = struct.unpack("<q", f.read(8))
            dtype = pending.get(str(key), np.dtype(np.uint8))
            data = f.read(count * dtype.itemsize)
            if len(data) != count * dtype.itemsize:
                raise TorchFileError(f"{path} is truncated (storage {key}).")
            arrays[str(key)] = np.frombuffer(data, dtype=dtype)
    return _resolve(obj, arrays, path)


def _resolve(obj: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """Replaces pending tensors with arrays over the storages read after the pickle."""
    if isinstance(obj, _PendingTensor):
        st = obj.storage
        if st.key not in arrays:
            raise TorchFileError(f"{path}: storage {st.key} is missing from the data section.")
        data = arrays[st.key]
        if st.view is not None:
            data = data[st.view[0] : st.view[0] + st.view[1]]
        return _strided(data, *obj.args)
    if isinstance(obj, dict):
        return type(obj)((k, _resolve(v, arrays, path)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(_resolve(v, arrays, path) for v in obj)
    return obj


def load_torch_file(path: str) -> Any:
    """The object a torch.save file holds, with every tensor as a numpy array."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist (or is not a file).")
    if zipfile.is_zipfile(path):
        return _load_zip(path)
    return _load_legacy(path)


def load_state_dict(path: str) -> dict[str, np.ndarray]:
    """A flat name -> array dict from a torch.save'd state_dict (also unwraps the common
    {"state_dict": ...} / {"model": ...} checkpoint dicts and DDP's "module." prefix)."""
    obj = load_torch_file(path)
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj:
        raise TorchFileError(f"{path} does not hold a state_dict (got {type(obj).__name__}).")
    out = {}
    for name, value in obj.items():
        if not isinstance(value, np.ndarray):
            raise TorchFileError(
                f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor: not a "
                "state_dict."
            )
        out[name.removeprefix("module.")] = value
    return out
