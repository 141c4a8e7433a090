"""The tiny SSD run (procedural shapes) reaches its documented mAP target."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, cpu_env

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ssd_end_to_end")]


def test_tiny_ssd_reaches_its_map_target(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "launch.train",
        "--config=configs/ssd.py:tiny",
        f"--workdir={tmp_path / 'run'}",
        f"--config.data.cache_dir={tmp_path / 'cache'}",
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, env=cpu_env(8), capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["benchmark"] == "ssd" and result["target_metric"] == "mAP"
    assert result["reached_target"], result["eval"]
    assert result["eval"]["mAP"] >= result["target"]
    # The MLPerf log carries the COCO mAP as eval_accuracy.
    log = (tmp_path / "run" / "mllog.txt").read_text()
    assert '"key": "eval_accuracy"' in log
