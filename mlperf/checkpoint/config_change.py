"""Whether a resumed run may continue with a config that differs from its checkpoint's.

A checkpoint stores the resolved config it was written with. On resume every key is
compared: a change that can alter the training trajectory (schedule, optimizer, batch,
model, data, seed, ...) is refused before anything is compiled, naming each key with both
values; a change that cannot (log frequency, eval settings, checkpoint retention, the
mesh and the parallel layout, which are resharded) is allowed and reported. The list of
trajectory-neutral keys is explicit: a key not on it (a new one included) counts as
altering the trajectory. `--allow_config_change=key1,key2` continues past named changes,
which the run then records in the MLPerf log and result.json.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from mlperf.checkpoint.integrity import CheckpointMismatchError

# Keys whose value cannot change the parameters a run reaches, step by step. A key ending
# in "." names every key below it. Everything else alters the trajectory.
TRAJECTORY_NEUTRAL = (
    "checkpoint.",  # where, how often and how many checkpoints are written and kept
    "eval.",  # how evals decode and score (beam size, NMS thresholds)
    "train.log_every_steps",
    # The same steps, k to a host dispatch: equal to float32 rounding, not bitwise
    # (test_steps_per_dispatch.py); a resume at any step runs single steps up to the
    # next mark where it needs to (mlperf/dispatch.py).
    "train.steps_per_dispatch",
    "train.eval_batch_size",
    "data.cache_dir",
    "data.input_workers",
    "data.read_threads",
    "data.eval_files",
    "data.eval_annotations",
    "data.eval_images_dir",
    "data.max_eval_examples",
    "model.eval_head_chunks",  # how the eval's vocabulary projection is grouped
    # The attention core in CPU blocks: the same dropout masks, values equal to float32
    # rounding (test_attention_core.py).
    "model.attention_cpu_block_bytes",
    # The mesh and the parallel layout: the state is resharded on restore (sums are then
    # taken in another order: equal to float32 rounding, not bitwise).
    "mesh.axes",
    "mesh.ici_shape",
    "mesh.dcn_shape",
    "mesh.num_devices",
    "parallel.weight_update_sharding",
    "parallel.fsdp",
    "parallel.grad_allreduce",
    "parallel.grad_bucket_bytes",
    "parallel.grad_allreduce_chunks",
    "parallel.rules",
)
ABSENT = "<absent>"


class ConfigChangeError(CheckpointMismatchError):
    """A resume with a config change that alters the training trajectory."""


def is_trajectory_neutral(key: str) -> bool:
    """Whether changing `key` (dotted) cannot alter the training trajectory."""
    return any(
        key.startswith(entry) if entry.endswith(".") else key == entry
        for entry in TRAJECTORY_NEUTRAL
    )


def plain_config(config: Any) -> dict[str, Any]:
    """The config as JSON values (tuples become lists), as a checkpoint stores it."""
    return json.loads(config.to_json_best_effort())


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclasses.dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between the checkpoint and this run."""

    key: str
    saved: Any
    now: Any

    @property
    def neutral(self) -> bool:
        return is_trajectory_neutral(self.key)

    def describe(self) -> str:
        return f"{self.key}: {_show(self.saved)} -> {_show(self.now)}"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "checkpoint": self.saved, "now": self.now}


def _show(value: Any) -> str:
    return value if value == ABSENT else json.dumps(value)


def config_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[ConfigChange]:
    """Every key whose value differs (absent on one side counts), sorted by key."""
    a, b = flatten(saved), flatten(now)
    return [
        ConfigChange(key, a.get(key, ABSENT), b.get(key, ABSENT))
        for key in sorted(set(a) | set(b))
        if a.get(key, ABSENT) != b.get(key, ABSENT)
    ]


def check_config_change(
    saved: dict[str, Any], now: dict[str, Any], allowed: Iterable[str], where: str
) -> list[ConfigChange]:
    """The changes from the checkpoint's config to this run's that may go ahead (neutral
    ones and the `allowed` keys); raises ConfigChangeError naming every other one."""
    allowed = set(allowed)
    changes = config_changes(saved, now)
    refused = [c for c in changes if not c.neutral and c.key not in allowed]
    if refused:
        listed = "; ".join(c.describe() for c in refused)
        keys = ",".join(c.key for c in refused)
        raise ConfigChangeError(
            f"resuming {where} with a config that alters the training trajectory: {listed}. "
            "Rerun with the checkpoint's values, start a new run in another --workdir, or "
            f"pass --allow_config_change={keys} to continue anyway (recorded in the MLPerf "
            "log and result.json)."
        )
    return changes


def unknown_allowed_keys(allowed: Iterable[str], now: dict[str, Any]) -> list[str]:
    """Keys named in --allow_config_change that this config does not have (typos)."""
    keys = flatten(now)
    return sorted(k for k in allowed if k not in keys)
