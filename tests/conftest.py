"""Test set-up: 8 fake CPU devices before jax is imported, plus shared small configs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()

# The test targets name one persistent compilation cache for their whole run
# (MULTIPOD_TEST_CACHE, tests/with_test_cache.sh): the many tests that compile the same
# small programs, in either xdist worker or in a training subprocess, compile each once.
# Without it the tests' training subprocesses compile afresh (the tests of the cache itself
# name their own directories). The user's own cache is never touched.
TEST_CACHE = os.environ.get("MULTIPOD_TEST_CACHE", "")
if TEST_CACHE:
    os.environ["MULTIPOD_COMPILATION_CACHE"] = TEST_CACHE
else:
    os.environ.setdefault("MULTIPOD_COMPILATION_CACHE", "none")

from launch.cli import relax_cpu_collective_timeouts  # noqa: E402

relax_cpu_collective_timeouts()  # also inherited by the tests' subprocesses

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mlperf.checkpoint import configure_checkpointing  # noqa: E402


def pytest_configure(config) -> None:
    """Process-wide settings as launch.train makes them at program start. A hook, not an
    import-time call: worker scripts import this module before jax.distributed starts,
    and configure_checkpointing asks jax for the process count."""
    configure_checkpointing()
    if TEST_CACHE:
        from mlperf import compilation_cache

        compilation_cache.enable(TEST_CACHE)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.environ.get("MULTIPOD_DATA_DIR", os.path.join(REPO, "..", "shared", "data"))


def cpu_env(devices: int = 8) -> dict[str, str]:
    """Environment for a subprocess with `devices` fake CPU devices."""
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )


def assert_bench_usage_error(args: list[str], message: str) -> None:
    """`python -m launch.bench.TOOL ARGS` (`args` = [TOOL, *ARGS]) fails with exit 2 and
    `message`, no traceback."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", f"launch.bench.{args[0]}", *args[1:]],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert message in out.stderr


def tiny_train_command(workdir, *overrides: str) -> list[str]:
    """`python -m launch.train` on the tiny BERT config, as a subprocess argv."""
    return [
        sys.executable,
        "-m",
        "launch.train",
        "--config",
        "configs/bert.py:tiny",
        "--workdir",
        str(workdir),
        *overrides,
    ]


def on_processes(train: list[str], processes: int, devices: int) -> list[str]:
    """`train` as is for one process, else under `launch.local` on N x `devices`."""
    if processes == 1:
        return train
    return [
        sys.executable,
        "-m",
        "launch.local",
        f"--processes={processes}",
        f"--devices_per_process={devices}",
        "--",
        *train,
    ]


# The one check a tiny BERT run's log fails: its accuracy is far below MLPerf's 0.712.
BERT_TARGET_NOT_REACHED = (
    "WARNING -  Failed checks for eval_accuracy : v['value'] >= 0.712 and v['value'] < 1.0"
)


