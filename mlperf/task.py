"""What the generic loop needs from a benchmark: the Task base class and training phases.

A benchmark subclasses `Task` (as t5x models subclass `BaseModel`): the abstract methods
are the contract every benchmark fills in; the other methods are optional hooks whose
defaults suit a benchmark that needs nothing special. The loop never asks a task whether
it has a method: every hook exists, here, with its default.

A task is immutable once constructed. What preparing the data learns (the vocabulary
size, the class count, the COCO ground truth) is returned by `prepare` and handed to a
new task: `task.with_data(task.prepare(shard_index, shard_count))`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar

import jax
import numpy as np
import optax
from flax import nnx

from mlperf.config_error import ConfigError
from mlperf.optimizer import PhaseSchedule, joined_schedule
from mlperf.pretrained import Pretrained

Batch = dict[str, Any]
ExampleSpec = dict[str, tuple[tuple[int, ...], str]]  # name -> (per-example shape, dtype)
D = TypeVar("D")  # what a task's `prepare` returns


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
    # Gradient accumulation: the global batch is trained in this many pieces.
    microbatches: int = 1
    # The config block the batch size and steps come from, named in config errors.
    source: str = "train"


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    """How the in-loop eval reads its set: the global batch of an eval step."""

    global_batch_size: int


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
        microbatches=config.train.microbatches,
    )


def from_config(
    cls: type,
    block: Mapping[str, Any],
    renamed: Mapping[str, str] | None = None,
    **explicit: Any,
) -> Any:
    """The dataclass `cls` built from the config block's entries named like its fields
    (fields the block leaves out keep the dataclass default); `explicit` values win.
    `renamed` maps a field to the block's key where they differ (a ResNet's `freeze_at`
    is the model block's `backbone_freeze_at`). Lists become tuples (frozen dataclasses
    hash their fields). One place for each default: the dataclass, not a
    `.get(name, default)` per caller."""
    renamed = renamed or {}
    values = {}
    for f in dataclasses.fields(cls):
        key = renamed.get(f.name, f.name)
        if f.name not in explicit and key in block:
            value = block[key]
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values, **explicit)


class _FrozenAfterInit(abc.ABCMeta):
    """Marks an instance read-only once its constructor has returned."""

    def __call__(cls, *args, **kwargs):
        task = super().__call__(*args, **kwargs)
        object.__setattr__(task, "_frozen", True)
        return task


class Task(Generic[D], metaclass=_FrozenAfterInit):
    """A benchmark the loop can drive; every method is pure and mesh-free.

    Subclasses call `super().__init__(config, data)` first: it computes the phases
    (`make_phases`, from the config alone) once.
    """

    benchmark: ClassVar[str]  # MLPerf benchmark name, e.g. "bert"
    target_metric: ClassVar[str]  # key of finalize_eval's output compared against the target
    # True: finalize_eval runs in a background thread while training continues (COCOeval).
    async_finalize: ClassVar[bool] = False
    # Whether part of the metrics is computed on the hosts (eval_outputs and
    # host_eval_stats overridden); set for each subclass from its methods.
    host_metrics: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        outputs = cls.eval_outputs is not Task.eval_outputs
        stats = cls.host_eval_stats is not Task.host_eval_stats
        if outputs != stats:
            raise TypeError(
                f"{cls.__name__}: host metrics need both eval_outputs and host_eval_stats."
            )
        cls.host_metrics = outputs

    def __init__(self, config, data: D | None = None):
        self.config = config
        self._data = data
        self._phases = tuple(self.make_phases())
        self._eval_plan = self.make_eval_plan()

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen", False):
            raise AttributeError(
                f"{type(self).__name__} is immutable after construction (setting {name!r}): "
                "return what you learn (see Task.prepare) and build a new task."
            )
        super().__setattr__(name, value)

    # ---- data ----------------------------------------------------------------------------
    @abc.abstractmethod
    def prepare(self, shard_index: int, shard_count: int) -> D:
        """Builds (or loads the cached) data before anything compiles and returns it with
        what it learnt (vocabulary size, classes); `with_data` gives the task that uses it."""

    def with_data(self, data: D) -> Self:
        """This task with prepared data: a new task; this one is unchanged."""
        return type(self)(self.config, data)

    @property
    def data(self) -> D:
        """What `prepare` returned; an error for a task built without it."""
        if self._data is None:
            raise RuntimeError(
                f"{type(self).__name__} has no data: use "
                "task.with_data(task.prepare(shard_index, shard_count))."
            )
        return self._data

    @property
    def has_data(self) -> bool:
        return self._data is not None

    @abc.abstractmethod
    def train_data(
        self, phase: Phase, host_batch_size: int, shard_index: int, shard_count: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """This host's endless batches. For exact resume the iterator has get_state() /
        set_state() (a grain DataLoader or Dataset iterator); without them a resumed run
        skips the batches already taken, which replays the input pipeline's work."""

    @abc.abstractmethod
    def example_spec(self, phase: Phase) -> ExampleSpec:
        """Name -> (per-example shape, dtype) of a training batch in this phase."""

    def input_axes(self) -> dict[str, tuple[str | None, ...]]:
        """Name -> logical axes of one example's dimensions, for the input fields (train
        and eval) that the model splits beyond their rows (an image's height under
        spatial partitioning): the partitioner sends each device only its part. The
        fields not named go to every device of their rows whole."""
        return {}

    @abc.abstractmethod
    def eval_data(
        self, global_batch_size: int, shard_index: int, shard_count: int
    ) -> list[dict[str, np.ndarray]]:
        """This host's padded eval batches (every host the same number), with `mask`."""

    @abc.abstractmethod
    def num_eval_examples(self) -> int:
        """Real examples in the eval set (all hosts), for the MLPerf log."""

    def eval_example_spec(self, phase: Phase) -> ExampleSpec:
        """Per-example spec of an eval batch (for compiling the eval step without data):
        by default the training spec of `phase` plus the padding `mask`."""
        return {**self.example_spec(phase), "mask": ((), "float32")}

    def step_samples(self, host_batch: Mapping[str, np.ndarray], phase: Phase) -> int:
        """Training samples in the global batch whose host rows are `host_batch`: the
        MLPerf log's `samples` and the eval schedule count these. By default one per
        row; a task packing several samples in a row counts them."""
        del host_batch
        return phase.global_batch_size

    def step_samples_vary(self, phase: Phase) -> bool:
        """Whether `step_samples` depends on the batch (several samples packed in a row):
        the evals due at sample counts then fall at steps known only while training."""
        del phase
        return False

    # ---- phases and schedule -------------------------------------------------------------
    @abc.abstractmethod
    def make_phases(self) -> Sequence[Phase]:
        """The training phases, from the config alone (called once, by __init__)."""

    def phases(self) -> tuple[Phase, ...]:
        """The training phases (computed once, at construction)."""
        return self._phases

    def make_eval_plan(self) -> EvalPlan:
        """The in-loop eval's batch, from the config alone (called once, by __init__)."""
        return EvalPlan(global_batch_size=self.config.train.eval_batch_size)

    def eval_plan(self) -> EvalPlan:
        """The in-loop eval's batch (computed once, at construction)."""
        return self._eval_plan

    def lr_drop_steps(self) -> tuple[int, ...]:
        """Global steps where the learning rate drops by `optimizer.lr_drop_factor`."""
        return tuple(self.config.optimizer.get("lr_drop_steps", ()))

    def schedule(self) -> optax.Schedule:
        """The learning-rate schedule: linear warmup and polynomial decay per phase, with
        x`lr_drop_factor` drops at `lr_drop_steps()`."""
        o = self.config.optimizer
        return joined_schedule(
            [
                PhaseSchedule(
                    p.learning_rate,
                    p.warmup_steps,
                    p.decay_steps,
                    p.steps,
                    power=o.get("power", 1.0),
                    drop_steps=self.lr_drop_steps(),
                    drop_factor=o.get("lr_drop_factor", 0.1),
                )
                for p in self.phases()
            ]
        )

    # ---- model, loss and eval ------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self, rngs: nnx.Rngs) -> nnx.Module: ...

    @abc.abstractmethod
    def denominators(self, batch: Batch) -> Any:
        """Normalisers of the loss computed once from the whole global batch, so that
        gradient accumulation over microbatches gives the same update as one batch."""

    @abc.abstractmethod
    def loss(
        self, model: nnx.Module, batch: Batch, denominators: Any, rng: jax.Array | None
    ) -> tuple[jax.Array, dict[str, jax.Array]]: ...

    @abc.abstractmethod
    def eval_sums(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
        """Per-batch sums (weighted by batch['mask']); the loop adds them over batches."""

    def eval_outputs(self, model: nnx.Module, batch: Batch) -> dict[str, jax.Array]:
        """Per-example device outputs (leading batch dim) for metrics computed on the
        hosts, e.g. beam-search tokens or fixed-size NMS detections (see
        mlperf/evaluate.py). Overridden together with host_eval_stats."""
        raise NotImplementedError(f"{type(self).__name__} has no host metrics.")

    def host_eval_stats(
        self, outputs: list[dict[str, np.ndarray]], batches: list[dict[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """Numpy stats with the same shapes on every host, from this host's rows (lists
        aligned with its eval batches); they reach finalize_eval stacked over data shards:
        name -> [shard_count, ...]."""
        raise NotImplementedError(f"{type(self).__name__} has no host metrics.")

    @abc.abstractmethod
    def finalize_eval(self, sums: dict[str, Any]) -> dict[str, float]:
        """The eval metrics from the summed device sums (and gathered host stats)."""

    @property
    def target_value(self) -> float:
        """The quality target of `target_metric`."""
        return float(self.config.train.target)

    def target_reached(self, metrics: dict[str, float]) -> bool:
        """Whether eval metrics meet the quality target(s)."""
        return metrics[self.target_metric] >= self.target_value

    def final_eval_sets(self) -> dict[str, Callable[[], Task]]:
        """The sets evaluated once after a successful run, outside the timed part (e.g.
        BLEU on whole test sets): name -> a function building the task whose eval data is
        that set (called when the set is evaluated). The trainer runs them
        (`Trainer.final_eval`); empty for none."""
        return {}

    # ---- reporting -----------------------------------------------------------------------
    @abc.abstractmethod
    def mllog_hparams(self) -> dict[str, Any]:
        """Hyperparameter events of the MLPerf log."""

    def mllog_metadata(self) -> dict[str, dict[str, Any]]:
        """Metadata the MLPerf rules require on some hyperparameter events (key -> dict)."""
        return {}

    @abc.abstractmethod
    def flops_per_example(self, phase: Phase) -> float:
        """Analytic training FLOPs per example (forward + backward) for MFU: per batch
        row, which a task packing several samples in a row counts once."""

    def rules_eval_schedule(self, phases: Sequence[Phase]) -> tuple[int, int]:
        """(first eval, eval interval) in samples under the MLPerf rules of the task's
        round, for train.eval_every_samples=-1."""
        del phases
        raise ConfigError(
            f"train.eval_every_samples=-1 (the MLPerf rules' schedule) is not defined for "
            f"{self.benchmark}; give a sample count"
        )

    # ---- initialisation --------------------------------------------------------------------
    def pretrained(self, param_shapes: Any) -> Pretrained | None:
        """What the run starts from instead of the random init (mlperf/pretrained.py),
        checked against `param_shapes` (the abstract params tree) before anything is
        compiled: a whole-model checkpoint (BERT's `init.checkpoint`), evaluated before the
        first step, or some modules (the detectors' ImageNet backbone). None: the random
        init. Not asked when a run resumes from its own checkpoint."""
        del param_shapes
        return None
