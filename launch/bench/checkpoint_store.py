"""Checkpoint save and restore time, a local folder against a bucket, in one run.

    python -m launch.bench.checkpoint_store --config configs/bert.py:base \\
        --local /tmp/ckpt-bench --bucket gs://my-bucket/ckpt-bench [--repeats 3]

Builds the config's train state (no data prepared), saves and restores it once untimed
(compiling the conversions to stored shapes), then saves it `--repeats` times
through the run's own Checkpointer (asynchronous orbax save, the manifest) into each
destination, timing `save` + `wait` (committed), then restores the newest one into the
same shardings. Prints a table with the bucket / local ratio. Point a bucket URL at a
GCS-protocol server with STORAGE_EMULATOR_HOST (docs/storage.md).
"""

from __future__ import annotations

import gc
import statistics
import time

from absl import flags

from launch.bench.common import CONFIG, REPEATS, run
from launch.cli import usage_error

# Checked in main, not `required`: a test process imports several tools, and absl checks a
# required flag whenever any of them parses flags.
_LOCAL = flags.DEFINE_string("local", "", "A local folder for the local saves.")
_BUCKET = flags.DEFINE_string("bucket", "", "A gs:// folder for the bucket saves.")


def measure(trainer, state, directory: str, repeats: int) -> dict[str, float]:
    """Median seconds of save+commit and of restore of `state` in `directory`."""
    import jax

    from input_pipeline import storage
    from mlperf.checkpoint import CheckpointConfig, Checkpointer
    from mlperf.train_state import stored_state_codec

    storage.rmtree(directory)
    cfg = CheckpointConfig(directory=directory, keep=2, keep_best=0)
    ckpt = Checkpointer(cfg, best_metric="none")
    ckpt.codec = stored_state_codec(trainer.layout, trainer.tx, trainer.partitioner)
    saves, restores = [], []
    for i in range(1, repeats + 1):
        start = time.perf_counter()
        ckpt.save(i, state, {"step": i}, None)
        ckpt.wait()
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        restored = ckpt.restore_step(i, trainer.layout.abstract_train_state)
        jax.block_until_ready(restored.state)
        restores.append(time.perf_counter() - start)
        del restored  # one restored copy at a time beside the saved state
        gc.collect()
    ckpt.close()
    nbytes = sum(storage.file_sizes(storage.join(directory, str(repeats))).values())
    storage.rmtree(directory)
    return {
        "save_s": statistics.median(saves),
        "restore_s": statistics.median(restores),
        "mib": nbytes / (1 << 20),
    }


def main(argv: list[str]) -> None:
    from input_pipeline import storage
    from mlperf.checkpoint import configure_checkpointing
    from mlperf.train_state import param_count
    from mlperf.trainer import build_trainer

    if CONFIG.value is None or not _LOCAL.value:
        usage_error("give --config, --local DIR and --bucket gs://BUCKET/FOLDER")
    if not storage.is_url(_BUCKET.value):
        usage_error(f"--bucket {_BUCKET.value!r}: give a gs:// URL")
    configure_checkpointing()
    trainer = build_trainer(CONFIG.value, prepare_data=False)
    state = trainer.init_state()
    # A first save and restore, untimed: it compiles the conversions to stored shapes.
    measure(trainer, state, storage.resolve(_LOCAL.value) + "-warmup", 1)
    rows = {}
    for name, where in (("local", storage.resolve(_LOCAL.value)), ("bucket", _BUCKET.value)):
        rows[name] = measure(trainer, state, where, REPEATS.value)
    print(
        f"{CONFIG.value.variant}: {param_count(trainer.layout) / 1e6:.1f}M parameters, "
        f"{rows['local']['mib']:.0f} MiB per checkpoint, median of {REPEATS.value}"
    )
    print("| destination | save + commit (s) | restore (s) |")
    print("|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['save_s']:.2f} | {r['restore_s']:.2f} |")
    local, bucket = rows["local"], rows["bucket"]
    print(
        f"| bucket / local | {bucket['save_s'] / local['save_s']:.2f}x | "
        f"{bucket['restore_s'] / local['restore_s']:.2f}x |"
    )


if __name__ == "__main__":
    run(main)
