"""Joining a multi-client run: one process per host, same command on every host.

Before `jax.distributed` starts, process 0 holds a roll call on the coordinator port:
every other process connects and says who it is, and process 0 starts the jax
coordination service only once all of them answered. XLA's coordination client aborts
the whole process (SIGABRT, a C++ trace) when a peer never registers, so the roll call
is where a missing process becomes one line naming it, on every host, within
`--init_timeout_s`. After joining, a peer that dies breaks the next collective; every
survivor then ends at once with one line naming it (exit code EXIT_PEER_LOST).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
from collections.abc import Sequence

from launch.cli import EXIT_PEER_LOST

_HELLO = "multipod-roll-call"


class DistributedSetupError(RuntimeError):
    """The process could not join the run; the message says why and what to check."""


class PeerLostError(RuntimeError):
    """Another process of the run died or stopped answering; the message names it."""

    def exit(self) -> None:
        """Ends the process at once with EXIT_PEER_LOST and one line on stderr.

        os._exit: jax's exit handler would wait for the dead process at the shutdown
        barrier until the heartbeat timeout, then abort with a C++ trace.
        """
        print(f"multipod: error: {self}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        from launch import host_log

        host_log.close_all()  # its upload, which os._exit would skip
        os._exit(EXIT_PEER_LOST)

    @classmethod
    def from_collective_error(
        cls, error: BaseException, process_id: int, num_processes: int
    ) -> PeerLostError | None:
        """A cross-process collective that failed because a peer went away, or None."""
        if num_processes <= 1:
            return None
        text = f"{type(error).__name__}: {error}"
        if not re.search(
            r"gloo|connection (reset|closed)|heartbeat|UNAVAILABLE|coordination service",
            text,
            re.IGNORECASE,
        ):
            return None
        dead = _dead_peer(text, process_id, num_processes)
        return cls(
            f"process {process_id} of {num_processes}: {dead} died or stopped answering: "
            "a cross-process collective failed "
            f"({_first_line(text, 160)}); check that process's log and host, then rerun the "
            "same command on every host to resume."
        )


_ADDRESS_KEY = "multipod/address/{}"


def _own_address(coordinator: str) -> str:
    """This host's IP on the route to the coordinator (what peers' sockets see)."""
    host, _, port = coordinator.rpartition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port)))  # UDP: picks the route, sends nothing
            return s.getsockname()[0]
    except OSError:
        return "?"


def _publish_address(coordinator: str, process_id: int) -> None:
    """Records this process's address in the coordination service's key-value store, so
    a survivor can name the process behind a broken connection."""
    from jax._src import distributed

    client = distributed.global_state.client
    if client is not None:
        client.key_value_set(_ADDRESS_KEY.format(process_id), _own_address(coordinator))


def _dead_peer(text: str, process_id: int, num_processes: int) -> str:
    """Which process a broken collective points to: the coordinator when its key-value
    store no longer answers, else the processes at the failed connection's address."""
    from jax._src import distributed

    client = distributed.global_state.client
    others = [p for p in range(num_processes) if p != process_id]
    if client is None:
        return "another process"
    addresses = {}
    try:
        for p in others:
            addresses[p] = client.blocking_key_value_get(_ADDRESS_KEY.format(p), 2000)
    except Exception:  # noqa: BLE001 - the coordination service is gone with process 0
        return "process 0 (the coordinator)" if process_id != 0 else "another process"
    match = re.search(r"\[([0-9a-fA-F.:]+)\]:\d+", text)
    candidates = [p for p, a in addresses.items() if match and a == match.group(1)] or others
    if len(candidates) == 1:
        return f"process {candidates[0]}"
    return "one of processes " + ", ".join(map(str, candidates))


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 3] + "..."


