"""The step model each TPU generation is estimated with, and its measured error band.

`roofline-eta` (v4): a data-parallel step of `b` examples per chip takes

    fixed_s + max(flops_per_example * b / (peak * eta), gradient all-reduce over ICI)

with the all-reduce `2 (P-1)/P * 4 bytes * params / (links * link bandwidth)` (float32
gradients, every link of the chip busy in both directions) hidden behind compute.
`eta` is the compute efficiency; `fixed_s` is time every step pays whatever its work,
an empirical term (latencies and work our FLOP count leaves out, not measured apart):
it is what makes the measured efficiency on our FLOP count rise with the work per chip,
and SSD's step take as long at 8 images per chip as at 16.

Both are global: one pair per generation, fitted once (`fit`) on that generation's
comparable measured runs (`mlperf.planning.measured_runs`, compared at
`MeasuredPoint.compared_s`) as the grid point (eta in 0.01 steps, fixed_s in 0.1 ms
steps) with the least sum of squared log(estimate / measured); nothing is fitted per run
or per model. v4: eta = 0.58, fixed_s = 6.6 ms on the twelve v0.7 TF runs (sum of
squared log ratios 0.223). With the all-reduce after compute instead (`overlapped=False`)
the best fit is worse (eta = 0.60, 5.7 ms: 0.263) and leaves Mask R-CNN on 8 chips at
0.78x, hence the overlap. The band is the range of estimate / measured over those runs;
`leave_one_out` gives each run's ratio under a fit without it. The floor
`lower_bound_s` is the roofline at peak with the all-reduce hidden and no fixed time.

v3 is estimated by libtpu's own compiler estimate of the compiled program (the TPU
table's full-size rows); its band compares those rows with Google's v0.7 JAX runs.
v5e, v5p, v6e (and v2) have no public measured run here: no band, and the planner and
the TPU table say "not validated" instead of a step time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from mlperf.planning.measured_runs import MeasuredPoint
from parallel.costmodel import StepTime
from parallel.hardware import CHIPS

# Parameters of the models the measured runs trained (float32 gradients all-reduced):
# BERT-large (Devlin et al.), Transformer big (Vaswani et al.), SSD with a ResNet-34
# backbone and Mask R-CNN with ResNet-50-FPN (their MLPerf reference implementations).
PARAMS = {"bert": 335e6, "transformer": 210e6, "ssd": 20e6, "maskrcnn": 44e6}


@dataclasses.dataclass(frozen=True)
class RooflineEta:
    """`roofline-eta`'s two global parameters for one generation."""

    eta: float  # compute efficiency: FLOPs run at eta x peak
    fixed_s: float  # seconds every step pays whatever its work


# Fitted once per generation (see `fit`; tests/tools/test_step_model.py re-derives it
# from the logs).
ROOFLINE_ETA = {"v4": RooflineEta(eta=0.58, fixed_s=0.0066)}

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


# The bands tests/tools/test_step_model.py re-derives from Google's logs, each the range of
# estimate / measured rounded outward to 0.01 (v3: the three v0.7 JAX runs; v4: the
# twelve v0.7 TF runs, the packed v2.0 BERT runs being another program).
VALIDATED = {
    "v3": Validation("libtpu compiler estimate", 0.72, 0.96, 3),
    "v4": Validation(
        "roofline-eta (6.6 ms + FLOPs at eta=0.58 x peak, ICI hidden behind compute)",
        0.80,
        1.25,
        12,
    ),
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
    params: RooflineEta,
    overlapped: bool = True,
) -> float:
    """`roofline-eta`'s step: the fixed time, then compute at eta x peak with the
    all-reduce hidden behind it (or, without `overlapped`, after it)."""
    compute = flops_per_example * batch_per_chip / (CHIPS[generation].peak_flops * params.eta)
    allreduce = allreduce_s(model, chips, generation)
    work = max(compute, allreduce) if overlapped else compute + allreduce
    return params.fixed_s + work


def lower_bound_s(flops_per_example: float, point: MeasuredPoint) -> float:
    """The roofline at peak with ICI overlapped: what no step of the padded program beats."""
    r = point.run
    peak = RooflineEta(eta=1.0, fixed_s=0.0)
    return roofline_eta_s(
        flops_per_example, point.batch_per_chip, r.model, r.chips, r.generation, peak
    )


def ratios(
    points: Sequence[MeasuredPoint],
    flops_per_example: dict[str, float],
    params: RooflineEta,
    overlapped: bool = True,
) -> list[float]:
    """estimate / measured (`compared_s`) of `roofline-eta` at each point."""
    return [
        roofline_eta_s(
            flops_per_example[p.run.model],
            p.batch_per_chip,
            p.run.model,
            p.run.chips,
            p.run.generation,
            params,
            overlapped,
        )
        / p.compared_s
        for p in points
    ]


# The grid `fit` searches: eta 0.30-1.00 in 0.01 steps, fixed_s 0-20 ms in 0.1 ms steps.
_GRID = [RooflineEta(e / 100, t / 10_000) for e in range(30, 101) for t in range(0, 201)]


def fit(
    points: Sequence[MeasuredPoint],
    flops_per_example: dict[str, float],
    overlapped: bool = True,
) -> RooflineEta:
    """The grid point with the least sum of squared log(estimate / measured) over
    `points`: one eta and one fixed time for every run and model."""

    def loss(params: RooflineEta) -> float:
        return sum(math.log(x) ** 2 for x in ratios(points, flops_per_example, params, overlapped))

    return min(_GRID, key=loss)


def leave_one_out(
    points: Sequence[MeasuredPoint], flops_per_example: dict[str, float]
) -> list[float]:
    """Each point's estimate / measured under the fit on all the other points: how well
    the model predicts a run it was not fitted on."""
    out = []
    for i, p in enumerate(points):
        params = fit([*points[:i], *points[i + 1 :]], flops_per_example)
        out.extend(ratios([p], flops_per_example, params))
    return out


def generation_of(topology: str) -> str:
    """`v4` of `v4:16x16x16`."""
    return topology.split(":", 1)[0]


def planned_step(step: StepTime, generation: str) -> StepTime:
    """The planner's step on `generation`: libtpu's estimate where it gave one (v3), else
    `roofline-eta` on the compiled program where the generation has fitted parameters
    (the fixed time, then compute at eta x peak, HBM and ICI overlapped, then DCN), else
    the roofline unchanged. The fit saw data-parallel programs only, whose ICI is the
    gradient all-reduce; a model axis's collectives are hidden the same way, unvalidated."""
    params = ROOFLINE_ETA.get(generation)
    if step.compiler_s is not None or params is None:
        return step
    work = max(step.compute_s / params.eta, step.memory_s, step.ici_s)
    return dataclasses.replace(step, total_s=params.fixed_s + work + step.dcn_s)
