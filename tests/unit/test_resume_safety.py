"""Safe resumes, fast: config changes refused before compiling, retention that keeps the
last good and the newest evaluated checkpoint, loss spikes, failed saves as one line, the
free space a resume needs, Ctrl-C, progress after a resume, the goodput ledger.

The whole-run versions of these (a real run interrupted, resumed, filled up) are in
tests/system/test_resume_safety_runs.py (slow).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess

import jax
import numpy as np
import pytest
from conftest import small_bert_config

from mlperf.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    CheckpointSaveError,
    ConfigChangeError,
    PreemptionNotice,
    SpikeRule,
    check_config_change,
    committed_steps,
    free_space_needed,
    last_good,
    plain_config,
)
from mlperf.checkpoint.config_change import config_changes, is_trajectory_neutral
from mlperf.checkpoint.integrity import FIRST_RUN_BYTES, LOG_ROOM_BYTES, directory_bytes
from mlperf.checkpoint.manager import save_failure
from mlperf.checkpoint.resume import set_aside_previous_run
from mlperf.goodput import Goodput
from mlperf.loop_state import LoopState
from mlperf.reporting import Progress

# ---- item 1: a resume refuses a config change that alters the trajectory -----------------


def test_trajectory_changes_are_refused_naming_each_key_with_both_values():
    saved = plain_config(small_bert_config())
    now = plain_config(
        small_bert_config(**{"train.steps": 80, "optimizer.learning_rate": 1e6, "seed": 7})
    )
    with pytest.raises(ConfigChangeError) as e:
        check_config_change(saved, now, allowed=(), where="ckpt/60")
    message = str(e.value)
    assert "\n" not in message  # one line
    for shown in ("train.steps: 10 -> 80", "optimizer.learning_rate: 0.01 -> 1000000.0"):
        assert shown in message
    assert "seed: 0 -> 7" in message
    assert "--allow_config_change=optimizer.learning_rate,seed,train.steps" in message


def test_neutral_changes_pass_and_named_keys_are_allowed():
    saved = plain_config(small_bert_config())
    neutral = {
        "train.log_every_steps": 1,
        "checkpoint.keep": 7,
        "mesh.ici_shape": (4, 2),
        "train.eval_batch_size": 32,
        "model.attention_cpu_block_bytes": 0,
    }
    now = plain_config(small_bert_config(**neutral))
    changes = check_config_change(saved, now, allowed=(), where="x")
    assert {c.key for c in changes} == set(neutral) and all(c.neutral for c in changes)
    forced = plain_config(small_bert_config(**{"train.steps": 12}))
    (change,) = check_config_change(saved, forced, allowed={"train.steps"}, where="x")
    assert (change.key, change.saved, change.now, change.neutral) == ("train.steps", 10, 12, False)


def test_a_new_key_alters_the_trajectory_by_default():
    assert not is_trajectory_neutral("optimizer.some_new_knob")
    assert not is_trajectory_neutral("train.steps")
    assert is_trajectory_neutral("checkpoint.some_new_retention_knob")
    assert is_trajectory_neutral("model.eval_head_chunks")  # the eval only
    assert not is_trajectory_neutral("model.hidden_size")
    (change,) = config_changes({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}})
    assert (change.key, change.saved, change.now) == ("a.c", "<absent>", 2)


def _checkpoint_of(config, workdir) -> Checkpointer:
    """A real checkpoint (step 10) of `config`'s initial state in workdir/checkpoints,
    with the metadata a run writes."""
    from mlperf.train_state import stored_state_codec
    from mlperf.trainer import build_trainer

    trainer = build_trainer(config)
    state = trainer.init_state()
    meta = LoopState(step=10, config=plain_config(config), rng_key=[0, 0]).to_meta()
    c = Checkpointer(CheckpointConfig.from_config(config, str(workdir)), "mlm_accuracy")
    c.codec = stored_state_codec(trainer.layout, trainer.tx, trainer.partitioner)  # as run
    c.save(10, state, meta, None)
    c.close()
    return c


def test_resume_with_a_changed_schedule_stops_before_compiling(tmp_path, monkeypatch):
    from mlperf import train, trainer

    # The prepared vocabulary (114 words) does not split over a model axis of 4.
    config = small_bert_config(**{"mesh.ici_shape": (8, 1)})
    _checkpoint_of(config, tmp_path)
    compiled = []
    monkeypatch.setattr(trainer.Trainer, "lower_train_step", lambda *a: compiled.append(a))
    with pytest.raises(ConfigChangeError, match=r"train\.steps: 10 -> 12"):
        train.run(small_bert_config(**{"train.steps": 12, "mesh.ici_shape": (8, 1)}), str(tmp_path))
    assert not compiled  # refused before any train step was lowered
    with pytest.raises(ValueError, match="--allow_config_change names train.stepz"):
        train.run(config, str(tmp_path), allow_config_change=["train.stepz"])


# ---- item 2: loss spikes and the last good checkpoint -----------------------------------


def test_a_loss_spike_starts_an_instability_and_names_the_checkpoint_before_it():
    rule, state = SpikeRule(factor=10.0, window=8), LoopState()
    for step, loss in enumerate([4.0, 3.9, 3.8, 3.7, 3.6, 3.5], start=1):
        assert rule.observe(state, step, loss) is None
    message = rule.observe(state, 7, 1.1e12)
    assert state.unstable_since == 7 and "loss spike at step 7" in message
    assert rule.observe(state, 8, 5e11) is None and state.unstable_since == 7
    saved = [(4, "c/4"), (6, "c/6"), (8, "c/8")]
    assert last_good(saved, state.unstable_since) == "c/6"
    rule.observe(state, 9, 3.4)  # back in range: stable again
    assert state.unstable_since is None and last_good(saved, None) == "c/8"
    with pytest.raises(ValueError, match="loss_spike_factor"):
        SpikeRule.from_config(small_bert_config(**{"checkpoint.loss_spike_factor": 1.0}))


def _small_state():
    return {"w": jax.numpy.arange(64.0).reshape(8, 8)}


def test_retention_keeps_the_newest_evaluated_and_the_last_good_checkpoint(tmp_path):
    c = Checkpointer(CheckpointConfig(str(tmp_path), keep=1, keep_best=0), "acc")
    c.save(1, _small_state(), {}, None, {"acc": 0.5})  # the only one with an eval
    c.save(2, _small_state(), {}, None)
    c.protected.unstable_since = 3  # a loss spike began at step 3
    c.save(3, _small_state(), {}, None)
    c.save(4, _small_state(), {}, None)
    c.close()
    assert committed_steps(str(tmp_path)) == [1, 2, 4]


def test_keep_zero_is_an_error_naming_the_allowed_range():
    with pytest.raises(ValueError, match=r"checkpoint.keep=0: must be >= 1"):
        CheckpointConfig.from_config(small_bert_config(**{"checkpoint.keep": 0}), "/w")


# ---- item 4: a failed save is one line; a resume needs room for one checkpoint ----------


def _immutable(path, on: bool) -> bool:
    """chattr +i/-i (root: permissions do not stop root); False if unsupported."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555 if on else 0o755)
        return True
    proc = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    return proc.returncode == 0


