"""A jax.profiler trace of a few more train steps, for `launch.bench --profile_dir`."""

from __future__ import annotations

import sys

import jax


def progress(text: str) -> None:
    """One `launch.bench` progress line on stderr (stdout stays the result, JSON with --json)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def trace_steps(profile_dir: str, steps: int, compiled, state, batch, key) -> bool:
    """Runs `steps` more steps under a jax.profiler trace into `profile_dir`. A profiler
    that fails (say, a GPU without CUPTI) costs the trace only, not the measurement."""
    try:
        with jax.profiler.trace(profile_dir):
            for _ in range(steps):
                state, metrics = compiled(state, batch, key)
            jax.block_until_ready(metrics)
    except Exception as e:  # noqa: BLE001 - any profiler failure: report it, keep the row
        progress(f"no trace written to {profile_dir}: {type(e).__name__}: {e}")
        return False
    progress(f"wrote a trace of {steps} steps to {profile_dir}")
    return True
