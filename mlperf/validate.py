"""Config checks that run before anything is built or compiled.

Each failure is one ConfigError naming the value and what would fix it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from input_pipeline import input_files, storage
from mlperf import dispatch
from mlperf.config_error import ConfigError  # raised here, imported from here by callers
from mlperf.optimizer import OPTIMIZERS
from parallel.data_parallel import GradReduction
from parallel.mesh import MeshShapeError, resolve_mesh_shape

if TYPE_CHECKING:
    from mlperf.task import Phase, Task

DEFAULT_CACHE_DIR = "~/.cache/multipod"


def mesh_sizes(config, num_devices: int) -> dict[str, int]:
    """Axis sizes the config's mesh will have on `num_devices` devices."""
    m = config.mesh
    if len(m.axes) != len(m.ici_shape):
        raise ConfigError(
            f"mesh.axes={tuple(m.axes)} and mesh.ici_shape={tuple(m.ici_shape)} "
            "must have the same length."
        )
    try:
        ici, dcn = resolve_mesh_shape(m.ici_shape, m.dcn_shape, num_devices, prefix="mesh.")
    except MeshShapeError as e:
        raise ConfigError(str(e)) from None
    return {a: i * d for a, i, d in zip(m.axes, ici, dcn, strict=True)}


def validate(config, num_devices: int, task: Task | None = None) -> dict[str, int]:
    """Checks the config, and the training phases and eval batch of its `task` (by
    default the config's task), against the device count; returns the mesh axis sizes."""
    sizes = mesh_sizes(config, num_devices)
    if "data" not in sizes:
        raise ConfigError(f"mesh.axes={tuple(config.mesh.axes)} has no 'data' axis; add one.")
    data = sizes["data"]
    t = config.train
    if task is None:
        from mlperf.tasks import get_task  # deferred: the tasks are built only to check

        task = get_task(config)
    check_phases(task.phases(), data)
    eval_batch = task.eval_plan().global_batch_size
    if eval_batch <= 0 or eval_batch % data:
        raise ConfigError(
            f"train.eval_batch_size={eval_batch} is not divisible by the "
            f"data-axis size {data}; use a multiple of {data}."
        )
    if t.steps <= 0:
        raise ConfigError(f"train.steps={t.steps} must be > 0.")
    if config.precision.compute_dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(
            f"precision.compute_dtype={config.precision.compute_dtype!r}: use float32 or bfloat16."
        )
    if config.precision.param_dtype != "float32":
        raise ConfigError(
            f"precision.param_dtype={config.precision.param_dtype!r}: master "
            "parameters and optimizer state are kept in float32; use float32."
        )
    softmax = config.model.get("attention_softmax_dtype", "float32")
    if softmax not in ("float32", "bfloat16"):
        raise ConfigError(f"model.attention_softmax_dtype={softmax!r}: use float32 or bfloat16.")
    block_bytes = config.model.get("attention_cpu_block_bytes", 0)
    if not isinstance(block_bytes, int) or block_bytes < 0:
        raise ConfigError(
            f"model.attention_cpu_block_bytes={block_bytes!r}: give a whole number of bytes "
            "for one CPU attention block's scores (0 keeps the attention core whole)."
        )
    policy = config.model.get("remat_policy", "nothing")
    if policy not in ("nothing", "dots", "dots_no_batch"):
        raise ConfigError(f"model.remat_policy={policy!r}: use nothing, dots or dots_no_batch.")
    unroll = config.model.get("scan_unroll", 1)
    if not isinstance(unroll, int) or unroll < 0:
        raise ConfigError(
            f"model.scan_unroll={unroll!r}: layers per scan iteration, an int >= 1 "
            "(0 unrolls the whole stack)."
        )
    chunks = config.model.get("eval_head_chunks", 1)
    if chunks < 1 or eval_batch % chunks:
        raise ConfigError(
            f"model.eval_head_chunks={chunks} must be >= 1 and divide "
            f"train.eval_batch_size={eval_batch}; use 1 or a divisor of it."
        )
    read_threads = config.data.get("read_threads", 0)
    if not isinstance(read_threads, int) or read_threads < 0:
        raise ConfigError(
            f"data.read_threads={read_threads!r}: give a whole number of reader threads "
            "(0: read each record when its batch is made)."
        )
    vocab_slice = config.model.get("train_head_vocab_slice", 0)
    if not isinstance(vocab_slice, int) or vocab_slice < 0:
        raise ConfigError(
            f"model.train_head_vocab_slice={vocab_slice!r}: give a whole number of vocabulary "
            "columns per slice (e.g. 2048), or 0 for the whole logits."
        )
    head_dtype = config.model.get("train_head_dtype", "")
    if head_dtype not in ("", "float32", "bfloat16"):
        raise ConfigError(
            f"model.train_head_dtype={head_dtype!r}: use float32, bfloat16 or '' (the "
            "compute dtype)."
        )
    if head_dtype and not vocab_slice:
        raise ConfigError(
            f"model.train_head_dtype={head_dtype!r} applies only to the sliced head: set "
            "model.train_head_vocab_slice > 0 too, or leave the dtype ''."
        )
    dispatch.check(config)
    check_names(config)
    return sizes


