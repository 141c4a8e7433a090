"""The preflight gate of a multi-host run: before step 1 every host publishes what it is
about to run, reads every other host's record, and all of them stop with the same line
if any two differ.

A host record holds a hash of the project's source, the jax/jaxlib/libtpu versions, the
resolved config, a data fingerprint, the devices the host holds, the resolved work
directory and the newest committed checkpoint step the host sees there. Different code or
config on one host otherwise shows up as a hang in the first collective or as an
"inconsistent program" error hours later; hosts that see different checkpoints (a work
directory on each host's own disk after a preemption) would resume from different steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import jax

from mlperf.validate import ConfigError

# Folders whose *.py files make up "the code" every host must agree on.
SOURCE_PACKAGES = ("configs", "parallel", "input_pipeline", "mlperf", "launch")
# Extra text a host adds to its record (tests make one host differ through it).
EXTRA_ENV = "MULTIPOD_PREFLIGHT_EXTRA"
_KEY = "multipod/preflight/{}"


class PreflightError(ConfigError):
    """Hosts disagree on code, versions, config, data or devices; the message names them."""


@dataclasses.dataclass(frozen=True)
class HostView:
    """What a host sees of the run's state: the resolved work directory and the newest
    committed checkpoint step there (None: none)."""

    workdir: str
    newest_checkpoint: int | None


def source_hash(root: str | None = None) -> str:
    """sha256 over the project's Python sources (paths and contents), 16 hex digits."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for package in SOURCE_PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\0")
    return digest.hexdigest()[:16]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_record(
    config, data_fingerprint: str, expected_local_devices: int, seen: HostView | None = None
) -> dict[str, Any]:
    """What this host is about to run: every field must be equal on all hosts."""
    devices = jax.local_devices()
    view = {}
    if seen is not None:
        newest = seen.newest_checkpoint
        view = {
            "workdir": seen.workdir,
            "newest checkpoint step": "none" if newest is None else newest,
        }
    return {
        **view,
        "code": source_hash(),
        "python": ".".join(map(str, sys.version_info[:2])),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "libtpu": _version("libtpu") or _version("libtpu-nightly"),
        "config": _flat(json.loads(config.to_json_best_effort(sort_keys=True))),
        "data": data_fingerprint,
        "devices": f"{len(devices)} x {devices[0].device_kind if devices else '?'}",
        "expected_devices": expected_local_devices,
        "extra": os.environ.get(EXTRA_ENV, ""),
    }


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def differences(records: list[dict[str, Any]]) -> list[str]:
    """One phrase per differing field: the field and which hosts hold which value."""
    out = []
    fields = sorted(set().union(*(r.keys() for r in records)))
    for field in fields:
        if field == "config":
            keys = sorted(set().union(*(r.get("config", {}).keys() for r in records)))
            for key in keys:
                out += _differ(f"config {key}", [r.get("config", {}).get(key) for r in records])
        else:
            out += _differ(field, [r.get(field) for r in records])
    for i, r in enumerate(records):
        have, want = r.get("devices", ""), r.get("expected_devices")
        if want is not None and not str(have).startswith(f"{want} x"):
            out.append(f"process {i} holds {have} devices but the mesh expects {want} per host")
    return out


def _differ(name: str, values: list[Any]) -> list[str]:
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(json.dumps(v, sort_keys=True, default=str), []).append(i)
    if len(groups) < 2:
        return []
    parts = [
        f"process {','.join(map(str, ids))} has {value}"
        for value, ids in sorted(groups.items(), key=lambda kv: kv[1])
    ]
    return [f"{name}: {'; '.join(parts)}"]


def check_hosts(
    config,
    data_fingerprint: str,
    mesh_size: int,
    seen: HostView | None = None,
    timeout_s: int = 300,
) -> None:
    """Exchanges host records through jax.distributed's key-value store; raises
    PreflightError (the same on every host) if any two hosts differ. No-op for one host."""
    n = jax.process_count()
    if n == 1:
        return
    from jax._src import distributed

    client = distributed.global_state.client
    me = jax.process_index()
    record = host_record(config, data_fingerprint, mesh_size // n, seen)
    client.key_value_set(_KEY.format(me), json.dumps(record, sort_keys=True, default=str))
    records = []
    for i in range(n):
        text = record if i == me else None
        if text is None:
            try:
                text = json.loads(client.blocking_key_value_get(_KEY.format(i), timeout_s * 1000))
            except Exception as e:  # noqa: BLE001 - names the host that never published
                raise PreflightError(
                    f"preflight: process {i} did not publish its host record within "
                    f"{timeout_s} s ({type(e).__name__}); check its log."
                ) from None
        records.append(text)
    found = differences(records)
    if found:
        shown = " | ".join(found[:6]) + (f" | ... {len(found) - 6} more" if len(found) > 6 else "")
        raise PreflightError(
            f"preflight: the {n} hosts differ, so none of them starts: {shown}. Run the "
            "same code, versions, command and data on every host, with the work directory "
            "in a bucket (gs://...) that every host reads."
        )


def data_fingerprint(task) -> str:
    """What every host must agree on about its prepared data: the eval set size (the
    config's data block, compared key by key, names the files)."""
    return f"eval_examples={task.num_eval_examples()}"
