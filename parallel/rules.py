"""The logical axis vocabulary and default logical -> mesh axis rules, as plain data.

Models annotate parameters and activations with logical names only; these rules map
each name to a mesh axis (or None = replicated). Rules are ordered (logical, mesh)
pairs, as in flax/t5x; the first rule for a name wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from jax.sharding import PartitionSpec

LogicalAxes = tuple[str | None, ...]
Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Every logical name a model may use. Unknown names are an error, not silent replication.
# The leading axis of a scanned layer stack ([num_layers, ...] parameters).
STACK_AXIS = "stack"

LOGICAL_AXES = (
    "batch",
    "length",
    "residual_length",
    "embed",
    "heads",
    "kv",
    "mlp",
    "vocab",
    "position",
    "type",
    "classes",
    "height",
    "width",
    "channels",
    "conv_in",
    "conv_out",
    "kernel_h",
    "kernel_w",
    "anchors",
    "boxes",
    "stack",
)

# Data parallelism over `data`; tensor (Megatron) parallelism over `model` for attention
# heads, MLP hidden units and the vocabulary, as in the MLPerf v0.7 BERT/Transformer runs.
DEFAULT_RULES: Rules = (
    ("batch", "data"),
    ("heads", "model"),
    ("mlp", "model"),
    ("vocab", "model"),
    ("length", None),
    # The sequence dimension of the residual stream between sublayers (layer norms,
    # dropout, residual adds). Mapped to `model` it is Megatron's sequence parallelism:
    # those elementwise ops run on a 1/model slice of the rows, which are gathered back
    # before each sublayer's projections.
    ("residual_length", None),
    ("embed", None),
    ("kv", None),
    ("position", None),
    ("type", None),
    ("classes", None),
    ("height", None),
    ("width", None),
    ("channels", None),
    ("conv_in", None),
    ("conv_out", None),
    ("kernel_h", None),
    ("kernel_w", None),
    ("anchors", None),
    ("boxes", None),
    ("stack", None),
)

# Spatial partitioning for detection models: image height over `model`.
SPATIAL_RULES: Rules = (("height", "model"),) + tuple(r for r in DEFAULT_RULES if r[0] != "height")


def logical_to_spec(
    logical_axes: Sequence[str | None], rules: Rules = DEFAULT_RULES
) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec; a mesh axis is used at most once."""
    table: dict[str, str | tuple[str, ...] | None] = {}
    for name, mesh_axis in rules:
        table.setdefault(name, mesh_axis)
    used: set[str] = set()
    spec: list[str | tuple[str, ...] | None] = []
    for name in logical_axes:
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise KeyError(
                f"logical axis {name!r} has no rule; known names: {sorted(table)}. "
                "Add it to parallel/rules.py or the config's sharding rules."
            )
        mesh_axis = table[name]
        members = (mesh_axis,) if isinstance(mesh_axis, str) else tuple(mesh_axis or ())
        # A mesh axis may shard only one dimension of an array: later uses fall back to None.
        if not members or used.intersection(members):
            spec.append(None)
            continue
        used.update(members)
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def rules_from_config(overrides: Sequence[Sequence[str]] | None) -> Rules:
    """Default rules with config overrides (pairs of logical name, mesh axis or '') first."""
    if not overrides:
        return DEFAULT_RULES
    extra = tuple((name, axis or None) for name, axis in overrides)
    return extra + DEFAULT_RULES