def compliance_check(mllog) -> tuple[str, list[str]]:
    """The official MLPerf 0.7.0 compliance checker on a log: (its output, failed checks).

    The checker ends a log it accepts with `INFO - SUCCESS` and exit code 0, and one it
    rejects with its report (WARNING lines), `ERROR - FAILED` and exit code 1; failed
    checks are that report's lines. Anything else (it did not run, crashed, or exited
    otherwise) fails the calling test here, so a broken checker never reads as a clean log.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker"]
        + ["--usage", "training", "--ruleset", "0.7.0", str(mllog)],
        cwd=os.path.dirname(str(mllog)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    lines = output.splitlines()
    assert "Traceback" not in output, f"the compliance checker crashed:\n{output}"
    if proc.returncode == 0:
        assert "INFO - SUCCESS" in lines, f"the checker exited 0 without SUCCESS:\n{output}"
        return output, []
    assert proc.returncode == 1 and "ERROR - FAILED" in lines, (
        f"the compliance checker exited {proc.returncode} without its verdict:\n{output}"
    )
    failures = [
        line
        for line in lines
        if line.strip()
        and not line.startswith(("INFO - ", "ERROR - FAILED", "** Logging output"))
        and set(line) != {"-"}  # the separator between two messages
    ]
    assert failures, f"the compliance checker FAILED without saying which check:\n{output}"
    return output, failures


def small_bert_config(**overrides):
    """A BERT config small enough to compile in seconds (synthetic data, fp32 compute)."""
    from configs.bert import get_config

    c = get_config("tiny")
    c.model.update(
        vocab_size=96,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        mlp_dim=64,
        max_position=32,
        dropout_rate=0.0,
    )
    c.data.update(seq_length=16, max_predictions=4, vocab_size=96)
    c.precision.compute_dtype = "float32"
    c.optimizer.update(learning_rate=1e-2, warmup_steps=2)
    c.train.update(global_batch_size=16, steps=10, eval_batch_size=16, microbatches=1)
    c.mesh.ici_shape = (2, 4)
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def synthetic_bert_batch(
    batch_size: int, seq: int = 16, preds: int = 4, vocab: int = 96, seed: int = 0
) -> dict[str, np.ndarray]:
    """A deterministic random BERT batch with padding and unused prediction slots."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq // 2, seq + 1, size=batch_size)
    input_mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    input_ids = rng.integers(5, vocab, size=(batch_size, seq)).astype(np.int32) * input_mask
    segment_ids = ((np.arange(seq)[None] >= (lengths[:, None] // 2)) * input_mask).astype(np.int32)
    positions = np.stack(
        [rng.choice(np.arange(1, seq // 2), preds, replace=False) for _ in range(batch_size)]
    ).astype(np.int32)
    weights = (rng.random((batch_size, preds)) < 0.8).astype(np.float32)
    weights[:, 0] = 1.0
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions * (weights > 0),
        "masked_lm_ids": rng.integers(5, vocab, size=(batch_size, preds)).astype(np.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": rng.integers(0, 2, size=(batch_size,)).astype(np.int32),
    }


@pytest.fixture(scope="session")
def devices():
    devs = jax.devices()
    assert len(devs) == 8, "tests expect 8 fake CPU devices (conftest sets XLA_FLAGS)"
    return devs


@dataclasses.dataclass
class StepsRun:
    """What `train_steps` leaves behind: the trainer, its compiled step, the final state
    and the loss of every step."""

    trainer: object
    compiled: object
    state: dict
    losses: list[float]

    def params(self) -> dict:
        """The final parameters as numpy arrays."""
        return jax.tree.map(np.asarray, jax.device_get(self.state["params"]))


def train_steps(config, batches, devices=None) -> StepsRun:
    """Builds the config's trainer (no data preparation), compiles its first phase's train
    step and runs it on the given host batches (one process: host batch = global batch)."""
    from mlperf.trainer import build_trainer

    trainer = build_trainer(config, devices=devices, prepare_data=False)
    phase = trainer.phases[0]
    compiled = trainer.lower_train_step(phase).compile()
    state = trainer.init_state()
    key = trainer.partitioner.replicate(lambda: jax.random.key(0))
    layout = trainer.partitioner.data_layout(phase.global_batch_size)
    losses = []
    for host_batch in batches:
        batch = trainer.partitioner.host_to_global(host_batch, layout)
        state, metrics = compiled(state, batch, key)
        losses.append(float(metrics["loss"]))
    return StepsRun(trainer, compiled, state, losses)


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    """A real GCS-protocol server on 127.0.0.1 (launch/gcs_emulator.py) with the bucket
    `multipod-test`, and this process's (and its subprocesses') clients pointed at it."""
    from launch.gcs_emulator import GcsServer

    server = GcsServer(str(tmp_path / "gcs-root"))
    server.start()
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    server.create_bucket("multipod-test")
    _forget_cached_gcs_clients()
    yield server
    server.stop()
    _forget_cached_gcs_clients()


def _forget_cached_gcs_clients() -> None:
    """fsspec caches one gcsfs instance per set of options; a new server (another port)
    needs a new one."""
    import fsspec

    with contextlib_suppress():
        fsspec.filesystem("gs").clear_instance_cache()
    with contextlib_suppress():
        from gcsfs import GCSFileSystem

        GCSFileSystem.clear_instance_cache()


def contextlib_suppress():
    import contextlib

    return contextlib.suppress(Exception)
