"""A finished (or stopped) run's model, read back from one of its checkpoints for inference.

`read_run` reads what a checkpoint says about itself (its step, benchmark and config)
without touching an array; `load_trained` builds the model for that config on the devices
present, on a mesh of their choosing (all of them on `data` by default: whatever mesh
wrote the checkpoint), and restores the parameters into it. The model's sizes that
training learnt from its data (vocabulary, classes) come from the checkpoint's own
shapes, so nothing is prepared or read but the checkpoint.

Used by `launch.predict` and `launch.export`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from ml_collections import ConfigDict

BENCHMARKS = ("bert", "transformer", "ssd", "maskrcnn")


class WrongBenchmarkError(ValueError):
    """The checkpoint belongs to another benchmark than the one asked for."""


@dataclasses.dataclass(frozen=True)
class RunCheckpoint:
    """One committed checkpoint of a run: where it is and what it says about itself."""

    directory: str  # the run's checkpoint directory
    step: int
    benchmark: str
    config: ConfigDict
    shapes: dict[str, Any]  # leaf path -> [shape, dtype], as the checkpoint stores them

    def shape(self, path: str) -> tuple[int, ...]:
        """The stored shape of the parameter at `path` ("['params']['embed']['embedding']")."""
        return tuple(self.shapes[path][0])


def read_run(
    workdir: str,
    step: int = -1,
    checkpoint_dir: str = "",
    benchmarks: Sequence[str] = BENCHMARKS,
    verb: str = "",
) -> RunCheckpoint:
    """The newest (or `step`'s) checkpoint of the run in `workdir` (or `checkpoint_dir`);
    a FileNotFoundError when there is none, a WrongBenchmarkError when its benchmark is not
    one of `benchmarks` (`verb` names what was asked, for the message)."""
    from input_pipeline import storage
    from mlperf.checkpoint import checkpoint_metadata

    # Local folders and buckets (gs://) alike, as the checkpointer writes them.
    if checkpoint_dir:
        directory = storage.resolve(checkpoint_dir)
    else:
        directory = storage.join(storage.resolve(workdir), "checkpoints")
    if not storage.isdir(directory):
        raise FileNotFoundError(
            f"no checkpoint directory {directory}: point --workdir at a run's work directory"
        )
    step, meta = checkpoint_metadata(directory, step, workdir)
    config = ConfigDict(meta["config"])
    benchmark = str(meta.get("benchmark") or config.benchmark)
    if benchmark not in benchmarks:
        what = f"`{verb}`" if verb else "this"
        raise WrongBenchmarkError(
            f"{storage.join(directory, str(step))} is a {benchmark} checkpoint; {what} needs "
            f"a {' or '.join(benchmarks)} run."
        )
    return RunCheckpoint(directory, step, benchmark, config, meta["shapes"])


def default_output(workdir: str, name: str, step: int) -> str:
    """W/<name>_step<N>, where predict and export write by default (in the current folder
    for a work directory in a bucket: outputs are written locally)."""
    from input_pipeline import storage

    folder = os.path.abspath(".") if storage.is_url(workdir) else workdir
    return os.path.join(folder, f"{name}_step{step}")


def _only_shape(run: RunCheckpoint, *parts: str) -> tuple[int, ...]:
    return run.shape("['params']" + "".join(f"[{p}]" for p in parts))


def sizes_from_checkpoint(run: RunCheckpoint, vocab_size: int = 0) -> ConfigDict:
    """The run's config with the sizes training took from its data (vocabulary, classes)
    set from the checkpoint's shapes: the model then builds without the data. BERT's
    `vocab_size`, when given, is its tokenizer's: table rows past it are padding."""
    config = ConfigDict(run.config.to_dict())
    if run.benchmark == "bert":
        config.model.vocab_size = _only_shape(run, "'word_embeddings'", "'embedding'")[0]
        if vocab_size:
            config.data.vocab_size = vocab_size
    elif run.benchmark == "transformer":
        config.data.vocab_size = _only_shape(run, "'embed'", "'embedding'")[0]
    elif run.benchmark == "maskrcnn":
        config.model.num_classes = _only_shape(run, "'box_head'", "'cls'", "'kernel'")[-1] - 1
    elif run.benchmark == "ssd":
        # The first level's class head has anchors x classes outputs; the box head
        # anchors x 4.
        classes = _only_shape(run, "'conf_heads'", "0", "'kernel'")[-1]
        boxes = _only_shape(run, "'loc_heads'", "0", "'kernel'")[-1]
        config.model.num_classes = classes * 4 // boxes
    return config


def inference_mesh(config: ConfigDict, ici_shape: Sequence[int] = ()) -> ConfigDict:
    """`config` set to run on this process's devices: `ici_shape` (default: every device on
    the first mesh axis), one slice, and spatial partitioning only where the new mesh
    still has the model axis it needs."""
    config = ConfigDict(config.to_dict())
    axes = tuple(config.mesh.axes)
    shape = tuple(ici_shape) or (-1,) + (1,) * (len(axes) - 1)
    if len(shape) != len(axes):
        raise ValueError(f"--ici_shape {shape} needs one size per mesh axis {axes}")
    config.mesh.ici_shape = shape
    config.mesh.dcn_shape = (1,) * len(axes)
    config.mesh.num_devices = 0
    partitions = config.model.get("spatial_partitions", 1)
    model_size = dict(zip(axes, shape, strict=True)).get("model", 1)
    if partitions > 1 and model_size != partitions:
        config.model.spatial_partitions = 1
    return config


@dataclasses.dataclass
class TrainedModel:
    """A checkpoint's parameters restored on the mesh, with what built them."""

    run: RunCheckpoint
    config: ConfigDict  # the run's, with sizes and mesh set for inference
    trainer: Any  # mlperf.trainer.Trainer: task, partitioner, layout
    params: Any  # the sharded parameter tree (batch-norm statistics included)

    @property
    def task(self):
        return self.trainer.task

    @property
    def partitioner(self):
        return self.trainer.partitioner

    @property
    def layout(self):
        return self.trainer.layout

    def host_params(self) -> Any:
        """The parameters as one host's numpy arrays (a nested dict)."""
        import jax
        import numpy as np

        return jax.tree.map(np.asarray, jax.device_get(self.params))


def load_trained(
    run: RunCheckpoint, ici_shape: Sequence[int] = (), vocab_size: int = 0
) -> TrainedModel:
    """The model of `run`'s config on this process's devices, with the checkpoint's
    parameters restored into their shardings (`vocab_size`: see sizes_from_checkpoint)."""
    from mlperf.checkpoint import CheckpointConfig, Checkpointer
    from mlperf.train_state import stored_state_codec
    from mlperf.trainer import build_trainer

    config = inference_mesh(sizes_from_checkpoint(run, vocab_size), ici_shape)
    trainer = build_trainer(config, prepare_data=False)
    checkpointer = Checkpointer(
        CheckpointConfig(run.directory), trainer.task.target_metric, read_only=True
    )
    # Optimizer leaves are stored in parameter shapes: the codec makes this mesh's views.
    checkpointer.codec = stored_state_codec(trainer.layout, trainer.tx, trainer.partitioner)
    try:
        restored = checkpointer.restore_step(run.step, trainer.layout.abstract_train_state)
    finally:
        checkpointer.close()
    return TrainedModel(run, config, trainer, restored.state["params"])
