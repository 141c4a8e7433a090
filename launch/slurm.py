"""A multi-process run's coordinates from SLURM: coordinator, process count and id, GPUs.

`srun` starts one task per process and describes it in `SLURM_*` variables; this module
reads them for `launch.train` (which uses them when the project's own --coordinator /
MULTIPOD_* coordinates are not given and `SLURM_PROCID` is set):

- the coordinator is the first host of the step's node list (`SLURM_STEP_NODELIST`,
  e.g. `gpu[003-004,010]` -> `gpu003`) on port 61440 + `SLURM_JOB_ID` % 4096 (the range
  JAX's own SLURM support uses), or `MULTIPOD_COORDINATOR_PORT`;
- the process count and id are `SLURM_NTASKS` and `SLURM_PROCID`;
- each process's GPUs come from `CUDA_VISIBLE_DEVICES` and the task's place on its node
  (`SLURM_LOCALID` of the node's tasks): one task per node owns every GPU it sees; with
  several tasks per node, a task that sees one GPU (`--gpus-per-task=1`, `--gpu-bind`)
  owns it, and a task that sees all of the node's GPUs owns its share of them, in order
  (task 3 of 8 tasks on 8 GPUs: GPU 3).

A variable that is missing, not a number, or inconsistent with the others is one line
naming it (SlurmError), never a guess. Nothing here imports jax.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

PORT_BASE = 65535 - 2**12 + 1  # 61440: JAX's SLURM port range, above Linux's ephemeral ports


class SlurmError(ValueError):
    """The SLURM environment is partial or inconsistent; the message names the variable."""


@dataclasses.dataclass(frozen=True)
class SlurmTask:
    """One process of a SLURM step, as launch.train needs it."""

    coordinator: str
    num_processes: int
    process_id: int
    node: int  # SLURM_NODEID
    tasks_per_node: int
    local_rank: int  # SLURM_LOCALID
    gpus: tuple[str, ...] | None  # the CUDA_VISIBLE_DEVICES entries this process owns
    local_device_ids: tuple[int, ...] | None  # their indices among the visible GPUs

    def describe(self) -> str:
        layout = (
            "one task per node"
            if self.tasks_per_node == 1
            else (f"{self.tasks_per_node} tasks per node")
        )
        gpus = f", GPU(s) {','.join(self.gpus)}" if self.gpus else ""
        return (
            f"SLURM: process {self.process_id} of {self.num_processes} (node {self.node}, "
            f"{layout}{gpus}), coordinator {self.coordinator}"
        )


def in_slurm_task(env: Mapping[str, str]) -> bool:
    """True inside a task that srun started (SLURM_PROCID is set)."""
    return "SLURM_PROCID" in env


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str]:
    """(name, value) of the first of `names` that is set; SlurmError naming them if none."""
    for name in names:
        if env.get(name, "").strip():
            return name, env[name].strip()
    others = " or ".join(names[1:])
    also = f" (nor {others})" if others else ""
    raise SlurmError(
        f"SLURM: {names[0]} is not set{also}, though SLURM_PROCID is: start the run with "
        "srun inside an allocation, or give --coordinator, --num_processes and --process_id."
    )


def _int(name: str, value: str, low: int = 0) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < low:
        raise SlurmError(f"SLURM: {name}={value!r} is not a whole number >= {low}.")
    return int(value)


def expand_hostlist(hostlist: str) -> list[str]:
    """SLURM's compressed host list -> host names: `gpu[001-002,7],login` ->
    gpu001, gpu002, gpu7, login (zero padding kept; several bracket groups multiply)."""
    hosts: list[str] = []
    for item in _split_top(hostlist):
        expanded = [""]
        for literal, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            choices = [literal]
            if ranges:
                choices = [literal + n for n in _expand_ranges(ranges, hostlist)]
            expanded = [e + c for e in expanded for c in choices]
        hosts += [h for h in expanded if h]
    if not hosts:
        raise SlurmError(f"SLURM: the node list {hostlist!r} names no host.")
    return hosts


def _split_top(text: str) -> list[str]:
    """Splits at the commas outside brackets."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [*items, current] if current else items


def _expand_ranges(ranges: str, hostlist: str) -> list[str]:
    out = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise SlurmError(f"SLURM: cannot read the node list {hostlist!r} (range {part!r}).")
        width = len(low)
        for n in range(int(low), int(high or low) + 1):
            out.append(str(n).zfill(width))
    return out


