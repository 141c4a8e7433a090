"""launch/host_log.py: a host's output copied into WORKDIR/logs/host_<i>.log, locally and
in a bucket (a real GCS-protocol server), where a recreated host (an empty disk) goes on
from the bucket's copy."""

from __future__ import annotations

import sys

from input_pipeline import storage
from launch import host_log


def test_a_host_log_copies_the_output_into_the_work_directory(tmp_path, capsys):
    log = host_log.start(str(tmp_path), 1)
    print("step 1/2")
    print("multipod: error: something", file=sys.stderr)
    log.close()
    text = (tmp_path / "logs" / "host_1.log").read_text()
    assert text.startswith("==== launch.train on ")
    assert text.endswith("step 1/2\nmultipod: error: something\n")
    assert "step 1/2" in capsys.readouterr().out  # the terminal still gets it


def test_a_host_log_in_a_bucket_is_uploaded_and_continued_after_a_new_disk(
    gcs, tmp_path, monkeypatch
):
    url = "gs://multipod-test/run"
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "disk1"))
    log = host_log.start(url, 0)
    print("attempt one")
    log.close()
    assert storage.read_text(f"{url}/logs/host_0.log").endswith("attempt one\n")
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "disk2"))  # a recreated VM
    log = host_log.start(url, 0)
    print("attempt two")
    log.close()
    text = storage.read_text(f"{url}/logs/host_0.log")
    assert text.count("==== launch.train on ") == 2
    assert text.index("attempt one") < text.index("attempt two")
