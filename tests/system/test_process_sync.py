"""mlperf.process_sync: every process waits at the barrier for the last one, so the first
cross-process collective after it meets all its peers within gloo's fixed 30 s
communicator deadline, however far apart they were before; a process that never comes
is a ProcessSyncError naming the barrier."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env, on_processes

# Process 1 arrives DELAY_S late; then every process sums its index + 1 over all devices.
SCRIPT = """
import os, time
from launch.distributed import init_distributed
n, me = int(os.environ["MULTIPOD_NUM_PROCESSES"]), int(os.environ["MULTIPOD_PROCESS_ID"])
init_distributed(os.environ["MULTIPOD_COORDINATOR"], n, me, False, 120)
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from mlperf.process_sync import ProcessSyncError, wait_for_every_process
jax.devices()  # every process joins the CPU backend (its topology) before the delay
if me == 1:
    time.sleep(float(os.environ["DELAY_S"]))
    if os.environ.get("SKIP_BARRIER"):
        raise SystemExit(0)
start = time.time()
try:
    wait_for_every_process("test_barrier", timeout_s=int(os.environ["TIMEOUT_S"]))
except ProcessSyncError as e:
    print(f"process {me}: {e}", flush=True)
    raise SystemExit(0)
waited = time.time() - start
mesh = Mesh(np.array(jax.devices()), ("d",))
local = np.full((1,), me + 1, np.float32)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(x)
print(f"process {me} waited {waited:.1f} s; sum {float(total.addressable_data(0)):.0f}", flush=True)
"""


def _run(delay_s: float, timeout_s: int, skip_barrier: bool = False) -> str:
    env = {**cpu_env(1), "DELAY_S": str(delay_s), "TIMEOUT_S": str(timeout_s)}
    if skip_barrier:
        env["SKIP_BARRIER"] = "1"
    proc = subprocess.run(
        on_processes([sys.executable, "-c", SCRIPT], processes=2, devices=1),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _waited(stdout: str, process: int) -> float:
    match = re.search(rf"process {process} waited ([0-9.]+) s; sum 3", stdout)
    assert match, stdout[-3000:]
    return float(match.group(1))


def test_the_barrier_holds_every_process_until_the_last_arrives():
    stdout = _run(delay_s=4, timeout_s=120)
    assert _waited(stdout, 0) >= 3.0  # process 0 waited for process 1's 4 s
    assert _waited(stdout, 1) < 3.0


def test_a_process_that_never_arrives_is_named_by_barrier_and_timeout():
    stdout = _run(delay_s=8, timeout_s=2, skip_barrier=True)
    assert "process 0 of 2: not every process reached 'test_barrier' within 2 s" in stdout


@pytest.mark.slow
def test_processes_40_s_apart_still_meet_in_their_first_collective():
    """Without the barrier, process 0's sum would give up on process 1 after gloo's 30 s
    (`Gloo context initialization failed: DEADLINE_EXCEEDED`)."""
    stdout = _run(delay_s=40, timeout_s=120)
    assert _waited(stdout, 0) >= 35.0
    assert _waited(stdout, 1) < 30.0