def _tasks_per_node(env: Mapping[str, str], num_processes: int, nodes: int) -> int:
    """Tasks on each node: every node must have the same number."""
    if num_processes % nodes:
        raise SlurmError(
            f"SLURM: {num_processes} tasks over {nodes} nodes (SLURM_NTASKS, "
            "SLURM_STEP_NUM_NODES) is not the same number on every node; give each node "
            "as many tasks (--ntasks-per-node)."
        )
    per_node = num_processes // nodes
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = env.get(name, "").strip()
        if not value:
            continue
        counts = []
        for group in value.split(","):
            match = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", group)
            if not match:
                raise SlurmError(f"SLURM: cannot read {name}={value!r}.")
            counts += [int(match.group(1))] * int(match.group(2) or 1)
        if set(counts) != {per_node}:
            raise SlurmError(
                f"SLURM: {name}={value!r} does not give every node {per_node} tasks "
                f"({num_processes} tasks over {nodes} nodes)."
            )
        break
    return per_node


def _gpus(
    env: Mapping[str, str], tasks_per_node: int, local_rank: int
) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None]:
    """(GPUs this task owns, their indices among the visible ones); (None, None) when
    CUDA_VISIBLE_DEVICES is not set (a CPU run, or every GPU JAX finds)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None or value.strip() in ("", "NoDevFiles"):
        return None, None
    visible = [v.strip() for v in value.split(",")]
    if any(not v for v in visible):
        raise SlurmError(f"SLURM: cannot read CUDA_VISIBLE_DEVICES={value!r}.")
    if tasks_per_node == 1 or len(visible) == 1:
        return tuple(visible), tuple(range(len(visible)))
    if len(visible) % tasks_per_node:
        raise SlurmError(
            f"SLURM: CUDA_VISIBLE_DEVICES={value!r} shows {len(visible)} GPUs to "
            f"{tasks_per_node} tasks per node, which cannot share them evenly; give each "
            "task one GPU (--gpus-per-task=1) or all of them to one task per node."
        )
    share = len(visible) // tasks_per_node
    ids = tuple(range(local_rank * share, (local_rank + 1) * share))
    return tuple(visible[i] for i in ids), ids


def resolve(env: Mapping[str, str]) -> SlurmTask:
    """This task's coordinates from the SLURM environment (see the module docstring)."""
    name, value = _first(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"))
    num_processes = _int(name, value, low=1)
    process_id = _int("SLURM_PROCID", env["SLURM_PROCID"].strip())
    if process_id >= num_processes:
        raise SlurmError(f"SLURM: SLURM_PROCID={process_id} is not below {name}={num_processes}.")
    list_name, nodelist = _first(
        env, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    )
    hosts = expand_hostlist(nodelist)
    nodes_name, nodes_value = _first(
        env, ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    )
    nodes = _int(nodes_name, nodes_value, low=1)
    if len(hosts) != nodes:
        raise SlurmError(
            f"SLURM: {list_name}={nodelist!r} names {len(hosts)} host(s) but {nodes_name}={nodes}."
        )
    per_node = _tasks_per_node(env, num_processes, nodes)
    local_rank = _int("SLURM_LOCALID", _first(env, ("SLURM_LOCALID",))[1])
    if local_rank >= per_node:
        raise SlurmError(
            f"SLURM: SLURM_LOCALID={local_rank} is not below the {per_node} task(s) per node."
        )
    node = _int("SLURM_NODEID", env.get("SLURM_NODEID", str(process_id // per_node)))
    if node >= nodes:
        raise SlurmError(f"SLURM: SLURM_NODEID={node} is not below {nodes_name}={nodes}.")
    if env.get("MULTIPOD_COORDINATOR_PORT", "").strip():
        port = _int("MULTIPOD_COORDINATOR_PORT", env["MULTIPOD_COORDINATOR_PORT"].strip(), 1)
    else:
        port = PORT_BASE + _int("SLURM_JOB_ID", _first(env, ("SLURM_JOB_ID",))[1]) % 2**12
    gpus, ids = _gpus(env, per_node, local_rank)
    return SlurmTask(
        f"{hosts[0]}:{port}", num_processes, process_id, node, per_node, local_rank, gpus, ids
    )
