"""Process-wide settings for checkpointing, made once at program start (from launch/).

They change global state (orbax's type-handler registry, the absl logger), so they are
not made by a library constructor: `launch.train` (and the tests' conftest) call
`configure_checkpointing()` once, after `jax.distributed` is set up.
"""

from __future__ import annotations

import logging
import os
import sys
import types

import jax
import orbax.checkpoint as ocp


class _OrbaxSaveTracebacks(logging.Filter):
    """Drops the tracebacks orbax logs when a background save fails: the same error is
    raised to the checkpointer, which stops the run with one line naming path and errno."""

    def filter(self, record: logging.LogRecord) -> bool:
        from_orbax = f"orbax{os.sep}checkpoint" in record.pathname
        return not (from_orbax and record.exc_info and record.levelno >= logging.ERROR)


def _is_late_store_reply(value: BaseException | None, tb: types.TracebackType | None) -> bool:
    """True for the error tensorstore reports when a store reply arrives after orbax has
    closed the event loop of a save it abandoned: tensorstore hands each finished
    request to `loop.call_soon_threadsafe` from one of its own threads, and reports the
    "Event loop is closed" that a closed loop raises as unraisable. Only that shape
    matches: the message, and a traceback made of asyncio's frames alone (no Python
    code called it)."""
    if not isinstance(value, RuntimeError) or str(value) != "Event loop is closed":
        return False
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    return (
        bool(frames)
        and frames[0].co_name == "call_soon_threadsafe"
        and all(
            code.co_filename.endswith(os.path.join("asyncio", "base_events.py")) for code in frames
        )
    )


def drop_late_store_replies() -> None:
    """Keeps tensorstore's late replies to an abandoned save out of the run's output.

    When the store goes away during a save, the first failed request fails the save and
    orbax closes its loop; the requests still in flight fail later (after their retries)
    and each would print a traceback from a tensorstore thread (`sys.unraisablehook`),
    around the run's one-line report of the failed save. Those replies carry nothing
    new: the save has failed and was reported. Every other unraisable error still
    reaches the previous hook. Installed once per process."""
    previous = sys.unraisablehook
    if getattr(previous, "_drops_late_store_replies", False):
        return

    def hook(unraisable) -> None:  # noqa: ANN001 - sys.UnraisableHookArgs
        if not _is_late_store_reply(unraisable.exc_value, unraisable.exc_traceback):
            previous(unraisable)

    hook._drops_late_store_replies = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


# How often tensorstore (which writes and reads the arrays of a checkpoint on an object
# store) retries a failed request, and the longest wait between tries: a store that stays
# away fails the save within about a minute, in one line, instead of after tensorstore's
# own default of 32 tries (a quarter of an hour); transient 5xx and 429 answers are still
# absorbed. MULTIPOD_STORE_RETRIES overrides the count (the fault tests make it small).
STORE_RETRIES_ENV = "MULTIPOD_STORE_RETRIES"
STORE_RETRIES = 6
STORE_MAX_DELAY = "16s"


def _bound_store_retries() -> None:
    """Puts the retry bound into the tensorstore context orbax builds for every save and
    restore (orbax has no option for it; its context templates are module dicts)."""
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    retries = {
        "max_retries": int(os.environ.get(STORE_RETRIES_ENV, STORE_RETRIES)),
        "initial_delay": "1s",
        "max_delay": STORE_MAX_DELAY,
    }
    for template in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
        getattr(ts_utils, template)["gcs_request_retries"] = retries


def configure_checkpointing() -> None:
    """Quiet orbax's logging and, with one process, write each shard whole.

    orbax logs its creation, every save and every deletion at INFO through absl, and a
    failed background save as a traceback; the run's own lines say what happened.

    With one process orbax writes each shard once, whole, instead of splitting replicated
    shards across their replicas ("replica-parallel", its default): splitting lets every
    host of a pod write a share of the replicated arrays, but with one process every
    replica is on this host, so it only adds a slice op per replica and shard to each save
    (measured on the wikitext BERT state, 9.6M parameters, 2 loaded cores: save() blocked
    the loop 29-58 s the first time, compiling ~120 slice programs, and 2-4 s at every later
    save). Several processes keep orbax's default. The registered handler's array-metadata
    store is kept (orbax exposes no public constructor for it)."""
    _bound_store_retries()
    drop_late_store_replies()
    absl_logger = logging.getLogger("absl")
    absl_logger.setLevel(logging.WARNING)
    if not any(isinstance(f, _OrbaxSaveTracebacks) for f in absl_logger.filters):
        absl_logger.addFilter(_OrbaxSaveTracebacks())
    if jax.process_count() == 1:
        current = ocp.type_handlers.get_type_handler(jax.Array)
        absl_logger.setLevel(logging.ERROR)  # orbax warns that it overrides a handler
        try:
            ocp.type_handlers.register_type_handler(
                jax.Array,
                ocp.type_handlers.ArrayHandler(
                    use_replica_parallel=False,
                    array_metadata_store=getattr(current, "_array_metadata_store", None),
                ),
                override=True,
            )
        finally:
            absl_logger.setLevel(logging.WARNING)
