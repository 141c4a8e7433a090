"""Beam search: the cached decoder equals the full decoder, beam 1 is the argmax sequence,
and beam 4 with a length penalty matches a plain Python beam search on a tiny model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.transformer import get_config
from mlperf.transformer.beam_search import length_penalty
from mlperf.transformer.model import Transformer, TransformerConfig
from mlperf.transformer.task import TransformerTask

EOS = 1
VOCAB = 16
EXTRA = 5  # decode up to input length + EXTRA tokens


# One-hot (TPU: no gather/scatter) and gather (CPU) decode-cache updates and beam reorders.
@pytest.fixture(scope="module", params=[True, False], ids=["one_hot", "gather"])
def model(request):
    cfg = TransformerConfig(
        vocab_size=VOCAB,
        emb_dim=32,
        num_heads=4,
        num_layers=2,
        mlp_dim=64,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        einsum_gather=request.param,
    )
    m = Transformer(cfg, rngs=nnx.Rngs(3))
    # Sharper output distributions than the 0.02 init gives: ranks then never hinge on
    # rounding differences between the cached and the full decoder.
    m.embed.embedding[...] = m.embed.embedding[...] * 40.0
    return m


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    x = np.zeros((3, 6), np.int32)
    for b, n in enumerate((6, 4, 3)):
        x[b, : n - 1] = rng.integers(3, VOCAB, n - 1)
        x[b, n - 1] = EOS
    return x


def _task(beam: int, alpha: float, einsum_gather: bool) -> TransformerTask:
    c = get_config("tiny")
    c.einsum_gather = einsum_gather
    c.eval.update(beam_size=beam, length_penalty=alpha, max_extra_length=EXTRA)
    return TransformerTask(c)


_FULL_CACHE: dict = {}


def _full_logp(model, src: np.ndarray, prefix: list[int]) -> np.ndarray:
    """log p(next token | prefix) from the full (teacher-forced) decoder, no cache."""
    length = src.shape[0] + EXTRA + 1  # fixed: one compile; causal, so padding is inert
    if id(model) not in _FULL_CACHE:
        graphdef, state = nnx.split(model)

        @jax.jit
        def full(state, src, targets):
            m = nnx.merge(graphdef, state)
            seg = (src > 0).astype(jnp.int32)[None]
            encoded = m.encode(src[None], seg, jnp.arange(src.shape[0])[None])
            logits = m.decode(
                encoded,
                seg,
                targets[None],
                jnp.ones((1, length), jnp.int32),
                jnp.arange(length)[None],
            )
            return jax.nn.log_softmax(logits[0])

        _FULL_CACHE[id(model)] = (full, state)
    full, state = _FULL_CACHE[id(model)]
    targets = np.zeros(length, np.int32)
    targets[: len(prefix)] = prefix
    return np.asarray(full(state, jnp.asarray(src), jnp.asarray(targets))[len(prefix)])


def _decode(model, inputs: np.ndarray, beam: int, alpha: float) -> np.ndarray:
    """The task's jitted beam search (TransformerTask.eval_outputs)."""
    task = _task(beam, alpha, model.cfg.einsum_gather)
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, inputs):
        return task.eval_outputs(nnx.merge(graphdef, state), {"inputs": inputs})["tokens"]

    return np.asarray(run(state, jnp.asarray(inputs)))


def _reference_beam_search(model, src: np.ndarray, beam: int, alpha: float) -> list[int]:
    """Textbook beam search over the full decoder, run to the length limit (no early stop)."""
    limit = int((src > 0).sum()) + EXTRA
    live = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    for i in range(limit):
        candidates = []
        for logp, seq in live:
            step = _full_logp(model, src, seq)
            if i + 1 >= limit:
                candidates.append((logp + 0.0, seq + [EOS]))  # forced end
                continue
            candidates += [(logp + float(step[v]), seq + [v]) for v in range(VOCAB)]
        candidates.sort(key=lambda c: -c[0])
        top = candidates[: 2 * beam]
        penalty = float(length_penalty(jnp.asarray(i + 1), alpha))
        finished += [(lp / penalty, seq) for lp, seq in top if seq[-1] == EOS]
        finished = sorted(finished, key=lambda c: -c[0])[:beam]
        live = [c for c in top if c[-1][-1] != EOS][:beam]
        if not live:
            break
    return finished[0][1]


def _trim(tokens: np.ndarray) -> list[int]:
    out = []
    for t in tokens:
        out.append(int(t))
        if t == EOS:
            break
    return out


def test_cached_decode_step_equals_full_decoder(model, inputs):
    src = inputs[:1]
    seg = (src > 0).astype(np.int32)
    encoded = model.encode(jnp.asarray(src), seg, np.arange(src.shape[1])[None])
    cross = model.cross_cache(encoded)
    cache = model.self_cache(1, 8)
    prefix = [5, 9, 3, 12]
    token = jnp.zeros((1,), jnp.int32)
    for i, nxt in enumerate(prefix):
        logits, cache = model.decode_step(token, cache, cross, i, seg)
        want = _full_logp(model, src[0], prefix[:i])
        np.testing.assert_allclose(jax.nn.log_softmax(logits[0]), want, rtol=1e-4, atol=1e-4)
        token = jnp.asarray([nxt], jnp.int32)


def test_beam_1_returns_the_argmax_sequence(model, inputs):
    tokens = _decode(model, inputs, beam=1, alpha=0.0)
    for b, src in enumerate(inputs):
        greedy = []
        limit = int((src > 0).sum()) + EXTRA
        while len(greedy) < limit and (not greedy or greedy[-1] != EOS):
            greedy.append(int(np.argmax(_full_logp(model, src, greedy))))
        if greedy[-1] != EOS:
            greedy[-1] = EOS  # the length limit forces the end
        assert _trim(tokens[b]) == greedy


def test_beam_4_matches_python_reference(model, inputs):
    tokens = _decode(model, inputs, beam=4, alpha=0.6)
    assert tokens.shape == (3, inputs.shape[1] + EXTRA)
    lengths = set()
    for b, src in enumerate(inputs):
        want = _reference_beam_search(model, src, beam=4, alpha=0.6)
        assert _trim(tokens[b]) == want
        assert np.all(tokens[b, len(want) :] == 0)
        lengths.add(len(want))
    assert len(lengths) > 1 or max(lengths) > 1  # not all trivially EOS-first