def init_distributed(
    coordinator: str | None,
    num_processes: int,
    process_id: int,
    tpu_pod: bool,
    timeout_s: int,
    heartbeat_timeout_s: int = 60,
    local_device_ids: Sequence[int] | None = None,
) -> None:
    """Calls jax.distributed.initialize for a multi-process run (no-op for one process).

    Cloud TPU VM pods discover their peers (`tpu_pod`); other runs name the coordinator
    (process 0's host:port), the process count and this process's id (given, or derived
    from SLURM by launch/slurm.py), and use gloo for cross-process collectives on CPU.
    `local_device_ids` restricts the GPUs this process uses (None: all it sees). JAX's
    own cluster detection is off on this path: the coordinates given are the ones used.
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
    deadline = time.monotonic() + timeout_s
    if process_id == 0:
        hold_roll_call(coordinator, num_processes, timeout_s)
    else:
        answer_roll_call(coordinator, process_id, num_processes, timeout_s)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    remaining = max(int(deadline - time.monotonic()), 10)
    try:
        jax.distributed.initialize(
            coordinator,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=list(local_device_ids) if local_device_ids else None,
            cluster_detection_method="deactivate",
            initialization_timeout=remaining,
            heartbeat_timeout_seconds=heartbeat_timeout_s,
        )
        _publish_address(coordinator, process_id)
    except Exception as e:  # noqa: BLE001 - re-raised with what to check
        raise DistributedSetupError(
            f"process {process_id} of {num_processes} answered the roll call but could not "
            f"join jax.distributed at {coordinator} ({_first_line(str(e))}); did another "
            "process exit meanwhile? Check every process's log."
        ) from e


def hold_roll_call(coordinator: str, num_processes: int, timeout_s: float) -> None:
    """Process 0: waits on the coordinator's port until processes 1..N-1 have all said
    hello, then releases the port for the jax coordination service. A process that never
    comes is named in a DistributedSetupError, on process 0 and on every waiting peer."""
    port = int(coordinator.rpartition(":")[2])
    deadline = time.monotonic() + timeout_s
    peers: dict[int, socket.socket] = {}
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if server.family == socket.AF_INET6:
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            server.bind(("", port))
        except OSError as e:
            raise DistributedSetupError(
                f"process 0 cannot listen on the coordinator port {port} ({e.strerror or e}); "
                "is another run using it? Choose another --coordinator port."
            ) from None
        server.listen(max(num_processes, 8))
        try:
            while len(peers) < num_processes - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [p for p in range(1, num_processes) if p not in peers]
                    message = (
                        f"process 0 of {num_processes}: process(es) "
                        f"{', '.join(map(str, missing))} did not join within {timeout_s:g} s; "
                        f"start the same command on their hosts (--process_id "
                        f"{', '.join(map(str, missing))}) and check that they reach "
                        f"{coordinator}."
                    )
                    _tell_all(peers, f"missing {' '.join(map(str, missing))}")
                    raise DistributedSetupError(message)
                server.settimeout(min(left, 1.0))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                peer = _read_hello(conn, num_processes, peers)
                if peer is not None:
                    peers[peer] = conn
            _tell_all(peers, "ok")
            for conn in peers.values():  # the peer closes first: no TIME_WAIT on our port
                with contextlib.suppress(OSError):
                    conn.settimeout(5.0)
                    conn.recv(16)
        finally:
            for conn in peers.values():
                conn.close()


def _read_hello(conn: socket.socket, num_processes: int, peers: dict) -> int | None:
    """A peer's `multipod-roll-call <id> <count>` line, checked; None if not a peer."""
    conn.settimeout(5.0)
    try:
        words = conn.recv(256).decode(errors="replace").split()
    except OSError:
        conn.close()
        return None
    if len(words) != 3 or words[0] != _HELLO or not all(w.isdigit() for w in words[1:]):
        conn.close()  # not one of ours (a port scanner, a stray client)
        return None
    peer, count = int(words[1]), int(words[2])
    problem = None
    if count != num_processes:
        problem = (
            f"process {peer} was started with --num_processes={count} but process 0 with "
            f"--num_processes={num_processes}; give every process the same count."
        )
    elif not 0 < peer < num_processes:
        problem = f"process id {peer} is out of range 1..{num_processes - 1}."
    elif peer in peers:
        problem = f"two processes were started with --process_id={peer}; give each its own id."
    if problem is not None:
        with contextlib.suppress(OSError):
            conn.sendall(f"error {problem}\n".encode())
        conn.close()
        _tell_all(peers, f"error {problem}")
        raise DistributedSetupError(f"process 0 of {num_processes}: {problem}")
    return peer


def _tell_all(peers: dict[int, socket.socket], line: str) -> None:
    for conn in peers.values():
        with contextlib.suppress(OSError):
            conn.sendall(f"{line}\n".encode())


def answer_roll_call(
    coordinator: str, process_id: int, num_processes: int, timeout_s: float
) -> None:
    """Processes 1..N-1: say hello to process 0 and wait until everyone has (or process 0
    names who is missing)."""
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout_s
    me = f"process {process_id} of {num_processes}"
    last_error = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistributedSetupError(
                f"{me} could not reach the coordinator {coordinator} within {timeout_s:g} s "
                f"({last_error}). Is process 0 running, and is the address reachable from here?"
            )
        try:
            with socket.create_connection((host, int(port)), timeout=min(left, 1.0)) as conn:
                conn.sendall(f"{_HELLO} {process_id} {num_processes}\n".encode())
                conn.settimeout(max(deadline - time.monotonic(), 0.1) + 5.0)
                reply = conn.recv(4096).decode(errors="replace").strip()
        except OSError as e:
            last_error = e.strerror or str(e) or type(e).__name__
            time.sleep(0.5)
            continue
        if reply == "ok":
            return
        if reply.startswith("missing "):
            missing = reply.split()[1:]
            raise DistributedSetupError(
                f"{me}: process 0 gave up waiting for process(es) {', '.join(missing)} "
                f"after {timeout_s:g} s; start the same command on their hosts."
            )
        if reply.startswith("error "):
            raise DistributedSetupError(f"{me}: {reply[len('error ') :]}")
        last_error = f"unexpected answer {reply[:60]!r}" if reply else "connection closed"
        time.sleep(0.5)
