"""CPU runs keep freed host memory: a large block freed and allocated again is not
faulted in again (mlperf/host_memory.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, cpu_env, tiny_train_command

from mlperf import host_memory

# Mallocs, writes and frees a 400 MB block five times (as XLA:CPU does a program's
# scratch memory); prints the page faults of the last four.
_FAULTS = """
import ctypes, resource, sys
from mlperf import host_memory
if sys.argv[1] == "keep":
    assert host_memory.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
def touch():
    block = libc.malloc(400 << 20)
    ctypes.memset(block, 1, 400 << 20)
    libc.free(block)
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    touch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_a_freed_block_is_reused_without_page_faults():
    # 400 MB is ~98,000 pages of 4 KB: glibc maps it afresh on every allocation.
    assert _faults("default") > 4 * 50_000
    assert _faults("keep") < 5_000


def test_the_environment_overrides_the_default():
    assert host_memory.wanted(True, {})
    assert not host_memory.wanted(False, {})
    assert not host_memory.wanted(True, {host_memory.ENV_VAR: "0"})
    assert host_memory.wanted(False, {host_memory.ENV_VAR: "1"})
    with pytest.raises(ValueError, match="set it to 1"):
        host_memory.wanted(False, {host_memory.ENV_VAR: "yes"})


def test_a_bad_setting_ends_train_with_one_line(tmp_path):
    env = dict(cpu_env(), **{host_memory.ENV_VAR: "yes"})
    out = subprocess.run(
        tiny_train_command(tmp_path / "w"), cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert "MULTIPOD_KEEP_HOST_MEMORY='yes'" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "w").exists()  # nothing started
