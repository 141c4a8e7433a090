"""`python -m launch.bench.input`: per-host input rates against pod pace (tiny sizes)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launch.bench import input as bench_input
from launch.bench.input_data import MODELS, write_fixtures

ROOT = Path(__file__).resolve().parents[2]  # the repository (tests/<kind>/this file)


def mlperf_models() -> list[str]:
    """Every configs/<model>.py with an `mlperf_v07` variant."""
    out = []
    for path in sorted((ROOT / "configs").glob("*.py")):
        module = importlib.import_module(f"configs.{path.stem}")
        if "mlperf_v07" in getattr(module, "VARIANTS", ()):
            out.append(path.stem)
    return out


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Each model's loader over 8-record fixtures, one host batch of 1 timed."""
    folder = str(tmp_path_factory.mktemp("inputs"))
    write_fixtures(folder, records=8)
    return {m: bench_input.measure(m, 1, 1, 0, folder, "") for m in MODELS}


def test_every_mlperf_config_has_a_row_per_generation_with_consistent_figures(measured):
    table = bench_input.read_tpu_table(str(ROOT / "docs" / "results" / "tpu-table-rows.json"))
    generations = list(bench_input.HOST_VCPUS)
    assert set(mlperf_models()) == set(MODELS)
    rows = bench_input.pod_rows(measured, table, generations)
    assert {(r.model, r.generation) for r in rows} == {(m, g) for m in MODELS for g in generations}
    for r in rows:
        assert r.needed > 0 and r.per_core > 0 and r.host_vcpus > 0
        assert r.per_core == measured[r.model].per_core
        assert r.cores == pytest.approx(r.needed / r.per_core)
        assert r.needed == pytest.approx(r.host_batch / (r.step_ms / 1e3))
        assert r.share == pytest.approx(r.cores / r.host_vcpus)
    by_key = {(r.model, r.generation): r for r in rows}
    # BERT on v3: 8192 sequences over 1024 hosts; Mask R-CNN on v4: data=256 of 1024
    # hosts, so every host loads 256 / 256 = 1 image.
    assert by_key[("bert", "v3")].host_batch == 8
    assert by_key[("maskrcnn", "v4")].host_batch == 1
    text = bench_input.markdown(list(measured.values()), rows, [])
    assert text.count("\n| ") == len(rows) + len(measured) + 1  # data rows, 2nd header


def test_loader_rates_are_positive(measured):
    for m in measured.values():
        assert m.in_process > 0 and m.per_core == m.in_process


def test_bad_flag_is_a_one_line_error(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for args in (
        ["--input_models", "bert,resnet", "--fixture_dir", str(tmp_path)],
        ["--timed_batches", "many"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "launch.bench.input", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("multipod: error:"), proc.stderr
    with pytest.raises(bench_input.InputBenchError, match="--input_generations"):
        bench_input.check_flags(["bert"], ["v9"])
    with pytest.raises(bench_input.InputBenchError, match="--tpu_table"):
        bench_input.read_tpu_table(str(tmp_path / "none.json"))
    assert bench_input.dispatch_steps(["1", "8"]) == [1, 8]
    for bad in (["0"], ["two"]):
        with pytest.raises(bench_input.InputBenchError, match="--steps_per_dispatch must be"):
            bench_input.dispatch_steps(bad)


def test_host_overhead_parts_add_up_and_name_the_steps_per_dispatch():
    from launch.bench.input_overhead import BUDGET, measure_overhead

    o = measure_overhead("bert", 8, 2, {"v3": 0.04385, "v5p": 0.02428})
    assert o.host_batch == 8 and o.state_leaves > 1 and o.batch_bytes > 0
    assert min(o.dispatch_s, o.transfer_s, o.logging_s) >= 0 and o.dispatch_s > 0
    assert o.total_s == pytest.approx(o.dispatch_s + o.transfer_s + o.logging_s)
    assert o.budgets_s["v5p"] == pytest.approx(BUDGET * 0.02428)
    assert o.steps_per_call * o.budgets_s["v5p"] >= o.total_s
    assert o.steps_per_call == 1 or (o.steps_per_call - 1) * o.budgets_s["v5p"] < o.total_s
    # The loop's multi-step dispatch (train.steps_per_dispatch): figures per step, the
    # fit from the host work of one dispatch of 2 steps.
    o2 = measure_overhead("bert", 8, 2, {"v3": 0.04385, "v5p": 0.02428}, steps_per_dispatch=2)
    assert o2.steps_per_dispatch == 2 and o2.dispatch_s > 0 and o2.transfer_s > 0
    assert o2.steps_per_call * o2.budgets_s["v5p"] >= 2 * o2.total_s
    row = bench_input.overhead_markdown([o, o2])[-1]
    assert row.startswith("| bert | 2 | 8 (")
    assert row.endswith(
        f"| {o2.steps_per_call} | {o2.stub_device_s * 1e6:.0f} us | - (nothing split) "
        f"| {o2.device_bytes / 2**20:.1f} MiB |"
    )
    assert o2.transfer_whole_s is None and o2.device_bytes_whole is None  # nothing split
    # BERT's rows split over data=2 of the 2 x 4 mesh: each row reaches the 4 model devices.
    assert o2.device_bytes == 4 * o2.batch_bytes
    # The stub's own run is timed apart from the host's work, not counted in it.
    assert o2.stub_device_s > 0
    assert o2.total_s == pytest.approx(o2.dispatch_s + o2.transfer_s + o2.logging_s)


def test_a_split_input_is_timed_against_its_rows_sent_whole_in_the_same_run():
    """SSD's mlperf_v07 mesh splits the image's height 4 ways: the transfer is timed as
    the loop sends it and, as the baseline, with every field's rows whole."""
    from launch.bench.input_overhead import measure_overhead

    o = measure_overhead("ssd", 8, 2, {"v3": 0.0077})
    assert o.transfer_s > 0 and o.transfer_whole_s is not None and o.transfer_whole_s > 0
    row = bench_input.overhead_markdown([o])[-1]
    ratio = o.transfer_whole_s / o.transfer_s
    assert f"| {o.transfer_whole_s * 1e6:.0f} us ({ratio:.2f}x) |" in row, row
    # data=2 x model=4: whole, each row reaches 4 devices; split, its image reaches them
    # a quarter each and only the per-anchor targets go whole.
    spec = _ssd_spec()
    image = 8 * int(np.prod(spec["image"][0]))  # uint8
    assert o.device_bytes_whole == 4 * o.batch_bytes
    assert o.device_bytes == 4 * (o.batch_bytes - image) + image
    assert row.endswith(
        f"| {o.device_bytes / 2**20:.1f} MiB ({o.device_bytes_whole / 2**20:.1f} MiB) |"
    )


def _ssd_spec() -> dict:
    """The train example spec of SSD's mlperf_v07 config."""
    from launch.bench.input_data import mlperf_config
    from mlperf.tasks import get_task

    task = get_task(mlperf_config("ssd"))
    return task.example_spec(task.phases()[0])
