"""Where a compiled step's time goes: its top-level ops ranked by the compiler's cost.

    rows = op_profile(compiled.as_text(), clock_hz=940e6, link_bandwidth=82e9)
    print(profile_table(summarize(rows, top=25)))

Reads the optimized HLO of one device (the SPMD program). Each op of the entry
computation and of every while body (counted times its trip count) becomes one row:

- `cycles`: the TPU compiler's own per-op estimate (`estimated_cycles` in the op's
  backend_config; libtpu writes it for fusions, copies and other kernels, not for
  collectives), converted to seconds with the chip's clock;
- `flops` (dots and convolutions exactly, elementwise ops one per element, as
  `parallel.hlo_counts.hlo_flops`) and `bytes` (operands read plus result written);
- collectives get the ring model's time instead: wire bytes (`parallel.hlo_text.wire_bytes`)
  over the links' bandwidth, since the compiler writes no cycle count for them;
- `kind`: matmul (a fusion holding a dot or convolution), collective, copy/transpose,
  elementwise (other fusions and ops), rng (random bits alone), control (while, call);
  `random_bits` marks a kernel that generates random bits inside (threefry arithmetic or
  an RngBitGenerator fused into, say, the matmul that reads a dropout mask).

The sum of the rows is not the compiler's step estimate (`optimal_seconds`): the
compiler overlaps asynchronous collectives with compute and its per-op cycle counts are
an upper bound per kernel. The ranking is what it is for: the ops to look at first.
Without per-op cycles (CPU) the rows rank by a roofline of FLOPs and bytes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from parallel.hlo_counts import instr_flops, trip_count
from parallel.hlo_text import (
    COLLECTIVES,
    attr,
    parse_computations,
    replica_group_size,
    shape_bytes,
    wire_bytes,
)

_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")
_SKIP = frozenset(
    "parameter get-tuple-element tuple constant bitcast after-all partition-id replica-id "
    "opt-barrier".split()
)
_COPY = frozenset("copy transpose copy-start".split())
_THREEFRY = "(threefry)"
# jax.random's functions as they appear in op names (threefry itself is inlined).
_RANDOM = re.compile(r'op_name="[^"]*(?:threefry|random_bits|_uniform|_bernoulli)')
KINDS = ("matmul", "elementwise", "collective", "copy/transpose", "rng", "control")


def _base_op(op: str) -> str:
    return op[: -len("-start")] if op.endswith("-start") else op


def _called_ops(name: str, comps: dict[str, list[dict]], seen: set[str] | None = None) -> set:
    """Opcodes inside a called computation and the computations it calls."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    ops = set()
    for instr in comps.get(name, []):
        ops.add(instr["op"])
        if _RANDOM.search(instr["text"]):
            ops.add(_THREEFRY)  # the random-bits arithmetic of jax.random's default keys
        called = attr(instr["text"], "calls") or attr(instr["text"], "to_apply")
        if called and instr["op"] in ("fusion", "call"):
            ops |= _called_ops(called, comps, seen)
    return ops


def _kind(instr: dict, inner: set[str]) -> str:
    op = instr["op"]
    source = (_OP_NAME.search(instr["text"]) or [None, ""])[1]
    if _base_op(op) in COLLECTIVES or op.endswith("-done") and _base_op(op[:-5]) in COLLECTIVES:
        return "collective"
    if op in ("dot", "convolution") or inner & {"dot", "convolution"}:
        return "matmul"
    if op == "rng-bit-generator" or _RANDOM.search(f'op_name="{source}"'):
        return "rng"
    if op in _COPY or (op == "fusion" and inner and inner <= _COPY | {"parameter", "bitcast"}):
        return "copy/transpose"
    if op in ("while", "conditional", "call", "custom-call"):
        return "control"
    return "elementwise"


def _flops(name: str, comps: dict[str, list[dict]], memo: dict[str, float]) -> float:
    if name not in memo:
        memo[name] = 0.0
        instrs = comps.get(name, [])
        defs = {i["name"]: i for i in instrs}
        total = 0.0
        for instr in instrs:
            called = attr(instr["text"], "calls")
            if instr["op"] == "fusion" and called:
                total += _flops(called, comps, memo)
            else:
                total += instr_flops(instr, defs, matmul_only=False)
        memo[name] = total
    return memo[name]


