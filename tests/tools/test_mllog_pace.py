"""Host dispatch pace against device pace in an MLPerf log."""

from __future__ import annotations

import json

import pytest

from launch.bench.mllog_pace import main
from mlperf.mllog_pace import step_pace


def _line(key, time_ms, **metadata):
    event = {"namespace": "", "time_ms": time_ms, "key": key, "value": None, "metadata": metadata}
    return ":::MLLOG " + json.dumps(event)


def _log():
    """10 steps per block dispatched in 200 ms (20 ms/step); evals after steps 20 and 30
    come back 500 ms apart (50 ms/step on the device)."""
    lines = [_line("run_start", 0)]
    for b in range(3):
        lines += [
            _line("block_start", 1000 * b, first_epoch_num=10 * b, epoch_count=10),
            _line("block_stop", 1000 * b + 200, first_epoch_num=10 * b, epoch_count=10),
        ]
    lines += ["noise line", _line("eval_accuracy", 1500, epoch_num=20)]
    lines += [_line("eval_accuracy", 2000, epoch_num=30), _line("run_stop", 2100)]
    return "\n".join(lines)


def test_dispatch_and_device_pace_are_read_apart():
    pace = step_pace(_log())
    assert pace["dispatch_ms_per_step"] == pytest.approx(20.0)
    assert pace["dispatch_ms_per_step_each"] == pytest.approx([20.0, 20.0, 20.0])
    assert pace["device_ms_per_step"] == pytest.approx(50.0)
    assert pace["eval_steps"] == [20, 30] and pace["run_s"] == pytest.approx(2.1)


def test_epochs_over_the_data_are_counted_in_steps():
    """An SSD-style log numbers real epochs: train_samples / global_batch_size steps
    each (here 4 steps), so a 200-ms one-epoch block is 50 ms per step; a BERT log's
    epochs are its steps."""
    head = [
        _line("submission_benchmark", 0),
        _line("train_samples", 0),
        _line("global_batch_size", 0),
    ]
    head = [
        h.replace('"value": null', f'"value": {v}')
        for h, v in zip(head, ['"ssd"', 400, 100], strict=True)
    ]
    body = [
        _line("block_start", 0, first_epoch_num=1, epoch_count=1),
        _line("block_stop", 200, first_epoch_num=1, epoch_count=1),
        _line("eval_accuracy", 1000, epoch_num=5),
        _line("eval_accuracy", 2200, epoch_num=10),
    ]
    pace = step_pace("\n".join(head + body))
    assert pace["steps_per_epoch"] == 4.0 and pace["eval_steps"] == [20.0, 40.0]
    assert pace["dispatch_ms_per_step"] == pytest.approx(50.0)
    assert pace["device_ms_per_step"] == pytest.approx(60.0)
    bert = step_pace("\n".join([head[0].replace('"ssd"', '"bert"'), *head[1:], *body]))
    assert bert["steps_per_epoch"] == 1.0 and bert["dispatch_ms_per_step"] == 200.0


def test_a_log_without_evals_has_no_device_pace():
    pace = step_pace(
        _line("block_start", 0, epoch_count=4) + "\n" + _line("block_stop", 40, epoch_count=4)
    )
    assert pace["dispatch_ms_per_step"] == 10.0 and "device_ms_per_step" not in pace


def test_cli_prints_rows_and_medians(tmp_path, capsys):
    path = tmp_path / "result_0.txt"
    path.write_text(_log())
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "median device_ms_per_step: 50.0" in out and "20.0" in out
    assert main([str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