def test_a_save_into_an_unwritable_directory_is_one_line_with_path_and_errno(tmp_path):
    c = Checkpointer(CheckpointConfig(str(tmp_path), keep=3), "acc")
    c.save(1, _small_state(), {}, None)
    c.wait()
    if not _immutable(tmp_path, True):
        pytest.skip("cannot make a directory unwritable here")
    try:
        with pytest.raises(CheckpointSaveError) as e:
            c.save(2, _small_state(), {}, None)
            c.wait()
    finally:
        _immutable(tmp_path, False)
    c.close()
    message = str(e.value)
    assert committed_steps(str(tmp_path)) == [1]  # the complete checkpoint is kept
    assert "\n" not in message and str(tmp_path) in message
    assert "[Errno 1]" in message or "[Errno 13]" in message, message


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MiB ext4 filesystem, loop-mounted (root only): a real full disk."""
    image, mount = tmp_path / "disk.img", tmp_path / "disk"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(4 << 20)
    steps = (["mkfs.ext4", "-q", "-F", str(image)], ["mount", "-o", "loop", str(image), str(mount)])
    for argv in steps:
        if subprocess.run(argv, capture_output=True).returncode != 0:
            pytest.skip("no loop-mounted filesystem here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_mid_save_is_one_line_and_keeps_the_complete_checkpoints(tiny_disk):
    directory = tiny_disk / "checkpoints"
    c = Checkpointer(CheckpointConfig(str(directory), keep=3), "acc")
    c.save(1, _small_state(), {}, None)  # 256 bytes of arrays: fits
    noise = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    big = {"w": jax.numpy.asarray(noise)}  # 4 MiB that do not compress: does not fit
    with pytest.raises(CheckpointSaveError) as e:
        c.save(2, big, {}, None)
        c.wait()
    c.close()
    message = str(e.value)
    assert "\n" not in message and str(directory) in message
    assert "[Errno 28]" in message and "ENOSPC" in message, message
    assert committed_steps(str(directory)) == [1]


def test_save_failure_names_the_errno_behind_wrapped_errors():
    inner = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/ck/5/state/x")
    try:
        try:
            raise inner
        except OSError as e:
            raise RuntimeError("Error writing tensorstore") from e
    except RuntimeError as outer:
        line = save_failure(outer, "/ck/5")
    assert line == "writing checkpoint /ck/5/state/x failed: [Errno 28] No space left on " + (
        "device (ENOSPC)"
    )
    text = ValueError("UNKNOWN: Error writing local file: [errno 28] No space left")
    assert "[Errno 28]" in save_failure(text, "/ck/6") and "/ck/6" in save_failure(text, "/ck/6")


def test_free_space_needed_follows_the_last_checkpoint_not_a_fixed_floor(tmp_path):
    assert free_space_needed(str(tmp_path)) == FIRST_RUN_BYTES
    step = tmp_path / "40" / "state"
    step.mkdir(parents=True)
    (step / "blob").write_bytes(b"\0" * (3 << 20))
    need = free_space_needed(str(tmp_path))
    assert need == directory_bytes(str(tmp_path / "40")) + LOG_ROOM_BYTES < FIRST_RUN_BYTES


# ---- item 6: Ctrl-C, MFU after a resume, logs of a run whose checkpoints were deleted ----


def test_ctrl_c_asks_for_a_checkpoint_and_a_second_one_interrupts():
    before = signal.getsignal(signal.SIGINT)
    notice = PreemptionNotice()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert notice.reached(5) and notice.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        notice.close()
    assert signal.getsignal(signal.SIGINT) is before


def test_first_progress_line_after_a_resume_counts_only_the_steps_run(monkeypatch, capsys):
    clock = iter([0.0, 100.0, 110.0])  # created; the loop begins at step 600; 10 s later
    monkeypatch.setattr("mlperf.reporting.time.perf_counter", lambda: next(clock))
    p = Progress(1000, "acc", peak_flops_per_s=1e9, flops_per_row=1e6)
    p.begin(step=600, samples=600 * 64, model_flops=600 * 64 * 1e6)
    for _ in range(10):
        p.step_done(64)
    p.log(610, 610 * 64, {"loss": 1.0, "learning_rate": 1e-3})
    assert p.samples_per_s == pytest.approx(64.0)  # 640 samples in 10 s, not 39040
    assert p.mfu == pytest.approx(0.064)
    assert "ETA 6m30s" in capsys.readouterr().out  # 390 steps left at 1 step/s


def test_logs_of_a_run_without_checkpoints_are_moved_aside(tmp_path):
    for name in ("mllog.txt", "metrics.jsonl", "result.json"):
        (tmp_path / name).write_text("old")
    line = set_aside_previous_run(str(tmp_path))
    moved = tmp_path / "previous_run_1"
    assert f"moved mllog.txt, metrics.jsonl, result.json to {moved}" in line
    assert (moved / "mllog.txt").read_text() == "old" and not (tmp_path / "mllog.txt").exists()
    assert set_aside_previous_run(str(tmp_path)) is None


# ---- the goodput ledger and the loop state --------------------------------------------


def test_goodput_moves_the_redone_steps_to_restart_lost(tmp_path):
    g = Goodput(train_s=100.0, compile_s=20.0, train_steps=50, last_step=50)
    g.write(str(tmp_path))
    again = Goodput.read(str(tmp_path))
    again.resumed_at(40)  # the checkpoint was at step 40: steps 41..50 are trained again
    assert again.restart_lost_s == pytest.approx(20.0) and again.train_s == pytest.approx(80.0)
    ledger = again.as_dict()
    assert ledger["attempts"] == 2 and ledger["total_s"] == pytest.approx(120.0)
    assert ledger["train_fraction"] == pytest.approx(80 / 120, abs=1e-4)


def test_loop_state_is_the_checkpoint_metadata():
    state = LoopState(step=7, samples=448, eval_metrics={"acc": np.float32(0.5)}, seed=3)
    meta = json.loads(json.dumps(state.to_meta(), default=float))
    meta["shapes"] = {"['w']": [[8, 8], "float32"]}  # added by the checkpointer: ignored
    assert LoopState.from_meta(meta) == LoopState(
        step=7, samples=448, eval_metrics={"acc": 0.5}, seed=3
    )
    del meta["loss_history"]  # a checkpoint written before a field existed: its default
    assert LoopState.from_meta(meta).loss_history == []
