"""launch.tables.tpu_step: a TPU-table row's step from the figures it keeps is the planner's
step model on the compiled program's roofline, so a stored row restepped after the model
changed holds the step a compile would give it."""

from __future__ import annotations

import itertools

import pytest

from launch.tables import tpu, tpu_page, tpu_step
from mlperf.planning import step_model
from parallel.costmodel import StepTime
from parallel.hardware import CHIPS


def _row(step: StepTime, generation: str) -> dict:
    """A row as `tpu.summarise` keeps a compiled program with roofline `step` (one chip a
    device): its figures, before `restep_row`."""
    return {
        "key": f"test-bert-{generation}",
        "model": "bert",
        "generation": generation,
        "chips": 4096,
        "flops_per_chip": step.compute_s * CHIPS[generation].peak_flops,
        "flops_vs_analytic": 1.25,
        "step_s": step.total_s,
        "step_bounds_s": (step.overlapped_s, step.serial_s),
        "compiler_s": step.compiler_s,
        "compiler_estimate": step.compiler_s is not None,
        "dcn_s": step.dcn_s,
        "step_method": "compiler" if step.compiler_s is not None else "stale",
        "steps": 1000,
    }


# Compute-, HBM- and ICI-bound programs, with and without DCN (seconds).
ROOFLINES = [
    StepTime(c, m, i, d, None, max(c, m) + i + d)
    for c, m, i, d in itertools.product((0.004, 0.02), (0.001, 0.03), (0.002, 0.05), (0, 0.003))
]


@pytest.mark.parametrize("generation", ["v4", "v5e"])
def test_a_rows_step_from_its_figures_is_the_planners_on_the_full_roofline(generation):
    """HBM and ICI are not kept apart in a row; its bounds and compute give the same step
    as `planned_step` on the compiled program's roofline, and the same bounds back."""
    for step in ROOFLINES:
        row = tpu_step.restep_row(_row(step, generation))
        planned = step_model.planned_step(step, generation).total_s
        assert row["step_s"] == pytest.approx(planned, rel=1e-12), step
        assert row["step_method"] == tpu_step.roofline_method(generation)
        rebuilt = tpu_step.roofline(row)
        assert (rebuilt.overlapped_s, rebuilt.serial_s) == pytest.approx(row["step_bounds_s"])
        # MFU: the analytic FLOPs (the compiled ones / 1.25) over chips x peak x step.
        assert row["mfu"] == pytest.approx(step.compute_s / 1.25 / planned)
        assert row["time_to_train_s"] == pytest.approx(1000 * planned)
        hours = 4096 * 1000 * planned / 3600
        assert row["chip_hours"] == pytest.approx(hours)
        assert row["dollars"] == pytest.approx(hours * CHIPS[generation].price_per_hour)
    v4 = step_model.ROOFLINE_ETA["v4"]
    compute_bound = tpu_step.restep_row(_row(ROOFLINES[0], "v4"))  # 4 ms compute, 2 ms ICI
    assert compute_bound["step_s"] == pytest.approx(v4.fixed_s + 0.004 / v4.eta)


def test_a_compiler_estimate_is_kept():
    step = StepTime(0.004, 0.001, 0.002, 0.001, 0.005, 0.006)
    row = tpu_step.restep_row(_row(step, "v3"))
    assert row["step_s"] == 0.006 and row["step_method"] == "compiler"
    assert not tpu_step.stale(row)


def test_a_row_without_the_figures_gets_no_step():
    row = _row(ROOFLINES[0], "v4")
    del row["step_bounds_s"]
    with pytest.raises(ValueError, match="test-bert-v4: no step_bounds_s"):
        tpu_step.restep_row(row)


@pytest.fixture(scope="module")
def rows():
    return tpu_page.load_rows()


def test_a_v4_rows_printed_step_is_the_step_models_for_its_stored_figures(rows):
    """The stored v4 rows (no usable compiler estimate) print roofline-eta on their FLOPs
    per chip and roofline: 6.6 ms + max(compute / eta, max(compute, HBM, ICI)), the
    latter the bound with ICI overlapped (no DCN on one v4 slice)."""
    v4 = step_model.ROOFLINE_ETA["v4"]
    page = tpu_page.page(rows).splitlines()
    stored = [r for r in rows if r["generation"] == "v4"]
    assert len(stored) == 4
    for row in stored:
        assert row["dcn_s"] == 0 and not row["compiler_estimate"]
        compute = row["flops_per_chip"] / CHIPS["v4"].peak_flops
        overlapped, serial = row["step_bounds_s"]
        expected = v4.fixed_s + max(compute / v4.eta, overlapped)
        assert row["step_s"] == pytest.approx(expected, rel=1e-12)
        line = next(ln for ln in page if ln.startswith(f"| {row['model']} | v4:"))
        assert (
            f"| {expected * 1e3:.2f} ms (roofline-eta: compiler estimate unusable; roofline "
            f"{overlapped * 1e3:.2f} ms with ICI overlapped, {serial * 1e3:.2f} ms serial) |"
        ) in line
        assert f"| {row['steps']} | {tpu._time(row['steps'] * expected)} |" in line


def test_every_stored_row_has_the_current_models_step(rows):
    """No stored row holds an earlier model's step; the v4 rows, compiled under the
    current model, are what `--restep` makes of them, and a stale form of each (as
    compiled under the roofline + ICI) resteps to it with a dated note."""
    assert tpu_page.stale_keys(rows) == []
    v4 = [r for r in rows if r["generation"] == "v4"]
    assert len(v4) == 4 and not any("restepped" in r for r in v4)
    for row in v4:
        assert tpu_step.restep_row(row) == row
        before = dict(row, step_s=row["step_bounds_s"][1], step_method="roofline + ICI: x", mfu=0.1)
        (after,) = tpu_page.restep([before], "2026-12-07")
        assert (
            after["restepped"].startswith("2026-12-07: ") and "not recompiled" in after["restepped"]
        )
        assert {k: v for k, v in after.items() if k != "restepped"} == row
    assert tpu_page.restep(rows, "2099-01-01") == rows  # nothing stale: nothing changes
