"""Checkpoints of a training run: sharded state, input position, loop counters, log offsets.

One step directory per checkpoint, written by orbax's CheckpointManager (asynchronously:
training continues while it writes). Orbax writes into a temporary directory and renames
it when every item and every process has finished, so a killed writer never leaves a
step directory that looks complete, and an old checkpoint is only deleted after the new
one is committed. Each step holds three items:

    state/   the train state {step, params, opt_state}, each host writing its own shards
    meta/    JSON: counters, eval schedule, MLPerf block state, RNG key, log offsets,
             the shapes of every state leaf (to refuse another model's checkpoint)
    data/    per-process grain iterator state (grain's own orbax handler)

Restore walks from the newest step to the oldest: a step whose files are missing or cut
short is reported with a warning naming it, and the previous one is used. The state is
restored straight into the target shardings (any mesh, any process count): each host
reads only the shards its devices hold.
"""

from __future__ import annotations

import dataclasses
import json
import logging as pylogging
import os
import signal
from typing import Any

import grain
import grain.checkpoint as grain_ckpt
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils
from orbax.checkpoint._src.checkpoint_managers import preservation_policy as pp

from mlperf.mllog import MlLog

PyTree = Any
ITEMS = ("state", "meta", "data")
# Written into a step directory once orbax has committed it: every file and its size.
# Zarr reads a missing chunk file as zeros and a cut ocdbt file may go unnoticed, so
# this list, not a failed read, is what tells a damaged checkpoint.
MANIFEST = "multipod_manifest.json"


class CheckpointMismatchError(ValueError):
    """A checkpoint written for another model or config than the one being restored."""


class NoUsableCheckpointError(ValueError):
    """Checkpoints exist but none of them can be read."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Where and when to checkpoint (the config's `checkpoint` block, with defaults)."""

    directory: str
    every_steps: int = 0  # 0: no periodic checkpoints
    keep: int = 2  # the last `keep` checkpoints...
    keep_best: int = 1  # ...plus the `keep_best` best by the eval target metric
    at_eval: bool = True
    async_save: bool = True
    enabled: bool = True

    @classmethod
    def from_config(cls, config, workdir: str) -> CheckpointConfig:
        """Reads `config.checkpoint` (absent: checkpoint at evals into workdir/checkpoints)."""
        c = config.get("checkpoint", None) or {}
        directory = c.get("dir", "") or os.path.join(workdir, "checkpoints")
        return cls(
            directory=os.path.abspath(os.path.expanduser(directory)),
            every_steps=int(c.get("every_steps", 0)),
            keep=int(c.get("keep", 2)),
            keep_best=int(c.get("keep_best", 1)),
            at_eval=bool(c.get("at_eval", True)),
            async_save=bool(c.get("async", True)),
            enabled=bool(c.get("enabled", True)),
        )


def iterator_state_of(iterator) -> bytes | None:
    """The grain iterator's checkpointable state; None for an iterator without one (its
    position is then restored by skipping the batches already taken)."""
    get_state = getattr(iterator, "get_state", None)
    if get_state is None:
        return None
    state = get_state()
    return state if isinstance(state, bytes) else json.dumps(state).encode()


class _FrozenIteratorState:
    """An iterator stand-in for grain's handler: the state captured when the batch after
    the checkpointed step was still unread (the loop prefetches one batch ahead)."""

    def __init__(self, state: bytes | None = None):
        self.state = state

    def get_state(self) -> bytes:
        return b"null" if self.state is None else self.state

    def set_state(self, state: bytes) -> None:
        self.state = state

    def start_prefetch(self) -> None:  # grain's handler calls this after set_state
        pass


@dataclasses.dataclass
class Restored:
    """A restored checkpoint: the sharded state, its metadata and this host's input state."""

    step: int
    state: PyTree
    meta: dict[str, Any]
    iterator_state: bytes | None  # None when written by another process count
    path: str


