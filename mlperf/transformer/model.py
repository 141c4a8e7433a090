"""MLPerf Transformer: encoder-decoder translation model (Flax NNX, logical axes only).

Pre-layer-norm Transformer (Vaswani et al.) as in Google's MLPerf v0.7 JAX code: one
embedding table shared by source, target and the output projection, sinusoidal
positions computed from position ids (packed rows restart them per pair), ReLU MLP.
Sizes: tiny, base (512/2048/8 heads), big (1024/4096/16 heads), 6+6 layers.
Attention is masked to the same segment (packing), causal in the decoder self-attention.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.attention_core import CPU_BLOCK_BYTES
from mlperf.layers.cached_attention import (
    Cache,
    MultiHeadAttention,
    causal_mask,
    segment_mask,
)
from mlperf.layers.dropout import dropout
from mlperf.layers.embedding import Embed
from mlperf.layers.linear import LayerNorm
from mlperf.layers.mlp import MlpBlock
from mlperf.layers.stack import stacked_layers
from parallel.partition import constrain


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Model hyperparameters, built from the config's `model` sub-dict."""

    vocab_size: int
    emb_dim: int = 1024
    num_heads: int = 16
    num_layers: int = 6  # encoder layers = decoder layers
    mlp_dim: int = 4096
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    # On CPU the attention core runs in blocks of examples whose scores fit this many
    # bytes (`attention_core`); 0 keeps it whole. Other platforms ignore it.
    attention_cpu_block_bytes: int = CPU_BLOCK_BYTES
    einsum_gather: bool = True
    compute_dtype: jnp.dtype = jnp.float32
    # Each stack's layers with their parameters stacked on a leading `stack` axis and
    # applied with lax.scan: a train state of tens of leaves instead of hundreds, so a
    # step's dispatch handles fewer buffers (docs/multi-host.md), and a program of one
    # layer per stack. Parameter paths become `encoder/<name>` with a leading
    # [num_layers] dim instead of `encoder/<i>/<name>` (the same for `decoder`).
    scan_layers: bool = False
    # Layers per scan iteration (lax.scan's unroll); 0 or >= num_layers unrolls the whole
    # stack: no loop in the program, the parameters still stacked (mlperf_v07's form: the
    # few leaves, and the TPU compiler's estimate of straight-line code).
    scan_unroll: int = 1


def sinusoid(positions: jax.Array, dim: int, dtype: jnp.dtype) -> jax.Array:
    """Sinusoidal embeddings of integer positions [...] -> [..., dim] (no table, no gather)."""
    half = dim // 2
    inv_freq = jnp.exp(-math.log(10000.0) * jnp.arange(half) / max(half - 1, 1))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1).astype(dtype)


def shift_right(targets: jax.Array, positions: jax.Array) -> jax.Array:
    """Decoder inputs: targets moved one step right, 0 (the start token) at every pair's
    first position, so packed pairs never see each other's tokens."""
    shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(positions == 0, 0, shifted)


def _split(rng: jax.Array | None, n: int):
    return [None] * n if rng is None else list(jax.random.split(rng, n))


def _scan_layers(
    stack: nnx.Module, x: jax.Array, keys: list | None, apply, unroll: int
) -> jax.Array:
    """`apply(layer, x, key)` of each stacked layer in turn, as one lax.scan (`unroll`
    layers an iteration; 0: all of them, no loop); layer i gets keys[i] as the unrolled
    loop gives it, so both forms agree."""
    graphdef, stacked = nnx.split(stack)

    def body(h, xs):
        state, key = xs
        return apply(nnx.merge(graphdef, state), h, key), None

    xs_keys = None if keys is None or keys[0] is None else jnp.stack(keys)
    x, _ = jax.lax.scan(body, x, (stacked, xs_keys), unroll=True if unroll <= 0 else unroll)
    return x


def _layer_list(stack, n: int, scanned: bool) -> list:
    """The layers one by one: a scanned stack's layer i is its parameters at [i]."""
    if not scanned:
        return list(stack)
    graphdef, stacked = nnx.split(stack)
    return [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], stacked)) for i in range(n)]


