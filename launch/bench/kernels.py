"""The small row-wise kernels of a tiny model's step, JAX against torch, on this process's
threads.

    python -m launch.bench.kernels [--kernel_rows 512,2048,8192] [--peer_threads 1]
                                   [--kernel_chains 4]

Each kernel runs on `[rows, 64]` float32 activations (the Transformer tiny width; 2,048
rows is its batch of 32 sentences of 64 tokens): the attention's softmax over the last
axis, a bias and ReLU, a product with a `[64, 64]` weight, and the attention's two
batched products (the rows as sentences of 64 tokens with 4 heads of 16, as queries:
scores `bqhd,bkhd->bhqk`, then context `bhqk,bkhd->bqhd`, against keys that are also the
values). A chain of `CHAIN` dependent applications is timed on each side, JAX as one
compiled program (an optimization barrier after each application keeps them apart, as
the ops of a step are) and torch eagerly, so neither side's per-call dispatch is what is
measured; the table gives microseconds per application and the ratio torch / JAX (above
1: JAX is faster). Every chain keeps its values' scale (no overflow, no denormals): the
bias is zero, the weight orthogonal, and each sentence's and head's keys have orthonormal
columns, so the attention products return their queries.
Run it with `--peer_threads 1` and without (each library's default threading) to see
what the second core buys each library at these sizes: the thread count is fixed when
JAX's backend starts, so the two settings are two processes.

`--kernel_chains N` adds a JAX-only table (`concurrency`): N independent chains in one
program against one chain N times as long. Its gain says whether XLA:CPU's executor runs
independent ops at once on the process's threads (up to min(N, threads)) or one after
another (about 1), which decides whether splitting work into independent pieces, as the
CPU attention blocks do, can use a second core.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from absl import flags

from launch.bench.common import JSON, PEER_THREADS, one_device_peers, run
from launch.cli import usage_error
from launch.markdown import markdown_table

_ROWS = flags.DEFINE_list(
    "kernel_rows", ["512", "2048", "8192"], "Rows of the [rows, 64] activations."
)
_CHAINS = flags.DEFINE_integer(
    "kernel_chains",
    0,
    "Also time this many independent JAX chains in one program against one chain "
    "as long as all of them (0: skip; 2 or more).",
)

WIDTH = 64
CHAIN = 50
HEADS = 4
SEQUENCE = 64
KERNELS = ("softmax", "bias_relu", "matmul_64x64", "attention_products")


@dataclasses.dataclass(frozen=True)
class Operands:
    """One kernel's input and weights, as numpy arrays both sides start from."""

    x: np.ndarray
    bias: np.ndarray
    weight: np.ndarray
    keys: np.ndarray  # [sentences, tokens, heads, head width]


def check_rows(rows: Sequence[int]) -> None:
    """ValueError unless every count is a positive number of whole 64-token sentences."""
    bad = [r for r in rows if r < 1 or r % SEQUENCE]
    if not rows or bad:
        raise ValueError(
            f"rows {bad or list(rows)}: give positive multiples of {SEQUENCE} (sentences of "
            f"{SEQUENCE} tokens), e.g. 512,2048"
        )