def check_phases(phases: Sequence[Phase], data: int) -> None:
    """Every phase's global batch splits over the `data` axis x its microbatches (at
    least one)."""
    for p in phases:
        name, micro, gbs = f"{p.source}.global_batch_size", p.microbatches, p.global_batch_size
        if micro < 1:
            raise ConfigError(f"train.microbatches={micro} must be >= 1.")
        if gbs <= 0:
            raise ConfigError(f"{name}={gbs} must be > 0; use a multiple of {data * micro}.")
        if gbs % (data * micro):
            raise ConfigError(
                f"{name}={gbs} is not divisible by data-axis size {data} x "
                f"train.microbatches {micro} = {data * micro}; use a multiple of {data * micro}."
            )


def check_names(config) -> None:
    """Names that are looked up only after the data is built (optimizer, all-reduce)."""
    opt = config.get("optimizer")
    if opt is not None and opt.get("name") not in OPTIMIZERS:
        raise ConfigError(
            f"optimizer.name={opt.get('name')!r} is unknown; use one of {', '.join(OPTIMIZERS)}."
        )
    try:
        GradReduction.from_config(config.get("parallel", {}))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_cache_dir(config) -> None:
    """data.cache_dir (or its default) must be creatable and writable: the data cache,
    its trained vocab and its build locks live there."""
    data = config.get("data")
    if data is None or "cache_dir" not in data:
        return
    if storage.is_url(data.cache_dir):
        raise ConfigError(
            f"data.cache_dir {data.cache_dir} is in an object store; the data cache (built "
            "data, offset indexes, locks) must be a local folder. Inputs may be in a bucket: "
            "set data.data_dir to the gs:// URL instead."
        )
    path = os.path.abspath(os.path.expanduser(data.cache_dir or DEFAULT_CACHE_DIR))
    try:
        storage.probe_write(path)
    except OSError as e:
        raise ConfigError(
            f"data.cache_dir {path!r} is not writable ({e.strerror or e}); set "
            "--config.data.cache_dir to a directory you can write to."
        ) from None


def _relative_input_files(data) -> list[tuple[str, str]]:
    """(key, path) of each file the data config reads under data.data_dir: the relative
    paths of the keys its source uses (none for an embedded or generated set)."""
    keys = []
    if data.get("source") == "coco":
        keys += ["annotations", "images_dir", "eval_annotations", "eval_images_dir"]
    if "corpus" in data and (data.get("format", "text") != "text" or data.corpus == "files"):
        keys += ["train_files", "eval_files", "eval_text_files"]
    keys.append("vocab_file")
    found = []
    for key in keys:
        value = data.get(key) or ()
        for path in (value,) if isinstance(value, str) else value:
            if not input_files.is_absolute(os.path.expanduser(path)):
                found.append((key, path))
    return found


