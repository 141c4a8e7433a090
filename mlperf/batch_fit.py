"""Global batches that do not split over a mesh's `data` axis: the nearest ones that do,
and the meshes on which the config's own batches split.

A topology fixes the device count; the config's mesh (e.g. data=-1, model=4) then fixes
the `data` size, and every global batch (train, phase 2, eval) must be a multiple of it
(train batches also of `train.microbatches`). When one is not, `inspect` and `plan` say
so in one line (`fit_text`) with the nearest valid batches below and above and the
meshes of the same axes that keep every batch as the config has it; `suggest` picks one
of those so that a table of published-scale compiles can go on (`launch.tables.tpu`).
"""

from __future__ import annotations

import dataclasses
import math

from mlperf.config_error import ConfigError


@dataclasses.dataclass(frozen=True)
class BatchProblem:
    """One global batch that is not a multiple of what the mesh needs."""

    name: str  # the config key, e.g. "train.eval_batch_size"
    batch: int
    multiple: int  # data size (x microbatches for train batches)
    below: int | None  # nearest valid batch under `batch` (None: there is none > 0)
    above: int

    @property
    def nearest(self) -> int:
        """The closer of `below` and `above`; a tie goes up (no example is dropped)."""
        if self.below is None or self.above - self.batch <= self.batch - self.below:
            return self.above
        return self.below


def nearest_multiples(batch: int, multiple: int) -> tuple[int | None, int]:
    """The multiples of `multiple` just under and just over `batch` (under: None if 0)."""
    below = batch // multiple * multiple
    above = below + multiple if below != batch else batch
    return (below or None), above


def _batches(config) -> list[tuple[str, int, int]]:
    """(config key, global batch, microbatches) of every batch the mesh must split."""
    t = config.train
    micro = max(int(t.microbatches), 1)
    out = [("train.global_batch_size", int(t.global_batch_size), micro)]
    if config.get("phase2") and config.phase2.get("enabled"):
        out.append(("phase2.global_batch_size", int(config.phase2.global_batch_size), micro))
    out.append(("train.eval_batch_size", int(t.eval_batch_size), 1))
    return out


def problems(config, data: int) -> list[BatchProblem]:
    """The config's global batches that do not split over `data` replicas."""
    found = []
    for name, batch, micro in _batches(config):
        multiple = data * micro
        if batch > 0 and batch % multiple:
            below, above = nearest_multiples(batch, multiple)
            found.append(BatchProblem(name, batch, multiple, below, above))
    return found


def mesh_proposals(config, devices: int, slices: int = 1) -> list[dict[str, int]]:
    """Meshes of the config's axes on `devices` devices (`slices` slices, `data` spanning
    them) on which every global batch splits, nearest to the config's own non-data axis
    size first. Only the first non-data axis changes (power-of-two sizes); the others
    keep their sizes."""
    axes = list(config.mesh.axes)
    other = next((a for a in axes if a != "data"), None)
    if "data" not in axes or other is None:
        return []
    ici = dict(zip(axes, config.mesh.ici_shape, strict=True))
    fixed = math.prod(int(ici[a]) for a in axes if a not in ("data", other))
    current = int(ici[other]) if int(ici[other]) > 0 else 1
    per_slice = devices // slices
    out = []
    size = 1
    while size * fixed <= per_slice:
        if per_slice % (size * fixed) == 0:
            sizes = {a: int(ici[a]) for a in axes}
            sizes[other] = size
            sizes["data"] = devices // (size * fixed)
            if not problems(config, sizes["data"]):
                out.append(sizes)
        size *= 2
    # Nearest to the config's own size (in factors of two), the smaller on a tie.
    out.sort(key=lambda s: (abs(math.log2(s[other]) - math.log2(current)), s[other]))
    return out


def mesh_text(sizes: dict[str, int]) -> str:
    """`data=1024,model=8` (the form `--mesh` takes)."""
    return ",".join(f"{a}={n}" for a, n in sizes.items())


def fit_text(config, sizes: dict[str, int], devices: int, where: str, slices: int = 1) -> str:
    """One line: which batches do not split over the mesh `sizes` on `where`, the nearest
    valid ones and the meshes that keep every batch; '' when every batch splits."""
    found = problems(config, sizes.get("data", 1))
    if not found:
        return ""
    parts = []
    for p in found:
        below = f"{p.below} or " if p.below else ""
        parts.append(
            f"{p.name}={p.batch} is not a multiple of {p.multiple} (data={sizes['data']}"
            f"{'' if p.multiple == sizes['data'] else ' x microbatches'}); nearest valid: "
            f"{below}{p.above} (--config.{p.name}={p.nearest})"
        )
    # As --mesh takes them: one slice's sizes, `data` spanning the slices on top.
    meshes = [dict(m, data=m["data"] // slices) for m in mesh_proposals(config, devices, slices)]
    per_slice = f" per slice (x {slices} slices)" if slices > 1 else ""
    mesh_hint = (
        "; or keep the batches on mesh " + " or ".join(mesh_text(m) for m in meshes[:3]) + per_slice
        if meshes
        else "; no mesh of these axes splits every batch"
    )
    return f"mesh {mesh_text(sizes)} on {where}: " + "; ".join(parts) + mesh_hint + "."


def suggest(config, sizes: dict[str, int], devices: int, slices: int = 1) -> dict[str, str]:
    """Overrides that make every batch split, as `launch.inspect` flags: the train batch
    is kept by changing the mesh when a mesh allows it (else its nearest valid value);
    an eval batch alone takes its nearest valid value. Empty when nothing is needed."""
    found = problems(config, sizes.get("data", 1))
    if not found:
        return {}
    if any(p.name != "train.eval_batch_size" for p in found):
        meshes = mesh_proposals(config, devices, slices)
        if meshes:
            # --mesh gives one slice's (ICI) sizes; `data` spans the slices on top.
            ici = dict(meshes[0], data=meshes[0]["data"] // slices)
            return {"mesh": mesh_text(ici)}
    return {f"config.{p.name}": str(p.nearest) for p in found}


def topology_fit_text(config, topology: str, slices: int = 1) -> str:
    """`fit_text` for the config's own mesh on a named TPU topology (`slices` of it, with
    `data` spanning them); '' when every batch splits or the mesh itself does not fit
    (that error is the mesh's, reported where the mesh is built)."""
    import copy

    from mlperf.validate import ConfigError, mesh_sizes
    from parallel.topology import get_topology

    topo = get_topology(topology, slices)
    c = copy.deepcopy(config)
    use_slices(c, slices)
    try:
        sizes = mesh_sizes(c, len(topo.devices))
    except ConfigError:
        return ""
    if "data" not in sizes:
        return ""
    return fit_text(c, sizes, len(topo.devices), topo.label, slices)


def use_slices(config, slices: int) -> None:
    """Sets config.mesh.dcn_shape for `slices` slices joined over DCN: the `data` axis
    spans them (the ICI shape keeps its sizes per slice). A config that already names a
    DCN shape for that many slices is left as it is."""
    import math

    m = config.mesh
    if slices <= 1 or math.prod(d for d in m.dcn_shape if d > 0) == slices:
        return
    axes = tuple(m.axes)
    if "data" not in axes:
        raise ConfigError(f"mesh.axes={axes} has no 'data' axis to span {slices} slices.")
    m.dcn_shape = tuple(slices if a == "data" else 1 for a in axes)
