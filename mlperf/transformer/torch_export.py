"""Our Transformer's parameters as a state_dict of its PyTorch peer
(launch/torch_transformer.py: `torch.nn.Transformer` with norm_first=True, batch_first=True,
ReLU, plus the shared `embed` table).

    (ours)                                    (the peer's, under core.encoder.layers.{i})
    embed.embedding                           embed.weight (no prefix)
    encoder.{i}.attention.{query,key,value}   self_attn.in_proj_weight (rows q, k, v)
    encoder.{i}.attention.out                 self_attn.out_proj.weight
    encoder.{i}.mlp.wi / wo                   linear1 / linear2
    encoder.{i}.norm1 / norm2                 norm1 / norm2
    encoder_norm                              core.encoder.norm (no layer prefix)
    (ours)                                    (the peer's, under core.decoder.layers.{i})
    decoder.{i}.self_attention                self_attn
    decoder.{i}.cross_attention               multihead_attn
    decoder.{i}.mlp.wi / wo                   linear1 / linear2
    decoder.{i}.norm1 / norm2 / norm3         norm1 / norm2 / norm3
    decoder_norm                              core.decoder.norm (no layer prefix)

Layouts: an attention projection kernel [E, H, K] becomes [H*K, E] (torch stacks query,
key and value as the rows of in_proj_weight), the output kernel [H, K, E] becomes
[E, H*K], dense kernels [in, out] become [out, in]; LayerNorm `scale` is torch's
`weight`. Our attention has no biases: torch's in_proj_bias and out_proj.bias are zeros.
The vocabulary is the model's (padded to a multiple of 128; ids past the tokenizer's
are never produced). The peer is built with the same sizes and LayerNorm eps 1e-6.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _child(node: dict, key: int) -> Any:
    """Layer `key` of a stack: its own subtree in the loop form (`encoder/<i>/...`), or
    every leaf at [key] in the scanned form (`model.scan_layers`: `encoder/...` with a
    leading [num_layers] dim)."""
    if key in node:
        return node[key]
    if str(key) in node:
        return node[str(key)]
    return {
        k: _child(v, key) if isinstance(v, dict) else np.asarray(v)[key] for k, v in node.items()
    }


def _f32(x: Any) -> np.ndarray:
    return np.asarray(x, np.float32)


def _attention(params: dict[str, Any], prefix: str, out: dict[str, np.ndarray]) -> None:
    rows = []
    for name in ("query", "key", "value"):
        kernel = _f32(params[name]["kernel"])  # [E, H, K]
        rows.append(kernel.reshape(kernel.shape[0], -1).T)
    in_proj = np.concatenate(rows, axis=0)
    out_kernel = _f32(params["out"]["kernel"])  # [H, K, E]
    out[f"{prefix}.in_proj_weight"] = np.ascontiguousarray(in_proj)
    out[f"{prefix}.in_proj_bias"] = np.zeros((in_proj.shape[0],), np.float32)
    out[f"{prefix}.out_proj.weight"] = np.ascontiguousarray(
        out_kernel.reshape(-1, out_kernel.shape[-1]).T
    )
    out[f"{prefix}.out_proj.bias"] = np.zeros((out_kernel.shape[-1],), np.float32)


def _dense(params: dict[str, Any], prefix: str, out: dict[str, np.ndarray]) -> None:
    out[f"{prefix}.weight"] = np.ascontiguousarray(_f32(params["kernel"]).T)
    out[f"{prefix}.bias"] = _f32(params["bias"])


def _norm(params: dict[str, Any], prefix: str, out: dict[str, np.ndarray]) -> None:
    out[f"{prefix}.weight"] = _f32(params["scale"])
    out[f"{prefix}.bias"] = _f32(params["bias"])


def _mlp(params: dict[str, Any], prefix: str, out: dict[str, np.ndarray]) -> None:
    _dense(params["wi"], f"{prefix}.linear1", out)
    _dense(params["wo"], f"{prefix}.linear2", out)


def to_torch_state_dict(params: dict[str, Any], num_layers: int) -> dict[str, np.ndarray]:
    """The peer's state_dict (numpy arrays) of our params (a nested dict of host arrays)."""
    out = {"embed.weight": _f32(params["embed"]["embedding"])}
    for i in range(num_layers):
        layer, prefix = _child(params["encoder"], i), f"core.encoder.layers.{i}"
        _attention(layer["attention"], f"{prefix}.self_attn", out)
        _mlp(layer["mlp"], prefix, out)
        _norm(layer["norm1"], f"{prefix}.norm1", out)
        _norm(layer["norm2"], f"{prefix}.norm2", out)
    _norm(params["encoder_norm"], "core.encoder.norm", out)
    for i in range(num_layers):
        layer, prefix = _child(params["decoder"], i), f"core.decoder.layers.{i}"
        _attention(layer["self_attention"], f"{prefix}.self_attn", out)
        _attention(layer["cross_attention"], f"{prefix}.multihead_attn", out)
        _mlp(layer["mlp"], prefix, out)
        for norm in ("norm1", "norm2", "norm3"):
            _norm(layer[norm], f"{prefix}.{norm}", out)
    _norm(params["decoder_norm"], "core.decoder.norm", out)
    return out


def peer_config(model_config) -> dict[str, Any]:
    """The peer's constructor arguments for our TransformerConfig (config.json)."""
    return {
        "vocab_size": model_config.vocab_size,
        "emb_dim": model_config.emb_dim,
        "num_heads": model_config.num_heads,
        "num_layers": model_config.num_layers,
        "mlp_dim": model_config.mlp_dim,
        "dropout_rate": 0.0,
        "layer_norm_eps": 1e-6,
    }
