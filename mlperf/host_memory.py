"""CPU runs keep freed host memory in the process instead of returning it every step.

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

Only CPU runs need it (accelerator programs keep their scratch memory on the device),
and only before the first allocation of XLA's threads, which get an arena each: call it
before JAX starts its backend. `MULTIPOD_KEEP_HOST_MEMORY=1` or `0` overrides the choice.
"""

from __future__ import annotations

import ctypes
import os
import platform

ENV_VAR = "MULTIPOD_KEEP_HOST_MEMORY"

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

_applied = False


def wanted(platforms: str | None, environ: dict[str, str] | None = None) -> bool:
    """Whether a run on JAX `platforms` (jax_platforms: "cpu", "tpu", "", None) should
    keep freed host memory: only when it runs on the CPU alone, unless the environment
    variable says otherwise ("1"/"0")."""
    env = os.environ if environ is None else environ
    override = env.get(ENV_VAR, "").strip()
    if override in ("0", "1"):
        return override == "1"
    if override:
        raise ValueError(f"{ENV_VAR}={override!r}: set it to 1 (keep) or 0 (glibc's defaults)")
    return (platforms or "").strip().lower() == "cpu"


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


def configure(platforms: str | None) -> bool:
    """`keep_freed_memory` when `wanted(platforms)`; returns whether it is in effect."""
    return wanted(platforms) and keep_freed_memory()


def in_effect() -> bool:
    """Whether this process keeps freed host memory."""
    return _applied