def _plain(value: Any) -> Any:
    """JSON form of numpy scalars and arrays (eval metrics may hold them)."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in checkpoint metadata")


def leaf_shapes(tree: PyTree) -> dict[str, list]:
    """Path -> [shape, dtype] of every array leaf: a fingerprint of the model and optimizer."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): [list(leaf.shape), str(leaf.dtype)] for path, leaf in flat}


def check_compatible(saved: dict[str, list], target: dict[str, list], where: str) -> None:
    """Raises CheckpointMismatchError naming the first differing paths and shapes."""
    problems = []
    # Parameters first: they name the model difference; optimizer slots repeat it.
    for path in sorted(set(saved) | set(target), key=lambda p: (not p.startswith("['params']"), p)):
        if path not in target:
            problems.append(f"{path}: in the checkpoint {saved[path]}, not in this model")
        elif path not in saved:
            problems.append(f"{path}: in this model {target[path]}, not in the checkpoint")
        elif saved[path] != target[path]:
            problems.append(f"{path}: checkpoint {saved[path]} vs this model {target[path]}")
    if problems:
        shown = "\n  ".join(problems[:5])
        more = f"\n  ... and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise CheckpointMismatchError(
            f"checkpoint {where} was written for another model or config "
            f"([shape, dtype] differ):\n  {shown}{more}\nRestore it with the config it was "
            "written with, or start a new run with another --workdir or checkpoint.dir."
        )


def _listing(path: str) -> dict[str, int]:
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            if not rel.startswith(MANIFEST):
                out[rel] = os.path.getsize(full)
    return out


def write_manifest(path: str) -> None:
    """Lists every file of a committed step directory with its size (atomically)."""
    files = _listing(path)
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f, sort_keys=True)
    os.replace(tmp, os.path.join(path, MANIFEST))


