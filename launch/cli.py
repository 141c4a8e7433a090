"""Helpers shared by the launch/ entry points (no flag definitions here)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# Fake CPU devices run as threads. On a loaded 2-core machine one of them can be
# descheduled for longer than XLA's default 40 s collective rendezvous limit, which
# aborts the whole process; a slow machine should make a run slow, not kill it.
CPU_COLLECTIVE_TIMEOUT_FLAGS = (
    "--xla_cpu_collective_call_terminate_timeout_seconds=1800",
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=300",
)


def relax_cpu_collective_timeouts(env: MutableMapping[str, str] = os.environ) -> None:
    """Adds CPU_COLLECTIVE_TIMEOUT_FLAGS to env['XLA_FLAGS'] (before jax starts)."""
    flags = env.get("XLA_FLAGS", "").split()
    names = {f.split("=")[0] for f in flags}
    flags += [f for f in CPU_COLLECTIVE_TIMEOUT_FLAGS if f.split("=")[0] not in names]
    env["XLA_FLAGS"] = " ".join(flags)


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
