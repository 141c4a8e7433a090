"""Read a compiled step: collectives and gathers from the HLO, memory and cost analysis.

Works on any compiled executable: fake CPU devices today, a TPU topology compiled on
CPU through libtpu for the planner. Byte counts come from the result shapes of each
collective in the optimized HLO (read by `parallel.hlo_text`); FLOPs and wire bytes with
each loop counted by its trip count come from `parallel.hlo_counts`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import jax
import numpy as np

from parallel.hlo_counts import hlo_flops, hlo_wire_bytes
from parallel.hlo_text import (
    COLLECTIVES,
    DTYPE_BYTES,
    INSTR,
    SHAPE,
    attr,
    parse_computations,
    repeated_link,
    replica_group_size,
    shape_bytes,
    shape_dims,
    wire_bytes,
)


def hlo_op_stats(hlo_text: str) -> dict[str, Any]:
    """Counts collective ops (with result bytes and ring wire bytes per device) and
    gather/scatter ops in HLO text. Async pairs count once (the `-start` op); `-done`
    ops are skipped. `collective_group_devices` sums, over the collective ops, the devices
    that meet in each op's group (a permute: its pair). `reduce_scatter_as_all_reduce`
    counts the reduce-scatters that the compiler rewrote as all-reduce + dynamic-slice
    (`sliced_all_reduces`); they are still counted (and on the wire) as the all-reduces
    they are. A collective the compiler split into a chain of fusions counts once
    (`collective_chain`).
    """
    counts: Counter[str] = Counter()
    chains_seen: set[tuple[str, str]] = set()
    nbytes: Counter[str] = Counter()
    wire: Counter[str] = Counter()
    group_devices = 0
    gather_scatter = 0
    for line in hlo_text.splitlines():
        m = INSTR.match(line)
        if not m:
            continue
        op = m.group("op")
        if op.endswith("-done"):
            continue
        base = op[: -len("-start")] if op.endswith("-start") else op
        if base in COLLECTIVES:
            if repeated_link(line, chains_seen):
                continue
            counts[base] += 1
            type_text = m.group("type")
            if op.endswith("-start") and type_text.startswith("("):
                # Async start results are (operand, result[, context]) tuples: count the result.
                shapes = SHAPE.findall(type_text)
                type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
            result = shape_bytes(type_text)
            nbytes[base] += result
            group = replica_group_size(line)
            wire[base] += wire_bytes(base, result, group)
            group_devices += 2 if base == "collective-permute" else group
        elif base in ("gather", "scatter"):
            gather_scatter += 1
    return {
        "collectives": {name: int(counts[name]) for name in COLLECTIVES},
        "collective_bytes": {name: int(nbytes[name]) for name in COLLECTIVES},
        "collective_wire_bytes": {name: float(wire[name]) for name in COLLECTIVES},
        "collective_group_devices": group_devices,
        "gather_scatter": gather_scatter,
        **sliced_all_reduces(hlo_text),
    }


def _slices_one_dim(full: list[int], part: list[int], group: int) -> bool:
    """Whether `part` is `full` cut along one dimension into a multiple of `group` pieces
    (more than `group` when the slice also takes a model shard of a tensor that is
    replicated over `model`, e.g. a bias laid out (model, data) by weight-update sharding).
    """
    if len(full) != len(part) or group < 2:
        return False
    cut = [i for i, (f, p) in enumerate(zip(full, part, strict=True)) if f != p]
    return len(cut) == 1 and part[cut[0]] > 0 and full[cut[0]] % (group * part[cut[0]]) == 0


def sliced_all_reduces(hlo_text: str) -> dict[str, int]:
    """All-reduced tensors that are only ever read through a 1/group dynamic-slice.

    That is a reduce-scatter written the long way, and it is how the TPU compiler
    emits most of the reduce-scatters of weight-update sharding: its
    `reduce-scatter-decomposer` pass turns a reduce-scatter into an all-reduce of the
    whole gradient, combined with the other small all-reduces into one tuple
    all-reduce, and each device's dynamic-slice of it fused into the optimizer update.
    Which ones it rewrites is the compiler's choice per op (libtpu 0.0.42, one
    `psum_scatter` of f32[N,128] compiled alone: on v3:2x2 in groups of 4 a 128 KiB shard
    stayed a reduce-scatter and an 8 KiB one did not; on v3:4x4 in groups of 8 every
    size from 8 KiB to 2 MiB stayed; in groups of 16 a 2 MiB shard was rewritten; over a
    whole slice, every size was rewritten).
    Counts each tensor of a combined all-reduce once; bytes are the slices' (the
    shards a reduce-scatter would have produced).
    """
    comps, _ = parse_computations(hlo_text)
    count, nbytes = 0, 0
    for instrs in comps.values():
        users: dict[str, list[dict]] = {}
        for instr in instrs:
            for operand in instr["operands"]:
                users.setdefault(operand, []).append(instr)
        for instr in instrs:
            if instr["op"] not in ("all-reduce", "all-reduce-start"):
                continue
            group = replica_group_size(instr["text"])
            value = instr
            if instr["op"] == "all-reduce-start":
                done = [u for u in users.get(instr["name"], []) if u["op"] == "all-reduce-done"]
                if len(done) != 1:
                    continue
                value = done[0]
            for elem, dtype, dims in _elements(value, users):
                parts = [_sliced_shape(u, elem, comps) for u in users.get(elem, [])]
                if parts and all(p is not None and _slices_one_dim(dims, p, group) for p in parts):
                    count += 1
                    nbytes += int(np.prod(parts[0])) * DTYPE_BYTES.get(dtype, 4)
    return {"reduce_scatter_as_all_reduce": count, "reduce_scatter_as_all_reduce_bytes": nbytes}


def _elements(value: dict, users: dict[str, list[dict]]) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, dims) of each tensor an all-reduce's result holds: the result
    itself, or for a tuple (combined all-reduce) the get-tuple-elements that read it."""
    shapes = SHAPE.findall(value["type"])
    if not value["type"].lstrip().startswith("("):
        dtype, dims = shapes[0] if shapes else ("f32", "")
        return [(value["name"], dtype, [int(d) for d in dims.split(",") if d])]
    out = []
    for user in users.get(value["name"], []):
        index = re.search(r"\bindex=(\d+)", user["text"])
        if user["op"] == "get-tuple-element" and index and int(index.group(1)) < len(shapes):
            dtype, dims = shapes[int(index.group(1))]
            out.append((user["name"], dtype, [int(d) for d in dims.split(",") if d]))
    return out