def check_manifest(path: str) -> str | None:
    """What is missing or cut short in a step directory (None: all files whole). A step
    without a manifest (killed between orbax's commit and the listing) is not checked."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            listed = json.load(f)["files"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as e:
        return f"{MANIFEST} is unreadable ({e})"
    present = _listing(path)
    for rel, size in sorted(listed.items()):
        if rel not in present:
            return f"file {rel} is missing"
        if present[rel] != size:
            return f"file {rel} has {present[rel]} bytes, {size} when written"
    return None


def _all_hosts_ok(ok: bool) -> bool:
    """True when `ok` holds on every process (every host must pick the same checkpoint)."""
    if jax.process_count() == 1:
        return ok
    flags = multihost_utils.process_allgather(np.asarray([int(ok)], np.int32))
    return bool(np.all(flags))


class Checkpointer:
    """Saves and restores one run's checkpoints (see the module docstring)."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        best_metric: str,
        best_mode: str = "max",
        read_only: bool = False,
    ):
        self.cfg = cfg
        self.best_metric = best_metric
        policies: list[pp.PreservationPolicy] = [pp.LatestN(n=max(cfg.keep, 1))]
        if cfg.keep_best > 0:
            policies.append(
                pp.BestN(
                    get_metric_fn=lambda m: m[best_metric],
                    reverse=best_mode == "min",
                    n=cfg.keep_best,
                    keep_checkpoints_without_metrics=False,
                )
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies),
            enable_async_checkpointing=cfg.async_save,
            # Leftover temporary directories of a killed writer are removed on start
            # (not by a reader such as launch.export, which may run beside the writer).
            cleanup_tmp_directories=not read_only,
            read_only=read_only,
        )
        handlers = {
            "state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
            "data": grain_ckpt.CheckpointHandler(),
        }
        # orbax logs its creation, every save and deletion at INFO through absl; keep the
        # run's output clean (set before the manager exists: it logs on creation).
        pylogging.getLogger("absl").setLevel(pylogging.WARNING)
        self.manager = ocp.CheckpointManager(
            cfg.directory, item_names=ITEMS, item_handlers=handlers, options=options
        )
        self._unlisted: int | None = None  # committed (or committing) without a manifest

    def steps(self) -> list[int]:
        """Committed checkpoint steps, oldest first."""
        return sorted(self.manager.all_steps())

    def step_path(self, step: int) -> str:
        return os.path.join(self.cfg.directory, str(step))

    def save(
        self,
        step: int,
        state: PyTree,
        meta: dict[str, Any],
        iterator_state: bytes | None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Starts writing a checkpoint of `state` at `step` (returns once the arrays are
        copied off the devices; the files are written in the background)."""
        self.wait()  # orbax would wait for the previous save here anyway
        if jax.devices()[0].platform == "cpu":
            # On CPU orbax's "host copy" of an array is a zero-copy view of its device
            # buffer; a private copy keeps the background write off the buffers that the
            # next (donating) train step receives. Defensive: JAX did not reuse a viewed
            # buffer in our checks, but nothing promises it.
            state = jax.tree.map(lambda x: x.copy(), state)
        meta = {**meta, "shapes": leaf_shapes(state), "process_count": jax.process_count()}
        meta = json.loads(json.dumps(meta, default=_plain))  # numpy values -> JSON
        best = None
        if metrics is not None and self.best_metric in metrics:
            best = {self.best_metric: float(metrics[self.best_metric])}
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                meta=ocp.args.JsonSave(meta),
                data=grain_ckpt.CheckpointSave(_FrozenIteratorState(iterator_state)),
            ),
            metrics=best,
            force=True,
        )
        self._unlisted = step

    def wait(self) -> None:
        """Blocks until every started checkpoint is committed, then writes its manifest."""
        self.manager.wait_until_finished()
        if self._unlisted is not None:
            step, self._unlisted = self._unlisted, None
            if jax.process_index() == 0 and step in self.manager.all_steps():
                write_manifest(self.step_path(step))

    def close(self) -> None:
        self.wait()
        self.manager.close()

    def _incomplete_reason(self, step: int) -> str | None:
        """Why a committed step directory cannot be a whole checkpoint (None if it can)."""
        path = self.step_path(step)
        for item in ("state", "meta"):
            if not os.path.isdir(os.path.join(path, item)):
                return f"item {item!r} is missing"
        meta_file = os.path.join(path, "meta", "metadata")
        if not os.path.isfile(meta_file):
            return "meta/metadata is missing"
        try:
            with open(meta_file) as f:
                json.load(f)
        except (OSError, ValueError) as e:
            return f"meta/metadata is unreadable ({e})"
        return check_manifest(path)

    def restore_step(self, step: int, abstract_state: PyTree) -> Restored:
        """Checkpoint `step` restored into `abstract_state`'s shapes and shardings; raises
        OSError (or orbax's error) when it is incomplete, CheckpointMismatchError when it
        belongs to another model."""
        path = self.step_path(step)
        reason = self._incomplete_reason(step)
        if reason:
            raise OSError(reason)
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]
        # Before reading any array: another model's checkpoint is an error, not a fallback.
        check_compatible(meta["shapes"], leaf_shapes(abstract_state), path)
        state = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
        )["state"]
        # Wait for every shard now, so a file cut short shows up here and not mid-training.
        state = jax.block_until_ready(state)
        iterator_state = None
        if meta.get("process_count") == jax.process_count():
            receiver = _FrozenIteratorState()
            self.manager.restore(
                step, args=ocp.args.Composite(data=grain_ckpt.CheckpointRestore(receiver))
            )
            iterator_state = None if receiver.state == b"null" else receiver.state
        return Restored(step, state, meta, iterator_state, path)

    def _set_aside(self, steps: list[int]) -> None:
        """Renames unreadable checkpoints to <step>.corrupted (kept for inspection, no
        longer a step), so the resumed run can write those steps again."""
        if steps and jax.process_index() == 0:
            for step in steps:
                path = self.step_path(step)
                target = f"{path}.corrupted"
                n = 1
                while os.path.exists(target):
                    target, n = f"{path}.corrupted{n}", n + 1
                os.rename(path, target)
                print(f"WARNING: moved {path} to {target}", flush=True)
        if steps:
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("multipod_checkpoint_set_aside")
            self.manager.reload()

    def restore_latest(self, abstract_state: PyTree) -> Restored | None:
        """The newest readable checkpoint restored into `abstract_state`'s shardings, or None
        when there is none. Unreadable ones are skipped with a warning naming them."""
        steps = self.steps()
        failures = []
        for step in reversed(steps):
            try:
                restored = self.restore_step(step, abstract_state)
                ok, error = True, None
            except CheckpointMismatchError:
                raise
            except Exception as e:  # noqa: BLE001 - any read error means "not usable"
                ok, error, restored = False, e, None
            if _all_hosts_ok(ok):
                self._set_aside(failures)
                return restored
            message = (
                f"checkpoint {self.step_path(step)} is incomplete or corrupted "
                f"({type(error).__name__ if error else 'on another host'}: "
                f"{str(error).splitlines()[0][:300] if error else ''}); "
                "falling back to the previous checkpoint."
            )
            logging.warning(message)
            print(f"WARNING: {message}", flush=True)
            failures.append(step)
        if steps:
            raise NoUsableCheckpointError(
                f"none of the checkpoints in {self.cfg.directory} (steps {steps}) can be read; "
                "move the directory away to start from scratch."
            )
        return None


def reopen_mllog(path: str, size: int, enabled: bool) -> MlLog:
    """An MlLog appending to `path` cut back to `size` bytes: the log as it was when the
    checkpoint was written, so the resumed run's events follow on (one log per run)."""
    if enabled:
        current = os.path.getsize(path) if os.path.exists(path) else 0
        if current < size:
            print(
                f"WARNING: {path} has {current} bytes, fewer than the {size} it had at the "
                "checkpoint; the MLPerf log of this run will be incomplete.",
                flush=True,
            )
        else:
            os.truncate(path, size)
    return MlLog(path, enabled=enabled, append=True)


def committed_steps(directory: str) -> list[int]:
    """Steps with a committed checkpoint directory (orbax renames a finished temporary
    directory to the bare step number), without opening a CheckpointManager."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


class PreemptionNotice:
    """SIGTERM (preemption notice) -> save a checkpoint at the next step and stop.

    One process: a signal handler sets a flag. Several processes: JAX's preemption sync
    point (set up by jax.distributed) makes every host stop at the same step."""

    def __init__(self):
        self.flag = False
        self._previous = None
        if jax.process_count() == 1:
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.flag = True

    def reached(self, step: int) -> bool:
        if jax.process_count() == 1:
            return self.flag
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # no preemption service in this cluster
            return False

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


@jax.jit
def all_finite(tree: PyTree) -> jax.Array:
    """Whether every element of every leaf is finite (one device reduction)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def resume_position(restored: Restored | None, phase_index: int, phase_steps: int, iterator) -> int:
    """Steps of a phase already trained at the checkpoint; moves the phase's fresh
    iterator to the first batch those steps had not taken."""
    if restored is None or phase_index > restored.meta["phase"]:
        return 0
    if phase_index < restored.meta["phase"]:
        return phase_steps  # an earlier phase: finished
    done = restored.meta["phase_step"]
    if restored.iterator_state is not None and hasattr(iterator, "set_state"):
        state = restored.iterator_state
        # grain's DataLoader iterators take bytes, its Dataset iterators a dict.
        iterator.set_state(
            json.loads(state) if isinstance(iterator, grain.DatasetIterator) else state
        )
    else:
        # Written by another process count (or no iterator state): this host's rows of the
        # same global batches follow from the number of batches taken (GlobalOrderHostRows).
        for _ in range(done):
            next(iterator)
    return done
