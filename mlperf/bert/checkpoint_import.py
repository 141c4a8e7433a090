"""BERT initial parameters from a pretrained checkpoint: TF1 (Google BERT / the MLPerf
reference `model.ckpt-28252`) or a Hugging Face `BertForPreTraining` directory.

`config.init.checkpoint` names the checkpoint; its format is detected from the files.
Names come from `hf_export.hf_tensors` (the one mapping, also used by the export); a
TF1 variable's name is derived from the HF one (`bert/encoder/layer_0/.../kernel`,
LayerNorm `gamma`/`beta`, `cls/predictions/output_bias`, ...). Everything is checked
against the model config from the files' headers (bert_config.json / config.json,
variable shapes) before a tensor is read. A vocabulary shorter than the model's table
(30,522 tokens in a 30,528-row table) gets zero padding rows, which the model never
predicts (`BertConfig.valid_vocab_size`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from input_pipeline import storage
from input_pipeline.input_errors import InputError
from input_pipeline.tf1_checkpoint import Tf1Checkpoint, is_tf1_checkpoint
from mlperf.bert.hf_export import HfTensor, from_hf_layout, hf_shape, hf_tensors, is_stacked
from mlperf.bert.model import BertConfig
from mlperf.pretrained import Pretrained

_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
# (checkpoint config key, our BertConfig field, the config override that sets it)
_CONFIG_KEYS = (
    ("hidden_size", "hidden_size", "model.hidden_size"),
    ("num_hidden_layers", "num_layers", "model.num_layers"),
    ("num_attention_heads", "num_heads", "model.num_heads"),
    ("intermediate_size", "mlp_dim", "model.mlp_dim"),
    ("max_position_embeddings", "max_position", "model.max_position"),
    ("type_vocab_size", "type_vocab_size", "model.type_vocab_size"),
)
# hidden_act -> whether it is GELU's tanh approximation. Google's TF BERT code (TF1
# checkpoints) implements "gelu" with tanh; transformers' "gelu" is the exact erf form.
_ACTIVATIONS = {
    True: {"gelu": True},
    False: {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True},
}
_TF1_SPECIAL = {
    "cls.predictions.bias": "cls/predictions/output_bias",
    "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
    "cls.seq_relationship.bias": "cls/seq_relationship/output_bias",
}


def tf1_name(hf: str) -> tuple[str, bool]:
    """Google BERT's TF1 variable name for an HF tensor name, and whether the TF value is
    the transpose of HF's (Dense kernels are [in, out]; the NSP `output_weights` are
    stored [2, hidden] like torch)."""
    if hf in _TF1_SPECIAL:
        return _TF1_SPECIAL[hf], False
    stem, last = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", hf).rsplit(".", 1)
    stem = stem.replace(".", "/")
    if stem.endswith("_embeddings"):
        return stem, False
    if stem.endswith("LayerNorm"):
        return f"{stem}/{'gamma' if last == 'weight' else 'beta'}", False
    return f"{stem}/{'kernel' if last == 'weight' else 'bias'}", last == "weight"


class _Tf1Source:
    """A TF1 checkpoint seen through HF names and layouts."""

    format = "TF1 checkpoint"

    def __init__(self, path: str):
        self.reader = Tf1Checkpoint(path)
        self.path = self.reader.prefix
        self.config_path = os.path.join(os.path.dirname(self.path), "bert_config.json")

    def name(self, t: HfTensor) -> str:
        return tf1_name(t.name)[0]

    def has(self, t: HfTensor) -> bool:
        return self.name(t) in self.reader.entries

    def shape(self, t: HfTensor) -> tuple[int, ...]:
        name, transposed = tf1_name(t.name)
        shape = self.reader.shape(name)
        return shape[::-1] if transposed else shape

    def read(self, t: HfTensor) -> np.ndarray:
        name, transposed = tf1_name(t.name)
        value = self.reader.read(name)
        return value.T if transposed else value

    def available(self) -> list[str]:
        return self.reader.names()


def _hf_weights_file(path: str) -> str:
    if os.path.isfile(path):
        return path
    for name in _HF_WEIGHTS:
        if os.path.exists(os.path.join(path, name)):
            return os.path.join(path, name)
    raise FileNotFoundError(
        f"init.checkpoint={path!r}: no TF checkpoint (*.index) and no Hugging Face weights "
        f"({', '.join(_HF_WEIGHTS)}) there; point it at a checkpoint prefix or an HF directory"
    )


def _legacy(name: str) -> str:
    """Older HF BERT files name LayerNorm parameters gamma/beta."""
    return re.sub(
        r"LayerNorm\.gamma$",
        "LayerNorm.weight",
        re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name),
    )


class _HfSource:
    """An HF BertForPreTraining directory (or weights file): safetensors (single or
    sharded) or pytorch_model.bin (needs torch)."""

    format = "Hugging Face checkpoint"

    def __init__(self, path: str):
        self.path = _hf_weights_file(path)
        self.config_path = os.path.join(os.path.dirname(self.path), "config.json")
        self._files: dict[str, str] = {}  # our HF name -> file
        self._keys: dict[str, str] = {}  # our HF name -> the file's key
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._torch: dict[str, Any] | None = None
        if self.path.endswith(".bin"):
            self._open_torch()
        else:
            files = [self.path]
            if self.path.endswith(".index.json"):
                with open(self.path) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
                files = [os.path.join(os.path.dirname(self.path), s) for s in shards]
            from safetensors import safe_open

            for file in files:
                with safe_open(file, "np") as f:
                    for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        self._add(key, file, tuple(f.get_slice(key).get_shape()))
        alias = "cls.predictions.decoder.bias"
        if "cls.predictions.bias" not in self._keys and alias in self._keys:
            self._keys["cls.predictions.bias"] = self._keys[alias]
            self._files["cls.predictions.bias"] = self._files[alias]
            self._shapes["cls.predictions.bias"] = self._shapes[alias]

    def _add(self, key: str, file: str, shape: tuple[int, ...]) -> None:
        name = _legacy(key)
        self._keys[name], self._files[name], self._shapes[name] = key, file, shape

    def _open_torch(self) -> None:
        try:
            import torch
        except ImportError:
            raise InputError(
                f"{self.path} is a PyTorch pickle and torch is not installed; install torch "
                "or save the model with safetensors (model.save_pretrained(dir))"
            ) from None
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        self._torch = {}
        for key, tensor in state.items():
            self._add(key, self.path, tuple(tensor.shape))
            self._torch[key] = tensor

    def name(self, t: HfTensor) -> str:
        return self._keys.get(t.name, t.name)

    def has(self, t: HfTensor) -> bool:
        return t.name in self._keys

    def shape(self, t: HfTensor) -> tuple[int, ...]:
        return self._shapes[t.name]

    def read(self, t: HfTensor) -> np.ndarray:
        key = self._keys[t.name]
        if self._torch is not None:
            return self._torch[key].float().numpy()
        from safetensors import safe_open

        with safe_open(self._files[t.name], "np") as f:
            return f.get_tensor(key)

    def available(self) -> list[str]:
        return sorted(self._keys)


def open_source(path: str) -> _Tf1Source | _HfSource:
    """The checkpoint at `path`, its format detected: a TF checkpoint prefix / index /
    directory with a `checkpoint` file, or an HF directory / weights file."""
    # A checkpoint in a bucket is read from a local copy of its folder (cached).
    path = storage.local_mirror(path) if storage.is_url(path) else os.path.expanduser(path)
    if not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise FileNotFoundError(f"init.checkpoint={path!r} does not exist")
    if os.path.isdir(path) and any(os.path.exists(os.path.join(path, n)) for n in _HF_WEIGHTS):
        return _HfSource(path)
    if is_tf1_checkpoint(path):
        return _Tf1Source(path)
    return _HfSource(path)


def check_config(source_config: str, cfg: BertConfig, tf1: bool = False) -> None:
    """The checkpoint's bert_config.json / config.json against our model config: one
    error naming every key that disagrees (a missing file is not an error: the shapes
    are checked anyway)."""
    if not os.path.exists(source_config):
        return
    with open(source_config) as f:
        theirs = json.load(f)
    wrong = []
    for key, field, override in _CONFIG_KEYS:
        if key in theirs and int(theirs[key]) != getattr(cfg, field):
            wrong.append(f"{key}={theirs[key]} (config: {override}={getattr(cfg, field)})")
    vocab = theirs.get("vocab_size")
    if vocab is not None and int(vocab) not in (cfg.predictable_vocab_size, cfg.vocab_size):
        wrong.append(
            f"vocab_size={vocab} (config: {cfg.predictable_vocab_size} tokens in a "
            f"{cfg.vocab_size}-row table: data.vocab_file / data.vocab_size, model.vocab_size)"
        )
    act = theirs.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS[tf1]:
        wrong.append(f"hidden_act={act!r}" + (" in Google's TF BERT" if tf1 else ""))
    elif _ACTIVATIONS[tf1][act] != cfg.gelu_approximate:
        wrong.append(
            f"hidden_act={act!r}{' in TF BERT' if tf1 else ''} is the "
            f"{'tanh-approximated' if not cfg.gelu_approximate else 'exact'} GELU (config: "
            f"model.gelu_approximate={cfg.gelu_approximate})"
        )
    if wrong:
        raise InputError(
            f"{source_config} disagrees with the model config: {'; '.join(wrong)}. Choose the "
            "matching variant or override those values."
        )


def _our_shape(shapes: Any, t: HfTensor) -> tuple[int, ...]:
    """Our parameter's (per-layer) shape from the abstract params tree."""
    node = shapes
    path = t.path
    if path[0] == "layers" and is_stacked(shapes["layers"]):
        node = shapes["layers"]
        for key in path[2:]:
            node = node[key]
        return tuple(node.shape[1:])
    for key in path:
        node = node[key] if key in node else node[str(key)]
    return tuple(node.shape)


