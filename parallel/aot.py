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
# One asynchronous collective that the TPU compiler (v5e) splits into a chain of fusions
# interleaved with compute: a start, continuations and a done, each holding a copy of
# the collective with the full result shape, the same channel_id and a `chain_id`.
_CHAIN = re.compile(r'chain_id=\\?"(\d+)')
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")


def collective_chain(line: str) -> tuple[str, str] | None:
    """(channel_id, chain_id) of a collective that is one link of a chain, else None.

    Every link repeats the whole collective's result shape, but the links together move
    the data once: counters count a chain once, not once per link.
    """
    chain = _CHAIN.search(line)
    if chain is None:
        return None
    channel = _CHANNEL.search(line)
    return (channel.group(1) if channel else "", chain.group(1))


def repeated_link(line: str, seen: set[tuple[str, str]]) -> bool:
    """True for a link of a chained collective whose chain was already counted; the
    first link of each chain is added to `seen` (a line-by-line counter's memory)."""
    chain = collective_chain(line)
    if chain is None:
        return False
    if chain in seen:
        return True
    seen.add(chain)
    return False


def chain_links(hlo_text: str) -> Counter[tuple[str, str]]:
    """How many links each chained collective of the module has (`collective_chain`)."""
    links: Counter[tuple[str, str]] = Counter()
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if m and m.group("op").removesuffix("-start") in COLLECTIVES:
            key = collective_chain(line)
            if key is not None:
                links[key] += 1
    return links


def _shape_bytes(type_text: str) -> int:
    total = 0
    for dtype, dims in _SHAPE.findall(type_text):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        total += n * _BYTES.get(dtype, 4)
    return total


def replica_group_size(instr_text: str) -> int:
    """Devices in each replica group of a collective (1 when the text names none).

    Reads the three forms XLA prints: explicit `{{0,4},{1,5}}`, iota `[G,S]<=[N]` and
    mesh `mesh['axis_0'=8,'axis_1'=4] {'axis_0'}` (the product of the named axes; also
    with a `device_ids=(...)` order between the two).
    """
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", instr_text)
    if m:
        return len([d for d in m.group(1).split(",") if d])
    m = re.search(r"replica_groups=\[\d+,(\d+)\]", instr_text)
    if m:
        return int(m.group(1))
    # The mesh form may carry a device order first: `mesh[...], device_ids=([4,2]T(1,0)) {...}`.
    m = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\S+)?\s*\{([^}]*)\}", instr_text
    )
    if m:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", m.group(1)))
        return int(np.prod([int(sizes.get(a, 1)) for a in re.findall(r"'([^']+)'", m.group(2))]))
    return 1


def wire_bytes(op: str, result_bytes: int, group: int) -> float:
    """Bytes one device sends for a collective with a ring algorithm over `group` devices.

    all-reduce 2(g-1)/g x size; all-gather (g-1)/g x result; reduce-scatter (g-1) x
    result (the result is one shard); all-to-all (g-1)/g x size; permute: its size.
    """
    g = max(group, 1)
    if op == "all-reduce":
        return 2.0 * (g - 1) / g * result_bytes
    if op in ("all-gather", "all-to-all"):
        return (g - 1) / g * result_bytes
    if op == "reduce-scatter":
        return float((g - 1) * result_bytes)
    return float(result_bytes)


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
        m = _INSTR.match(line)
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
                shapes = _SHAPE.findall(type_text)
                type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
            result = _shape_bytes(type_text)
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
    comps, _ = _parse_computations(hlo_text)
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
                    nbytes += int(np.prod(parts[0])) * _BYTES.get(dtype, 4)
    return {"reduce_scatter_as_all_reduce": count, "reduce_scatter_as_all_reduce_bytes": nbytes}


