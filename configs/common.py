"""Config blocks every benchmark shares: mesh, parallelism, precision, checkpoints, train.

Each benchmark file starts from these and sets only what differs; any value can still
be overridden from the command line (`--config.mesh.ici_shape='(2,4)'`).
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict


def mesh_block() -> ConfigDict:
    """A data-parallel mesh over every device; `-1` is filled from the device count."""
    return ConfigDict(
        dict(
            axes=("data", "model"),
            ici_shape=(-1, 1),
            dcn_shape=(1, 1),
            # Devices the mesh uses: 0 = all; N = the first N (one process only). On a
            # CPU, fewer and larger devices can be faster than many fake ones.
            num_devices=0,
        )
    )


def parallel_block(**extra: Any) -> ConfigDict:
    """Weight-update sharding on, XLA's gradient reduction; `extra` adds keys (rules)."""
    return ConfigDict(
        dict(
            weight_update_sharding=True,
            fsdp=False,
            # Gradient reduction over `data`: "xla" (XLA's reduce-scatter / all-reduce) or
            # linear_pipeline, ring, tree, bidirectional_exchange (parallel/collectives.py).
            grad_allreduce="xla",
            grad_bucket_bytes=4 << 20,
            grad_allreduce_chunks=0,  # linear_pipeline chunks; 0: the cost model's choice
            # Type of the gradients while summed over `data`: float32, bfloat16 (Google's
            # v0.7 BERT) or float16 (x grad_loss_scale before the cast, / after).
            grad_reduce_dtype="float32",
            grad_loss_scale=1024.0,
            # Where the data-parallel reduction is written: "shard_map" (explicit, above)
            # or "annotations" (XLA's partitioner; float32 and grad_allreduce=xla only).
            grad_path="shard_map",
            **extra,
        )
    )


def precision_block() -> ConfigDict:
    """bf16 compute, fp32 master parameters and optimizer state."""
    return ConfigDict(dict(compute_dtype="bfloat16", param_dtype="float32"))


def checkpoint_block() -> ConfigDict:
    """Checkpoints (mlperf/checkpoint/) at each eval: the last 2 plus the best."""
    return ConfigDict(
        {
            "enabled": True,
            "dir": "",  # "": WORKDIR/checkpoints
            "every_steps": 0,  # also every N steps (0: only at evals and on SIGTERM)
            "at_eval": True,
            "keep": 2,
            "keep_best": 1,
            "async": True,
            # A logged loss above factor x the running median of the last `window` starts
            # an instability: checkpoints from then on are not "last good".
            "loss_spike_factor": 10.0,
            "loss_spike_window": 20,
        }
    )


def train_block(**values: Any) -> ConfigDict:
    """The loop's train settings; `values` override the defaults or add task keys."""
    train = dict(
        global_batch_size=256,
        microbatches=1,
        steps=1000,
        eval_every_samples=0,  # 0: 10 evals over the run
        eval_batch_size=256,
        log_every_steps=10,
        # Train steps one host dispatch runs (mlperf/dispatch.py): the host's per-dispatch
        # work is paid once per that many steps. log_every_steps and
        # checkpoint.every_steps must be multiples of it; around a phase end or an eval
        # off its grid the loop runs single steps.
        steps_per_dispatch=1,
        target=0.0,
        stop_at_target=True,
    )
    train.update(values)
    return ConfigDict(train)
