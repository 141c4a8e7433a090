"""launch.report: the table and plots of our runs; MLPerf time to train as summarized."""

from __future__ import annotations

import json
import os

import pytest
from conftest import small_bert_config

from launch import report

T0 = 1_600_000_000_000  # ms, like the time_ms of the v0.7 logs


def _line(key: str, value, time_ms: int, event_type="POINT_IN_TIME", **metadata) -> str:
    record = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": {"file": "run.py", "lineno": 1, **metadata},
    }
    return ":::MLLOG " + json.dumps(record)


def write_result_file(path, org, platform, benchmark, run_ms, status="success", prefix=""):
    """A small, realistic MLPerf v0.7 result log: submission info, init, run with two
    epochs and evals, run_stop with its status (host prefixes like multi-host logs)."""
    start = T0 + 60_000
    lines = [
        _line("cache_clear", True, T0),
        _line("init_start", None, T0 + 1, "INTERVAL_START"),
        _line("submission_org", org, T0 + 2),
        _line("submission_platform", platform, T0 + 2),
        _line("submission_division", "closed", T0 + 2),
        _line("submission_status", "onprem", T0 + 2),
        _line("submission_benchmark", benchmark, T0 + 2),
        _line("global_batch_size", 8192, T0 + 3),
        _line("init_stop", None, start - 1, "INTERVAL_END"),
        _line("run_start", None, start, "INTERVAL_START"),
        _line("block_start", None, start + 1, "INTERVAL_START", first_epoch_num=0, epoch_count=1),
        _line("eval_accuracy", 0.70, start + run_ms // 2, epoch_num=1),
        _line("eval_accuracy", 0.721, start + run_ms - 10, epoch_num=2),
        _line("run_stop", None, start + run_ms, "INTERVAL_END", status=status),
        "some other program output",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(prefix + line for line in lines) + "\n")
    return start, start + run_ms


def test_time_to_train_is_run_stop_minus_run_start(tmp_path):
    start, stop = write_result_file(
        tmp_path / "result_0.txt", "Google", "tpu-v3-4096", "bert", 23_456, prefix="0: "
    )
    events = report.read_mllog(str(tmp_path / "result_0.txt"))
    assert report.time_to_train_ms(events) == stop - start == 23_456
    assert report.run_status(events) == "success"


def test_missing_run_stop_is_a_clear_error(tmp_path):
    path = tmp_path / "result_0.txt"
    path.write_text(_line("run_start", None, T0, "INTERVAL_START") + "\n")
    with pytest.raises(ValueError, match="run_stop not recorded"):
        report.time_to_train_ms(report.read_mllog(str(path)))


def test_olympic_mean_follows_the_v07_summarizer():
    assert report.olympic_mean([5.0, 1.0, 3.0, 4.0, 2.0], dropped=0) == 3.0  # min, max out
    # One non-converged run stands for the slowest: only the fastest is dropped.
    assert report.olympic_mean([1.0, 2.0, 3.0, 10.0], dropped=1) == 5.0
    assert report.olympic_mean([1.0, 2.0, 3.0], dropped=2) is None
    assert report.olympic_mean([1.0, 2.0], dropped=0) is None


def test_published_systems_are_scored_per_benchmark(tmp_path):
    times = [60_000, 90_000, 120_000, 150_000, 600_000]  # ms
    for i, ms in enumerate(times):
        write_result_file(
            tmp_path / "google" / f"result_{i}.txt", "Google", "tpu-v3-4096", "bert", ms
        )
    for i, ms in enumerate([30_000, 36_000, 42_000, 48_000]):
        status = "aborted" if i == 3 else "success"
        write_result_file(
            tmp_path / "other" / f"result_{i}.txt", "Other", "gpu-8", "transformer", ms, status
        )
    scores = {s.org: s for s in report.summarize_published([str(tmp_path)])}
    assert scores["Google"].minutes == pytest.approx((90 + 120 + 150) / 3 / 60)
    assert scores["Google"].runs == 5 and scores["Google"].dropped == 0
    # Aborted run dropped; of 30, 36, 42 s only the fastest goes: (36 + 42) / 2 s.
    assert scores["Other"].minutes == pytest.approx(39 / 60)
    assert scores["Other"].dropped == 1
    text = report.table([], scores.values())
    assert "Google tpu-v3-4096" in text and "olympic mean of 5 runs" in text


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny BERT run's workdir (target 0: reached at the first eval)."""
    from mlperf.train import run

    workdir = str(tmp_path_factory.mktemp("tiny_run"))
    config = small_bert_config(
        **{
            "train.steps": 6,
            "train.eval_every_samples": 48,
            "train.log_every_steps": 2,
            "train.target": 0.0,
            "mesh.ici_shape": (8, 1),  # the data vocabulary need not split over model
        }
    )
    result = run(config, workdir)
    return workdir, result


@pytest.mark.xdist_group("report_tiny_run")
def test_report_on_a_tiny_run(tiny_run, tmp_path):
    workdir, result = tiny_run
    runs = [report.load_run(workdir)]
    row = report.run_row(runs[0])
    with open(os.path.join(workdir, "result.json")) as f:
        saved = json.load(f)
    assert row["devices"] == saved["devices"] == 8
    assert row["time_to_target_s"] == saved["time_to_target_s"] is not None
    assert row["final_metric"] == saved["eval"][saved["target_metric"]]
    assert row["mfu"] == saved.get("mfu") and row["samples_per_s"] == saved.get("samples_per_s")
    assert row["mesh"] == "x".join(f"{k}={v}" for k, v in saved["mesh"].items())
    ms = report.time_to_train_ms(runs[0].events)
    assert 0 < ms / 1000 == row["mlperf_time_s"]
    text = report.report([workdir], plots_dir=str(tmp_path))
    assert f"{saved['time_to_target_s']:.1f}" in text
    assert "eval_vs_time.png" in text and "loss_vs_step.png" in text
    for name in ("eval_vs_time.png", "loss_vs_step.png"):
        path = tmp_path / name
        assert path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Two runs: the time-to-target-against-devices plot too.
    report.report([workdir, workdir], plots_dir=str(tmp_path / "two"))
    assert (tmp_path / "two" / "time_to_target_vs_devices.png").stat().st_size > 1000


def test_report_needs_a_finished_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="result.json"):
        report.load_run(str(tmp_path))
