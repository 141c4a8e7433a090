"""`python -m launch.bench.cross_entropy`: the train loss's softmax cross-entropy, ours against the
textbook autodiff form, in one process.

Times the loss and gradient of [rows, vocab] fp32 logits under `jax.jit`, both forms
alternating, and checks first that they agree (loss, top-1 count, gradient), so that a
faster form cannot be a wrong one. The textbook form is autodiff through log_softmax, a
take_along_axis label pick and an argmax for the accuracy; ours is
`mlperf.layers.cross_entropy`. With `bias`, a [vocab] bias is added to the logits first,
as in BERT's masked-LM head: the textbook side with a broadcast add (autodiff sums its
gradient over the rows), ours with `mlperf.layers.bias.add_bias` (the sum as a dot), and
both gradients, of the logits and of the bias, are checked and timed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from launch.bench.common import ROUNDS, print_rows, run
from launch.cli import usage_error
from launch.markdown import markdown_table
from mlperf.layers.bias import add_bias
from mlperf.layers.cross_entropy import softmax_cross_entropy

_SHAPES = flags.DEFINE_list(
    "xent_shapes",
    ["320x2048", "640x30522", "4096x4000"],
    "ROWSxVOCAB logits (bert:tiny's and bert:wikitext's masked positions, "
    "transformer:multi30k's tokens).",
)
_SMOOTHING = flags.DEFINE_float("xent_smoothing", 0.0, "Label smoothing.")
_BIAS = flags.DEFINE_bool(
    "xent_bias", False, "Add a [vocab] bias to the logits first (BERT's masked-LM head)."
)


def parse_shape(text: str) -> tuple[int, int]:
    """'640x30522' -> (640, 30522); ValueError with the expected form otherwise."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape {text!r}: give ROWSxVOCAB with positive integers, e.g. 640x30522")
    return int(parts[0]), int(parts[1])


def _textbook(logits, labels, smoothing):
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    vocab = logits.shape[-1]
    loss = (1.0 - smoothing) * nll + smoothing / (vocab - 1) * (-jnp.sum(log_probs, -1) - nll)
    return jnp.mean(loss), jnp.sum(jnp.argmax(logits, -1) == labels)


def _ours(logits, labels, smoothing):
    loss, _, top1 = softmax_cross_entropy(logits, labels, smoothing)
    return jnp.mean(loss), jnp.sum(top1)


def _step(form: Callable, smoothing: float, add: Callable):
    """Loss, top-1 count and gradients of (logits, bias) for `form` after `add(logits, bias)`."""
    return jax.jit(
        jax.value_and_grad(
            lambda x, b, y: form(add(x, b), y, smoothing), argnums=(0, 1), has_aux=True
        )
    )


def _broadcast_add(x, b):
    return x + b


def _no_bias(x, b):
    return x


def _mean_ms(fn: Callable, args, calls: int) -> float:
    """Mean ms per call over `calls` back-to-back calls (dispatch is asynchronous)."""
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return 1e3 * (time.perf_counter() - start) / calls


def bench(
    shapes: Sequence[tuple[int, int]],
    smoothing: float = 0.0,
    rounds: int = 5,
    calls: int = 10,
    bias: bool = False,
) -> list[dict]:
    """One row per shape: ms per loss+gradient of each form (median over rounds), the
    ratio textbook / ours, and the largest gradient difference (logits and bias)."""
    rows = []
    for n, vocab in shapes:
        logits = jax.random.normal(jax.random.key(0), (n, vocab)) * 3.0
        labels = jax.random.randint(jax.random.key(1), (n,), 0, vocab)
        b = jax.random.normal(jax.random.key(2), (vocab,)) if bias else jnp.zeros((vocab,))
        adds = (_broadcast_add, add_bias) if bias else (_no_bias, _no_bias)
        forms = {
            "textbook": _step(_textbook, smoothing, adds[0]),
            "ours": _step(_ours, smoothing, adds[1]),
        }
        (ref_loss, ref_hits), ref_grads = forms["textbook"](logits, b, labels)
        (loss, hits), grads = forms["ours"](logits, b, labels)
        pairs = list(zip(grads, ref_grads, strict=True))
        grad_diff = max(float(jnp.max(jnp.abs(g - r))) for g, r in pairs)
        agree = int(hits) == int(ref_hits) and np.isclose(loss, ref_loss, rtol=1e-5)
        close = all(np.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in pairs)
        if not (agree and close):
            raise AssertionError(
                f"[{n}, {vocab}]: the forms disagree (loss {loss} vs {ref_loss}, "
                f"top-1 {hits} vs {ref_hits}, largest gradient difference {grad_diff:.2e})"
            )
        times: dict[str, list[float]] = {k: [] for k in forms}
        for _ in range(rounds):
            for name, fn in forms.items():
                times[name].append(_mean_ms(fn, (logits, b, labels), calls))
        textbook, ours = (statistics.median(times[k]) for k in ("textbook", "ours"))
        rows.append(
            {
                "rows": n,
                "vocab": vocab,
                "smoothing": smoothing,
                "bias": bias,
                "textbook_ms": textbook,
                "ours_ms": ours,
                "speedup": textbook / ours,
                "max_grad_diff": grad_diff,
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of `bench` rows."""
    headers = [
        "logits",
        "smoothing",
        "bias",
        "textbook ms",
        "ours ms",
        "textbook / ours",
        "max grad diff",
    ]
    return markdown_table(
        headers,
        [
            [
                f"[{r['rows']}, {r['vocab']}]",
                str(r["smoothing"]),
                "yes" if r["bias"] else "no",
                f"{r['textbook_ms']:.2f}",
                f"{r['ours_ms']:.2f}",
                f"{r['speedup']:.2f}x",
                f"{r['max_grad_diff']:.1e}",
            ]
            for r in rows
        ],
    )


def main(argv: list[str]) -> None:
    try:
        shapes = [parse_shape(t) for t in _SHAPES.value]
    except ValueError as e:
        usage_error(f"--xent_shapes: {e}")
    if not 0.0 <= _SMOOTHING.value < 1.0:
        usage_error(f"--xent_smoothing {_SMOOTHING.value}: give a value in [0, 1)")
    rows = bench(shapes, _SMOOTHING.value, max(ROUNDS.value, 1), bias=_BIAS.value)
    print_rows(rows, table)


if __name__ == "__main__":
    run(main)
