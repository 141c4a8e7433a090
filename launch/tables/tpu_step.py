"""A TPU-table row's step, and what follows from it, from the figures the row keeps.

Both ways a row gets its step go through `restep_row`: a compile (`tpu.summarise`, which
first keeps the compiled program's figures in the row) and `python -m launch.tpu_table
--restep` (a stored row whose step an earlier step model computed). So a restepped row
holds the step a compile of the same program would get now.

The step is the planner's (`step_model.planned_step`) on the row's roofline. A row keeps
that roofline as its FLOPs per chip (compute: FLOPs at peak), its two bounds
(`step_bounds_s`: max(compute, HBM, ICI) + DCN with ICI overlapped, max(compute, HBM) +
ICI + DCN serial) and DCN; HBM and ICI are not kept apart. `roofline` rebuilds a StepTime
with the same compute, DCN and bounds; the larger of HBM and ICI sits in its HBM slot and
the smaller in its ICI slot. `planned_step` reads the roofline only through those figures:
roofline-eta takes max(compute / eta, HBM, ICI), which is max(compute / eta, max(compute,
HBM, ICI)) for any eta <= 1, and without a fitted model the step is the serial bound. Where
libtpu's estimate is usable the step is that estimate plus DCN, kept as the row's step.
"""

from __future__ import annotations

from typing import Any

from mlperf.planning import step_model
from mlperf.planning.reports import PUBLISHED_V07
from parallel.costmodel import StepTime
from parallel.hardware import CHIPS

# The method of a row stepped by the generation's `roofline-eta` (step_model).
ROOFLINE_ETA_METHOD = "roofline-eta"
# The method of a row whose step is the serial roofline: no fitted model on its generation.
ROOFLINE_ICI_METHOD = "roofline + ICI"
# The figures `restep_row` writes.
STEP_FIELDS = ("step_s", "step_method", "mfu", "time_to_train_s", "chip_hours", "dollars")


def roofline_method(generation: str) -> str:
    """The step method of a row on `generation` whose compiler estimate is unusable."""
    name = ROOFLINE_ETA_METHOD if generation in step_model.ROOFLINE_ETA else ROOFLINE_ICI_METHOD
    return f"{name}: compiler estimate unusable"


def roofline(row: dict[str, Any]) -> StepTime:
    """The row's roofline as the StepTime `step_model.planned_step` takes (module doc):
    compute from the FLOPs per chip, HBM and ICI slots from the two bounds, the step the
    compiler's estimate plus DCN where the row has one, else the serial bound."""
    _require(
        row,
        ("generation", "flops_per_chip", "step_bounds_s", "dcn_s", "step_s", "compiler_estimate"),
    )
    overlapped, serial = row["step_bounds_s"]
    dcn = row["dcn_s"]
    compiler = None
    if row["compiler_estimate"]:  # rows read back from a page keep only the step
        compiler = row.get("compiler_s", row["step_s"] - dcn)
    return StepTime(
        compute_s=row["flops_per_chip"] / CHIPS[row["generation"]].peak_flops,
        memory_s=overlapped - dcn,  # max(compute, HBM, ICI)
        ici_s=serial - overlapped,  # min(max(compute, HBM), ICI)
        dcn_s=dcn,
        compiler_s=compiler,
        total_s=row["step_s"] if row["compiler_estimate"] else serial,
    )


def restep_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its step from its generation's step model and its MFU (analytic FLOPs
    over chips x peak x step), time to train (steps x step), chip-hours, list-price dollars
    and, on v3, ratio to Google's published step computed from that step."""
    _require(row, ("model", "chips", "steps", "flops_vs_analytic", "compiler_estimate"))
    generation = row["generation"]
    chip = CHIPS[generation]
    step = step_model.planned_step(roofline(row), generation).total_s
    analytic = row["flops_per_chip"] * row["chips"] / row["flops_vs_analytic"]  # per step
    seconds = row["steps"] * step
    out = dict(row, step_s=step, mfu=analytic / (row["chips"] * chip.peak_flops * step))
    if not row["compiler_estimate"]:
        out["step_method"] = roofline_method(generation)
    out.update(
        time_to_train_s=seconds,
        chip_hours=row["chips"] * seconds / 3600,
        dollars=row["chips"] * seconds / 3600 * chip.price_per_hour,
    )
    published = PUBLISHED_V07.get(row["model"], {}).get("step_s")
    out["vs_published"] = step / published if published and generation == "v3" else None
    return out


def _require(row: dict[str, Any], keys: tuple[str, ...]) -> None:
    """A row that lacks a figure the step needs gets no step made up for it."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{row.get('key')}: no {', '.join(missing)} to take its step from")


def stale(row: dict[str, Any]) -> bool:
    """Whether the row's step or its method is not what `restep_row` gives it now."""
    if "step_s" not in row:
        return False
    now = restep_row(row)
    return (now["step_s"], now["step_method"]) != (row["step_s"], row["step_method"])