def op_profile(
    hlo_text: str,
    clock_hz: float | None = None,
    link_bandwidth: float | None = None,
    peak_flops: float | None = None,
    hbm_bandwidth: float | None = None,
) -> list[dict[str, Any]]:
    """One row per top-level op (entry and while bodies, times their trip counts),
    heaviest first by `seconds`: the compiler's cycles at `clock_hz` where it wrote
    them, the ring model over `link_bandwidth` (bytes/s a device sends) for collectives,
    else the roofline max(flops / peak_flops, bytes / hbm_bandwidth) when both are given.
    """
    comps, entry = parse_computations(hlo_text)
    if entry is None:
        return []
    memo: dict[str, float] = {}
    rows: list[dict[str, Any]] = []

    def walk(comp: str, trips: int, loop: str) -> None:
        defs = {i["name"]: i for i in comps.get(comp, [])}
        for instr in comps.get(comp, []):
            op = instr["op"]
            if op in _SKIP or op.endswith("-done"):
                continue
            if op == "while":
                body = attr(instr["text"], "body") or ""
                walk(body, trips * trip_count(instr, comps, defs), instr["name"])
                continue
            called = attr(instr["text"], "calls") or ""
            inner = _called_ops(called, comps) if called else set()
            flops = _flops(called, comps, memo) if op == "fusion" else 0.0
            if op != "fusion":
                flops = instr_flops(instr, defs, matmul_only=False)
            operand_bytes = sum(
                shape_bytes(defs[o]["type"]) for o in instr["operands"] if o in defs
            )
            result = instr["type"]
            if op.endswith("-start") and result.startswith("("):
                # async start: (operand, result[, context]); the result is the second shape
                shapes = re.findall(r"\b(?:pred|[sufc]\d+|bf16)\[[\d,]*\]", result)
                result = shapes[1] if len(shapes) > 1 else result
            out_bytes = shape_bytes(result)
            cycles = _CYCLES.search(instr["text"])
            kind = _kind(instr, inner)
            row: dict[str, Any] = {
                "name": instr["name"],
                "op": op,
                "kind": kind,
                "fusion_kind": (_FUSION_KIND.search(instr["text"]) or [None, None])[1],
                "shape": result.split("{")[0] if not result.startswith("(") else "(tuple)",
                "count": trips,
                "loop": loop,
                "flops": flops * trips,
                "bytes": float(operand_bytes + out_bytes) * trips,
                "cycles": int(cycles.group(1)) * trips if cycles else None,
                "source": (_OP_NAME.search(instr["text"]) or [None, ""])[1],
                # Random bits generated inside this kernel (a dropout mask fused into the
                # op that reads it): the op's time includes making them.
                "random_bits": bool(inner & {_THREEFRY, "rng-bit-generator"}),
            }
            seconds, method = None, None
            if cycles and clock_hz:
                seconds, method = row["cycles"] / clock_hz, "compiler cycles"
            elif kind == "collective" and link_bandwidth:
                base = _base_op(op)
                wire = wire_bytes(base, out_bytes, replica_group_size(instr["text"]))
                row["wire_bytes"] = wire * trips
                seconds, method = row["wire_bytes"] / link_bandwidth, "ring model"
            elif peak_flops and hbm_bandwidth:
                seconds = max(row["flops"] / peak_flops, row["bytes"] / hbm_bandwidth)
                method = "roofline"
            row["seconds"], row["method"] = seconds, method
            # The roofline of the op alone, also where the compiler wrote cycles: the
            # compiler's step estimate (`optimal_seconds`) is close to the sum of these
            # over the non-collective ops, not to the sum of its per-op cycles.
            row["roofline_s"] = None
            if peak_flops and hbm_bandwidth and kind != "collective":
                row["roofline_s"] = max(row["flops"] / peak_flops, row["bytes"] / hbm_bandwidth)
            rows.append(row)

    walk(entry, 1, "")
    rows.sort(key=lambda r: (r["seconds"] or 0.0, r["flops"], r["bytes"]), reverse=True)
    return rows