class PretrainedBert(Pretrained):
    """A checked checkpoint, ready to read into our parameter tree."""

    whole_model = True

    def __init__(self, path: str, cfg: BertConfig, param_shapes: Any):
        self.source = open_source(path)
        self.cfg = cfg
        self.shapes = param_shapes
        check_config(self.source.config_path, cfg, isinstance(self.source, _Tf1Source))
        self.tensors = hf_tensors(cfg.num_layers)
        missing = [t for t in self.tensors if not self.source.has(t)]
        if missing:
            names = ", ".join(self.source.name(t) for t in missing[:3])
            held = ", ".join(self.source.available()[:5])
            raise InputError(
                f"{self.source.format} {self.source.path} lacks {len(missing)} variable(s) "
                f"the model needs: {names}{' ...' if len(missing) > 3 else ''} (it holds "
                f"e.g. {held}); is it a BertForPreTraining checkpoint with "
                f"{cfg.num_layers} layers?"
            )
        wrong = []
        for t in self.tensors:
            need, have = hf_shape(t, _our_shape(param_shapes, t)), self.source.shape(t)
            if t.vocab_rows and have[1:] == need[1:] and have[0] <= need[0]:
                continue  # padded with zero rows that are never predicted
            if have != need:
                wrong.append(
                    f"{self.source.name(t)} is {have} in the checkpoint, the config needs {need}"
                )
        if wrong:
            raise InputError(
                f"{self.source.format} {self.source.path} does not match the model config: "
                f"{'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''}. Choose the "
                "matching variant (e.g. configs/bert.py:large) or override model.*."
            )

    def describe(self) -> str:
        return f"{self.source.format} {self.source.path}"

    def read(self) -> dict[str, Any]:
        """Every parameter as a host float32 array, in our tree (unrolled or stacked)."""
        out: dict[str, Any] = {}
        stacked = is_stacked(self.shapes["layers"])
        per_layer: dict[tuple, list] = {}
        for t in self.tensors:
            shape = _our_shape(self.shapes, t)
            value = np.asarray(self.source.read(t), np.float32)
            if t.vocab_rows and value.shape[0] < shape[0]:
                pad = np.zeros((shape[0] - value.shape[0], *value.shape[1:]), np.float32)
                value = np.concatenate([value, pad])
            value = from_hf_layout(value, t, shape)
            if stacked and t.path[0] == "layers":
                per_layer.setdefault(("layers", *t.path[2:]), []).append(value)
            else:
                _set(out, t.path, value)
        for path, values in per_layer.items():
            _set(out, path, np.stack(values))
        return out


def _set(tree: dict, path: tuple, value: np.ndarray) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
