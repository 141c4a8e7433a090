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
import os
from typing import Any

import jax

PyTree = Any
# Written into a step directory once orbax has committed it: every file and its size.
MANIFEST = "multipod_manifest.json"


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


def incomplete_reason(path: str) -> str | None:
    """Why a committed step directory cannot be a whole checkpoint (None if it can)."""
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


def committed_steps(directory: str) -> list[int]:
    """Steps with a committed checkpoint directory (orbax renames a finished temporary
    directory to the bare step number), without opening a CheckpointManager."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


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
    with open(os.path.join(directory, str(step), "meta", "metadata")) as f:
        return step, json.load(f)


# Room kept free for logs, metrics and TensorBoard events beyond the next checkpoint.
LOG_ROOM_BYTES = 16 << 20
# Needed before the first checkpoint, whose size is not known yet.
FIRST_RUN_BYTES = 64 << 20


def directory_bytes(path: str) -> int:
    """Bytes of every file under `path`."""
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, files in os.walk(path)
        for name in files
    )


def free_space_needed(directory: str) -> int:
    """Free bytes a run needs to start: the next checkpoint (as large as the newest one in
    `directory`; older ones are deleted only after it is committed) plus room for logs;
    a fixed 64 MiB before there is any checkpoint."""
    steps = committed_steps(directory)
    if not steps:
        return FIRST_RUN_BYTES
    return directory_bytes(os.path.join(directory, str(steps[-1]))) + LOG_ROOM_BYTES
