"""The step model each TPU generation is estimated with, and its measured error band.

`roofline-eta` (v4): a data-parallel step of `b` examples per chip takes

    flops_per_example * b / (peak * eta) + gradient all-reduce over ICI

with the all-reduce `2 (P-1)/P * 4 bytes * params / (links * link bandwidth)` (float32
gradients, every link of the chip busy in both directions) after the backward pass, as
the measured TF programs sum their gradients. `eta`, the compute efficiency, is
calibrated once per generation: the value (in 0.01 steps) whose estimates have a median
estimate / measured of 1 over that generation's comparable measured runs
(`mlperf.planning.measured_runs`); nothing is fitted per run. The band is the range of
estimate / measured over those runs. The floor `lower_bound_s` is the same roofline at
peak with the all-reduce hidden behind compute.

v3 is estimated by libtpu's own compiler estimate of the compiled program (the TPU
table's full-size rows); its band compares those rows with Google's v0.7 JAX runs.
v5e, v5p, v6e (and v2) have no public measured run here: no band, and the planner and
the TPU table say "not validated" instead of a step time.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from mlperf.planning.measured_runs import MeasuredPoint
from parallel.costmodel import StepTime
from parallel.hardware import CHIPS

# Parameters of the models the measured runs trained (float32 gradients all-reduced):
# BERT-large (Devlin et al.), Transformer big (Vaswani et al.), SSD with a ResNet-34
# backbone and Mask R-CNN with ResNet-50-FPN (their MLPerf reference implementations).
PARAMS = {"bert": 335e6, "transformer": 210e6, "ssd": 20e6, "maskrcnn": 44e6}

# The compute efficiency of `roofline-eta`, calibrated once per generation (see
# `calibrate`; tests/tools/test_step_model.py re-derives it from the logs).
ETA = {"v4": 0.50}

# libtpu's compiler estimate of the full-size v3 rows (docs/tpu-table.md, ms per step):
# the v3 model's estimates at the published scale, compared with the v0.7 JAX runs.
V3_COMPILER_ESTIMATE_MS = {"bert": 43.85, "transformer": 11.57, "ssd": 7.70}


@dataclasses.dataclass(frozen=True)
class Validation:
    """A generation's step model and its measured band (estimate / measured)."""

    model: str
    low: float
    high: float
    runs: int

    def label(self) -> str:
        return (
            f"{self.model}; estimate/measured {self.low:.2f}-{self.high:.2f}x "
            f"over {self.runs} measured runs"
        )


# The bands tests/tools/test_step_model.py re-derives from Google's logs (v3: the three v0.7
# JAX runs; v4: the twelve v0.7 TF runs, the packed v2.0 BERT runs being another program).
VALIDATED = {
    "v3": Validation("libtpu compiler estimate", 0.72, 0.96, 3),
    "v4": Validation("roofline-eta (eta=0.50, gradient all-reduce after compute)", 0.38, 1.43, 12),
}

NOT_VALIDATED = "not validated: no public measured run on this generation"


def validation_label(generation: str) -> str:
    """The model and band of `generation`, or NOT_VALIDATED."""
    v = VALIDATED.get(generation)
    return NOT_VALIDATED if v is None else v.label()


def allreduce_s(model: str, chips: int, generation: str) -> float:
    """The float32 gradient all-reduce over every ICI link of the chip."""
    chip = CHIPS[generation]
    return 2.0 * (chips - 1) / chips * 4 * PARAMS[model] / (chip.links * chip.link_bandwidth)


def roofline_eta_s(
    flops_per_example: float,
    batch_per_chip: float,
    model: str,
    chips: int,
    generation: str,
    eta: float,
    overlapped: bool = False,
) -> float:
    """`roofline-eta`'s step: compute at `eta` x peak, then the all-reduce (or, with
    `overlapped`, the all-reduce hidden behind compute)."""
    compute = flops_per_example * batch_per_chip / (CHIPS[generation].peak_flops * eta)
    allreduce = allreduce_s(model, chips, generation)
    return max(compute, allreduce) if overlapped else compute + allreduce


def lower_bound_s(flops_per_example: float, point: MeasuredPoint) -> float:
    """The roofline at peak with ICI overlapped: what no step of the padded program beats."""
    r = point.run
    return roofline_eta_s(
        flops_per_example, point.batch_per_chip, r.model, r.chips, r.generation, 1.0, True
    )


def ratios(
    points: Sequence[MeasuredPoint], flops_per_example: dict[str, float], eta: float
) -> list[float]:
    """estimate / measured of `roofline-eta` at each point."""
    return [
        roofline_eta_s(
            flops_per_example[p.run.model],
            p.batch_per_chip,
            p.run.model,
            p.run.chips,
            p.run.generation,
            eta,
        )
        / p.step_s
        for p in points
    ]


def calibrate(points: Sequence[MeasuredPoint], flops_per_example: dict[str, float]) -> float:
    """The eta in 0.01 steps whose median |log(estimate / measured)| is nearest 0."""
    return min(
        (e / 100 for e in range(5, 101)),
        key=lambda eta: abs(math.log(statistics.median(ratios(points, flops_per_example, eta)))),
    )


def generation_of(topology: str) -> str:
    """`v4` of `v4:16x16x16`."""
    return topology.split(":", 1)[0]


def planned_step(step: StepTime, generation: str) -> StepTime:
    """The planner's step on `generation`: libtpu's estimate where it gave one (v3), else
    `roofline-eta` on the compiled program where the generation has a calibrated eta
    (compute at eta x peak, HBM, then ICI and DCN), else the roofline unchanged."""
    eta = ETA.get(generation)
    if step.compiler_s is not None or eta is None:
        return step
    total = max(step.compute_s / eta, step.memory_s) + step.ici_s + step.dcn_s
    return dataclasses.replace(step, total_s=total)
