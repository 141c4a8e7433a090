"""Checkpoint save and restore time, a local folder against a bucket, in one run.

    python -m launch.bench_checkpoint_store --config configs/bert.py:base \\
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

from absl import app, flags
from ml_collections import config_flags

from launch.cli import parse_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/bert.py:base.")
_LOCAL = flags.DEFINE_string("local", None, "A local folder for the local saves.", required=True)
_BUCKET = flags.DEFINE_string("bucket", None, "A gs:// folder for the bucket saves.", required=True)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Saves (and restores) per destination.")


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
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from input_pipeline import storage
    from mlperf.checkpoint import configure_checkpointing
    from mlperf.train_state import param_count
    from mlperf.trainer import build_trainer

    if not storage.is_url(_BUCKET.value):
        raise app.UsageError(f"--bucket {_BUCKET.value}: give a gs:// URL")
    configure_checkpointing()
    trainer = build_trainer(_CONFIG.value, prepare_data=False)
    state = trainer.init_state()
    # A first save and restore, untimed: it compiles the conversions to stored shapes.
    measure(trainer, state, storage.resolve(_LOCAL.value) + "-warmup", 1)
    rows = {}
    for name, where in (("local", storage.resolve(_LOCAL.value)), ("bucket", _BUCKET.value)):
        rows[name] = measure(trainer, state, where, _REPEATS.value)
    print(
        f"{_CONFIG.value.variant}: {param_count(trainer.layout) / 1e6:.1f}M parameters, "
        f"{rows['local']['mib']:.0f} MiB per checkpoint, median of {_REPEATS.value}"
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
    app.run(main, flags_parser=parse_flags)
