"""What the generic loop needs from a benchmark: the Task protocol and training phases."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Protocol

import jax
import numpy as np
from flax import nnx

Batch = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Phase:
    """A stretch of training with one batch size and input shape (BERT: seq 128, then 512)."""

    name: str
    global_batch_size: int
    steps: int
    learning_rate: float
    warmup_steps: int
    decay_steps: int
    data: dict[str, Any]  # task-specific input settings, e.g. {"seq_length": 128}


def single_phase(config, data: dict[str, Any]) -> Phase:
    """The one phase of a task trained at one batch size and input shape, from the
    config's train / optimizer blocks."""
    return Phase(
        name="train",
        global_batch_size=config.train.global_batch_size,
        steps=config.train.steps,
        learning_rate=config.optimizer.learning_rate,
        warmup_steps=config.optimizer.warmup_steps,
        decay_steps=config.optimizer.decay_steps or config.train.steps,
        data=data,
    )


class Task(Protocol):
    """A benchmark the loop can drive; every method is pure and mesh-free."""

    benchmark: str  # MLPerf benchmark name, e.g. "bert"
    target_metric: str  # key of finalize_eval's output compared against the target
    target_value: float

    def phases(self) -> list[Phase]: ...

    def build_model(self, rngs: nnx.Rngs) -> nnx.Module: ...

    def train_data(
        self, phase: Phase, host_batch_size: int, shard_index: int, shard_count: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """This host's endless batches. For exact resume the iterator has get_state() /
        set_state() (a grain DataLoader or Dataset iterator); without them a resumed run
        skips the batches already taken, which replays the input pipeline's work."""

    def example_spec(self, phase: Phase) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (per-example shape, dtype) of a training batch in this phase."""

    def eval_data(
        self, global_batch_size: int, shard_index: int, shard_count: int
    ) -> list[dict[str, np.ndarray]]: ...

    def denominators(self, batch: Batch) -> Any:
        """Normalisers of the loss computed once from the whole global batch, so that
        gradient accumulation over microbatches gives the same update as one batch."""

    def loss(
        self, model: nnx.Module, batch: Batch, denominators: Any, rng: jax.Array | None
    ) -> tuple[jax.Array, dict[str, jax.Array]]: ...

    def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
        """Per-batch sums (weighted by batch['mask']); the loop adds them over batches."""

    def finalize_eval(self, sums: dict[str, float]) -> dict[str, float]: ...

    def mllog_hparams(self) -> dict[str, Any]: ...

    def flops_per_example(self, phase: Phase) -> float:
        """Analytic training FLOPs per example (forward + backward) for MFU."""

    # Optional, for metrics computed on the hosts (see mlperf/evaluate.py):
    #   eval_outputs(model, batch) -> dict of per-example arrays (leading batch dim),
    #       e.g. beam-search tokens or fixed-size NMS detections;
    #   host_eval_stats(outputs, batches) -> dict of numpy arrays with the same shapes on
    #       every host, from this host's rows (lists aligned with its eval batches); they
    #       reach finalize_eval stacked over data shards: name -> [shard_count, ...];
    #   async_finalize: bool, run finalize_eval in a background thread (COCOeval);
    #   target_reached(metrics) -> bool, for several targets (Mask R-CNN box and mask).
    # Optional, for starting from pretrained weights (mlperf/train_state.py):
    #   pretrained_params() -> {top-level module name: params subtree as numpy} or None,
    #       e.g. {"backbone": ...} from a torchvision ImageNet ResNet; checked against the
    #       model's shapes and placed into the state after the random init.


def target_reached(task: Task, metrics: dict[str, float]) -> bool:
    """Whether eval metrics meet the task's quality target(s)."""
    custom = getattr(task, "target_reached", None)
    if custom is not None:
        return bool(custom(metrics))
    return metrics[task.target_metric] >= task.target_value
