"""Joining a multi-client run: one process per host, same command on every host."""

from __future__ import annotations

import socket
import time


class DistributedSetupError(RuntimeError):
    """The process could not join the run; the message says why and what to check."""


def init_distributed(
    coordinator: str | None, num_processes: int, process_id: int, tpu_pod: bool, timeout_s: int
) -> None:
    """Calls jax.distributed.initialize for a multi-process run (no-op for one process).

    Cloud TPU VM pods discover their peers (`tpu_pod`); CPU runs name the coordinator
    (process 0's host:port), the process count and this process's id, and use gloo for
    cross-process collectives.
    """
    import jax

    if tpu_pod:
        try:
            jax.distributed.initialize(initialization_timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - re-raised with what to check
            raise DistributedSetupError(
                f"could not join the TPU pod's jax.distributed run within {timeout_s} s: {e}. "
                "Run the same command on every worker (launch.tpu run --worker=all)."
            ) from e
        return
    if num_processes < 1:
        raise DistributedSetupError(f"--num_processes={num_processes} must be >= 1.")
    if not 0 <= process_id < num_processes:
        raise DistributedSetupError(
            f"--process_id={process_id} is out of range for --num_processes={num_processes}; "
            f"use 0..{num_processes - 1}."
        )
    if num_processes == 1:
        return
    if not coordinator or ":" not in coordinator:
        raise DistributedSetupError(
            f"--num_processes={num_processes} needs --coordinator host:port (process 0's "
            f"address), got {coordinator!r}."
        )
    if process_id != 0:
        # XLA's client aborts the whole process when the coordinator never answers, so
        # wait for it here, where a timeout can still be a clear error.
        _wait_for_coordinator(coordinator, timeout_s, process_id, num_processes)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=timeout_s,
        )
    except Exception as e:  # noqa: BLE001 - re-raised with what to check
        raise DistributedSetupError(
            f"process {process_id} of {num_processes} could not reach the coordinator "
            f"{coordinator} within {timeout_s} s ({type(e).__name__}). Is process 0 running, "
            "and is the address reachable from here?"
        ) from e


def _wait_for_coordinator(
    address: str, timeout_s: int, process_id: int, num_processes: int
) -> None:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise DistributedSetupError(
                    f"process {process_id} of {num_processes} could not reach the coordinator "
                    f"{address} within {timeout_s} s ({e.strerror or e}). Is process 0 running, "
                    "and is the address reachable from here?"
                ) from e
            time.sleep(0.5)
