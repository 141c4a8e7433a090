"""What docs/gpu.md promises a GPU user, checked without a GPU: the install extra, the
MFU denominator for GPU device kinds, and the one-GPU check script."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
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


# Stands in for the GPU's Python in the test below: it writes what the script's parts
# write (a bench row, a run's MLPerf log and result, an XLA dump, a profiler trace), so
# that the script's own handling of them can be checked without a GPU.
FAKE_PYTHON = r"""#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exec python3 "$@"; fi
args=" $* "
dump=$(printf '%s' "${XLA_FLAGS:-}" | grep -o 'xla_dump_to=[^ ]*' | cut -d= -f2)
if [ -n "$dump" ]; then
  mkdir -p "$dump" && for i in 1 2 3 4 5 6 7 8 9; do echo hlo > "$dump/m$i.txt"; done
fi
case "$args" in
  *" launch.bench.step "*)
    profile=$(printf '%s' "$args" | grep -o -- '--profile_dir=[^ ]*' | cut -d= -f2)
    [ -n "$profile" ] && mkdir -p "$profile/plugins/profile/run" \
        && echo trace > "$profile/plugins/profile/run/host.xplane.pb" \
        && echo trace | gzip > "$profile/plugins/profile/run/host.trace.json.gz"
    echo '{"step_ms": 1.0}' ;;
  *" launch.train "*)
    workdir=$(printf '%s' "$args" | sed 's/.*--workdir \([^ ]*\).*/\1/')
    mkdir -p "$workdir" && echo ':::MLLOG {}' > "$workdir/mllog.txt"
    echo '{"reached": true}' > "$workdir/result.json" ;;
esac
"""


def test_the_gpu_check_hands_back_few_files_none_in_a_folder(tmp_path):
    """A lent machine hands back at most 8 files, none more than two folders down
    (the device tool's limits): the script packs the logs, the XLA dump and the trace."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "WORK": str(work), "PYTHON": str(fake)}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"  # no nvidia-smi here: the script goes on
    run = subprocess.run(
        ["bash", f"{REPO}/launch/gpu_check.sh"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == [
        "bench.jsonl",
        "log",
        "mllogs.tgz",
        "results.jsonl",
        "trace_transformer.trace.json.gz",
        "trace_transformer.xplane.pb",
        "xla_transformer.tgz",
    ]
    assert len((out / "bench.jsonl").read_text().splitlines()) == 5
    assert len((out / "results.jsonl").read_text().splitlines()) == 3
    with tarfile.open(out / "mllogs.tgz") as tar:
        assert len([n for n in tar.getnames() if n.endswith(".mllog.txt")]) == 3
    with tarfile.open(out / "xla_transformer.tgz") as tar:
        assert len([n for n in tar.getnames() if n.endswith(".txt")]) == 9


def _cuda_ops(module, devices) -> set[str]:
    """The StableHLO op names of a config's `mlperf_v07` train step lowered for `cuda`
    (one device, batch 8: op kinds do not depend on either)."""
    from mlperf.trainer import build_trainer

    config = module.get_config("mlperf_v07")
    config.mesh.ici_shape = (1, 1)
    config.mesh.num_devices = 1
    config.train.global_batch_size = 8
    trainer = build_trainer(config, devices=devices, prepare_data=False)
    text = trainer.lower_train_step(trainer.phases[0], platforms=("cuda",)).as_text()
    return set(re.findall(r"\bstablehlo\.([a-z_]+)", text))


def test_transformer_big_on_gpu_has_no_op_that_bert_large_lacks_but_its_positions(devices):
    """docs/gpu.md: Transformer-big's step, lowered for `cuda` on this CPU, holds no op
    kind that BERT-large's (whose step runs on an H200) lacks but sine and cosine (the
    positions), and neither has a loop, a sort, a gather, a scatter or a custom call:
    the einsum lookups hold in GPU programs too."""
    from configs import bert, transformer

    transformer_ops, bert_ops = _cuda_ops(transformer, devices), _cuda_ops(bert, devices)
    assert "dot_general" in transformer_ops and "dot_general" in bert_ops
    assert transformer_ops - bert_ops == {"sine", "cosine"}
    for ops in (transformer_ops, bert_ops):
        assert not ops & {"while", "sort", "gather", "scatter", "custom_call"}, ops