def operands(rows: int, seed: int = 0) -> Operands:
    """Random activations, a zero bias (so a ReLU chain keeps its values), an orthogonal
    weight (so a product chain keeps its norms) and keys with orthonormal columns per
    sentence and head (so the attention products give back their queries)."""
    check_rows([rows])
    rng = np.random.default_rng(seed)
    weight, _ = np.linalg.qr(rng.standard_normal((WIDTH, WIDTH)))
    # [sentences, heads, tokens, head width], orthonormal over the tokens.
    columns, _ = np.linalg.qr(
        rng.standard_normal((rows // SEQUENCE, HEADS, SEQUENCE, WIDTH // HEADS))
    )
    keys = columns.transpose(0, 2, 1, 3).astype(np.float32)
    return Operands(
        rng.standard_normal((rows, WIDTH)).astype(np.float32),
        np.zeros(WIDTH, np.float32),
        weight.astype(np.float32),
        keys,
    )


def _jax_apply(kernel: str) -> Callable[..., Any]:
    """One application of `kernel` in JAX: f(x, bias, weight, keys) -> x."""
    import jax
    import jax.numpy as jnp

    return {
        "softmax": lambda x, b, w, k: jax.nn.softmax(x, axis=-1),
        "bias_relu": lambda x, b, w, k: jnp.maximum(x + b, 0.0),
        "matmul_64x64": lambda x, b, w, k: x @ w,
        "attention_products": _jax_attention_products,
    }[kernel]


def _jax_run(kernel: str, chain: int, x, b, w, k):
    import jax

    apply = _jax_apply(kernel)
    for _ in range(chain):
        x = jax.lax.optimization_barrier(apply(x, b, w, k))
    return x


def jax_chain(kernel: str, chain: int) -> Callable[..., Any]:
    """A compiled chain of `chain` applications of `kernel`: f(x, bias, weight, keys) -> x."""
    import jax

    return jax.jit(functools.partial(_jax_run, kernel, chain))


def jax_independent_chains(kernel: str, chain: int) -> Callable[..., Any]:
    """One compiled program of independent chains, one per input:
    f([x0, x1, ...], bias, weight, keys) -> [chain(x0), chain(x1), ...]. Nothing joins
    the chains, so an executor free to run independent ops at once can run them on as
    many threads as there are chains."""
    import jax

    def run(xs, b, w, k):
        return [_jax_run(kernel, chain, x, b, w, k) for x in xs]

    return jax.jit(run)


def _jax_attention_products(x, bias, weight, keys):
    import jax.numpy as jnp

    q = x.reshape(keys.shape)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, keys)
    return jnp.einsum("bhqk,bkhd->bqhd", scores, keys).reshape(x.shape)


def _torch_attention_products(x, bias, weight, keys):
    import torch

    q = x.reshape(keys.shape)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, keys)
    return torch.einsum("bhqk,bkhd->bqhd", scores, keys).reshape(x.shape)


def torch_chain(kernel: str, chain: int) -> Callable[..., Any]:
    """The same chain in eager torch: f(x, bias, weight, keys) -> x."""
    import torch

    apply = {
        "softmax": lambda x, b, w, k: torch.softmax(x, dim=-1),
        "bias_relu": lambda x, b, w, k: torch.relu(x + b),
        "matmul_64x64": lambda x, b, w, k: x @ w,
        "attention_products": _torch_attention_products,
    }[kernel]

    def run(x, b, w, k):
        with torch.inference_mode():
            for _ in range(chain):
                x = apply(x, b, w, k)
        return x

    return run


def _median_seconds(call: Callable[[], Any], calls: int, repeats: int) -> float:
    call()  # warm-up (and JAX's compile)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = call()
        for leaf in out if isinstance(out, list) else [out]:  # a program's outputs, all
            if hasattr(leaf, "block_until_ready"):
                leaf.block_until_ready()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure(
    rows: Sequence[int],
    kernels: Sequence[str] = KERNELS,
    chain: int = CHAIN,
    calls: int = 10,
    repeats: int = 7,
) -> list[dict[str, Any]]:
    """One row per (kernel, rows): microseconds per application on each side, their ratio,
    and the largest difference between the two sides' chain outputs. ValueError before
    any timing unless every count of `rows` is whole sentences (`check_rows`)."""
    import jax.numpy as jnp
    import torch

    check_rows(rows)
    out = []
    for n in rows:
        ops = operands(n)
        arrays = (ops.x, ops.bias, ops.weight, ops.keys)
        jx = [jnp.asarray(a) for a in arrays]
        tx = [torch.from_numpy(a.copy()) for a in arrays]
        for kernel in kernels:
            jf, tf = jax_chain(kernel, chain), torch_chain(kernel, chain)
            jax_s = _median_seconds(functools.partial(jf, *jx), calls, repeats)
            torch_s = _median_seconds(functools.partial(tf, *tx), calls, repeats)
            diff = float(np.max(np.abs(np.asarray(jf(*jx)) - tf(*tx).numpy())))
            out.append(
                {
                    "kernel": kernel,
                    "shape": [n, WIDTH],
                    "jax_us": 1e6 * jax_s / chain,
                    "torch_us": 1e6 * torch_s / chain,
                    "torch_over_jax": torch_s / jax_s,
                    "max_abs_diff": diff,
                }
            )
    return out


