"""Helpers shared by the launch/ entry points (no flag definitions here)."""

from __future__ import annotations


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
