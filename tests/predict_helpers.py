"""What the predict and export tests share: a tiny run trained for a couple of steps, the
`launch.predict` / `launch.export` commands, and a stablehlo export reloaded in a fresh
Python process that imports nothing of the project."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
from conftest import REPO, cpu_env

STEPS = 2  # a checkpoint trained a couple of steps: what is restored is a trained state
# Every platform jax.export lowers for (BERT's export in the tests: lowering for three
# costs each model's program again); the fresh process runs the CPU one.
PLATFORMS = ("cpu", "cuda", "tpu")


def train_tiny(workdir, config: str, *overrides: str) -> None:
    """`python -m launch.train --config configs/<config>` for STEPS steps into workdir
    (it stops below its target: exit code 1), with a checkpoint at its last step."""
    cmd = [
        sys.executable,
        "-m",
        "launch.train",
        f"--config=configs/{config}",
        f"--workdir={workdir}",
        f"--config.train.steps={STEPS}",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=cpu_env(8), capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (workdir / "checkpoints" / str(STEPS)).is_dir(), proc.stderr[-3000:]


def train_tiny_detector(root, config: str, eval_images: int, *overrides: str):
    """A tiny detector (`config`: ssd.py:tiny, maskrcnn.py:tiny) on a small shapes set with
    `eval_images` eval images, trained a couple of steps into root/run (returned)."""
    train_tiny(
        root / "run",
        config,
        f"--config.data.cache_dir={root / 'cache'}",
        "--config.data.shapes_images=40",
        f"--config.data.eval_count={eval_images}",
        f"--config.train.eval_batch_size={eval_images}",
        *overrides,
    )
    return root / "run"


def run_cli(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> ARGS` from the repository root on 8 fake CPU devices."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=cpu_env(8),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    """Exit code 2, one `multipod: error:` line naming `message`, no traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("multipod: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-3000:]


# Runs in a fresh interpreter outside the repository: loads the program with jax.export
# alone, runs it on the saved inputs, and checks that no project package was imported.
_RELOAD = textwrap.dedent(
    """
    import json, sys
    import jax, numpy as np
    from safetensors.numpy import load_file

    folder, inputs_path, out_path = sys.argv[1:]
    exported = jax.export.deserialize(open(folder + "/model.stablehlo", "rb").read())
    params = load_file(folder + "/params.safetensors")
    inputs = dict(np.load(inputs_path))
    outputs = exported.call(params, inputs)
    np.savez(out_path, **{k: np.asarray(v) for k, v in outputs.items()})
    project = ("mlperf", "launch", "parallel", "input_pipeline", "configs")
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in project)))
    """
)


def run_exported(
    folder, inputs: dict[str, np.ndarray], tmp_path, platforms=("cpu",)
) -> dict[str, np.ndarray]:
    """The exported program's outputs on `inputs`, computed in a fresh process that
    imports nothing of the project (asserted); it was lowered for `platforms`."""
    inputs_path, out_path = tmp_path / "inputs.npz", tmp_path / "outputs.npz"
    np.savez(inputs_path, **inputs)
    proc = subprocess.run(
        [sys.executable, "-c", _RELOAD, str(folder), str(inputs_path), str(out_path)],
        cwd=tmp_path,  # not the repository: nothing of it on the path but the install
        env=cpu_env(1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["platforms"] == list(platforms)
    return dict(np.load(out_path))
