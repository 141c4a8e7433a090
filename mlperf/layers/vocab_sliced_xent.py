"""Softmax cross-entropy of a tied output projection, computed a vocabulary slice at a time.

The masked-LM head of BERT makes [N, V] logits `h @ table.T + bias` (V = 30,522) and
takes their softmax cross-entropy. Done whole, the forward pass writes the [N, V] logits
to memory, and the backward pass reads them back, writes their gradient and reads that
twice more, once per gradient matmul. On a CPU those [640, 30,522] fp32 buffers (78 MB)
do not fit any cache, and the passes over them cost about as much as the matmuls.

Here the vocabulary is cut into slices of `slice_size` columns, whose [N, slice] logits
stay in cache. The forward pass keeps a running maximum and a running sum of exponentials
per row (the online softmax) and the label's logit; nothing of size [N, V] is stored. The
backward pass makes each slice's logits again, turns them into the slice's gradient
`softmax - targets`, and uses it at once for the slice's table and bias gradients and the
input gradient's running sum. The price is one more [N, D] x [D, V] matmul. On a 2-core
CPU the slices, with bfloat16 matmul operands, make bert:wikitext's train step about 1.2x
faster (`python -m launch.bench.step --config configs/bert.py:wikitext
--config.model.train_head_vocab_slice=0` for the whole-logits step; docs/design.md,
"The masked-LM head a vocabulary slice at a time").

The loop runs over the vocabulary, so a table sharded over devices along the vocabulary
would be gathered slice by slice: the TPU configs keep the whole-logits form.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from mlperf.layers.cross_entropy import logit_gradient, smoothed_loss

# What padding columns of the vocabulary get as a logit (as BERT's head does): they never
# win the argmax nor take probability mass.
PADDING_LOGIT = -1e9


def _sliced(table: jax.Array, bias: jax.Array, size: int):
    """(table, bias, offset) per whole slice, stacked for `lax.scan`, and the remainder's
    (None when `size` divides the vocabulary)."""
    whole = table.shape[0] // size * size
    stacked = (
        table[:whole].reshape(-1, size, table.shape[1]),
        bias[:whole].reshape(-1, size),
        jnp.arange(whole // size, dtype=jnp.int32) * size,
    )
    rest = (table[whole:], bias[whole:], jnp.int32(whole)) if whole < table.shape[0] else None
    return stacked, rest


def _zeros(like: jax.Array, *operands: jax.Array) -> jax.Array:
    """fp32 zeros shaped like `like` that vary over every manual mesh axis any operand
    varies over (inside `shard_map` a scan's carry must keep one type through the loop)."""
    out = jnp.zeros_like(like, jnp.float32)
    for x in operands:
        out = out + jnp.zeros_like(x.reshape(-1)[0], jnp.float32)
    return out


def _slice_logits(h, table_slice, bias_slice, offset, valid_vocab, compute_dtype):
    """[N, S] fp32 logits of one slice; columns at or past `valid_vocab` get PADDING_LOGIT."""
    logits = jnp.einsum(
        "nd,vd->nv",
        h.astype(compute_dtype),
        table_slice.astype(compute_dtype),
        preferred_element_type=jnp.float32,
    )
    logits = logits + bias_slice.astype(jnp.float32)
    column = offset + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    if valid_vocab is not None:
        logits = jnp.where(column < valid_vocab, logits, PADDING_LOGIT)
    return logits, column


def _forward(h, table, bias, labels, size, smoothing, valid_vocab, compute_dtype):
    vocab = table.shape[0]

    def update(carry, xs):
        top, total, label_logit, logit_sum = carry
        table_slice, bias_slice, offset = xs
        logits, column = _slice_logits(
            h, table_slice, bias_slice, offset, valid_vocab, compute_dtype
        )
        new_top = jnp.maximum(top, jnp.max(logits, axis=1))
        total = total * jnp.exp(top - new_top) + jnp.sum(jnp.exp(logits - new_top[:, None]), axis=1)
        label_logit = label_logit + jnp.sum(
            jnp.where(column == labels[:, None], logits, 0.0), axis=1
        )
        logit_sum = logit_sum + jnp.sum(logits, axis=1)
        return (new_top, total, label_logit, logit_sum), None

    zeros = _zeros(labels, h, table, bias)
    carry = (zeros - jnp.inf, zeros, zeros, zeros)
    stacked, rest = _sliced(table, bias, size)
    carry, _ = jax.lax.scan(update, carry, stacked)
    if rest is not None:
        carry, _ = update(carry, rest)
    top, total, label_logit, logit_sum = carry
    lse = top + jnp.log(total)
    nll = lse - label_logit
    loss = smoothed_loss(nll, lse, lambda: logit_sum, vocab, smoothing)
    # The label holds the largest logit (a tie counts as correct), as in
    # `softmax_cross_entropy`.
    top1 = label_logit >= top
    return (loss, nll, top1), lse


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _xent(h, table, bias, labels, size, smoothing, valid_vocab, compute_dtype):
    return _forward(h, table, bias, labels, size, smoothing, valid_vocab, compute_dtype)[0]


def _xent_fwd(h, table, bias, labels, size, smoothing, valid_vocab, compute_dtype):
    out, lse = _forward(h, table, bias, labels, size, smoothing, valid_vocab, compute_dtype)
    return out, (h, table, bias, labels, lse)


def _xent_bwd(size, smoothing, valid_vocab, compute_dtype, residuals, cotangents):
    h, table, bias, labels, lse = residuals
    g_loss, g_nll, _ = cotangents
    vocab = table.shape[0]
    ones = jnp.ones((h.shape[0],), jnp.float32)

    def slice_grads(g_h, xs):
        table_slice, bias_slice, offset = xs
        logits, column = _slice_logits(
            h, table_slice, bias_slice, offset, valid_vocab, compute_dtype
        )
        probs = jnp.exp(logits - lse[:, None])
        hits = column == labels[:, None]
        grad = logit_gradient(probs, hits, g_loss, g_nll, vocab, smoothing)
        if valid_vocab is not None:  # padding columns get no gradient
            grad = jnp.where(column < valid_vocab, grad, 0.0)
        grad_c = grad.astype(compute_dtype)
        g_h = g_h + jnp.einsum(
            "nv,vd->nd",
            grad_c,
            table_slice.astype(compute_dtype),
            preferred_element_type=jnp.float32,
        )
        g_table = jnp.einsum(
            "nv,nd->vd", grad_c, h.astype(compute_dtype), preferred_element_type=jnp.float32
        )
        # The bias gradient as a dot (see mlperf.layers.bias): exact fp32 on any backend.
        g_bias = jnp.dot(ones, grad, precision=jax.lax.Precision.HIGHEST)
        return g_h, (g_table.astype(table.dtype), g_bias.astype(bias.dtype))

    stacked, rest = _sliced(table, bias, size)
    g_h = _zeros(h, table, bias, labels, lse, g_loss, g_nll)
    g_h, (g_table, g_bias) = jax.lax.scan(slice_grads, g_h, stacked)
    g_table = g_table.reshape(-1, table.shape[1])
    g_bias = g_bias.reshape(-1)
    if rest is not None:
        g_h, (g_table_rest, g_bias_rest) = slice_grads(g_h, rest)
        g_table = jnp.concatenate([g_table, g_table_rest])
        g_bias = jnp.concatenate([g_bias, g_bias_rest])
    return g_h.astype(h.dtype), g_table, g_bias, None


_xent.defvjp(_xent_fwd, _xent_bwd)


def vocab_sliced_cross_entropy(
    h: jax.Array,
    table: jax.Array,
    bias: jax.Array,
    labels: jax.Array,
    slice_size: int,
    smoothing: float = 0.0,
    valid_vocab: int | None = None,
    compute_dtype=jnp.float32,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per position of `h` [..., D]: (loss, nll, top1) of the logits `h @ table.T + bias`
    against integer `labels` [...], as `softmax_cross_entropy` gives them, without making
    the [..., V] logits at once.

    table: [V, D]; bias: [V]. The vocabulary is taken `slice_size` columns at a time (the
    last slice holds the remainder). Columns at or past `valid_vocab` are padding: logit
    PADDING_LOGIT, no gradient. The matmuls take `compute_dtype` operands and accumulate
    in fp32; the softmax is fp32.
    """
    vocab, width = table.shape
    if slice_size < 1:
        raise ValueError(f"vocabulary slice size {slice_size} must be >= 1.")
    if h.shape[-1] != width or bias.shape != (vocab,) or labels.shape != h.shape[:-1]:
        raise ValueError(
            f"shapes do not fit: h {h.shape}, table {table.shape}, bias {bias.shape}, "
            f"labels {labels.shape}; want h [..., D], table [V, D], bias [V], labels [...]."
        )
    if valid_vocab is not None and valid_vocab >= vocab:
        valid_vocab = None
    lead = h.shape[:-1]
    out = _xent(
        h.reshape(-1, width),
        table,
        bias,
        labels.reshape(-1).astype(jnp.int32),
        int(min(slice_size, vocab)),
        float(smoothing),
        valid_vocab,
        jnp.dtype(compute_dtype),
    )
    return tuple(x.reshape(lead) for x in out)
