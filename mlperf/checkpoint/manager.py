"""Saving and restoring one run's checkpoints with orbax's CheckpointManager.

Saves are asynchronous: `save` returns once the arrays are copied off the devices and the
files are written in the background while training continues. Orbax writes into a
temporary directory and renames it when every item and every process has finished, so an
old checkpoint is only deleted after the new one is committed; a file manifest is added
after the commit (integrity.py).

Restore walks from the newest step to the oldest: a step whose files are missing or cut
short is reported with a warning naming it and set aside, and the previous one is used.
The state is restored straight into the target shardings (any mesh, any process count):
each host reads only the shards its devices hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import grain.checkpoint as grain_ckpt
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from input_pipeline import storage
from mlperf.checkpoint.integrity import (
    CheckpointMismatchError,
    check_compatible,
    committed_steps,
    directory_bytes,
    incomplete_reason,
    leaf_shapes,
    write_manifest,
)
from mlperf.checkpoint.iterator_state import FrozenIteratorState
from mlperf.config_error import ConfigError

PyTree = Any
# Called with a checkpoint's metadata and path before its arrays are read; raises
# CheckpointMismatchError (or a subclass) to refuse it.
MetaCheck = Callable[[dict[str, Any], str], None]
ITEMS = ("state", "meta", "data")


pp = ocp.checkpoint_managers


class NoUsableCheckpointError(ValueError):
    """Checkpoints exist but none of them can be read."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (disk full, directory unwritable, ...).

    `transient`: the object store holding it could not be reached or was failing
    (`storage.transient`), so the same command may write it later."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


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

    def __post_init__(self):
        for key, low in (("keep", 1), ("keep_best", 0), ("every_steps", 0)):
            if getattr(self, key) < low:
                why = " (checkpoint.enabled=False writes none)" if key == "keep" else ""
                raise ConfigError(f"checkpoint.{key}={getattr(self, key)}: must be >= {low}{why}")

    @classmethod
    def from_config(cls, config, workdir: str) -> CheckpointConfig:
        """Reads `config.checkpoint` (absent: checkpoint at evals into workdir/checkpoints)."""
        c = config.get("checkpoint", None) or {}
        directory = c.get("dir", "") or storage.join(storage.resolve(workdir), "checkpoints")
        return cls(
            directory=storage.resolve(directory),
            every_steps=int(c.get("every_steps", 0)),
            keep=int(c.get("keep", 2)),
            keep_best=int(c.get("keep_best", 1)),
            at_eval=bool(c.get("at_eval", True)),
            async_save=bool(c.get("async", True)),
            enabled=bool(c.get("enabled", True)),
        )


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


def all_hosts_ok(ok: bool) -> bool:
    """True when `ok` holds on every process (every host must pick the same checkpoint)."""
    if jax.process_count() == 1:
        return ok
    flags = multihost_utils.process_allgather(np.asarray([int(ok)], np.int32))
    return bool(np.all(flags))


class ProtectedSteps:
    """An orbax preservation policy: keeps the newest checkpoint that has an eval result
    and the newest one written before `unstable_since` (the step a loss spike began)."""

    def __init__(self):
        self.unstable_since: int | None = None

    def should_preserve(self, checkpoints: Sequence, *, context=None) -> list[bool]:
        keep = set()
        evaluated = [c.step for c in checkpoints if c.metrics is not None]
        if evaluated:
            keep.add(max(evaluated))
        if self.unstable_since is not None:
            before = [c.step for c in checkpoints if c.step < self.unstable_since]
            if before:
                keep.add(max(before))
        return [c.step in keep for c in checkpoints]


