"""Jitted beam search with a length penalty (Wu et al. 2016), as in Google's MLPerf v0.7.

All state has static shapes and lives in one `lax.while_loop`: live and finished
hypotheses [B, beam, T], their log-probabilities / scores, and the decoder's
self-attention cache with a leading B*beam dimension. Every step expands each live
beam over the vocabulary, keeps the 2*beam best candidates (enough that `beam` of them
do not end in EOS), moves EOS-ended ones to the finished set scored by
logp / ((5 + length) / 6) ** alpha, and reorders the cache to the surviving parents.
A hypothesis is forced to end (EOS) at its example's length limit (input length + 50 in
MLPerf) or at T. The loop stops early once no live beam can beat the worst kept
finished one (scores only fall as a hypothesis grows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

NEG_INF = -1.0e9  # finite: -inf would give NaNs in score arithmetic

StepFn = Callable[[jax.Array, Any, jax.Array], tuple[jax.Array, Any]]


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """((5 + length) / 6) ** alpha."""
    return ((5.0 + length.astype(jnp.float32)) / 6.0) ** alpha


def _take_beams(x: jax.Array, idx_BxN: jax.Array) -> jax.Array:
    """x[b, idx[b, n]] for x [B, K, ...] (integer bookkeeping arrays)."""
    idx = idx_BxN.reshape(idx_BxN.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def _reorder_cache(cache: Any, parents_BxK: jax.Array, beam: int, one_hot: bool) -> Any:
    """Each new beam's cache rows from its parent beam: a one-hot einsum (MXU-friendly, no
    gather: the TPU choice) or a gather (one copy of the cache instead of `beam` multiply-adds
    over it: the CPU choice)."""
    weights = jax.nn.one_hot(parents_BxK, beam)  # [B, K(new), K(old)]

    def one(x):
        xb = x.reshape(-1, beam, *x.shape[1:])
        if one_hot:
            y = jnp.einsum("bnk,bk...->bn...", weights.astype(x.dtype), xb)
        else:
            y = _take_beams(xb, parents_BxK)
        return y.reshape(x.shape)

    return jax.tree.map(one, cache)


def beam_search(
    step_fn: StepFn,
    cache: Any,
    batch_size: int,
    beam_size: int,
    max_length: int,
    eos_id: int,
    alpha: float,
    length_limits: jax.Array | None = None,
    one_hot_reorder: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Best sequences [B, T] (EOS included, zeros after) and their scores [B].

    step_fn(tokens [B*beam], cache, index) -> (logits [B*beam, V], cache): the decoder
    at position `index` given the previous tokens (0 at index 0). `cache` leaves have a
    leading B*beam dimension (beam-major within each example). length_limits [B]: most
    tokens (EOS included) per example; default T. one_hot_reorder: reorder the cache by
    one-hot einsum (True) or by gather.
    """
    B, K, T = batch_size, beam_size, max_length
    limits = jnp.full((B,), T, jnp.int32) if length_limits is None else length_limits
    limits = jnp.minimum(limits.astype(jnp.int32), T)
    positions_T = jnp.arange(T)

    state = {
        "i": jnp.asarray(0, jnp.int32),
        "last": jnp.zeros((B, K), jnp.int32),
        "live_seqs": jnp.zeros((B, K, T), jnp.int32),
        # Only beam 0 is live at the start: the others would duplicate it.
        "live_logp": jnp.tile(jnp.asarray([0.0] + [NEG_INF] * (K - 1)), (B, 1)),
        "fin_seqs": jnp.zeros((B, K, T), jnp.int32),
        "fin_scores": jnp.full((B, K), NEG_INF),
        "cache": cache,
    }

    def not_done(s):
        # The best a live beam can still reach: its logp now, at the largest penalty.
        bound = s["live_logp"][:, 0] / length_penalty(limits, alpha)
        worst_finished = jnp.min(s["fin_scores"], axis=1)
        done = (worst_finished > NEG_INF / 2) & (worst_finished >= bound)
        return (s["i"] < T) & ~jnp.all(done)

    def body(s):
        i = s["i"]
        logits, cache = step_fn(s["last"].reshape(B * K), s["cache"], i)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1).reshape(B, K, -1)
        V = logp.shape[-1]
        # At an example's limit only EOS may follow.
        force = (i + 1 >= limits)[:, None, None]
        eos_only = jnp.where(jnp.arange(V) == eos_id, 0.0, NEG_INF)
        logp = jnp.where(force, eos_only, logp)
        cand = (s["live_logp"][:, :, None] + logp).reshape(B, K * V)
        top_logp, top_idx = jax.lax.top_k(cand, 2 * K)
        parent, token = top_idx // V, top_idx % V
        written = (positions_T == i).astype(jnp.int32)  # this step's column
        seqs = _take_beams(s["live_seqs"], parent) + written * token[:, :, None]
        is_eos = token == eos_id

        # Live: the best K candidates that did not just end.
        alive_logp = jnp.where(is_eos, NEG_INF, top_logp)
        live_logp, pos = jax.lax.top_k(alive_logp, K)
        live_parent = jnp.take_along_axis(parent, pos, axis=1)

        # Finished: merge the ended candidates with the kept ones, keep the best K.
        scores = jnp.where(is_eos, top_logp / length_penalty(i + 1, alpha), NEG_INF)
        all_scores = jnp.concatenate([s["fin_scores"], scores], axis=1)
        all_seqs = jnp.concatenate([s["fin_seqs"], seqs], axis=1)
        fin_scores, fin_pos = jax.lax.top_k(all_scores, K)
        return {
            "i": i + 1,
            "last": jnp.take_along_axis(token, pos, axis=1),
            "live_seqs": _take_beams(seqs, pos),
            "live_logp": live_logp,
            "fin_seqs": _take_beams(all_seqs, fin_pos),
            "fin_scores": fin_scores,
            "cache": _reorder_cache(cache, live_parent, K, one_hot_reorder),
        }

    final = jax.lax.while_loop(not_done, body, state)
    return final["fin_seqs"][:, 0], final["fin_scores"][:, 0]
