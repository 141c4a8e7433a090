"""MLPerf BERT: encoder with masked-LM and next-sentence heads (Flax NNX, logical axes).

Post-layer-norm BERT as in the MLPerf reference (Devlin et al.). Sizes range from
`tiny` to `large` through `BertConfig`. The model never sees a mesh: parameters carry
logical axis names, activations are placed with `parallel.partition.constrain`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from mlperf.layers.attention import SelfAttention
from mlperf.layers.attention_core import CPU_BLOCK_BYTES
from mlperf.layers.bias import add_bias
from mlperf.layers.cross_entropy import chunked_eval_stats, softmax_cross_entropy
from mlperf.layers.dropout import dropout
from mlperf.layers.embedding import Embed, gather_positions
from mlperf.layers.linear import DenseGeneral, LayerNorm, logical_param
from mlperf.layers.matmul import MATMUL_OUTPUT
from mlperf.layers.mlp import ACTIVATIONS, MlpBlock
from mlperf.layers.stack import stacked_layers
from mlperf.layers.vocab_sliced_xent import PADDING_LOGIT, vocab_sliced_cross_entropy
from parallel.partition import constrain, constrain_if_mapped

# jax.checkpoint policies by config name (None: save nothing, recompute the layer).
_SAVE_MATMULS = jax.checkpoint_policies.save_only_these_names(MATMUL_OUTPUT)
# Dense layers' matmuls are custom_vjp functions (mlperf/layers/matmul.py), which the dot
# policies cannot see into: their outputs are saved by name.
REMAT_POLICIES = {
    "nothing": None,
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_saveable, _SAVE_MATMULS
    ),
    "dots_no_batch": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, _SAVE_MATMULS
    ),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Model hyperparameters, built from the config's `model` sub-dict."""

    vocab_size: int
    # Rows of the vocabulary that are real tokens; the rest (a table padded from 30,522 to
    # 30,528 so it splits over the model axis) get a large negative logit and are never
    # predicted. 0: every row is a token.
    valid_vocab_size: int = 0
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    max_position: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    # dtype of the attention scores and softmax (`SelfAttention`): "float32" or
    # "bfloat16" (half the bytes of the [B, H, L, L] tensors; not the default: numerics).
    attention_softmax_dtype: str = "float32"
    # Divide by the softmax's sum after the product with the values (`SelfAttention`),
    # as Google's v0.7 BERT: the same outputs, less elementwise work over [B, H, L, L].
    attention_normalize_after_values: bool = False
    # On CPU the attention core runs in blocks of examples whose scores fit this many
    # bytes (`attention_core`); 0 keeps it whole. Other platforms ignore it.
    attention_cpu_block_bytes: int = CPU_BLOCK_BYTES
    einsum_gather: bool = True
    compute_dtype: jnp.dtype = jnp.float32
    # One layer's parameters stacked on a leading `stack` axis and applied with lax.scan:
    # the compiled program holds one layer whatever the depth (24-layer BERT-large
    # compiles for 8192 TPU cores like a 1-layer one). Parameter paths become
    # `layers/<name>` with a leading [num_layers] dim instead of `layers/<i>/<name>`.
    scan_layers: bool = False
    # Layers per scan iteration (lax.scan's unroll); 0 or >= num_layers unrolls the whole
    # stack (no loop; the parameters stay stacked). inspect compiles 1 and 2 to read one
    # layer's cost off the TPU compiler's estimate, which sees a loop body once.
    scan_unroll: int = 1
    # Recompute each layer's activations in the backward pass (jax.checkpoint): memory
    # for the per-layer activations traded for about one more forward pass.
    remat: bool = False
    # What the remat keeps from the forward pass (`REMAT_POLICIES`): "nothing" (recompute
    # the whole layer), "dots" (keep every matmul output, recompute the elementwise ops)
    # or "dots_no_batch" (keep the projections' and MLP's outputs; recompute attention's
    # batched [B, H, L, L] products, softmax and dropout masks).
    remat_policy: str = "nothing"
    # GELU's tanh approximation, as Google's TF BERT (the MLPerf reference checkpoint was
    # trained with it), instead of the exact erf form (Hugging Face's `gelu`).
    gelu_approximate: bool = False
    # The eval's masked-LM head in this many groups of the batch (`chunked_eval_stats`):
    # each group's [rows, vocab] logits are reduced before the next are made, so on a CPU
    # they stay in cache. 1: the whole batch at once. Must divide the eval batch.
    eval_head_chunks: int = 1
    # The training loss's masked-LM head a vocabulary slice of this many columns at a time
    # (`vocab_sliced_cross_entropy`): no [B, P, V] logits in memory, one more matmul. On a
    # CPU the slices stay in cache. 0: the whole logits at once (the TPU form: a table
    # sharded along the vocabulary needs no loop over it).
    train_head_vocab_slice: int = 0
    # dtype of the masked-LM head's matmul operands when `train_head_vocab_slice` is set
    # ("": the compute dtype). Accumulation and the softmax stay fp32.
    train_head_dtype: str = ""
    # The last encoder layer computes its outputs only at the rows the heads read: the
    # masked-LM positions and [CLS]. Their keys and values still come from every row, so
    # the outputs are the full layer's (with dropout, the masks are other draws). The
    # rest of the layer (queries, attention, MLP) runs on P + 1 rows instead of L.
    last_layer_head_positions_only: bool = False

    @property
    def activation(self) -> str:
        return "gelu_tanh" if self.gelu_approximate else "gelu"

    @property
    def predictable_vocab_size(self) -> int:
        """Rows of the vocabulary that can be predicted (padding rows excluded)."""
        return self.valid_vocab_size or self.vocab_size


