"""Keeping freed host memory in the process on CPU runs, instead of returning it every step.

XLA:CPU allocates a program's scratch memory (its temp buffer: every intermediate of a
train step) when the program starts and frees it when it ends. With glibc's defaults a
block that large is mapped fresh from the kernel and unmapped on free, so every step
first-touches every page of it again: for BERT-base at batch 8 that is a 1.35 GB
map/unmap and ~330,000 page faults per step, about a tenth of the step alone and up to
a third when other allocations in the process (a peer framework, a data pipeline) make
each fault dearer (docs/performance.md, "Host memory on CPU runs").

`keep_freed_memory` sets glibc's allocator to serve every thread from one arena
(M_ARENA_MAX=1: a thread's own arena cannot grow past 64 MB and would map large blocks
regardless), never to map blocks of their own (M_MMAP_MAX=0) and never to give the top
of the heap back (M_TRIM_THRESHOLD=-1). A freed temp buffer is then reused by the next
step. The process holds its peak host memory until it exits, which is what a training
process does anyway.

It pays where a step's scratch memory is large and one thread runs it: BERT-base on one
CPU device, 5.6 -> 5.4 s a step alone, 7.3 -> 5.4 s beside torch. It costs where many
threads allocate: one arena serialises them, and BERT tiny on 8 fake devices ran 35%
slower (6.58 -> 4.31 steps/s). So it is off by default; `launch.bench.peers` (one
device, one thread per side) turns it on, and `MULTIPOD_KEEP_HOST_MEMORY=1` turns it on
for `launch.train` and the other `launch.bench` tools (`0` turns it off in `peers`). XLA's
threads get an arena each on their first allocation: it must be set before JAX starts its
backend.
"""

from __future__ import annotations

import ctypes
import os
import platform

from mlperf.config_error import ConfigError

ENV_VAR = "MULTIPOD_KEEP_HOST_MEMORY"

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

_applied = False


def wanted(default: bool, environ: dict[str, str] | None = None) -> bool:
    """Whether to keep freed host memory: `default`, unless the environment variable
    says otherwise ("1"/"0")."""
    env = os.environ if environ is None else environ
    override = env.get(ENV_VAR, "").strip()
    if override in ("0", "1"):
        return override == "1"
    if override:
        raise ConfigError(f"{ENV_VAR}={override!r}: set it to 1 (keep) or 0 (glibc's defaults)")
    return default


def keep_freed_memory() -> bool:
    """Sets glibc's allocator to keep freed memory (see the module docstring); returns
    whether it did (False on a C library without glibc's mallopt, e.g. macOS or musl)."""
    global _applied
    if _applied:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # mallopt returns 1 on success; -1 as the trim threshold turns trimming off.
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))
    done = [mallopt(param, value) for param, value in settings]
    _applied = all(r == 1 for r in done)
    return _applied


def configure(default: bool) -> bool:
    """`keep_freed_memory` when `wanted(default)`; returns whether it is in effect."""
    return wanted(default) and keep_freed_memory()
