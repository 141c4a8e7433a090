"""The run log: one object writes the MLPerf log, metrics.jsonl, TensorBoard and the
progress line; a resumed run cuts both logs back to their sizes at the checkpoint."""

from __future__ import annotations

import json

from mlperf.mllog import keys
from mlperf.run_log import RunLog
from mlperf.summaries import read_scalars


def _mllog(path) -> list[dict]:
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(path)]


def _mllog_keys(path) -> list[str]:
    return [event["key"] for event in _mllog(path)]


def _train_and_eval(log: RunLog, step: int) -> None:
    log.train(step, 10 * step, {"loss": 2.0 / step, "learning_rate": 0.1})
    log.eval(step, 10 * step, {"acc": 0.25 * step, "eval_examples": 8})


def test_every_sink_gets_train_and_eval(tmp_path, capsys):
    log = RunLog(str(tmp_path), is_main=True)
    log.start(keys.RUN_START)
    log.begin_training(total_steps=4, target_metric="acc", peak_flops_per_s=1e9)
    log.progress.flops_per_row = 1e6
    log.progress.step_done(10)
    _train_and_eval(log, 1)
    log.end_training()
    log.end(keys.RUN_STOP, metadata={keys.STATUS: keys.SUCCESS})
    log.close()
    log.close()  # closing twice is harmless

    events = _mllog(tmp_path / "mllog.txt")
    assert [e["key"] for e in events] == ["run_start", "eval_accuracy", "run_stop"]
    # Each event names the line that logged it: the caller of the run log here.
    assert events[0]["metadata"]["file"] == __file__
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["step"], x["samples"]) for x in lines] == [
        ("train", 1, 10),
        ("eval", 1, 10),
    ]
    assert lines[0]["loss"] == 2.0 and lines[0]["mfu"] is not None
    assert lines[1]["acc"] == 0.25 and lines[1]["eval_samples"] == 10
    scalars = read_scalars(str(tmp_path / "tensorboard"))
    assert scalars["train/loss"] == [(1, 2.0)] and scalars["eval/acc"] == [(1, 0.25)]
    out = capsys.readouterr().out
    assert "step      1/4 |" in out and "last eval: none yet" in out
    assert "eval @ 10 samples (step 1): acc 0.2500, eval_examples 8" in out
    assert log.progress.last_eval == (10, 0.25)


def test_other_processes_write_and_print_nothing(tmp_path, capsys):
    log = RunLog(str(tmp_path), is_main=False)
    log.start(keys.RUN_START)
    log.begin_training(total_steps=4, target_metric="acc")
    _train_and_eval(log, 1)
    assert log.sizes() == (0, 0)
    log.close()
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""


def test_resume_cuts_both_logs_back_to_the_checkpoint(tmp_path, capsys):
    log = RunLog(str(tmp_path), is_main=True)
    log.start(keys.RUN_START)
    log.begin_training(total_steps=4, target_metric="acc")
    _train_and_eval(log, 1)
    mllog_bytes, metrics_bytes = log.sizes()  # a checkpoint at step 1
    _train_and_eval(log, 2)  # written after it, then the run stopped
    log.close()

    again = RunLog(str(tmp_path), is_main=True, resuming=True)
    again.resume(mllog_bytes, metrics_bytes)
    again.begin_training(total_steps=4, target_metric="acc", last_eval=(10, 0.25))
    _train_and_eval(again, 2)
    again.close()
    assert _mllog_keys(tmp_path / "mllog.txt") == ["run_start", "eval_accuracy", "eval_accuracy"]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["step"]) for x in lines] == [
        ("train", 1),
        ("eval", 1),
        ("train", 2),
        ("eval", 2),
    ]
    # The resumed progress line shows the checkpoint's eval until the next one.
    assert "last eval: acc 0.2500 @ 10" in capsys.readouterr().out.split("eval @ 10")[-1]


def test_a_log_shorter_than_the_checkpoint_says_so(tmp_path, capsys):
    log = RunLog(str(tmp_path), is_main=True)
    log.start(keys.RUN_START)
    log.close()
    again = RunLog(str(tmp_path), is_main=True, resuming=True)
    again.resume(mllog_bytes=10**6, metrics_bytes=0)
    again.close()
    assert "fewer than the 1000000 it had at the checkpoint" in capsys.readouterr().out


def test_a_value_the_mllog_cannot_encode_is_an_error_not_a_lost_event(tmp_path):
    """mllog writes "Failed to encode" in place of such an event, and the compliance
    checker then reports the key as missing; the log refuses it where it is logged."""
    import pytest

    from mlperf.mllog import MlLog

    log = MlLog(str(tmp_path / "mllog.txt"))
    log.event(keys.EVAL_SAMPLES, 383)
    with pytest.raises(TypeError, match="'eval_samples'.*is not JSON"):
        log.event(keys.EVAL_SAMPLES, object.__repr__)  # e.g. a method not called
    lines = (tmp_path / "mllog.txt").read_text().splitlines()
    assert len(lines) == 1 and '"value": 383' in lines[0]


def test_numpy_values_are_logged_as_mllog_writes_them(tmp_path):
    import numpy as np

    from mlperf.mllog import MlLog

    log = MlLog(str(tmp_path / "mllog.txt"))
    log.event(keys.EVAL_ACCURACY, np.float32(0.5), metadata={"epoch_num": np.int64(3)})
    line = (tmp_path / "mllog.txt").read_text()
    assert '"value": 0.5' in line and '"epoch_num": 3' in line
