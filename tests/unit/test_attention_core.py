"""mlperf/layers/attention_core.py: on CPU the attention core runs in interleaved blocks
of examples with the same outputs, gradients and dropout as the whole core; the block
count follows one device's scores; other platforms lower the core whole."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from mlperf.layers import attention_core
from mlperf.layers.attention_core import attention_context, cpu_block_count
from parallel.partition import Partitioner, shard_count

B, Q, H, D = 8, 16, 4, 8
WHOLE = 0
# One example's fp32 scores are H*Q*Q*4 = 4 KiB: room for two and one examples a block.
TWO_A_BLOCK, ONE_A_BLOCK = 2 * H * Q * Q * 4, H * Q * Q * 4


def _inputs():
    keys = jax.random.split(jax.random.key(0), 4)
    q, k, v = (jax.random.normal(key, (B, Q, H, D)) for key in keys[:3])
    keep = jax.random.bernoulli(keys[3], 0.8, (B, 1, Q, Q)).at[:, :, :, 0].set(True)
    return q, k, v, keep


def _context(block_bytes, *, additive, normalize, rng):
    q, k, v, keep = _inputs()
    mask = jnp.where(keep, 0.0, -1e9) if additive else keep

    def run(q, k, v):
        return attention_context(
            q,
            k,
            v,
            mask,
            rng,
            dropout_rate=0.25,
            dtype=jnp.float32,
            additive_mask=additive,
            normalize_after_values=normalize,
            block_bytes=block_bytes,
        )

    return run, (q, k, v)


def _squared_sum_grads(run, args):
    return jax.jit(jax.grad(lambda *a: jnp.sum(run(*a) ** 2), argnums=(0, 1, 2)))(*args)


@pytest.mark.parametrize("additive", [False, True], ids=["bool_mask", "bias"])
@pytest.mark.parametrize("normalize", [False, True], ids=["softmax", "normalize_after"])
@pytest.mark.parametrize("with_dropout", [False, True], ids=["eval", "dropout"])
def test_blocks_compute_what_the_whole_core_does(additive, normalize, with_dropout):
    rng = jax.random.key(5) if with_dropout else None
    whole, args = _context(WHOLE, additive=additive, normalize=normalize, rng=rng)
    want = jax.jit(whole)(*args)
    want_grads = _squared_sum_grads(whole, args)
    for block_bytes in (TWO_A_BLOCK, ONE_A_BLOCK):
        blocked, _ = _context(block_bytes, additive=additive, normalize=normalize, rng=rng)
        np.testing.assert_allclose(jax.jit(blocked)(*args), want, rtol=1e-5, atol=1e-6)
        for got, expected in zip(_squared_sum_grads(blocked, args), want_grads, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    if with_dropout:
        # The blocks drop what the whole core drops: without dropout the result differs.
        undropped, _ = _context(ONE_A_BLOCK, additive=additive, normalize=normalize, rng=None)
        assert not np.allclose(jax.jit(undropped)(*args), want, atol=1e-3)


def _dots_in_cpu_program(block_bytes) -> int:
    run, args = _context(block_bytes, additive=False, normalize=False, rng=None)
    hlo = jax.jit(run).lower(*args).compile().as_text()
    return len(re.findall(r"\bdot\(", hlo))


def test_the_cpu_program_runs_one_pair_of_products_per_block():
    whole = _dots_in_cpu_program(WHOLE)
    assert whole >= 2
    assert _dots_in_cpu_program(TWO_A_BLOCK) == 4 * whole
    assert _dots_in_cpu_program(ONE_A_BLOCK) == 8 * whole


def test_other_platforms_lower_the_core_whole():
    """TPU and GPU (and AOT compiles for TPU from a CPU host) keep one score product and
    one value product: their compilers tile the core themselves."""
    run, args = _context(ONE_A_BLOCK, additive=False, normalize=False, rng=jax.random.key(1))

    def dots(platform: str) -> int:
        text = jax.jit(run).trace(*args).lower(lowering_platforms=(platform,)).as_text()
        return text.count("stablehlo.dot_general")

    assert dots("tpu") == dots("cuda") == 2
    assert dots("cpu") == 8 * 2


def test_the_block_count_fits_the_budget_or_does_not_split():
    # [B, H, Q, K] = [32, 4, 64, 64] fp32 (the Transformer tiny size): 2 MiB, 64 KiB an example.
    args = (32, 4, 64, 64, 4)
    assert cpu_block_count(*args, block_bytes=512 * 1024) == 4
    assert cpu_block_count(*args, block_bytes=2 * 1024 * 1024) == 1  # fits whole
    assert cpu_block_count(*args, block_bytes=0) == 1
    assert cpu_block_count(*args, block_bytes=48 * 1024) == 1  # one example does not fit
    # The count divides the batch: 12 examples of 64 KiB in 256 KiB takes 3 blocks of 4.
    assert cpu_block_count(12, 4, 64, 64, 4, block_bytes=256 * 1024) == 3
    assert attention_core.CPU_BLOCK_BYTES == 512 * 1024


def test_the_models_and_configs_default_to_the_same_budget():
    from configs.bert import get_config as bert_config
    from configs.transformer import get_config as transformer_config
    from mlperf.bert.model import BertConfig
    from mlperf.transformer.model import TransformerConfig

    budget = attention_core.CPU_BLOCK_BYTES
    assert BertConfig(vocab_size=8).attention_cpu_block_bytes == budget
    assert TransformerConfig(vocab_size=8).attention_cpu_block_bytes == budget
    for config in (bert_config("tiny"), transformer_config("tiny"), bert_config("wikitext")):
        assert config.model.attention_cpu_block_bytes == budget


@pytest.mark.parametrize("model", ["bert", "transformer"])
def test_the_config_reaches_every_attention_layer(model):
    """`model.attention_cpu_block_bytes` (0 keeps the core whole) sets every layer's."""
    from flax import nnx

    from configs import bert, transformer
    from mlperf.bert.task import BertTask
    from mlperf.layers.attention import SelfAttention
    from mlperf.layers.cached_attention import MultiHeadAttention
    from mlperf.transformer.task import TransformerTask

    config_module, task_class = {
        "bert": (bert, BertTask),
        "transformer": (transformer, TransformerTask),
    }[model]
    c = config_module.get_config("tiny")
    c.model.attention_cpu_block_bytes = 0
    built = task_class(c).build_model(nnx.Rngs(0))
    layers = [
        node
        for _, node in nnx.iter_graph(built)
        if isinstance(node, (SelfAttention, MultiHeadAttention))
    ]
    assert len(layers) == {"bert": 2, "transformer": 6}[model]
    assert {layer.cpu_block_bytes for layer in layers} == {0}


