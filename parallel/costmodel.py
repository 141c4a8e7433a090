"""Alpha-beta cost model of the collectives in `parallel/collectives.py` (plain Python).

A message costs `alpha + bytes * beta` seconds on one link (alpha: per-message latency,
beta: seconds per byte). Links are full duplex and a device can drive both of its
chain/ring neighbours at once. Reduction arithmetic (the "gamma" term) is left out: it
is the same sum for every algorithm, so it does not change which one is cheapest.
P devices, n message bytes, k chunks:

| algorithm                | broadcast / reduce           | all-reduce                    |
|--------------------------|------------------------------|-------------------------------|
| linear_pipeline          | (P + k - 2)(alpha + n/k beta) | (2P + k - 3)(alpha + n/k beta) |
| ring                     | 2(P - 1)(alpha + n/P beta)    | 2(P - 1)(alpha + n/P beta)     |
| tree (binomial)          | L(alpha + n beta)             | 2L(alpha + n beta)             |
| bidirectional_exchange   | 2 log2(P) alpha + 2(P-1)/P n beta (all three)                |

with L = ceil(log2 P). These are the forms of Wang et al., "Efficient communications
in training large scale neural networks" (docs/design.md, References): a linear pipeline
streams k chunks down a chain, so after a fill of P - 2 steps one chunk arrives per
step and the total approaches n*beta whatever P is; a minimum-spanning (binomial) tree
sends the whole message log P times; bidirectional exchange (recursive halving
reduce-scatter / recursive doubling all-gather, also used to build broadcast as scatter
+ all-gather and reduce as reduce-scatter + gather) moves about 2n bytes, twice LP's n.

LP all-reduce here overlaps the two halves: the chain's last device starts sending each
reduced chunk back up the chain while later chunks are still being reduced, so the
reduce (P + k - 2 steps) and the broadcast overlap and take 2P + k - 3 steps in all,
instead of the 2(P + k - 2) of reduce-then-broadcast; this is what keeps LP's large
message all-reduce near n*beta, up to 2x better than ring and bidirectional exchange.

Ring and bidirectional exchange serve reduce and broadcast with their all-reduce (a
broadcast is an all-reduce of the root's data and zeros); the alpha-beta cost of that
equals scatter + all-gather (reduce-scatter + gather), so the formulas are exact for
what the code does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("linear_pipeline", "ring", "tree", "bidirectional_exchange")
OPS = ("broadcast", "reduce", "all_reduce")

# Rough defaults (order of magnitude for an accelerator interconnect hop) used only to
# pick a chunk count when a caller gives none.
DEFAULT_ALPHA = 1e-5  # seconds per message
DEFAULT_BETA = 1.0 / 50e9  # seconds per byte (50 GB/s)


def _check(op: str, algorithm: str, P: int, n_bytes: float) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective op {op!r}; valid ops: {', '.join(OPS)}")
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"unknown algorithm {algorithm!r}; valid algorithms: {', '.join(ALGORITHMS)}"
        )
    if P < 1:
        raise ValueError(f"P={P} devices; need P >= 1")
    if n_bytes < 0:
        raise ValueError(f"n_bytes={n_bytes} is negative")


def _is_power_of_two(P: int) -> bool:
    return P >= 1 and P & (P - 1) == 0


def lp_fill_steps(op: str, P: int) -> int:
    """Pipeline steps beyond k for linear pipelining: total steps = fill + k."""
    return 2 * P - 3 if op == "all_reduce" else P - 2


def collective_time(
    op: str,
    algorithm: str,
    P: int,
    n_bytes: float,
    alpha: float,
    beta: float,
    num_chunks: int | None = None,
) -> float:
    """Seconds for `op` with `algorithm` on P devices; see the module docstring's table.

    `num_chunks` is used by linear_pipeline only; None picks the best (`lp_chunks`).
    """
    _check(op, algorithm, P, n_bytes)
    if P == 1 or n_bytes == 0:
        return 0.0
    n = float(n_bytes)
    if algorithm == "linear_pipeline":
        k = lp_chunks(op, P, n_bytes, alpha, beta) if num_chunks is None else num_chunks
        if k < 1:
            raise ValueError(f"num_chunks={k}; need at least 1")
        return (lp_fill_steps(op, P) + k) * (alpha + n / k * beta)
    if algorithm == "ring":
        return 2 * (P - 1) * (alpha + n / P * beta)
    if algorithm == "tree":
        rounds = math.ceil(math.log2(P))
        factor = 2 if op == "all_reduce" else 1
        return factor * rounds * (alpha + n * beta)
    if not _is_power_of_two(P):
        raise ValueError(f"bidirectional_exchange needs a power-of-two P; got P={P}")
    return 2 * math.log2(P) * alpha + 2 * (P - 1) / P * n * beta


def lp_chunks(
    op: str,
    P: int,
    n_bytes: float,
    alpha: float,
    beta: float,
    max_chunks: int | None = None,
) -> int:
    """The chunk count k minimising linear-pipeline time (fill + k)(alpha + n/k beta).

    d/dk [(m + k)(alpha + n beta / k)] = alpha - m n beta / k^2 = 0 gives
    k* = sqrt(m n beta / alpha), m the fill steps (P - 2, or 2P - 3 for all-reduce); the
    integer neighbours of k* are compared, clamped to [1, max_chunks] (default: n bytes).
    """
    _check(op, "linear_pipeline", P, n_bytes)
    upper = max(1, int(n_bytes) if max_chunks is None else int(max_chunks))
    m = lp_fill_steps(op, P)
    if P == 1 or n_bytes == 0 or m <= 0:
        return 1  # no pipeline to fill: extra chunks only add latency
    if alpha <= 0:
        return upper  # latency-free links: more chunks never hurt
    k_star = math.sqrt(m * n_bytes * beta / alpha)
    candidates = {min(upper, max(1, c)) for c in (math.floor(k_star), math.ceil(k_star))}
    return min(candidates, key=lambda k: ((m + k) * (alpha + n_bytes / k * beta), k))


@dataclass(frozen=True)
class Choice:
    """The cheapest algorithm for one collective, its modelled seconds and LP chunks."""

    algorithm: str
    seconds: float
    num_chunks: int


def best_algorithm(
    op: str, P: int, n_bytes: float, alpha: float, beta: float, max_chunks: int | None = None
) -> Choice:
    """The cheapest algorithm for (op, P, n, alpha, beta); ties go to the earlier listed.

    bidirectional_exchange is only considered for power-of-two P (the code needs it).
    """
    best: Choice | None = None
    for algorithm in ALGORITHMS:
        if algorithm == "bidirectional_exchange" and not _is_power_of_two(P):
            continue
        k = lp_chunks(op, P, n_bytes, alpha, beta, max_chunks) if algorithm == ALGORITHMS[0] else 1
        t = collective_time(op, algorithm, P, n_bytes, alpha, beta, num_chunks=k)
        if best is None or t < best.seconds:
            best = Choice(algorithm, t, k)
    assert best is not None
    return best


# ---- Step-time model for the planner (COMET-style) -------------------------------------
# A step is compute, HBM traffic and communication. On a TPU slice the compiler's own
# estimate (`optimal_seconds`) covers what it sees; the analytic terms below split it and
# add what it cannot see (DCN between slices). For clusters without a compiler here
# (GPUs) the same terms come from the FLOPs and bytes of a CPU or TPU compile. Peaks are
# used as published: nothing is fitted to a measured run.


@dataclass(frozen=True)
class StepTime:
    """Seconds per training step, split by resource; `total_s` is the prediction."""

    compute_s: float  # FLOPs at peak
    memory_s: float  # HBM bytes at peak bandwidth
    ici_s: float  # in-slice / in-node collectives
    dcn_s: float  # between slices / nodes
    compiler_s: float | None  # the TPU compiler's estimate, where there is one
    total_s: float

    @property
    def comm_s(self) -> float:
        return self.ici_s + self.dcn_s

    @property
    def serial_s(self) -> float:
        """The roofline with ICI after it, no overlap: max(compute, memory) + ICI + DCN
        (`total_s` where there is no compiler estimate)."""
        return max(self.compute_s, self.memory_s) + self.ici_s + self.dcn_s

    @property
    def overlapped_s(self) -> float:
        """The roofline with every ICI collective hidden behind compute: max(compute,
        memory, ICI) + DCN. A floor: libtpu's estimate, where usable, is never below it.
        `serial_s` is no ceiling: a small program whose compute and memory times are
        close sums kernels bound by one or the other (docs/aot-and-planning.md)."""
        return max(self.compute_s, self.memory_s, self.ici_s) + self.dcn_s


# Bytes per gradient element while it is summed (`parallel.grad_reduce_dtype`).
GRAD_REDUCE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def grad_bytes_ratio(dtype: str) -> float:
    """Gradient all-reduce bytes in `dtype` relative to float32 (bf16/fp16 halve them)."""
    if dtype not in GRAD_REDUCE_BYTES:
        raise ValueError(
            f"grad_reduce_dtype={dtype!r} is unknown; use one of {', '.join(GRAD_REDUCE_BYTES)}."
        )
    return GRAD_REDUCE_BYTES[dtype] / 4


def ring_allreduce_s(n_bytes: float, P: int, bandwidth: float) -> float:
    """Bandwidth term of a ring all-reduce of n bytes on P devices: 2(P-1)/P n / bw."""
    return 0.0 if P <= 1 or n_bytes <= 0 else 2.0 * (P - 1) / P * n_bytes / bandwidth


def tpu_step_time(
    flops: float,
    bytes_accessed: float,
    wire_bytes: float,
    compiler_s: float | None,
    peak_flops: float,
    hbm_bandwidth: float,
    ici_bandwidth: float,
    slices: int = 1,
    dcn_bytes: float = 0.0,
    dcn_bandwidth: float = 1.0,
    ici_scale: float = 1.0,
    dcn_wire_bytes: float | None = None,
) -> StepTime:
    """One device's step on a TPU slice from its compiled program (per-device numbers).

    `ici_bandwidth` is what one device can drive: a ring along one torus dimension uses
    both directions of its link. The total is the compiler's estimate when there is one
    (else max(compute, memory) + ICI, no overlap: `serial_s`; `overlapped_s` is the
    other bound), plus DCN for `slices` > 1: an
    all-reduce of `dcn_bytes` (the device's gradient shard) over the slices. `ici_scale`
    (a what-if on ICI bandwidth) changes the ICI term inside the compiler's estimate too.
    `dcn_wire_bytes`, from a compiled multi-slice program (`parallel.dcn`), replaces
    that modelled all-reduce: the bytes the collectives that cross slices send.
    """
    compute = flops / peak_flops
    memory = bytes_accessed / hbm_bandwidth
    ici = wire_bytes / (ici_bandwidth * ici_scale)
    dcn = ring_allreduce_s(dcn_bytes, slices, dcn_bandwidth)
    if dcn_wire_bytes is not None:
        dcn = dcn_wire_bytes / dcn_bandwidth
    if compiler_s is not None:
        base = compiler_s + ici - wire_bytes / ici_bandwidth
    else:
        base = max(compute, memory) + ici
    return StepTime(compute, memory, ici, dcn, compiler_s, base + dcn)


def cluster_step_time(
    flops_per_example: float,
    bytes_per_example: float,
    grad_bytes: float,
    batch_per_device: int,
    devices_per_node: int,
    nodes: int,
    peak_flops: float,
    hbm_bandwidth: float,
    intra_node_bandwidth: float,
    inter_node_bandwidth: float,
    flops_per_step: float = 0.0,
    bytes_per_step: float = 0.0,
    microbatches: int = 1,
) -> StepTime:
    """A data-parallel step on a GPU cluster: `microbatches` accumulated microbatches of
    `batch_per_device` examples each, then one hierarchical all-reduce of the gradients
    (`grad_bytes`, in the reduction's precision): a ring inside each node, then a ring over
    the nodes' NICs (each node's NIC carries the whole gradient once per ring step).

    Compute and HBM traffic grow with the examples; `flops_per_step` (the optimizer) is
    paid once per step and `bytes_per_step` (weights and optimizer state, which do not
    grow with the batch) once per microbatch: an upper bound, as only the weights are
    re-read for every microbatch.
    """
    examples = batch_per_device * microbatches
    compute = (flops_per_example * examples + flops_per_step) / peak_flops
    memory = (bytes_per_example * examples + bytes_per_step * microbatches) / hbm_bandwidth
    intra = ring_allreduce_s(grad_bytes, devices_per_node, intra_node_bandwidth)
    inter = ring_allreduce_s(grad_bytes, nodes, inter_node_bandwidth)
    return StepTime(compute, memory, intra, inter, None, max(compute, memory) + intra + inter)