def _elements(value: dict, users: dict[str, list[dict]]) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, dims) of each tensor an all-reduce's result holds: the result
    itself, or for a tuple (combined all-reduce) the get-tuple-elements that read it."""
    shapes = _SHAPE.findall(value["type"])
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
        return _dims(user["type"]) if user["operands"][:1] == [name] else None
    if user["op"] != "fusion" or name not in user["operands"]:
        return None
    called = comps.get(_attr(user["text"], "calls") or "", [])
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
        shapes = {tuple(_dims(i["type"])) for i in inner}
        if len(shapes) != 1 or (found is not None and list(shapes.pop()) != found):
            return None
        found = _dims(inner[0]["type"])
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


# ---- FLOPs with loops ----------------------------------------------------------------
# `cost_analysis()` counts a while body once. Counting FLOPs from the HLO text instead,
# with each while body multiplied by its trip count, gives the per-step figure for
# scans (gradient accumulation, layer scans). Dots and convolutions (TPU rewrites dots
# as convolutions) are counted exactly; elementwise arithmetic as one FLOP per output
# element and reductions as one per input element, which is close to XLA's own count.
_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\{\s*$")
_ELEMENTWISE = frozenset(
    "add subtract multiply divide maximum minimum negate abs exponential exponential-minus-one "
    "log log-plus-one tanh logistic rsqrt sqrt cbrt power remainder atan2 sine cosine tan "
    "compare select clamp and or xor not floor ceil round-nearest-afz round-nearest-even "
    "sign erf".split()
)


def _dims(type_text: str) -> list[int]:
    """Dimensions of the first array shape in a type (a tuple's first element)."""
    m = _SHAPE.search(type_text)
    if not m or not m.group(2):
        return []
    return [int(d) for d in m.group(2).split(",") if d]


def _operands(rest: str) -> list[str]:
    """Operand names of `opcode(%a, %b), attrs`, from the text after the opcode's '('."""
    depth = 1
    for pos, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return re.findall(r"%([\w.\-]+)", rest[:pos])
    return re.findall(r"%([\w.\-]+)", rest)


def _attr(text: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=(%?[\w.\-]+|\{{[^}}]*\}})", text)
    return m.group(1).lstrip("%") if m else None