class EncoderLayer(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.rate = cfg.dropout_rate
        self.norm1 = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)
        self.attention = MultiHeadAttention(
            cfg.emb_dim,
            cfg.num_heads,
            rngs=rngs,
            dropout_rate=cfg.attention_dropout_rate,
            dtype=dt,
            cpu_block_bytes=cfg.attention_cpu_block_bytes,
        )
        self.norm2 = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)
        self.mlp = MlpBlock(cfg.emb_dim, cfg.mlp_dim, rngs=rngs, activation="relu", dtype=dt)

    def __call__(self, x, mask, rng):
        r = _split(rng, 3)
        h = self.norm1(x)
        x = x + dropout(self.attention(h, h, mask, r[0]), self.rate, r[1])
        x = x + dropout(self.mlp(self.norm2(x)), self.rate, r[2])
        return constrain(x, ("batch", "length", "embed"))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.rate = cfg.dropout_rate
        self.one_hot = cfg.einsum_gather  # decode-cache update by one-hot multiply-add

        def attention():
            return MultiHeadAttention(
                cfg.emb_dim,
                cfg.num_heads,
                rngs=rngs,
                dropout_rate=cfg.attention_dropout_rate,
                dtype=dt,
                cpu_block_bytes=cfg.attention_cpu_block_bytes,
            )

        self.norm1 = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)
        self.self_attention = attention()
        self.norm2 = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)
        self.cross_attention = attention()
        self.norm3 = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)
        self.mlp = MlpBlock(cfg.emb_dim, cfg.mlp_dim, rngs=rngs, activation="relu", dtype=dt)

    def __call__(self, y, encoded, self_mask, cross_mask, rng):
        r = _split(rng, 5)
        h = self.norm1(y)
        y = y + dropout(self.self_attention(h, h, self_mask, r[0]), self.rate, r[1])
        h = self.norm2(y)
        y = y + dropout(self.cross_attention(h, encoded, cross_mask, r[2]), self.rate, r[3])
        y = y + dropout(self.mlp(self.norm3(y)), self.rate, r[4])
        return constrain(y, ("batch", "length", "embed"))

    def decode_step(self, y, own: Cache, cross: Cache, index, cross_mask):
        """One position: cached self-attention, cross-attention over the encoder's K/V."""
        out, own = self.self_attention.decode_step(self.norm1(y), own, index, self.one_hot)
        y = y + out
        y = y + self.cross_attention.attend(self.norm2(y), cross["k"], cross["v"], cross_mask)
        y = y + self.mlp(self.norm3(y))
        return y, own


