"""FLOPs and collective wire bytes of one execution of an optimized HLO module.

`cost_analysis()` counts a while body once. Counting from the HLO text instead, with each
while body multiplied by its trip count, gives the per-step figure for scans (gradient
accumulation, layer scans). Dots and convolutions (TPU rewrites dots as convolutions) are
counted exactly; elementwise arithmetic as one FLOP per output element and reductions as
one per input element, which is close to XLA's own count.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from parallel.hlo_text import (
    COLLECTIVES,
    SHAPE,
    attr,
    chain_links,
    collective_chain,
    parse_computations,
    replica_group_size,
    shape_bytes,
    shape_dims,
    wire_bytes,
)

_ELEMENTWISE = frozenset(
    "add subtract multiply divide maximum minimum negate abs exponential exponential-minus-one "
    "log log-plus-one tanh logistic rsqrt sqrt cbrt power remainder atan2 sine cosine tan "
    "compare select clamp and or xor not floor ceil round-nearest-afz round-nearest-even "
    "sign erf".split()
)


def trip_count(instr: dict, comps: dict[str, list[dict]], defs: dict[str, dict]) -> int:
    """Iterations of a while loop: XLA's known_trip_count, else `i < N` in the condition
    with i's initial value from the loop's init tuple (0 when it cannot be read)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', instr["text"])
    if known:
        return int(known.group(1))
    cond = comps.get(attr(instr["text"], "condition") or "", [])
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
    direction = attr(root["text"], "direction")
    span = {"LT": limit - start, "LE": limit - start + 1, "NE": limit - start}.get(direction, 1)
    step = _loop_step(comps.get(attr(instr["text"], "body") or "", []), index)
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


def instr_flops(instr: dict, defs: dict[str, dict], matmul_only: bool) -> float:
    """FLOPs of one instruction (not of what it calls); `defs` names its computation's
    instructions, for operand shapes."""
    op, out = instr["op"], shape_dims(instr["type"])
    out_elems = float(np.prod(out)) if out else 1.0
    if op == "dot":
        lhs = shape_dims(defs[instr["operands"][0]]["type"]) if instr["operands"][0] in defs else []
        contracting = attr(instr["text"], "lhs_contracting_dims") or "{}"
        k = np.prod([lhs[int(d)] for d in re.findall(r"\d+", contracting)] or [1])
        return 2.0 * out_elems * float(k)
    if op == "convolution":
        lhs_def = defs.get(instr["operands"][0]) if instr["operands"] else None
        rhs_def = defs.get(instr["operands"][1]) if len(instr["operands"]) > 1 else None
        rhs = shape_dims(rhs_def["type"]) if rhs_def else []
        m = re.search(r"\bdim_labels=(\w+_\w+->\w+)", instr["text"])
        labels = m.group(1) if m else ""
        kernel = labels.split("_")[1].split("->")[0] if "_" in labels else ""
        if not rhs or "o" not in kernel:
            return 2.0 * out_elems
        lhs = shape_dims(lhs_def["type"]) if lhs_def else []
        taps = _conv_taps(instr["text"], labels, lhs, out)
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
        return float(np.prod(shape_dims(src["type"]) or [1])) if src else out_elems
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
    return _hlo_sum(hlo_text, lambda instr, defs: instr_flops(instr, defs, matmul_only), loops_once)


def hlo_wire_bytes(
    hlo_text: str, loops_once: bool = False, scale: Callable[[str], float] | None = None
) -> float:
    """Ring wire bytes per device of every collective one execution of the module runs,
    each while body times its trip count: a scanned layer stack's per-layer collectives
    and a windowed einsum's permutes run once per iteration, where `hlo_op_stats`, like
    XLA's cost analysis, sees them once. The links of a chained collective
    (`collective_chain`) share its bytes, so the chain sends them once per execution.
    `scale(instruction text)`, when given, weighs each collective's bytes
    (`parallel.ici_links`: by the torus dimensions its group spans)."""
    links = chain_links(hlo_text)

    def wire(instr: dict, defs: dict[str, dict]) -> float:
        del defs
        op = instr["op"]
        base = op[: -len("-start")] if op.endswith("-start") else op
        if base not in COLLECTIVES or op.endswith("-done"):
            return 0.0
        type_text = instr["type"]
        if op.endswith("-start") and type_text.startswith("("):
            shapes = SHAPE.findall(type_text)  # (operand, result[, context]): the result
            type_text = "{}[{}]".format(*shapes[1]) if len(shapes) > 1 else type_text
        chain = collective_chain(instr["text"])
        share = 1.0 / links[chain] if chain is not None else 1.0
        sent = wire_bytes(base, shape_bytes(type_text), replica_group_size(instr["text"]))
        return share * sent * (scale(instr["text"]) if scale is not None else 1.0)

    return _hlo_sum(hlo_text, wire, loops_once)


def _hlo_sum(hlo_text: str, value, loops_once: bool) -> float:
    """Sum of `value(instr, defs)` over one execution of the HLO module: called
    computations (fusions, calls, async starts) once per call, while bodies times their
    trip counts (once with `loops_once`), a conditional's costliest branch."""
    comps, entry = parse_computations(hlo_text)
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
                body = attr(instr["text"], "body")
                trips = 1 if loops_once else trip_count(instr, comps, defs)
                total += trips * total_of(body or "")
            elif op in ("fusion", "call") or op.endswith("-start") and "calls=" in instr["text"]:
                called = attr(instr["text"], "calls") or attr(instr["text"], "to_apply")
                total += total_of(called or "")
            elif op == "conditional":
                branch_text = attr(instr["text"], "branch_computations") or ""
                branches = re.findall(r"%([\w.\-]+)", branch_text)
                total += max((total_of(b) for b in branches), default=0.0)
            else:
                total += value(instr, defs)
        memo[name] = total
        return total

    return total_of(entry)
