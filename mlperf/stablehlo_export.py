"""A model's inference function serialized with `jax.export`, with its parameters beside it.

`export_program` writes, into one folder:

    model.stablehlo     `Exported.serialize()`: StableHLO for each platform asked for
                        (cpu, cuda, tpu), with the calling convention
    params.safetensors  the parameters, one tensor per leaf, named by its path ("a.b.0.c")
    manifest.json       inputs and outputs (names, shapes, dtypes), platforms, what the
                        program computes, the preprocessing it expects, the source run
    README.md           how to load and call it

The program is `f(params, inputs) -> outputs` with `params` the flat {name: array} of
params.safetensors and `inputs` a dict of named arrays, so it runs with JAX alone:

    exported = jax.export.deserialize(open("model.stablehlo", "rb").read())
    outputs = exported.call(safetensors.numpy.load_file("params.safetensors"), inputs)

Shapes are static: the batch and sequence sizes are fixed at export time.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from safetensors.numpy import save_file

PLATFORMS = ("cpu", "cuda", "tpu")
PROGRAM_FILE = "model.stablehlo"
PARAMS_FILE = "params.safetensors"
MANIFEST_FILE = "manifest.json"


@dataclasses.dataclass(frozen=True)
class Program:
    """An inference function of (params, inputs) and what to write about it."""

    fn: Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]]
    inputs: dict[str, jax.ShapeDtypeStruct]
    description: str  # what the outputs are, for the manifest and README
    preprocessing: str = ""  # what the inputs must be made like (tokenisation, pixels)
    extra_files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)


def _key_name(key: Any) -> str:
    return str(getattr(key, "key", getattr(key, "idx", key)))


def flat_params(params: Any) -> dict[str, np.ndarray]:
    """{"a.b.0.c": array} of a nested params tree, in a stable order."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {".".join(_key_name(k) for k in path): np.asarray(x) for path, x in leaves}


def _unflatten_fn(params: Any) -> Callable[[dict[str, jax.Array]], Any]:
    """The inverse of flat_params for trees shaped like `params`."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    names = [".".join(_key_name(k) for k in path) for path, _ in paths]

    def unflatten(flat: dict[str, jax.Array]) -> Any:
        return jax.tree_util.tree_unflatten(treedef, [flat[n] for n in names])

    return unflatten


def check_platforms(platforms: Sequence[str]) -> tuple[str, ...]:
    """The platforms, checked against the ones JAX can lower for."""
    platforms = tuple(p.strip().lower() for p in platforms if p.strip())
    unknown = sorted(set(platforms) - set(PLATFORMS))
    if unknown or not platforms:
        raise ValueError(f"platforms {list(platforms)}: choose from {', '.join(PLATFORMS)}")
    return platforms


def _avals(tree: Any) -> Any:
    return jax.tree.map(lambda s: {"shape": list(s.shape), "dtype": str(s.dtype)}, tree)


def export_program(
    program: Program,
    params: Any,
    output_dir: str,
    platforms: Sequence[str] = ("cpu",),
    source: Mapping[str, Any] | None = None,
) -> list[str]:
    """Serializes `program` for `platforms` with `params` (host arrays) into output_dir;
    returns the paths written."""
    platforms = check_platforms(platforms)
    flat = flat_params(params)
    unflatten = _unflatten_fn(params)

    def inference(flat_params: dict[str, jax.Array], inputs: dict[str, jax.Array]):
        return program.fn(unflatten(flat_params), inputs)

    abstract_params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat.items()}
    exported = jax.export.export(jax.jit(inference), platforms=platforms)(
        abstract_params, program.inputs
    )
    outputs = jax.tree_util.tree_unflatten(exported.out_tree, list(exported.out_avals))
    os.makedirs(output_dir, exist_ok=True)
    paths = [os.path.join(output_dir, n) for n in (PROGRAM_FILE, PARAMS_FILE, MANIFEST_FILE)]
    with open(paths[0], "wb") as f:
        f.write(exported.serialize())
    save_file({k: np.ascontiguousarray(v) for k, v in flat.items()}, paths[1])
    manifest = {
        "program": PROGRAM_FILE,
        "params": PARAMS_FILE,
        "platforms": list(platforms),
        "description": program.description,
        "preprocessing": program.preprocessing,
        "inputs": _avals(program.inputs),
        "outputs": _avals(outputs),
        "source": dict(source or {}),
    }
    with open(paths[2], "w") as f:
        json.dump(manifest, f, indent=2)
    for name, data in program.extra_files.items():
        path = os.path.join(output_dir, name)
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    readme = os.path.join(output_dir, "README.md")
    with open(readme, "w") as f:
        f.write(readme_text(manifest))
    return [*paths, readme]


def readme_text(manifest: Mapping[str, Any]) -> str:
    """How to run the exported program, for the folder's README.md."""
    inputs = "\n".join(
        f"- `{name}`: {spec['dtype']}{spec['shape']}" for name, spec in manifest["inputs"].items()
    )
    outputs = "\n".join(
        f"- `{name}`: {spec['dtype']}{spec['shape']}" for name, spec in manifest["outputs"].items()
    )
    return f"""# Exported inference program

{manifest["description"]}

Platforms: {", ".join(manifest["platforms"])}. Needs `jax` and `safetensors` only:

```python
import jax, numpy as np
from safetensors.numpy import load_file

exported = jax.export.deserialize(open("model.stablehlo", "rb").read())
params = load_file("params.safetensors")
outputs = exported.call(params, inputs)  # inputs: a dict of the arrays below
```

Inputs:

{inputs}

Outputs:

{outputs}

Preprocessing: {manifest["preprocessing"] or "none"}
"""
