"""Read optimized HLO text: instructions, shapes and their bytes, computations and their
attributes, collectives (replica groups, chained links) and the ring model's wire bytes.

The parsing that `parallel.aot` (op counts), `parallel.hlo_counts` (per-execution FLOPs and
wire bytes), `parallel.hlo_profile` and `parallel.dcn` share.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
DTYPE_BYTES = {
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
INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<type>.+?)\s+(?P<op>[a-z][\w\-]*)\(")
SHAPE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\]")
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
        m = INSTR.match(line)
        if m and m.group("op").removesuffix("-start") in COLLECTIVES:
            key = collective_chain(line)
            if key is not None:
                links[key] += 1
    return links


def shape_bytes(type_text: str) -> int:
    """Bytes of every array shape in a type (a tuple's elements summed)."""
    total = 0
    for dtype, dims in SHAPE.findall(type_text):
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        total += n * DTYPE_BYTES.get(dtype, 4)
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


_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(.*\{\s*$")


def shape_dims(type_text: str) -> list[int]:
    """Dimensions of the first array shape in a type (a tuple's first element)."""
    m = SHAPE.search(type_text)
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


def attr(text: str, key: str) -> str | None:
    """The value of attribute `key=` in an instruction's text (a leading % dropped)."""
    m = re.search(rf"\b{key}=(%?[\w.\-]+|\{{[^}}]*\}})", text)
    return m.group(1).lstrip("%") if m else None


def parse_computations(hlo_text: str) -> tuple[dict[str, list[dict]], str | None]:
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
        m = INSTR.match(line)
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