def _partitioner(devices, data: int, model: int) -> Partitioner:
    mesh = Mesh(np.array(devices[: data * model]).reshape(data, model), ("data", "model"))
    return Partitioner(mesh)


def test_the_block_count_follows_one_devices_share(devices):
    args = (32, 4, 64, 64, 4)
    with _partitioner(devices, 4, 2).active():
        assert shard_count("batch") == 4 and shard_count("heads") == 2
        # One device holds [8, 2, 64, 64]: 256 KiB, whole within 512 KiB.
        assert cpu_block_count(*args, block_bytes=512 * 1024) == 1
        assert cpu_block_count(*args, block_bytes=128 * 1024) == 2
        # 18 examples over 4 data shards: 4 a device; 4 blocks would not divide the 18.
        assert cpu_block_count(18, 4, 64, 64, 4, block_bytes=64 * 1024) == 2
        assert cpu_block_count(18, 4, 64, 64, 4, block_bytes=32 * 1024) == 1
    assert shard_count("batch") == 1  # no active partitioner


def test_sharded_blocks_equal_the_unsharded_whole_core(devices):
    """On a data x model mesh the interleaved blocks split like the batch: each device
    computes its own rows' blocks, and the result equals the whole core's."""
    rng = jax.random.key(7)
    whole, args = _context(WHOLE, additive=True, normalize=False, rng=rng)
    want = jax.jit(whole)(*args)
    partitioner = _partitioner(devices, 2, 2)
    # One device's share: [4, 2, 16, 16] fp32 = 8 KiB; 4 KiB blocks split it in two.
    blocked, _ = _context(2 * 2 * Q * Q * 4, additive=True, normalize=False, rng=rng)
    with partitioner.active():
        assert cpu_block_count(B, H, Q, Q, 4, 2 * 2 * Q * Q * 4) == 2
    jitted = partitioner.jit(blocked)
    hlo = jitted.lower(*args).compile().as_text()
    assert "all-to-all" not in hlo and "all-gather" not in hlo
    np.testing.assert_allclose(jitted(*args), want, rtol=1e-5, atol=1e-6)
