"""TensorBoard summaries, the profile window, MFU in progress lines, and the peak FLOP/s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from mlperf.peak_flops import peak_for_devices
from mlperf.profiling import ProfileWindow, parse_steps, trace_steps
from mlperf.reporting import Progress
from mlperf.summaries import RunSummaries, read_scalars
from parallel.hardware import bf16_peak_flops_per_device


def test_summaries_round_trip(tmp_path):
    s = RunSummaries(str(tmp_path), enabled=True)
    for step in (10, 20):
        s.train(step, {"loss": 5.0 - step / 10, "learning_rate": 1e-3 * step}, 123.0, 0.25)
    s.eval(20, {"mlm_accuracy": 0.5, "eval_examples": 64, "note": "not a number"})
    s.close()
    scalars = read_scalars(s.logdir)
    assert scalars["train/loss"] == [(10, 4.0), (20, 3.0)]
    assert [v for _, v in scalars["train/learning_rate"]] == pytest.approx([0.01, 0.02])
    assert scalars["perf/samples_per_s"][-1] == (20, 123.0)
    assert scalars["perf/mfu"][-1] == (20, 0.25)
    assert scalars["eval/mlm_accuracy"] == [(20, 0.5)]
    assert "eval/note" not in scalars


def test_summaries_disabled_writes_nothing(tmp_path):
    s = RunSummaries(str(tmp_path), enabled=False)
    s.train(1, {"loss": 1.0})
    s.close()
    assert not (tmp_path / "tensorboard").exists()


def test_progress_mfu_and_result_fields(capsys):
    p = Progress(10, "acc", enabled=True, peak_flops_per_s=1e9, flops_per_row=1e6)
    for _ in range(5):
        p.step_done(100)
    p.log(5, 500, {"loss": 1.0, "learning_rate": 0.1})
    # MFU = rows/s x FLOPs per row / peak (one sample a row here), whatever the rate was.
    assert p.mfu == pytest.approx(p.samples_per_s * 1e6 / 1e9)
    assert "MFU" in capsys.readouterr().out
    for _ in range(5):
        p.step_done(100)
    fields = p.result_fields(run_time_s=2.0, samples=1000)
    assert fields["samples_per_s"] == 500.0
    assert fields["model_flops_per_s"] == pytest.approx(1000 * 1e6 / 2.0)
    assert fields["mfu"] == pytest.approx(0.5)


def test_packed_rows_count_their_flops_once(monkeypatch):
    """10 steps of 42 packed rows holding 63 samples in 10 s: 63 samples/s, and the
    FLOPs of 42 rows a second, not of 63."""
    import mlperf.reporting as reporting

    clock = iter([0.0, 0.0, 10.0])
    monkeypatch.setattr(reporting.time, "perf_counter", lambda: next(clock))
    p = Progress(100, "acc", enabled=False, peak_flops_per_s=1e9, flops_per_row=1e6)
    p.begin()
    for _ in range(10):
        p.step_done(42)
    p.log(10, 630, {"loss": 1.0, "learning_rate": 0.1})
    assert p.samples_per_s == pytest.approx(63.0)
    assert p.mfu == pytest.approx(42 * 1e6 / 1e9)
    assert p.result_fields(10.0, 630)["model_flops_per_s"] == pytest.approx(42e6)


def test_progress_rate_leaves_out_eval_and_save_time(monkeypatch):
    """A window of 10 s that held a 6 s eval trained 100 samples in 4 s: 25 samples/s."""
    import mlperf.reporting as reporting

    p = Progress(10, "acc", enabled=False)
    clock = iter([100.0, 110.0, 120.0])
    monkeypatch.setattr(reporting.time, "perf_counter", lambda: next(clock))
    p.begin()
    p.log(1, 100, {"loss": 1.0, "learning_rate": 0.1}, paused_s=6.0)
    assert p.samples_per_s == pytest.approx(25.0)
    p.log(2, 200, {"loss": 1.0, "learning_rate": 0.1})
    assert p.samples_per_s == pytest.approx(10.0)


def test_progress_without_peak_has_no_mfu(capsys):
    p = Progress(10, "acc", enabled=True)
    p.log(1, 10, {"loss": 1.0, "learning_rate": 0.1})
    assert p.mfu is None and "MFU" not in capsys.readouterr().out
    assert p.result_fields(1.0, 10)["mfu"] is None


def test_cpu_peak_is_measured_and_tpu_peaks_are_data():
    peak = peak_for_devices(jax.devices())
    assert peak.flops_per_s > 1e8 and "measured" in peak.source
    assert bf16_peak_flops_per_device("TPU v4") == 275e12
    assert bf16_peak_flops_per_device("TPU v3") == 61.5e12  # one of a chip's two cores
    assert bf16_peak_flops_per_device("TPU v5 lite") == 197e12
    assert bf16_peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
    assert bf16_peak_flops_per_device("NVIDIA H200") == 989e12
    assert bf16_peak_flops_per_device("Some Accelerator") is None


def test_profile_window_traces_the_steps(tmp_path):
    window = ProfileWindow("1:3", str(tmp_path))
    f = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((64, 64))
    started = []
    for step in range(5):
        window.before_step(step)
        started.append(window.active)
        x = f(x)
        window.after_step(step, x)
    window.close()
    assert started == [False, True, True, False, False]
    assert window.done and window.trace_files()


def test_profile_window_closes_when_the_run_ends_inside(tmp_path):
    window = ProfileWindow("2:100", str(tmp_path))
    for step in range(4):
        window.before_step(step)
        window.after_step(step)
    assert window.active
    window.close()
    assert not window.active and window.trace_files()


def test_trace_steps_carries_the_state_through_the_traced_steps(tmp_path):
    said = []
    step = jax.jit(lambda x: (x + 1.0, x.sum()))
    logdir = trace_steps(str(tmp_path), 3, step, jnp.zeros(4), said.append)
    assert logdir == str(tmp_path / "profile")
    assert list((tmp_path / "profile").glob("plugins/profile/*/*.xplane.pb"))
    assert said == [f"wrote a trace of 3 steps to {logdir}"]


def test_a_profiler_that_fails_costs_the_trace_not_the_caller(tmp_path, monkeypatch):
    """A GPU without CUPTI, say: the failure is reported and the caller goes on."""

    def no_profiler(logdir):
        raise RuntimeError("CUPTI is not available")

    monkeypatch.setattr(jax.profiler, "start_trace", no_profiler)
    said = []
    step = jax.jit(lambda x: (x + 1.0, x.sum()))
    assert trace_steps(str(tmp_path), 2, step, jnp.zeros(4), said.append) is None
    assert said == [
        f"no trace written to {tmp_path / 'profile'}: RuntimeError: CUPTI is not available"
    ]


@pytest.mark.parametrize("spec", ["5", "a:b", "3:3", "4:2", "-1:2", "1:2:3"])
def test_bad_profile_steps_are_clear_errors(spec):
    with pytest.raises(ValueError, match="profile_steps"):
        parse_steps(spec)


def test_no_profile_steps_means_no_profiling(tmp_path):
    window = ProfileWindow("", str(tmp_path))
    window.before_step(0)
    assert not window.enabled and not window.active
