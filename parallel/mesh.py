"""Build a named device mesh from config axes (ICI shape x DCN shape).

This module is the only place that decides mesh axis types: meshes are built with
`AxisType.Auto` so XLA's SPMD partitioner propagates shardings pjit-style (explicit
"sharding in types" would force an `out_sharding` on every contracting matmul).

On TPU, each slice's devices are laid out by `parallel.torus` (the last mesh axis on
the fastest physical axes, physical axes split where a size needs it) and slices are
stacked along `dcn_shape`, the DCN index major on each axis; `describe_mapping` says
which layout a mesh got.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from parallel.torus import AxisMapping, MeshMappingError, slice_device_mesh


class MeshShapeError(ValueError):
    """A mesh shape that does not fit the available devices."""


def resolve_shape(
    shape: Sequence[int], num_devices: int, what: str = "ici_shape"
) -> tuple[int, ...]:
    """Fills the single `-1` entry of `shape` so that its product equals `num_devices`."""
    shape = tuple(int(s) for s in shape)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise MeshShapeError(f"{what}={shape} has more than one -1; give at most one.")
    if any(s == 0 or s < -1 for s in shape):
        raise MeshShapeError(f"{what}={shape} has a zero or negative size; sizes are >= 1 or -1.")
    known = math.prod(s for s in shape if s != -1)
    if unknown:
        if num_devices % known:
            raise MeshShapeError(
                f"{what}={shape}: the known sizes multiply to {known}, which does not divide "
                f"the {num_devices} devices; choose sizes whose product divides {num_devices}."
            )
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    elif known != num_devices:
        raise MeshShapeError(
            f"{what}={shape} needs {known} devices but {num_devices} are available; "
            f"make the product equal {num_devices} or use -1 for one axis."
        )
    return shape


def resolve_mesh_shape(
    ici_shape: Sequence[int],
    dcn_shape: Sequence[int] | None,
    num_devices: int,
    num_slices: int | None = None,
    prefix: str = "",
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ICI shape, DCN shape) with their -1 entries filled for `num_devices` devices.

    `num_slices` is the devices' slice count; None (a config checked before any device
    is seen) takes it from dcn_shape, a -1 there counting as one slice. `prefix` names
    the config block in error messages (e.g. "mesh.").
    """
    dcn = tuple(dcn_shape) if dcn_shape is not None else (1,) * len(ici_shape)
    if len(dcn) != len(ici_shape):
        raise MeshShapeError(
            f"{prefix}ici_shape={tuple(ici_shape)} and {prefix}dcn_shape={dcn} need one "
            "size per mesh axis each."
        )
    if num_slices is None:
        num_slices = math.prod(d for d in dcn if d != -1) or 1
    dcn = resolve_shape(dcn, num_slices, f"{prefix}dcn_shape")
    slices = math.prod(dcn)
    if num_devices % slices:
        raise MeshShapeError(
            f"{prefix}dcn_shape={dcn} needs {slices} slices but {num_devices} devices do "
            "not split into that many equal slices."
        )
    return resolve_shape(ici_shape, num_devices // slices, f"{prefix}ici_shape"), dcn


def select_devices(devices: Sequence[jax.Device], num_devices: int) -> list[jax.Device]:
    """The devices a run's mesh uses: all of `devices` (num_devices=0) or the first
    `num_devices` of them, which only a single-process run may ask for (every process of
    a multi-process run must hold part of the mesh)."""
    devices = list(devices)
    if num_devices == 0 or num_devices == len(devices):
        return devices
    if num_devices < 0 or num_devices > len(devices):
        raise MeshShapeError(
            f"mesh.num_devices={num_devices}, but {len(devices)} devices are available; "
            f"use 0 (all) or a count from 1 to {len(devices)}."
        )
    if jax.process_count() > 1:
        raise MeshShapeError(
            f"mesh.num_devices={num_devices} uses part of the devices, which a run of "
            f"{jax.process_count()} processes cannot; set mesh.num_devices=0."
        )
    return devices[:num_devices]


def build_mesh(
    axes: Sequence[str],
    ici_shape: Sequence[int],
    dcn_shape: Sequence[int] | None = None,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """Builds a Mesh with named `axes` over `devices` (default: all of `jax.devices()`).

    `ici_shape` is the per-slice shape (one entry may be -1); `dcn_shape` (default all
    ones) multiplies it across slices for a hybrid multi-slice mesh. Works for CPU
    devices, TPU devices and TPU topology descriptions (AOT).
    """
    axes = tuple(axes)
    devices = list(jax.devices() if devices is None else devices)
    dcn = tuple(dcn_shape) if dcn_shape is not None else (1,) * len(axes)
    if len(ici_shape) != len(axes) or len(dcn) != len(axes):
        raise MeshShapeError(
            f"mesh axes {axes} need one size each: got ici_shape={tuple(ici_shape)}, "
            f"dcn_shape={dcn}."
        )
    ici, dcn = resolve_mesh_shape(ici_shape, dcn, len(devices), _count_slices(devices))
    num_slices = math.prod(dcn)
    if devices[0].platform == "tpu":
        # Physical-topology-aware placement so neighbouring mesh coordinates share ICI links.
        try:
            device_array, _ = _tpu_device_array(devices, axes, ici, dcn)
        except MeshMappingError as e:
            raise MeshShapeError(str(e)) from None
    elif num_slices > 1:
        device_array = _stack_slices(
            [np.asarray(s, dtype=object).reshape(ici) for s in _by_slice(devices)], dcn
        )
    else:
        device_array = np.asarray(devices, dtype=object).reshape(ici)
    return Mesh(device_array, axes, axis_types=(AxisType.Auto,) * len(axes))


def _by_slice(devices: Sequence[jax.Device]) -> list[list[jax.Device]]:
    """Devices grouped by slice_index (one group when there is none), in slice order."""
    groups: dict[int, list[jax.Device]] = {}
    for d in devices:
        groups.setdefault(getattr(d, "slice_index", 0) or 0, []).append(d)
    return [groups[k] for k in sorted(groups)]


def _stack_slices(arrays: list[np.ndarray], dcn: tuple[int, ...]) -> np.ndarray:
    """Per-slice logical meshes stacked over the DCN shape: axis i has size dcn_i x
    ici_i, the slice index major (each ICI group stays inside one slice)."""
    ici = arrays[0].shape
    stacked = np.stack(arrays).reshape(dcn + ici)
    n = len(ici)
    order = [k for i in range(n) for k in (i, n + i)]  # (dcn_0, ici_0, dcn_1, ici_1, ...)
    return stacked.transpose(order).reshape([d * i for d, i in zip(dcn, ici, strict=True)])


def _tpu_device_array(
    devices: Sequence[jax.Device], axes: tuple[str, ...], ici: tuple[int, ...], dcn: tuple[int, ...]
) -> tuple[np.ndarray, AxisMapping]:
    """Each slice laid out by `parallel.torus` (same sizes, same mapping), stacked."""
    arrays, mapping = [], None
    for group in _by_slice(devices):
        array, mapping = slice_device_mesh(group, axes, ici)
        arrays.append(array)
    assert mapping is not None
    return _stack_slices(arrays, dcn), mapping


def describe_mapping(mesh: Mesh) -> str:
    """How `build_mesh` lays a TPU mesh of these sizes on the hardware, e.g. `model=4 <-
    x 4; data=64 <- x 4 x y 16 on 16x16 (x, y); split physical axes: x; DCN: data x 2
    slices` (the DCN factor of each axis read from the mesh's slice indices); for other
    devices, the plain device order."""
    devices = list(mesh.devices.flat)
    if devices[0].platform != "tpu":
        return f"{devices[0].platform} devices in order (no physical topology)"
    groups = _by_slice(devices)
    sizes = mesh_shape(mesh)
    dcn = {a: 1 for a in sizes}
    if len(groups) > 1:  # which axes change slice: the DCN factor of each axis
        slice_of = np.vectorize(lambda d: getattr(d, "slice_index", 0))(mesh.devices)
        for i, a in enumerate(sizes):
            moved = np.moveaxis(slice_of, i, 0).reshape(sizes[a], -1)
            dcn[a] = len(set(moved[:, 0].tolist()))
    ici = tuple(sizes[a] // dcn[a] for a in sizes)
    _, mapping = _tpu_device_array(groups[0], tuple(sizes), ici, (1,) * len(sizes))
    text = mapping.describe()
    across = [f"{a} x {n}" for a, n in dcn.items() if n > 1]
    if across:
        text += f"; DCN: {', '.join(across)} slices"
    return text


def _count_slices(devices: Sequence[jax.Device]) -> int:
    slice_ids = {getattr(d, "slice_index", 0) for d in devices}
    return max(len(slice_ids), 1)


def mesh_shape(mesh: Mesh) -> dict[str, int]:
    """Axis name -> size, in mesh order."""
    return {name: int(size) for name, size in mesh.shape.items()}