class Transformer(nnx.Module):
    """Encoder-decoder with shared embeddings; __call__ gives training logits."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.compute_dtype
        self.embed = Embed(
            cfg.vocab_size,
            cfg.emb_dim,
            ("vocab", "embed"),
            rngs=rngs,
            einsum_gather=cfg.einsum_gather,
            dtype=dt,
        )
        self.encoder = self._stack(lambda r: EncoderLayer(cfg, rngs=r), rngs)
        self.encoder_norm = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)
        self.decoder = self._stack(lambda r: DecoderLayer(cfg, rngs=r), rngs)
        self.decoder_norm = LayerNorm(cfg.emb_dim, rngs=rngs, eps=1e-6, dtype=dt)

    def _stack(self, make, rngs: nnx.Rngs) -> nnx.Module:
        """`num_layers` layers: stacked (`scan_layers`) or a list."""
        n = self.cfg.num_layers
        if self.cfg.scan_layers:
            return stacked_layers(make, n, rngs)
        return nnx.List([make(rngs) for _ in range(n)])

    def _run(self, stack: nnx.Module, x: jax.Array, keys: list, apply) -> jax.Array:
        """`apply(layer, x, key)` of every layer in turn: one lax.scan over a stacked
        stack, a Python loop over a list; layer i gets keys[i] either way."""
        if self.cfg.scan_layers:
            return _scan_layers(stack, x, keys, apply, self.cfg.scan_unroll)
        for layer, key in zip(stack, keys, strict=True):
            x = apply(layer, x, key)
        return x

    def _embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        # Scaled by sqrt(dim) (Vaswani et al.): token and position terms of similar size.
        scale = jnp.asarray(math.sqrt(self.cfg.emb_dim), self.cfg.compute_dtype)
        positions_BxLxE = sinusoid(positions, self.cfg.emb_dim, self.cfg.compute_dtype)
        x = self.embed(tokens) * scale + positions_BxLxE
        return constrain(x, ("batch", "length", "embed"))

    def encode(self, inputs, segments, positions, rng=None) -> jax.Array:
        """[B,L] token ids, segment ids (0 = padding), positions -> encoded [B,L,E]."""
        n = self.cfg.num_layers
        r = _split(rng, n + 1)
        x = dropout(self._embed(inputs, positions), self.cfg.dropout_rate, r[-1])
        mask = segment_mask(segments, segments)
        x = self._run(self.encoder, x, r[:n], lambda layer, h, key: layer(h, mask, key))
        return self.encoder_norm(x)

    def decode(self, encoded, input_segments, targets, segments, positions, rng=None):
        """Teacher-forced decoder: logits [B,T,V] fp32 for every target position."""
        n = self.cfg.num_layers
        r = _split(rng, n + 1)
        y = self._embed(shift_right(targets, positions), positions)
        y = dropout(y, self.cfg.dropout_rate, r[-1])
        self_mask = segment_mask(segments, segments) & causal_mask(targets.shape[1])
        cross_mask = segment_mask(segments, input_segments)

        def apply(layer, h, key):
            return layer(h, encoded, self_mask, cross_mask, key)

        y = self._run(self.decoder, y, r[:n], apply)
        return self.logits(self.decoder_norm(y))

    def logits(self, y: jax.Array) -> jax.Array:
        """Output projection tied to the shared embedding, fp32."""
        out = self.embed.attend(y).astype(jnp.float32)
        return constrain(out, ("batch", "length", "vocab"))

    def __call__(self, batch: dict[str, jax.Array], rng: jax.Array | None = None) -> jax.Array:
        """Logits [B,T,V] of a (packed) batch with segmentation and position fields."""
        r = _split(rng, 2)
        encoded = self.encode(
            batch["inputs"], batch["inputs_segmentation"], batch["inputs_position"], r[0]
        )
        return self.decode(
            encoded,
            batch["inputs_segmentation"],
            batch["targets"],
            batch["targets_segmentation"],
            batch["targets_position"],
            r[1],
        )

    # ---- incremental decoding (beam search) ----------------------------------------------
    # A scanned stack decodes layer by layer too (its layer i: the parameters at [i]), so
    # the caches are one per layer in either form.
    def decoder_layers(self) -> list[DecoderLayer]:
        """The decoder's layers in order."""
        return _layer_list(self.decoder, self.cfg.num_layers, self.cfg.scan_layers)

    def cross_cache(self, encoded: jax.Array) -> list[Cache]:
        """Per-layer cross-attention K/V of the encoder output (computed once per sentence)."""
        caches = []
        for layer in self.decoder_layers():
            k, v = layer.cross_attention.keys_values(encoded)
            caches.append({"k": k, "v": v})
        return caches

    def self_cache(self, batch: int, max_length: int) -> list[Cache]:
        """Per-layer empty self-attention K/V for max_length decoder positions."""
        layers = self.decoder_layers()
        return [layer.self_attention.init_cache(batch, max_length) for layer in layers]

    def decode_step(self, tokens_B, self_cache, cross_cache, index, input_segments):
        """Logits [B,V] fp32 for position `index` given the previous tokens [B] (0 at the
        start); returns (logits, updated self cache)."""
        positions = jnp.full((tokens_B.shape[0], 1), index, jnp.int32)
        y = self._embed(tokens_B[:, None], positions)
        cross_mask = (input_segments > 0)[:, None, None, :]
        new_cache = []
        layers = self.decoder_layers()
        for layer, own, cross in zip(layers, self_cache, cross_cache, strict=True):
            y, own = layer.decode_step(y, own, cross, index, cross_mask)
            new_cache.append(own)
        return self.logits(self.decoder_norm(y))[:, 0], new_cache