def save_failure(error: BaseException, path: str) -> str:
    """One line naming the checkpoint path and the operating-system error behind a failed
    save (orbax and tensorstore wrap it; the errno is found in the chain or the text). On
    an object store: the store, the step and why (unreachable, permission, ...)."""
    if storage.is_url(path):
        why = storage.describe(error, "writing checkpoint", path)
        return why.replace(f" {path} failed", f" {path} (step {storage.basename(path)}) failed")
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            where = seen.filename or path
            return (
                f"writing checkpoint {where} failed: [Errno {seen.errno}] "
                f"{seen.strerror or os.strerror(seen.errno)} "
                f"({errno.errorcode.get(seen.errno, '?')})"
            )
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(error).split())
    number = re.search(r"\[?errno\s*[=:]?\s*(\d+)", text, re.IGNORECASE)
    if number:
        code = int(number.group(1))
        return (
            f"writing checkpoint {path} failed: [Errno {code}] {os.strerror(code)} "
            f"({errno.errorcode.get(code, '?')})"
        )
    for code in (errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EPERM, errno.EDQUOT):
        if os.strerror(code).lower() in text.lower():
            return (
                f"writing checkpoint {path} failed: [Errno {code}] {os.strerror(code)} "
                f"({errno.errorcode[code]})"
            )
    return f"writing checkpoint {path} failed: {type(error).__name__}: {text[:300]}"


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
        # mlperf.train_state.StoredStateCodec: optimizer leaves stored in parameter shapes.
        self.codec = None
        # Never deleted: the newest `keep`, the `keep_best` best, the newest with an eval
        # result and the newest written before a loss spike began (stability.py).
        self.protected = ProtectedSteps()
        policies: list = [pp.LatestN(n=cfg.keep), self.protected]
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
            # The step directory is created in save() itself: a directory that became
            # unwritable since _check_room's probe fails there, in one line, instead of
            # in orbax's background thread, which surfaces it only at its timeout.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
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
        self.manager = ocp.CheckpointManager(
            cfg.directory, item_names=ITEMS, item_handlers=handlers, options=options
        )
        self._unlisted: int | None = None  # committed (or committing) without a manifest
        self.failed: str | None = None  # why a save failed (then no more are attempted)
        self.failed_transient = False  # ... and whether the store was only unreachable

    def steps(self) -> list[int]:
        """Committed checkpoint steps, oldest first."""
        return sorted(self.manager.all_steps())

    def step_path(self, step: int) -> str:
        return storage.join(self.cfg.directory, str(step))

    def save(
        self,
        step: int,
        state: PyTree,
        meta: dict[str, Any],
        iterator_state: bytes | None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Starts writing a checkpoint of `state` at `step` (returns once the arrays are
        copied off the devices; the files are written in the background). Raises
        CheckpointSaveError when this or the previous save failed."""
        self.wait()  # orbax would wait for the previous save here anyway
        # No private copy of the state is needed on CPU, where orbax's host copy of an array
        # is a zero-copy view of its device buffer: while such a view exists JAX does not
        # donate the buffer to the next train step (it copies instead), so the files hold
        # the state at save time (tests/unit/test_checkpoint_async.py checks this).
        if self.codec is not None:
            state = self.codec.encode(state)
        meta = {**meta, "shapes": leaf_shapes(state), "process_count": jax.process_count()}
        meta = json.loads(json.dumps(meta, default=_plain))  # numpy values -> JSON
        best = None
        if metrics is not None and self.best_metric in metrics:
            best = {self.best_metric: float(metrics[self.best_metric])}
        self._unlisted = step
        with self._failures():
            self._check_room(step)
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    meta=ocp.args.JsonSave(meta),
                    data=grain_ckpt.CheckpointSave(FrozenIteratorState(iterator_state)),
                ),
                metrics=best,
                force=True,
            )

    def ready_to_save(self, step: int) -> None:
        """Waits for the save in flight, then checks the directory has room for `step`'s
        checkpoint; raises CheckpointSaveError if not. Several processes each call it and
        agree before `save` (TrainLoop), so every host stops at the same step when one
        cannot save."""
        self.wait()
        if self.failed is not None:
            raise CheckpointSaveError(self.failed, self.failed_transient)
        with self._failures(self.step_path(step)):
            self._check_room(step)

    def _check_room(self, step: int) -> None:
        """Raises OSError (with errno) unless the directory takes a file and has room for
        a checkpoint as large as the newest one. Checked before orbax starts: it creates
        the step directory in a background thread, and a failure there surfaces only as a
        timeout minutes later. An object store takes the probe object; it has no free
        space to check (validate.check_workdir says so at start)."""
        directory, path = self.cfg.directory, self.step_path(step)
        try:
            storage.probe_write(directory, f".write_probe_{jax.process_index()}_{os.getpid()}")
        except storage.StorageError:
            raise  # names the store and the path itself
        except OSError as e:
            raise OSError(e.errno, e.strerror, path) from e
        if storage.is_url(directory):
            return
        committed = [s for s in committed_steps(directory) if s != step]
        need = directory_bytes(self.step_path(committed[-1])) if committed else 0
        free = shutil.disk_usage(directory).free
        if free < need:
            raise OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)}: {free >> 20} MiB free, the last checkpoint "
                f"took {need >> 20} MiB",
                path,
            )

    @contextlib.contextmanager
    def _failures(self, path: str | None = None):
        """Turns any error of a save in flight (or of the checks before writing `path`)
        into CheckpointSaveError (one line)."""
        try:
            yield
        except CheckpointSaveError:
            raise
        except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            step = self._unlisted
            self._unlisted = None
            if path is None:
                path = self.step_path(step) if step is not None else self.cfg.directory
            self.failed = save_failure(e, path)
            self.failed_transient = storage.is_url(path) and storage.transient(e)
            raise CheckpointSaveError(self.failed, self.failed_transient) from e

    def check(self) -> None:
        """Raises CheckpointSaveError if a background save has failed (does not block)."""
        if self._unlisted is not None and self.failed is None:
            with self._failures():
                self.manager.check_for_errors()

    def wait(self) -> None:
        """Blocks until every started checkpoint is committed, then writes its manifest."""
        if self.failed is not None:
            return
        with self._failures():
            self.manager.wait_until_finished()
            if self._unlisted is not None:
                step = self._unlisted
                if jax.process_index() == 0 and step in self.manager.all_steps():
                    write_manifest(self.step_path(step))
                self._unlisted = None

    def close(self) -> None:
        """Waits for the save in flight and closes the manager; after a failed save it
        only closes (the failure has been reported)."""
        try:
            self.wait()
        finally:
            try:
                self.manager.close()
            except Exception:  # noqa: BLE001
                if self.failed is None:
                    raise

    def restore_step(
        self, step: int, abstract_state: PyTree, check_meta: MetaCheck | None = None
    ) -> Restored:
        """Checkpoint `step` restored into `abstract_state`'s shapes and shardings; raises
        OSError (or orbax's error) when it is incomplete, CheckpointMismatchError when it
        belongs to another model or `check_meta(meta, path)` refuses it."""
        path = self.step_path(step)
        reason = incomplete_reason(path)
        if reason:
            raise OSError(reason)
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]
        # Before reading any array: another model's checkpoint is an error, not a fallback.
        stored = abstract_state if self.codec is None else self.codec.abstract
        check_compatible(meta["shapes"], leaf_shapes(stored), path)
        if check_meta is not None:
            check_meta(meta, path)
        state = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(stored))
        )["state"]
        if self.codec is not None:
            state = self.codec.decode(state)
        # Wait for every shard now, so a file cut short shows up here and not mid-training.
        state = jax.block_until_ready(state)
        iterator_state = None
        if meta.get("process_count") == jax.process_count():
            receiver = FrozenIteratorState()
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
                while storage.exists(target):
                    target, n = f"{path}.corrupted{n}", n + 1
                storage.rename(path, target)
                print(f"WARNING: moved {path} to {target}", flush=True)
        if steps:
            if jax.process_count() > 1:
                multihost_utils.sync_global_devices("multipod_checkpoint_set_aside")
            self.manager.reload()

    def restore_latest(
        self, abstract_state: PyTree, check_meta: MetaCheck | None = None
    ) -> Restored | None:
        """The newest readable checkpoint restored into `abstract_state`'s shardings, or None
        when there is none. Unreadable ones are skipped with a warning naming them."""
        steps = self.steps()
        failures = []
        for step in reversed(steps):
            try:
                restored = self.restore_step(step, abstract_state, check_meta)
                ok, error = True, None
            except CheckpointMismatchError:
                raise
            except Exception as e:  # noqa: BLE001 - any read error means "not usable"
                ok, error, restored = False, e, None
            if all_hosts_ok(ok):
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
