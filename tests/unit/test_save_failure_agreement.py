"""Several hosts agree on a failed checkpoint save and on whether it was transient (the
store unreachable: exit code 69 on every host) or not (exit code 1 on every host).

The hosts' vote (`all_hosts_ok`, one small all-gather) is replaced by one that adds the
other host's answers, so the agreement's logic runs in one process."""

from __future__ import annotations

import pytest

import mlperf.loop as loop
from mlperf.checkpoint.manager import CheckpointSaveError

OK, FAILED, UNREACHABLE = "ok", "failed", "unreachable"


def _vote_with(other: str):
    """`all_hosts_ok` for two hosts, the other one in state `other`: the first vote asks
    "did every save work?", the second "was every failure only an unreachable store?"."""
    votes = iter([other == OK, other in (OK, UNREACHABLE)])

    def all_hosts_ok(mine: bool) -> bool:
        theirs = next(votes)
        return bool(mine) and theirs

    return all_hosts_ok


def _error(state: str) -> CheckpointSaveError | None:
    if state == OK:
        return None
    return CheckpointSaveError(f"writing checkpoint failed ({state})", state == UNREACHABLE)


@pytest.mark.parametrize(
    "mine, other, transient",
    [
        (OK, UNREACHABLE, True),
        (UNREACHABLE, OK, True),
        (UNREACHABLE, UNREACHABLE, True),
        (UNREACHABLE, FAILED, False),
        (FAILED, UNREACHABLE, False),
        (OK, FAILED, False),
        (FAILED, OK, False),
    ],
)
def test_hosts_agree_the_failure_is_transient_only_if_every_failure_was(
    monkeypatch, mine, other, transient
):
    monkeypatch.setattr(loop, "all_hosts_ok", _vote_with(other))
    agreed = loop._agreed_failure(_error(mine))
    assert agreed is not None and agreed.transient is transient
    if mine == OK:  # this host's own save worked: it says another host failed
        assert str(agreed) == "a checkpoint save failed on another process"
    else:
        assert str(agreed) == f"writing checkpoint failed ({mine})"


def test_no_failure_on_any_host_is_none(monkeypatch):
    monkeypatch.setattr(loop, "all_hosts_ok", _vote_with(OK))
    assert loop._agreed_failure(None) is None
