"""Our BERT parameters under Hugging Face `BertForPreTraining` names, plus its config.json.

The architectures are the same (post-LN encoder, exact GELU, LayerNorm eps 1e-12, MLM
transform dense -> GELU -> LayerNorm, output projection tied to the word embeddings, a
tanh pooler and a 2-way next-sentence head); only layouts differ:

- torch `nn.Linear` stores weight as [out, in]; our kernels are [in..., out...] with
  attention kernels split per head ([D, H, K] and [H, K, D]), so kernels are flattened
  over heads and transposed;
- our LayerNorm `scale` is HF's `weight`.

The MLM decoder weight and bias are tied in HF (`cls.predictions.decoder.*` share the
word embeddings and `cls.predictions.bias`), so only the tied originals are written.
`hf_tensors` is the one name mapping: export walks it one way, the checkpoint import
(mlperf/bert/checkpoint_import.py) the other, and TF1 names are derived from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from safetensors.numpy import save_file

from mlperf.bert.model import BertConfig

Params = Mapping[str, Any]
Path = tuple[str | int, ...]


@dataclasses.dataclass(frozen=True)
class HfTensor:
    """One HF tensor and the parameter of ours it holds.

    `in_dims` is None for tensors stored as ours up to a reshape (embeddings, biases,
    LayerNorm); for a Linear weight it is how many leading dims of our kernel are inputs.
    `vocab_rows`: the leading dim is the vocabulary (padded in our configs)."""

    name: str
    path: Path
    in_dims: int | None = None
    vocab_rows: bool = False


def hf_config(cfg: BertConfig) -> dict[str, Any]:
    """transformers' BertConfig fields for our model config (the predictable vocabulary:
    rows padded for sharding are not exported)."""
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": cfg.predictable_vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        # HF's "gelu" is the exact (erf) form, "gelu_new" the tanh approximation.
        "hidden_act": "gelu_new" if cfg.gelu_approximate else "gelu",
        "max_position_embeddings": cfg.max_position,
        "type_vocab_size": cfg.type_vocab_size,
        "layer_norm_eps": 1e-12,
        "hidden_dropout_prob": cfg.dropout_rate,
        "attention_probs_dropout_prob": cfg.dropout_rate,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def _dense(hf: str, path: Path, in_dims: int = 1) -> list[HfTensor]:
    return [
        HfTensor(f"{hf}.weight", (*path, "kernel"), in_dims),
        HfTensor(f"{hf}.bias", (*path, "bias")),
    ]


def _norm(hf: str, path: Path) -> list[HfTensor]:
    return [HfTensor(f"{hf}.weight", (*path, "scale")), HfTensor(f"{hf}.bias", (*path, "bias"))]


def hf_tensors(num_layers: int) -> list[HfTensor]:
    """Every HF BertForPreTraining tensor (tied ones once) with our parameter path; layer
    parameters under ("layers", i, ...), the unrolled form."""
    out = [
        HfTensor(
            "bert.embeddings.word_embeddings.weight",
            ("word_embeddings", "embedding"),
            vocab_rows=True,
        ),
        HfTensor(
            "bert.embeddings.position_embeddings.weight", ("position_embeddings", "embedding")
        ),
        HfTensor("bert.embeddings.token_type_embeddings.weight", ("type_embeddings", "embedding")),
        *_norm("bert.embeddings.LayerNorm", ("embedding_norm",)),
    ]
    for i in range(num_layers):
        hf, ours = f"bert.encoder.layer.{i}", ("layers", i)
        for name in ("query", "key", "value"):
            out += _dense(f"{hf}.attention.self.{name}", (*ours, "attention", name))
        out += _dense(f"{hf}.attention.output.dense", (*ours, "attention", "out"), in_dims=2)
        out += _norm(f"{hf}.attention.output.LayerNorm", (*ours, "attention_norm"))
        out += _dense(f"{hf}.intermediate.dense", (*ours, "mlp", "wi"))
        out += _dense(f"{hf}.output.dense", (*ours, "mlp", "wo"))
        out += _norm(f"{hf}.output.LayerNorm", (*ours, "mlp_norm"))
    out += [
        *_dense("bert.pooler.dense", ("pooler",)),
        *_dense("cls.predictions.transform.dense", ("mlm_transform",)),
        *_norm("cls.predictions.transform.LayerNorm", ("mlm_norm",)),
        HfTensor("cls.predictions.bias", ("mlm_bias",), vocab_rows=True),
        *_dense("cls.seq_relationship", ("nsp",)),
    ]
    return out


def is_stacked(layers: Params) -> bool:
    """Whether `layers` is the scanned form (`layers/...` with a leading [num_layers] dim)
    rather than a list (`layers/<i>/...`)."""
    return "attention" in layers


def leaf(params: Params, path: Path) -> Any:
    """Our parameter at an unrolled-form path, from either layer form."""
    node = params
    for i, key in enumerate(path):
        if key == "layers" and is_stacked(node[key]):
            return np.asarray(leaf(node[key], path[i + 2 :]))[path[i + 1]]
        if isinstance(key, int) and key not in node:
            key = str(key)
        node = node[key]
    return node


def to_hf_layout(value: np.ndarray, t: HfTensor) -> np.ndarray:
    """Our array -> HF's layout: Linear kernels [in..., out...] -> [out, in], biases (per
    head [H, K] in attention) and LayerNorm parameters flattened, embeddings as they are."""
    v = np.asarray(value, np.float32)
    if t.in_dims is not None:
        rows = int(np.prod(v.shape[: t.in_dims]))
        return np.ascontiguousarray(v.reshape(rows, -1).T)
    return v if t.path[-1] == "embedding" else v.reshape(-1)


def from_hf_layout(value: np.ndarray, t: HfTensor, shape: tuple[int, ...]) -> np.ndarray:
    """HF's layout -> our array of `shape` (the inverse of to_hf_layout)."""
    v = np.asarray(value, np.float32)
    if t.in_dims is not None:
        v = v.T
    return np.ascontiguousarray(v.reshape(shape))


def hf_shape(t: HfTensor, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF shape of one of our parameters of `shape`."""
    if t.in_dims is not None:
        return (int(np.prod(shape[t.in_dims :])), int(np.prod(shape[: t.in_dims])))
    return tuple(shape) if t.path[-1] == "embedding" else (int(np.prod(shape)),)


def to_hf_state_dict(
    params: Params, num_layers: int, vocab_size: int | None = None
) -> dict[str, np.ndarray]:
    """Our params (a pure dict of host arrays) -> HF BertForPreTraining tensor names; the
    vocabulary rows are cut to `vocab_size` (dropping padding) when given."""
    out = {}
    for t in hf_tensors(num_layers):
        value = to_hf_layout(leaf(params, t.path), t)
        if t.vocab_rows and vocab_size is not None:
            value = value[:vocab_size]
        out[t.name] = np.ascontiguousarray(value)
    return out


def export_safetensors(params: Params, cfg: BertConfig, output_dir: str) -> list[str]:
    """Writes output_dir/model.safetensors and config.json, loadable with
    `transformers.BertForPreTraining.from_pretrained(output_dir)`. Returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    weights = os.path.join(output_dir, "model.safetensors")
    config = os.path.join(output_dir, "config.json")
    params = jax.tree.map(np.asarray, params)
    tensors = to_hf_state_dict(params, cfg.num_layers, cfg.predictable_vocab_size)
    save_file(tensors, weights, metadata={"format": "pt"})
    with open(config, "w") as f:
        json.dump(hf_config(cfg), f, indent=2, sort_keys=True)
    return [weights, config]
