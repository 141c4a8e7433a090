"""Whether a checkpoint on disk is whole, and whether it belongs to the model restoring it.

Orbax commits a step directory by renaming it once every item is written, so a killed
writer never leaves one that looks complete; but zarr reads a missing chunk file as zeros
and a cut ocdbt file may go unnoticed, so a file list written after the commit (every file
and its size), not a failed read, is what tells a damaged checkpoint. The shapes of every
state leaf, stored with the checkpoint, refuse another model's checkpoint before any array
is read.
"""

from __future__ import annotations

import json
from typing import Any

import jax

from input_pipeline import storage

PyTree = Any
# Written into a step directory once orbax has committed it: every file and its size.
MANIFEST = "multipod_manifest.json"
# On an object store orbax writes a step in place (there is no atomic rename) and marks
# it committed with this object once every item and process has finished.
COMMIT_MARKER = "commit_success.txt"


class CheckpointMismatchError(ValueError):
    """A checkpoint written for another model or config than the one being restored."""


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
    return {
        rel: nbytes
        for rel, nbytes in storage.file_sizes(path).items()
        if not rel.startswith(MANIFEST)
    }


def write_manifest(path: str) -> None:
    """Lists every file of a committed step directory with its size (atomically)."""
    files = _listing(path)
    storage.write_text(storage.join(path, MANIFEST), json.dumps({"files": files}, sort_keys=True))


def check_manifest(path: str) -> str | None:
    """What is missing or cut short in a step directory (None: all files whole). A step
    without a manifest (killed between orbax's commit and the listing) is not checked."""
    try:
        listed = json.loads(storage.read_text(storage.join(path, MANIFEST)))["files"]
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


def incomplete_reason(path: str) -> str | None:
    """Why a committed step directory cannot be a whole checkpoint (None if it can)."""
    for item in ("state", "meta"):
        if not storage.isdir(storage.join(path, item)):
            return f"item {item!r} is missing"
    meta_file = storage.join(path, "meta", "metadata")
    if not storage.isfile(meta_file):
        return "meta/metadata is missing"
    try:
        json.loads(storage.read_text(meta_file))
    except (OSError, ValueError) as e:
        return f"meta/metadata is unreadable ({e})"
    return check_manifest(path)


def committed_steps(directory: str) -> list[int]:
    """Steps with a committed checkpoint directory, without opening a CheckpointManager:
    on a local disk orbax renames a finished temporary directory to the bare step number;
    on an object store a step is committed once its COMMIT_MARKER exists."""
    steps = sorted(int(name) for name in storage.listdir(directory) if name.isdigit())
    if not storage.is_url(directory):
        return steps
    return [s for s in steps if storage.exists(storage.join(directory, str(s), COMMIT_MARKER))]


def checkpoint_metadata(directory: str, step: int = -1, workdir: str = "") -> tuple[int, dict]:
    """(step, metadata) of the committed checkpoint `step` in `directory` (-1: the newest),
    read without opening a CheckpointManager; a clear error when there is none."""
    steps = committed_steps(directory)
    if not steps:
        hint = f"; train with --workdir {workdir}" if workdir else ""
        raise FileNotFoundError(f"no checkpoints in {directory}{hint}")
    step = steps[-1] if step < 0 else step
    if step not in steps:
        raise ValueError(f"no checkpoint for step {step} in {directory}; there are {steps}")
    meta = storage.read_text(storage.join(directory, str(step), "meta", "metadata"))
    return step, json.loads(meta)


# Room kept free for logs, metrics and TensorBoard events beyond the next checkpoint.
LOG_ROOM_BYTES = 16 << 20
# Needed before the first checkpoint, whose size is not known yet.
FIRST_RUN_BYTES = 64 << 20


def directory_bytes(path: str) -> int:
    """Bytes of every file under `path`."""
    return sum(storage.file_sizes(path).values())


def free_space_needed(directory: str) -> int:
    """Free bytes a run needs to start: the next checkpoint (as large as the newest one in
    `directory`; older ones are deleted only after it is committed) plus room for logs;
    a fixed 64 MiB before there is any checkpoint; none on an object store, which has no
    free space to check."""
    if storage.is_url(directory):
        return 0
    steps = committed_steps(directory)
    if not steps:
        return FIRST_RUN_BYTES
    return directory_bytes(storage.join(directory, str(steps[-1]))) + LOG_ROOM_BYTES
