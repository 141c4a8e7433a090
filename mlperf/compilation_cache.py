"""JAX's persistent compilation cache: a repeated or resumed run loads its compiled
programs from disk instead of compiling them again.

JAX keys every entry by the program (its StableHLO), the compile options, the devices
and the jax/jaxlib/XLA versions, so one directory can serve every config, mesh and
version safely: a changed program is a miss, never a wrong executable. Only process 0
writes entries (JAX's rule for multi-host runs); every process reads them.
"""

from __future__ import annotations

import dataclasses
import os

import jax

DEFAULT_DIR = "~/.cache/multipod/xla"
ENV_VAR = "MULTIPOD_COMPILATION_CACHE"

_HITS = "/jax/compilation_cache/cache_hits"
_MISSES = "/jax/compilation_cache/cache_misses"


@dataclasses.dataclass
class CacheStats:
    """Where the cache lives and how many compiles it answered (hits) or missed."""

    directory: str
    hits: int = 0
    misses: int = 0


_stats: CacheStats | None = None


def default_directory() -> str:
    """$MULTIPOD_COMPILATION_CACHE, else ~/.cache/multipod/xla ("" or "none": off)."""
    return os.environ.get(ENV_VAR, DEFAULT_DIR)


def _count(event: str, **_kwargs) -> None:
    if _stats is None:
        return
    if event == _HITS:
        _stats.hits += 1
    elif event == _MISSES:
        _stats.misses += 1


def enable(directory: str) -> CacheStats | None:
    """Turns the persistent cache on in `directory` for this process (call once, before
    the first compile). "" or "none" leaves it off. A directory that cannot be created
    only turns the cache off, with one line: a cache must never stop a run."""
    global _stats
    if directory.strip().lower() in ("", "none"):
        return None
    path = os.path.abspath(os.path.expanduser(directory))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        print(f"multipod: compilation cache off: cannot create {path} ({e.strerror})", flush=True)
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    # Cache every program, however quick to compile: eval and small init programs add
    # up to seconds of start-up on a CPU, and the entries are small.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if _stats is None:
        jax.monitoring.register_event_listener(_count)
    _stats = CacheStats(path)
    return _stats


def stats() -> CacheStats | None:
    """This process's cache directory and hit/miss counts so far (None: cache off)."""
    return _stats


def stats_dict() -> dict | None:
    """`stats()` as a plain dict for result.json (None: cache off)."""
    return dataclasses.asdict(_stats) if _stats is not None else None
