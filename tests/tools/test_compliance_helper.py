"""tests/conftest.py's `compliance_check` reports the checker's verdict, and a checker that
does not run, crashes or exits without its verdict fails the test instead of reading as
a log with no failed checks."""

from __future__ import annotations

import subprocess

import conftest
import pytest
from conftest import compliance_check


def test_a_rejected_log_lists_the_failed_checks(tmp_path):
    mllog = tmp_path / "mllog.txt"
    mllog.write_text("")
    output, failures = compliance_check(mllog)
    assert "ERROR - FAILED" in output
    assert "WARNING -  Required EXACTLY_ONE occurrence of 'submission_org' but found 0" in failures
    assert "No log lines detected" in failures
    assert not any(set(line) == {"-"} for line in failures)


def test_a_checker_that_crashes_fails_the_test(tmp_path):
    with pytest.raises(AssertionError, match="crashed"):
        compliance_check(tmp_path / "missing.txt")


def _fake_checker(monkeypatch, returncode: int, stdout: str) -> None:
    def run(args, **kwargs):
        return subprocess.CompletedProcess(args, returncode, stdout, "")

    monkeypatch.setattr(conftest.subprocess, "run", run)


@pytest.mark.parametrize(
    "returncode, stdout, message",
    [
        (0, "", "without SUCCESS"),  # e.g. the checker module did not run at all
        (2, "usage: mlperf_logging.compliance_checker\n", "exited 2 without its verdict"),
        (1, "INFO - Running compliance on file: x\nERROR - FAILED\n", "without saying which"),
    ],
)
def test_no_verdict_fails_the_test(monkeypatch, tmp_path, returncode, stdout, message):
    _fake_checker(monkeypatch, returncode, stdout)
    with pytest.raises(AssertionError, match=message):
        compliance_check(tmp_path / "mllog.txt")


def test_success_and_the_known_bert_failure(monkeypatch, tmp_path):
    _fake_checker(monkeypatch, 0, "** Logging output also at x.log\nINFO - SUCCESS\n")
    assert compliance_check(tmp_path / "mllog.txt")[1] == []
    rejected = f"INFO - Running compliance on file: x\n{conftest.BERT_TARGET_NOT_REACHED}\n"
    _fake_checker(monkeypatch, 1, rejected + "ERROR - FAILED\n")
    assert compliance_check(tmp_path / "mllog.txt")[1] == [conftest.BERT_TARGET_NOT_REACHED]
