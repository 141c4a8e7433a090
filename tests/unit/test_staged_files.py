"""Growing files of a work directory in a bucket (mlperf/staged_files.py): uploaded when
changed, pulled back for a resume, and a store that is away costs one warning and no
waits at the progress lines that follow."""

from __future__ import annotations

import time

from input_pipeline import storage
from mlperf.staged_files import StagedWorkdir


def test_changed_files_are_uploaded_pulled_back_and_discarded(gcs, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "cache"))
    staged = StagedWorkdir("gs://multipod-test/run")
    assert staged.remote and staged.local.startswith(str(tmp_path / "cache"))
    with open(staged.path("mllog.txt"), "w") as f:
        f.write("one\n")
    assert staged.push("mllog.txt", "tensorboard")  # an absent folder uploads nothing
    assert storage.read_text("gs://multipod-test/run/mllog.txt") == "one\n"
    with open(staged.path("mllog.txt"), "a") as f:
        f.write("two\n")
    assert staged.push("mllog.txt")
    assert storage.read_text("gs://multipod-test/run/mllog.txt") == "one\ntwo\n"

    other = StagedWorkdir("gs://multipod-test/run")  # a new process on a new disk
    other.discard("mllog.txt")
    other.pull("mllog.txt", "metrics.jsonl")
    with open(other.path("mllog.txt")) as f:
        assert f.read() == "one\ntwo\n"
    assert not storage.exists(other.path("metrics.jsonl"))


def test_a_store_that_is_away_is_one_warning_then_skipped_until_forced(
    gcs, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MULTIPOD_STORAGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MULTIPOD_STORE_TIMEOUT_S", "3")
    staged = StagedWorkdir("gs://multipod-test/away")
    with open(staged.path("metrics.jsonl"), "w") as f:
        f.write("{}\n")
    gcs.stop()
    assert not staged.push("metrics.jsonl")
    start = time.monotonic()
    assert not staged.push("metrics.jsonl")  # within RETRY_AFTER_S: not tried at all
    assert time.monotonic() - start < 0.5
    assert not staged.push("metrics.jsonl", force=True)  # tried, failed, not said again
    warnings = [line for line in capsys.readouterr().out.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "logs not uploaded" in warnings[0], warnings
    gcs.start()
    assert staged.push("metrics.jsonl", force=True)
    assert storage.read_text("gs://multipod-test/away/metrics.jsonl") == "{}\n"


def test_a_local_work_directory_is_its_own_staging_folder(tmp_path):
    staged = StagedWorkdir(str(tmp_path))
    assert not staged.remote and staged.path("mllog.txt") == str(tmp_path / "mllog.txt")
    (tmp_path / "mllog.txt").write_text("kept")
    staged.discard("mllog.txt")  # never deletes a local run's files
    assert staged.push("mllog.txt") and (tmp_path / "mllog.txt").read_text() == "kept"