def check_data_dir(config) -> None:
    """A config that reads files by relative path names the folder they are under: with
    data.data_dir empty, one line naming the key (before anything is built)."""
    data = config.get("data")
    if data is None or data.get("data_dir"):
        return
    relative = _relative_input_files(data)
    if relative:
        key, path = relative[0]
        raise ConfigError(
            f"data.data_dir is not set, and data.{key} ({path!r}) is relative to it; pass "
            "--config.data.data_dir=DIR, the folder that holds the data set."
        )


def _probe_store(name: str, path: str) -> None:
    """A missing bucket, missing permission or an unreachable store is one line before
    anything is built: bad input (ConfigError), except an unreachable or failing store,
    which stays a transient StorageError (exit code 69: a supervisor starts it again)."""
    try:
        storage.probe_write(path)
    except OSError as e:
        if isinstance(e, storage.StorageError) and e.transient:
            raise storage.StorageError(
                f"{name} {path}: cannot write there ({e}); the store did not answer, the "
                "same command continues once it does.",
                transient=True,
            ) from None
        raise ConfigError(
            f"{name} {path}: cannot write there ({e}); check the bucket name and this "
            "host's credentials (docs/multi-host.md)."
        ) from None


def check_workdir(workdir: str, checkpoint_dir: str | None = None, min_free_mb: int = 64) -> None:
    """Fails before anything is built if the work (or checkpoint) directory cannot be
    created or written, or its disk is (nearly) full. A folder in a bucket takes a probe
    object; an object store has no free space to check (said once)."""
    said_store = False
    for name, path in (("--workdir", workdir), ("checkpoint.dir", checkpoint_dir)):
        if not path:
            continue
        if storage.is_url(path):
            _probe_store(name, path)
            if not said_store:
                said_store = True
                print(
                    f"{name} {path} is in the object store {storage.bucket(path)}: "
                    "no free-space check there.",
                    flush=True,
                )
            continue
        try:
            storage.probe_write(path)
        except OSError as e:
            raise ConfigError(
                f"{name} {path!r} is not writable ({e.strerror or e}); choose a directory "
                "you can write to, or fix its permissions."
            ) from None
        free_mb = shutil.disk_usage(path).free // (1 << 20)
        if free_mb < min_free_mb:
            raise ConfigError(
                f"{name} {path!r} has only {free_mb} MiB free (at least {min_free_mb} MiB "
                "needed for logs and checkpoints); free some space or choose another directory."
            )


def set_config_key(config, key: str, value, convert: bool = False) -> None:
    """Sets the dotted `key` ("model.remat") of `config`; ConfigError naming a section or
    key the config lacks (a typo must not add a key nothing reads). `convert`: `value` is
    text, cast to the type of the value it replaces."""
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
        if p not in node:
            raise ConfigError(f"{key}: the config has no section {p!r}")
        node = node[p]
    if leaf not in node:
        raise ConfigError(f"{key}: the config has no key {leaf!r} there")
    node[leaf] = type(node[leaf])(value) if convert else value


def apply_mesh_override(config, mesh_text: str) -> None:
    """`data=8,model=1` -> config.mesh.axes / ici_shape (single slice)."""
    if not mesh_text:
        return
    axes, sizes = [], []
    for part in mesh_text.split(","):
        name, _, size = part.partition("=")
        if not name.strip() or not size.strip().lstrip("-").isdigit():
            raise ValueError(f"--mesh {mesh_text!r}: use axis=size pairs, e.g. data=8,model=1")
        axes.append(name.strip())
        sizes.append(int(size))
    config.mesh.axes = tuple(axes)
    config.mesh.ici_shape = tuple(sizes)
    config.mesh.dcn_shape = (1,) * len(axes)