def _sliced_shape(user: dict, name: str, comps: dict[str, list[dict]]) -> list[int] | None:
    """The shape `user` reads of `name` when it reads only a dynamic-slice of it, else None.

    A fusion counts when every use of the matching parameter inside it is one
    dynamic-slice of the same shape (the compiler fuses the slice into the update)."""
    if user["op"] == "dynamic-slice":
        return shape_dims(user["type"]) if user["operands"][:1] == [name] else None
    if user["op"] != "fusion" or name not in user["operands"]:
        return None
    called = comps.get(attr(user["text"], "calls") or "", [])
    found: list[int] | None = None
    for position, operand in enumerate(user["operands"]):
        if operand != name:
            continue
        param = next(
            (i for i in called if i["op"] == "parameter" and f"parameter({position})" in i["text"]),
            None,
        )
        inner = [i for i in called if param is not None and param["name"] in i["operands"]]
        if not inner or any(
            i["op"] != "dynamic-slice" or i["operands"][0] != param["name"] for i in inner
        ):
            return None
        shapes = {tuple(shape_dims(i["type"])) for i in inner}
        if len(shapes) != 1 or (found is not None and list(shapes.pop()) != found):
            return None
        found = shape_dims(inner[0]["type"])
    return found


def program_gather_scatter(lowered: Any) -> int:
    """gather/scatter ops in the program as written: the lowered, pre-backend HLO.

    This is what the einsum rewrites control. A backend may add its own later: the CPU
    compiler expands a max-pool gradient (`select-and-scatter`, native on TPU) into a
    `scatter`, so counts on a CPU-compiled step would blame the model for the backend.
    """
    return int(hlo_op_stats(lowered.as_text(dialect="hlo"))["gather_scatter"])


def bytes_per_device(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded arrays / ShapeDtypeStructs (max shard)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def total_bytes(tree: Any) -> int:
    """Unsharded bytes of a tree."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def cost_analysis(compiled: Any) -> dict[str, Any]:
    """XLA's cost analysis of a compiled executable as one dict (older JAX: a list);
    on TPU it carries the compiler's step-time estimate, `optimal_seconds`."""
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    return cost or {}


def compiled_stats(compiled: Any, lowered: Any = None) -> dict[str, Any]:
    """Memory analysis, cost analysis and HLO op statistics of a compiled executable.

    FLOPs and bytes are per device (the HLO is the SPMD-partitioned program of one
    device). `flops` counts each while body times its trip count (`hlo_flops`);
    `flops_cost_analysis` is XLA's own count, which sees a loop body once. Given the
    `lowered` step too, `gather_scatter` counts the program as written
    (`program_gather_scatter`) and `gather_scatter_compiled` the backend's output, and
    `reduce_scatter_program` the reduce-scatters as written.
    """
    text = compiled.as_text()
    stats: dict[str, Any] = hlo_op_stats(text)
    stats["gather_scatter_compiled"] = stats["gather_scatter"]
    if lowered is not None:
        program = hlo_op_stats(lowered.as_text(dialect="hlo"))
        stats["gather_scatter"] = program["gather_scatter"]
        # The reduce-scatters written in the program (shard_map's psum_scatter), to set
        # beside what the compiler kept and what it rewrote as all-reduce + slice.
        stats["reduce_scatter_program"] = program["collectives"]["reduce-scatter"]
    mem = compiled.memory_analysis()
    if mem is not None:
        stats["memory"] = {
            "argument": int(mem.argument_size_in_bytes),
            "output": int(mem.output_size_in_bytes),
            "temp": int(mem.temp_size_in_bytes),
            "generated_code": int(mem.generated_code_size_in_bytes),
            "alias": int(mem.alias_size_in_bytes),
        }
        m = stats["memory"]
        # Donated outputs reuse their argument buffers (alias): count them once.
        m["total"] = m["argument"] + m["output"] - m["alias"] + m["temp"] + m["generated_code"]
    cost = cost_analysis(compiled)
    stats["flops"] = hlo_flops(text)
    stats["matmul_flops"] = hlo_flops(text, matmul_only=True)
    stats["flops_loops_once"] = hlo_flops(text, loops_once=True)
    stats["wire_bytes"] = hlo_wire_bytes(text)
    stats["flops_cost_analysis"] = float(cost.get("flops", 0.0))
    stats["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
    if "optimal_seconds" in cost:
        stats["optimal_seconds"] = float(cost["optimal_seconds"])
    return stats
