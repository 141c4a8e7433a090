"""Read a compiled step: collectives and gathers from the HLO, memory and cost analysis.

Works on any compiled executable: fake CPU devices today, a TPU topology compiled on
CPU through libtpu for the planner. Byte counts come from the result shapes of each
collective in the optimized HLO.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import jax
import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
# `%name = <result type> <opcode>(` in HLO text; the opcode may carry -start (async).
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s+(?P<op>[a-z][\w\-]*)\(")
_SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\]")


def _shape_bytes(type_text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(type_text):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        total += n * _BYTES.get(dtype, 4)
    return total


def hlo_op_stats(hlo_text: str) -> dict[str, Any]:
    """Counts collective ops (with result bytes) and gather/scatter ops in HLO text.

    Async pairs count once (the `-start` op); `-done` ops are skipped.
    """
    counts: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    gather_scatter = 0
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        op = m.group("op")
        if op.endswith("-done"):
            continue
        base = op[: -len("-start")] if op.endswith("-start") else op
        if base in COLLECTIVES:
            counts[base] += 1
            type_text = m.group("type")
            if op.endswith("-start") and type_text.startswith("("):
                # Async start results are (operand, result[, context]) tuples: count the result.
                shapes = _SHAPE.findall(type_text)
                type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
            nbytes[base] += _shape_bytes(type_text)
        elif base in ("gather", "scatter"):
            gather_scatter += 1
    return {
        "collectives": {name: int(counts[name]) for name in COLLECTIVES},
        "collective_bytes": {name: int(nbytes[name]) for name in COLLECTIVES},
        "gather_scatter": gather_scatter,
    }


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


def compiled_stats(compiled: Any) -> dict[str, Any]:
    """Memory analysis, cost analysis and HLO op statistics of a compiled executable."""
    stats: dict[str, Any] = hlo_op_stats(compiled.as_text())
    mem = compiled.memory_analysis()
    if mem is not None:
        stats["memory"] = {
            "argument": int(mem.argument_size_in_bytes),
            "output": int(mem.output_size_in_bytes),
            "temp": int(mem.temp_size_in_bytes),
            "generated_code": int(mem.generated_code_size_in_bytes),
            "alias": int(mem.alias_size_in_bytes),
        }
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    cost = cost or {}
    # cost_analysis counts a scan/while body once (not times its trip count).
    stats["flops"] = float(cost.get("flops", 0.0))
    stats["bytes_accessed"] = float(cost.get("bytes accessed", 0.0))
    if "optimal_seconds" in cost:
        stats["optimal_seconds"] = float(cost["optimal_seconds"])
    return stats