def table(rows: list[dict[str, Any]], threads: str) -> str:
    """The rows as a markdown table; `threads` labels the setting they ran under."""
    return markdown_table(
        ["kernel", "shape", "threads", "JAX us", "torch us", "torch / JAX"],
        [
            [
                r["kernel"],
                "x".join(str(d) for d in r["shape"]),
                threads,
                f"{r['jax_us']:.1f}",
                f"{r['torch_us']:.1f}",
                f"{r['torch_over_jax']:.2f}x",
            ]
            for r in rows
        ],
    )


def concurrency(
    rows: Sequence[int],
    kernels: Sequence[str] = KERNELS,
    chains: int = 4,
    chain: int = CHAIN,
    calls: int = 3,
    repeats: int = 5,
) -> list[dict[str, Any]]:
    """JAX only, one row per (kernel, rows): `chains` independent chains of `chain`
    applications in one program against one chain of `chains * chain`, microseconds per
    application each, and the gain serial / independent. Near 1, the executor ran the
    independent chains one after another; near min(chains, threads), at once. Each chain
    starts from its own activations (distinct seeds), so the compiler cannot merge them
    into one. ValueError before any timing for bad rows or fewer than 2 chains."""
    import jax.numpy as jnp

    check_rows(rows)
    if chains < 2:
        raise ValueError(f"chains {chains}: give 2 or more independent chains, e.g. 4")
    total = chains * chain
    out = []
    for n in rows:
        first = operands(n)
        shared = [jnp.asarray(a) for a in (first.bias, first.weight, first.keys)]
        xs = [jnp.asarray(operands(n, seed=i).x) for i in range(chains)]
        for kernel in kernels:
            serial = functools.partial(jax_chain(kernel, total), xs[0], *shared)
            independent = functools.partial(jax_independent_chains(kernel, chain), xs, *shared)
            serial_s = _median_seconds(serial, calls, repeats)
            independent_s = _median_seconds(independent, calls, repeats)
            out.append(
                {
                    "kernel": kernel,
                    "shape": [n, WIDTH],
                    "chains": chains,
                    "serial_us": 1e6 * serial_s / total,
                    "independent_us": 1e6 * independent_s / total,
                    "gain": serial_s / independent_s,
                }
            )
    return out


def concurrency_table(rows: list[dict[str, Any]], threads: str) -> str:
    """The `concurrency` rows as a markdown table under the `threads` label."""
    return markdown_table(
        ["kernel", "shape", "threads", "chains", "serial us", "independent us", "gain"],
        [
            [
                r["kernel"],
                "x".join(str(d) for d in r["shape"]),
                threads,
                str(r["chains"]),
                f"{r['serial_us']:.1f}",
                f"{r['independent_us']:.1f}",
                f"{r['gain']:.2f}x",
            ]
            for r in rows
        ],
    )


def main(argv: list[str]) -> None:
    one_device_peers()  # before jax starts its backend
    text = ",".join(_ROWS.value)
    try:
        rows = [int(r) for r in _ROWS.value]
    except ValueError:
        usage_error(f"kernels: --kernel_rows={text}: give whole numbers, e.g. 512,2048")
    try:
        check_rows(rows)
    except ValueError as e:
        usage_error(f"kernels: --kernel_rows={text}: {e}")
    chains = _CHAINS.value
    if chains and chains < 2:
        usage_error(f"kernels: --kernel_chains={chains}: give 0 (skip) or 2 or more, e.g. 4")
    result = measure(rows)
    together = concurrency(rows, chains=chains) if chains else []
    threads = str(PEER_THREADS.value) if PEER_THREADS.value else "default"
    if JSON.value:
        print(json.dumps({"kernels": result, "concurrency": together}, indent=2))
        return
    print(table(result, threads))
    if together:
        print()
        print(concurrency_table(together, threads))


if __name__ == "__main__":
    run(main, keep_memory=False)  # one_device_peers keeps host memory by default
