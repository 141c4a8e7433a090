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
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from safetensors.numpy import save_file

from mlperf.bert.model import BertConfig

Params = Mapping[str, Any]


def hf_config(cfg: BertConfig) -> dict[str, Any]:
    """transformers' BertConfig fields for our model config."""
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu",  # exact (erf) GELU, as mlperf/layers/mlp.py uses
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


def _linear(kernel: np.ndarray, in_dims: int) -> np.ndarray:
    """[in..., out...] kernel -> torch Linear weight [out, in]."""
    k = np.asarray(kernel, np.float32)
    rows = int(np.prod(k.shape[:in_dims]))
    return np.ascontiguousarray(k.reshape(rows, -1).T)


def _dense(prefix: str, p: Params, in_dims: int = 1) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.weight": _linear(p["kernel"], in_dims),
        f"{prefix}.bias": np.asarray(p["bias"], np.float32).reshape(-1),
    }


def _norm(prefix: str, p: Params) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.weight": np.asarray(p["scale"], np.float32),
        f"{prefix}.bias": np.asarray(p["bias"], np.float32),
    }


def _layer(layers: Params, i: int) -> Params:
    """Layer i's parameters from either form: a list (`layers/<i>/...`) or a scanned
    stack (`layers/...` with a leading [num_layers] dimension)."""
    if "attention" in layers:
        return jax.tree.map(lambda a: np.asarray(a)[i], layers)
    return layers[i] if i in layers else layers[str(i)]


def to_hf_state_dict(params: Params, num_layers: int) -> dict[str, np.ndarray]:
    """Our params (a pure dict of host arrays) -> HF BertForPreTraining tensor names."""
    out = {
        "bert.embeddings.word_embeddings.weight": params["word_embeddings"]["embedding"],
        "bert.embeddings.position_embeddings.weight": params["position_embeddings"]["embedding"],
        "bert.embeddings.token_type_embeddings.weight": params["type_embeddings"]["embedding"],
        **_norm("bert.embeddings.LayerNorm", params["embedding_norm"]),
        **_dense("bert.pooler.dense", params["pooler"]),
        **_dense("cls.predictions.transform.dense", params["mlm_transform"]),
        **_norm("cls.predictions.transform.LayerNorm", params["mlm_norm"]),
        "cls.predictions.bias": params["mlm_bias"],
        **_dense("cls.seq_relationship", params["nsp"]),
    }
    for i in range(num_layers):
        layer = _layer(params["layers"], i)
        att = layer["attention"]
        hf = f"bert.encoder.layer.{i}"
        for name in ("query", "key", "value"):
            out.update(_dense(f"{hf}.attention.self.{name}", att[name]))
        out.update(_dense(f"{hf}.attention.output.dense", att["out"], in_dims=2))
        out.update(_norm(f"{hf}.attention.output.LayerNorm", layer["attention_norm"]))
        out.update(_dense(f"{hf}.intermediate.dense", layer["mlp"]["wi"]))
        out.update(_dense(f"{hf}.output.dense", layer["mlp"]["wo"]))
        out.update(_norm(f"{hf}.output.LayerNorm", layer["mlp_norm"]))
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def export_safetensors(params: Params, cfg: BertConfig, output_dir: str) -> list[str]:
    """Writes output_dir/model.safetensors and config.json, loadable with
    `transformers.BertForPreTraining.from_pretrained(output_dir)`. Returns the paths."""
    os.makedirs(output_dir, exist_ok=True)
    weights = os.path.join(output_dir, "model.safetensors")
    config = os.path.join(output_dir, "config.json")
    save_file(to_hf_state_dict(params, cfg.num_layers), weights, metadata={"format": "pt"})
    with open(config, "w") as f:
        json.dump(hf_config(cfg), f, indent=2, sort_keys=True)
    return [weights, config]