class EncoderLayer(nnx.Module):
    """Post-LN transformer encoder layer."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        dt = cfg.compute_dtype
        self.rate = cfg.dropout_rate
        self.attention = SelfAttention(
            cfg.hidden_size,
            cfg.num_heads,
            rngs=rngs,
            dropout_rate=cfg.dropout_rate,
            dtype=dt,
            softmax_dtype=jnp.dtype(cfg.attention_softmax_dtype),
            normalize_after_values=cfg.attention_normalize_after_values,
            cpu_block_bytes=cfg.attention_cpu_block_bytes,
        )
        self.attention_norm = LayerNorm(cfg.hidden_size, rngs=rngs, dtype=dt)
        self.mlp = MlpBlock(
            cfg.hidden_size, cfg.mlp_dim, rngs=rngs, activation=cfg.activation, dtype=dt
        )
        self.mlp_norm = LayerNorm(cfg.hidden_size, rngs=rngs, dtype=dt)
        self.einsum_gather = cfg.einsum_gather

    def __call__(self, x, mask, rng, positions=None):
        """[B, L, D] -> [B, L, D]; with `positions` [B, Q] only the outputs at those rows,
        [B, Q, D] (the rows attend over all L)."""
        r = jax.random.split(rng, 3) if rng is not None else (None, None, None)
        rows = x if positions is None else gather_positions(x, positions, self.einsum_gather)
        # The residual stream's rows may be split over `model` (sequence parallelism);
        # the head rows of a last layer at `positions` are few and stay whole.
        axes = ("batch", "residual_length" if positions is None else "length", "embed")
        h = dropout(self.attention(x, mask, r[0], queries_BxQxD=rows), self.rate, r[1])
        # The sums are placed only when the rows are split: pinned replicated, they cost
        # the default program 3% of its TPU step estimate (docs/design.md).
        x = self.attention_norm(constrain_if_mapped(rows + h, axes, axis="residual_length"))
        x = x + dropout(self.mlp(x), self.rate, r[2])
        x = self.mlp_norm(constrain_if_mapped(x, axes, axis="residual_length"))
        return constrain(x, axes)


def same_sequence(query_ids_BxQ: jax.Array, key_ids_BxL: jax.Array) -> jax.Array:
    """Packed rows' attention mask, bool [B,Q,L]: a query sees the keys of its own
    sequence (sequence id > 0; 0 is padding)."""
    same = query_ids_BxQ[:, :, None] == key_ids_BxL[:, None, :]
    return same & (key_ids_BxL[:, None, :] > 0)


def _apply_layer(graphdef, state, x, mask, rng, positions=None):
    """One encoder layer as a pure function of its parameters (for scan and remat)."""
    return nnx.merge(graphdef, state)(x, mask, rng, positions)


class BertForPreTraining(nnx.Module):
    """BERT encoder + masked-LM head (tied to the word embeddings) + NSP head."""

    def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        dt = cfg.compute_dtype
        eg = cfg.einsum_gather
        self.word_embeddings = Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            ("vocab", "embed"),
            rngs=rngs,
            einsum_gather=eg,
            dtype=dt,
        )
        self.position_embeddings = Embed(
            cfg.max_position, cfg.hidden_size, ("position", "embed"), rngs=rngs, dtype=dt
        )
        self.type_embeddings = Embed(
            cfg.type_vocab_size,
            cfg.hidden_size,
            ("type", "embed"),
            rngs=rngs,
            einsum_gather=eg,
            dtype=dt,
        )
        self.embedding_norm = LayerNorm(cfg.hidden_size, rngs=rngs, dtype=dt)
        if cfg.scan_layers:
            self.layers = stacked_layers(lambda r: EncoderLayer(cfg, rngs=r), cfg.num_layers, rngs)
        else:
            self.layers = nnx.List([EncoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.mlm_transform = DenseGeneral(
            (cfg.hidden_size,), (cfg.hidden_size,), ("embed", "embed"), rngs=rngs, dtype=dt
        )
        self.mlm_norm = LayerNorm(cfg.hidden_size, rngs=rngs, dtype=dt)
        self.mlm_bias = logical_param(rngs, nnx.initializers.zeros, (cfg.vocab_size,), ("vocab",))
        self.pooler = DenseGeneral(
            (cfg.hidden_size,), (cfg.hidden_size,), ("embed", "embed"), rngs=rngs, dtype=dt
        )
        self.nsp = DenseGeneral((cfg.hidden_size,), (2,), ("embed", "classes"), rngs=rngs, dtype=dt)

    def encode(
        self,
        input_ids,
        segment_ids,
        input_mask,
        rng=None,
        last_positions=None,
        positions=None,
        sequence_ids=None,
    ):
        """Token, position and type embeddings, then the encoder stack: [B,L] -> [B,L,D];
        with `last_positions` [B,Q] the last layer's outputs at those rows only, [B,Q,D].

        Packed rows (`input_pipeline.bert_packing`) pass `positions` [B,L], restarting at 0
        in every sequence, and `sequence_ids` [B,L] (1, 2, ... per sequence, 0 padding):
        a token then attends only to its own sequence's tokens."""
        length = input_ids.shape[1]
        if length > self.cfg.max_position:
            raise ValueError(f"sequence length {length} > max_position {self.cfg.max_position}")
        if positions is None:
            # Positions are a static slice of the table: no gather on either path.
            table = self.position_embeddings.embedding[...]
            position_BxLxD = table[:length].astype(self.cfg.compute_dtype)[None]
        else:
            position_BxLxD = self.position_embeddings(positions)
        x = self.word_embeddings(input_ids) + self.type_embeddings(segment_ids) + position_BxLxD
        mask, last_mask = input_mask, input_mask
        if sequence_ids is not None:
            mask = last_mask = same_sequence(sequence_ids, sequence_ids)
            if last_positions is not None:
                rows_BxQ = jnp.take_along_axis(sequence_ids, last_positions, axis=1)
                last_mask = same_sequence(rows_BxQ, sequence_ids)
        x = constrain(self.embedding_norm(x), ("batch", "residual_length", "embed"))
        n = self.cfg.num_layers
        rngs = jax.random.split(rng, n + 1) if rng is not None else None
        x = dropout(x, self.cfg.dropout_rate, None if rngs is None else rngs[-1])
        apply = _apply_layer
        if self.cfg.remat:
            policy = REMAT_POLICIES[self.cfg.remat_policy]
            apply = jax.checkpoint(_apply_layer, static_argnums=(0,), policy=policy)
        if self.cfg.scan_layers:
            graphdef, stacked = nnx.split(self.layers)

            def body(h, xs):
                state, key = xs
                return apply(graphdef, state, h, mask, key), None

            # Layer i gets rngs[i] as in the unrolled loop, so both forms agree.
            keys = None if rngs is None else rngs[:n]
            if last_positions is None:
                x, _ = jax.lax.scan(body, x, (stacked, keys), unroll=self.cfg.scan_unroll)
                return x
            # All layers but the last in the scan, the last on its own at the rows asked.
            head = jax.tree.map(lambda a: a[: n - 1], (stacked, keys))
            if n > 1:
                x, _ = jax.lax.scan(body, x, head, unroll=self.cfg.scan_unroll)
            last_state, last_key = jax.tree.map(lambda a: a[n - 1], (stacked, keys))
            return apply(graphdef, last_state, x, last_mask, last_key, last_positions)
        for i, layer in enumerate(self.layers):
            graphdef, state = nnx.split(layer)
            rows, layer_mask = (last_positions, last_mask) if i == n - 1 else (None, mask)
            x = apply(graphdef, state, x, layer_mask, None if rngs is None else rngs[i], rows)
        return x

    def features(self, batch: dict[str, jax.Array], rng: jax.Array | None = None):
        """(masked-LM head input at the masked positions [B,P,D], next-sentence logits [B,2]
        fp32): everything but the vocabulary projection.

        A packed batch (with `sequence_ids`, `positions` and `cls_positions` [B,K]) gets
        next-sentence logits [B,K,2], one per packed sequence's [CLS]."""
        ids, segments, mask = batch["input_ids"], batch["segment_ids"], batch["input_mask"]
        positions_BxP = batch["masked_lm_positions"]
        packed = "sequence_ids" in batch
        extra = {}
        if packed:
            cls_BxK = batch["cls_positions"]
            extra = {"positions": batch["positions"], "sequence_ids": batch["sequence_ids"]}
        else:
            cls_BxK = jnp.zeros_like(positions_BxP[:, :1])  # [CLS] is row 0
        k = cls_BxK.shape[1]
        if self.cfg.last_layer_head_positions_only:
            # The heads read the [CLS] rows and the masked positions: the last layer makes
            # only those rows.
            rows = jnp.concatenate([cls_BxK, positions_BxP], axis=1)
            x_BxKPxD = self.encode(ids, segments, mask, rng, last_positions=rows, **extra)
            cls_BxKxD, masked_BxPxD = x_BxKPxD[:, :k], x_BxKPxD[:, k:]
        else:
            x_BxLxD = self.encode(ids, segments, mask, rng, **extra)
            masked_BxPxD = gather_positions(x_BxLxD, positions_BxP, self.cfg.einsum_gather)
            if packed:
                cls_BxKxD = gather_positions(x_BxLxD, cls_BxK, self.cfg.einsum_gather)
            else:
                cls_BxKxD = x_BxLxD[:, :1]
        act = ACTIVATIONS[self.cfg.activation]
        h = self.mlm_norm(act(self.mlm_transform(masked_BxPxD)))
        # Unpacked, the heads see [B, D] as they always did: [CLS] is the one row.
        pooled = jnp.tanh(self.pooler(cls_BxKxD if packed else cls_BxKxD[:, 0]))
        nsp_logits = self.nsp(pooled).astype(jnp.float32)
        return h, nsp_logits

    def mlm_logits(self, h: jax.Array) -> jax.Array:
        """Masked-LM logits [..., V] fp32 from the head input (tied word embeddings)."""
        # add_bias: the bias gradient as a dot, not XLA:CPU's slow wide column sum.
        logits = self.word_embeddings.attend(h).astype(jnp.float32)
        mlm_logits = add_bias(logits, self.mlm_bias[...])
        if self.cfg.predictable_vocab_size < self.cfg.vocab_size:
            # Padding rows can never win the argmax nor take probability mass, and get
            # no gradient through the head.
            real = jnp.arange(self.cfg.vocab_size) < self.cfg.predictable_vocab_size
            mlm_logits = jnp.where(real, mlm_logits, PADDING_LOGIT)
        return constrain(mlm_logits, ("batch",) + (None,) * (h.ndim - 2) + ("vocab",))

    def train_heads(self, batch: dict[str, jax.Array], rng: jax.Array | None = None):
        """For the training loss: (masked-LM cross-entropy [B,P], whether the label holds
        the largest logit [B,P], next-sentence logits [B,2]). With `train_head_vocab_slice`
        the head runs a vocabulary slice at a time, else on the whole logits."""
        h, nsp_logits = self.features(batch, rng)
        labels = batch["masked_lm_ids"]
        slice_size = self.cfg.train_head_vocab_slice
        if not slice_size:
            xent, _, top1 = softmax_cross_entropy(self.mlm_logits(h), labels)
            return xent, top1, nsp_logits
        xent, _, top1 = vocab_sliced_cross_entropy(
            h,
            self.word_embeddings.embedding[...],
            self.mlm_bias[...],
            labels,
            slice_size,
            valid_vocab=self.cfg.predictable_vocab_size,
            compute_dtype=jnp.dtype(self.cfg.train_head_dtype or self.cfg.compute_dtype),
        )
        return xent, top1, nsp_logits

    def __call__(self, batch: dict[str, jax.Array], rng: jax.Array | None = None):
        """Returns (masked-LM logits [B,P,V] fp32, next-sentence logits [B,2] fp32)."""
        h, nsp_logits = self.features(batch, rng)
        return self.mlm_logits(h), nsp_logits

    def eval_heads(self, batch: dict[str, jax.Array]):
        """For the eval, without dropout: (masked-LM nll [B,P], whether argmax(logits) is the
        label [B,P], next-sentence logits [B,2]). The vocabulary projection runs in
        `eval_head_chunks` groups of the batch (`chunked_eval_stats`)."""
        h, nsp_logits = self.features(batch, rng=None)
        nll, hits = chunked_eval_stats(
            h, batch["masked_lm_ids"], self.mlm_logits, self.cfg.eval_head_chunks
        )
        return nll, hits, nsp_logits