def _parse_computations(hlo_text: str) -> tuple[dict[str, list[dict]], str | None]:
    """name -> instructions (name, op, dims, operands, text), and the entry's name."""
    comps: dict[str, list[dict]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        header = _COMP_HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group("name")
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
            continue
        m = _INSTR.match(line)
        if current is None or not m:
            continue
        name = line.split("=", 1)[0].strip().removeprefix("ROOT").strip().lstrip("%")
        comps[current].append(
            {
                "name": name,
                "op": m.group("op"),
                "type": m.group("type"),
                "operands": _operands(line[m.end() :]),
                "text": line,
                "root": line.lstrip().startswith("ROOT"),
            }
        )
    return comps, entry


def _trip_count(instr: dict, comps: dict[str, list[dict]], defs: dict[str, dict]) -> int:
    """Iterations of a while loop: XLA's known_trip_count, else `i < N` in the condition
    with i's initial value from the loop's init tuple (0 when it cannot be read)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', instr["text"])
    if known:
        return int(known.group(1))
    cond = comps.get(_attr(instr["text"], "condition") or "", [])
    cdefs = {i["name"]: i for i in cond}
    root = next((i for i in cond if i["root"]), None)
    if root is None or root["op"] != "compare" or len(root["operands"]) != 2:
        return 1
    lhs, rhs = (cdefs.get(n) for n in root["operands"])
    if lhs is None or rhs is None or rhs["op"] != "constant":
        return 1
    limit = int(re.search(r"constant\((-?\d+)\)", rhs["text"]).group(1))
    index = re.search(r"index=(\d+)", lhs["text"]) if lhs["op"] == "get-tuple-element" else None
    start = 0
    init = defs.get(instr["operands"][0]) if instr["operands"] else None
    if index and init is not None and init["op"] == "tuple":
        first = defs.get(init["operands"][int(index.group(1))])
        if first is not None and first["op"] == "constant":
            start = int(re.search(r"constant\((-?\d+)\)", first["text"]).group(1))
    direction = _attr(root["text"], "direction")
    span = {"LT": limit - start, "LE": limit - start + 1, "NE": limit - start}.get(direction, 1)
    step = _loop_step(comps.get(_attr(instr["text"], "body") or "", []), index)
    return max(-(-span // step), 0)


def _loop_step(body: list[dict], index: re.Match | None) -> int:
    """How much a while body adds to its induction variable (tuple element `index`) per
    iteration: the constant of `add(i, c)` feeding that element of the body's root
    tuple, else 1. XLA's bidirectional windowed einsums (collective matmuls) step by 2."""
    root = next((i for i in body if i["root"]), None)
    if index is None or root is None or root["op"] != "tuple":
        return 1
    k = int(index.group(1))
    if k >= len(root["operands"]):
        return 1
    defs = {i["name"]: i for i in body}
    update = defs.get(root["operands"][k])
    if update is None or update["op"] != "add":
        return 1
    for name in update["operands"]:
        const = defs.get(name)
        if const is not None and const["op"] == "constant":
            value = re.search(r"constant\((-?\d+)\)", const["text"])
            if value and int(value.group(1)) > 0:
                return int(value.group(1))
    return 1


def _instr_flops(instr: dict, defs: dict[str, dict], matmul_only: bool) -> float:
    op, out = instr["op"], _dims(instr["type"])
    out_elems = float(np.prod(out)) if out else 1.0
    if op == "dot":
        lhs = _dims(defs[instr["operands"][0]]["type"]) if instr["operands"][0] in defs else []
        contracting = _attr(instr["text"], "lhs_contracting_dims") or "{}"
        k = np.prod([lhs[int(d)] for d in re.findall(r"\d+", contracting)] or [1])
        return 2.0 * out_elems * float(k)
    if op == "convolution":
        lhs_def = defs.get(instr["operands"][0]) if instr["operands"] else None
        rhs_def = defs.get(instr["operands"][1]) if len(instr["operands"]) > 1 else None
        rhs = _dims(rhs_def["type"]) if rhs_def else []
        m = re.search(r"\bdim_labels=(\w+_\w+->\w+)", instr["text"])
        labels = m.group(1) if m else ""
        kernel = labels.split("_")[1].split("->")[0] if "_" in labels else ""
        if not rhs or "o" not in kernel:
            return 2.0 * out_elems
        taps = _conv_taps(instr["text"], labels, _dims(lhs_def["type"]) if lhs_def else [], out)
        if taps is not None:
            # Output batch x features x the kernel's input features x the (output
            # position, window tap) pairs that read a real input element.
            o_labels = labels.split("->")[1]
            rows = out[o_labels.index("b")] * out[o_labels.index("f")]
            return 2.0 * rows * rhs[kernel.index("i")] * taps
        # Each output element sums over the kernel's input features x window.
        return 2.0 * out_elems * float(np.prod(rhs)) / rhs[kernel.index("o")]
    if matmul_only:
        return 0.0
    if op in _ELEMENTWISE:
        return out_elems
    if op in ("reduce", "reduce-window"):
        src = defs.get(instr["operands"][0]) if instr["operands"] else None
        return float(np.prod(_dims(src["type"]) or [1])) if src else out_elems
    return 0.0


def _window_field(window: str, key: str, count: int, default: int) -> list[int]:
    m = re.search(rf"\b{key}=([\d\-_x]+)", window)
    if not m:
        return [default] * count
    return [int(v) for v in m.group(1).split("x")]


def _conv_taps(text: str, labels: str, lhs: list[int], out: list[int]) -> float | None:
    """(output position, window tap) pairs of a convolution that land on a real input
    element, multiplied over the spatial dimensions: the taps that fall on padding or
    between base-dilated (`lhs_dilate`) elements read zeros and cost nothing.

    Matters on TPU: the compiler rewrites batched dots as convolutions whose batch
    dimensions become windows over a base-dilated input, e.g. `size=2x512x1
    stride=1x511x1 lhs_dilate=2x512x1`, where 1 of every 512 taps is real. Counting all
    taps overstated a Mask R-CNN step 11-78x. XLA's cost analysis counts the same way.
    None when the text cannot be read (the caller then counts every tap).
    """
    m = re.search(r"window=\{([^}]*)\}", text)
    parts = re.match(r"(\w+)_(\w+)->(\w+)$", labels)
    if not parts:
        return None
    lhs_l, _, out_l = parts.groups()
    spatial = sorted(c for c in out_l if c.isdigit())
    if not m:
        if not spatial:
            return 1.0
        return None
    window = m.group(1)
    n = len(spatial)
    size = _window_field(window, "size", n, 1)
    stride = _window_field(window, "stride", n, 1)
    base = _window_field(window, "lhs_dilate", n, 1)
    dil = _window_field(window, "rhs_dilate", n, 1)
    pad_m = re.search(r"\bpad=([\d\-_x]+)", window)
    pads = [p.split("_") for p in pad_m.group(1).split("x")] if pad_m else [["0", "0"]] * n
    if not lhs or any(len(f) != n for f in (size, stride, base, dil, pads)):
        return None
    taps = 1.0
    for d, label in enumerate(spatial):
        size_in, size_out = lhs[lhs_l.index(label)], out[out_l.index(label)]
        o = np.arange(size_out)[:, None]
        k = np.arange(size[d])[None, :]
        q = o * stride[d] + k * dil[d] - int(pads[d][0])  # position in the dilated input
        real = (q >= 0) & (q % base[d] == 0) & (q // base[d] < size_in)
        taps *= float(np.count_nonzero(real))
    return taps


def hlo_flops(hlo_text: str, matmul_only: bool = False, loops_once: bool = False) -> float:
    """FLOPs of one execution of the HLO module, each while body times its trip count
    (only dots and convolutions with `matmul_only`; each body once with `loops_once`,
    as XLA's cost analysis and step-time estimate see it)."""
    return _hlo_sum(
        hlo_text, lambda instr, defs: _instr_flops(instr, defs, matmul_only), loops_once
    )


def hlo_wire_bytes(hlo_text: str, loops_once: bool = False) -> float:
    """Ring wire bytes per device of every collective one execution of the module runs,
    each while body times its trip count: a scanned layer stack's per-layer collectives
    and a windowed einsum's permutes run once per iteration, where `hlo_op_stats`, like
    XLA's cost analysis, sees them once. The links of a chained collective
    (`collective_chain`) share its bytes, so the chain sends them once per execution."""
    links = chain_links(hlo_text)

    def wire(instr: dict, defs: dict[str, dict]) -> float:
        del defs
        op = instr["op"]
        base = op[: -len("-start")] if op.endswith("-start") else op
        if base not in COLLECTIVES or op.endswith("-done"):
            return 0.0
        type_text = instr["type"]
        if op.endswith("-start") and type_text.startswith("("):
            shapes = _SHAPE.findall(type_text)  # (operand, result[, context]): the result
            type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
        chain = collective_chain(instr["text"])
        share = 1.0 / links[chain] if chain is not None else 1.0
        sent = wire_bytes(base, _shape_bytes(type_text), replica_group_size(instr["text"]))
        return share * sent

    return _hlo_sum(hlo_text, wire, loops_once)


def _hlo_sum(hlo_text: str, value, loops_once: bool) -> float:
    """Sum of `value(instr, defs)` over one execution of the HLO module: called
    computations (fusions, calls, async starts) once per call, while bodies times their
    trip counts (once with `loops_once`), a conditional's costliest branch."""
    comps, entry = _parse_computations(hlo_text)
    if entry is None:
        return 0.0
    memo: dict[str, float] = {}

    def total_of(name: str) -> float:
        if name in memo:
            return memo[name]
        memo[name] = 0.0  # guards against (impossible) recursion
        instrs = comps.get(name, [])
        defs = {i["name"]: i for i in instrs}
        total = 0.0
        for instr in instrs:
            op = instr["op"]
            if op == "while":
                body = _attr(instr["text"], "body")
                trips = 1 if loops_once else _trip_count(instr, comps, defs)
                total += trips * total_of(body or "")
            elif op in ("fusion", "call") or op.endswith("-start") and "calls=" in instr["text"]:
                called = _attr(instr["text"], "calls") or _attr(instr["text"], "to_apply")
                total += total_of(called or "")
            elif op == "conditional":
                branch_text = _attr(instr["text"], "branch_computations") or ""
                branches = re.findall(r"%([\w.\-]+)", branch_text)
                total += max((total_of(b) for b in branches), default=0.0)
            else:
                total += value(instr, defs)
        memo[name] = total
        return total

    return total_of(entry)
