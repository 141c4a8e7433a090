"""What docs/gpu.md promises a GPU user, checked without a GPU: the install extra, the
MFU denominator for GPU device kinds, and the one-GPU check script."""

from __future__ import annotations

import re
import subprocess
import tomllib
from types import SimpleNamespace

import pytest
from conftest import REPO

from mlperf import peak_flops


def test_gpu_extra_installs_jax_cuda_at_the_projects_jax_version():
    with open(f"{REPO}/pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    [jax_pin] = [d for d in project["dependencies"] if d.startswith("jax>")]
    assert project["optional-dependencies"]["gpu"] == [jax_pin.replace("jax", "jax[cuda12]")]


@pytest.mark.parametrize("kind", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_mfu_of_a_known_gpu_is_against_its_published_bf16_peak(kind):
    gpus = [SimpleNamespace(platform="gpu", device_kind=kind)] * 2
    peak = peak_flops.peak_for_devices(gpus)
    assert peak.flops_per_s == 2 * 989e12
    assert peak.source == f"published bf16 ({kind}) x 2"


def test_an_unknown_gpu_gets_a_measured_peak_that_says_so(monkeypatch):
    monkeypatch.setattr(peak_flops, "_measured_peak", lambda: 1e12)
    gpus = [SimpleNamespace(platform="gpu", device_kind="NVIDIA Future 9000")]
    peak = peak_flops.peak_for_devices(gpus)
    assert peak.flops_per_s == 1e12
    assert peak.source == "measured fp32 matmul (NVIDIA Future 9000) x 1"


def test_the_gpu_check_script_parses_and_gives_one_gpu_meshes():
    script = f"{REPO}/launch/gpu_check.sh"
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    with open(script) as f:
        text = f.read()
    assert "--mesh data=1,model=1" in text and "--config.mesh.ici_shape='(1,1)'" in text
    assert len(re.findall(r"^\s*bench --config", text, re.M)) == 5
    assert text.count("\ntrain ") == 3
    # The 2-layer Transformer-big run leaves its GPU programs in $OUT, finished or not.
    assert "--xla_dump_to=$OUT/xla_transformer --xla_dump_hlo_as_text" in text