def by_kind(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Totals per kind: ops, seconds, roofline seconds, flops, bytes."""
    out: dict[str, dict[str, float]] = defaultdict(
        lambda: {"ops": 0, "seconds": 0.0, "roofline_s": 0.0, "flops": 0.0, "bytes": 0.0}
    )
    for r in rows:
        k = out[r["kind"]]
        k["ops"] += r["count"]
        k["seconds"] += r["seconds"] or 0.0
        k["roofline_s"] += r.get("roofline_s") or 0.0
        k["flops"] += r["flops"]
        k["bytes"] += r["bytes"]
    return {kind: dict(out[kind]) for kind in KINDS if kind in out}


def random_bits_share(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds and ops of the kernels that generate random bits (fused or alone)."""
    hit = [r for r in rows if r["random_bits"] or r["kind"] == "rng"]
    return {"ops": sum(r["count"] for r in hit), "seconds": sum(r["seconds"] or 0.0 for r in hit)}


def by_source(rows: list[dict[str, Any]], depth: int = 0) -> dict[str, float]:
    """Seconds per source op name (the JAX primitive path in the op's metadata), with
    `depth` > 0 keeping only the last `depth` path components: which line of the model
    the time belongs to."""
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        source = r["source"] or f"({r['op']})"
        if depth:
            source = "/".join(source.split("/")[-depth:])
        out[source] += r["seconds"] or 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def summarize(rows: list[dict[str, Any]], top: int = 25) -> dict[str, Any]:
    """What a report keeps of a profile: totals per kind, the sum of the rows, the
    `top` heaviest ops and the `top` heaviest source lines (2 path components)."""
    keep = ("kind", "op", "shape", "count", "seconds", "method", "flops", "bytes", "source")
    keep += ("random_bits", "roofline_s")
    return {
        "by_kind": by_kind(rows),
        "sum_s": sum(r["seconds"] or 0.0 for r in rows),
        "roofline_sum_s": sum(r.get("roofline_s") or 0.0 for r in rows),
        "ops": len(rows),
        "random_bits": random_bits_share(rows),
        "top": [{k: r[k] for k in keep} for r in rows[:top]],
        "by_source": dict(list(by_source(rows, depth=2).items())[:top]),
    }


def profile_table(summary: dict[str, Any]) -> str:
    """A `summarize` result as aligned text: totals per kind, then the heaviest ops."""
    total = summary["sum_s"] or 1.0
    head = f"{'kind':<16}{'ops':>7}{'ms':>10}{'share':>8}{'roofline ms':>13}{'GFLOP':>10}{'GB':>9}"
    lines = [head]
    for kind, t in summary["by_kind"].items():
        lines.append(
            f"{kind:<16}{t['ops']:>7}{t['seconds'] * 1e3:>10.3f}{t['seconds'] / total:>8.1%}"
            f"{t['roofline_s'] * 1e3:>13.3f}{t['flops'] / 1e9:>10.2f}{t['bytes'] / 1e9:>9.3f}"
        )
    lines.append(
        f"{'sum of ops':<16}{'':>7}{summary['sum_s'] * 1e3:>10.3f}{'':>8}"
        f"{summary['roofline_sum_s'] * 1e3:>13.3f}"
    )
    rb = summary["random_bits"]
    lines.append(
        f"{'random bits in':<16}{rb['ops']:>7}{rb['seconds'] * 1e3:>10.3f}"
        f"{rb['seconds'] / total:>8.1%}  (ops that generate random bits, e.g. a fused dropout mask)"
    )
    lines.append("")
    lines.append(f"{'ms':>8} {'x':>3} {'kind':<14} {'shape':<28} {'GFLOP':>8} {'MB':>8}  source")
    for r in summary["top"]:
        ms = (r["seconds"] or 0.0) * 1e3
        source = "/".join((r["source"] or r["op"]).split("/")[-3:])
        lines.append(
            f"{ms:>8.3f} {r['count']:>3} {r['kind']:<14} {r['shape'][:28]:<28} "
            f"{r['flops'] / 1e9:>8.2f} {r['bytes'] / 1e6:>8.1f}  {source[:70]}"
            + (" [random bits]" if r["random_bits"] else "")
        )
    lines.append("")
    lines.append(f"{'ms':>8}  source (the model's line, last 2 path components)")
    for source, seconds in summary["by_source"].items():
        lines.append(f"{seconds * 1e3:>8.3f}  {source[:100]}")
    return "\n".join(lines)
