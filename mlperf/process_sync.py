"""Every process of a multi-client run reaching the same point before going on.

XLA's CPU collectives (gloo) build a communicator the first time a program uses a
group of devices, and give the other processes 30 s to join it (a fixed deadline,
`Gloo context initialization failed: DEADLINE_EXCEEDED`). Processes finish their
compiles, data preparation and peak measurement at different times, so the first train
step meets its peers only if they start it together: `mlperf.train` calls
`wait_for_every_process` before init_stop. The barrier is jax.distributed's coordination
service, not a device program, so it has its own, long, deadline and needs no
communicator.
"""

from __future__ import annotations

import itertools

import jax

# Long enough for the slowest host's compile and data preparation; a process that died
# is reported sooner, by the coordination service's heartbeat.
DEFAULT_TIMEOUT_S = 1800
_uses = itertools.count()


class ProcessSyncError(RuntimeError):
    """Not every process reached a barrier in time; the message names the barrier."""


def wait_for_every_process(name: str, timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
    """Blocks until every process has called this with the same `name` (in the same
    order). No-op for one process."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        return
    barrier = f"multipod/{name}/{next(_uses)}"
    try:
        client.wait_at_barrier(barrier, timeout_s * 1000)
    except Exception as e:  # noqa: BLE001 - re-raised with what it means
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ProcessSyncError(
            f"process {jax.process_index()} of {jax.process_count()}: not every process "
            f"reached {name!r} within {timeout_s} s through the coordination service "
            f"({first[:200]}); check the other processes' logs."
        ) from e
