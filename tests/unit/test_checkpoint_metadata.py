"""checkpoint_metadata: the step and metadata of a committed checkpoint, or a clear error."""

import json

import pytest

from mlperf.checkpoint import checkpoint_metadata


def _commit(directory, step: int, meta: dict) -> None:
    (directory / str(step) / "meta").mkdir(parents=True)
    (directory / str(step) / "meta" / "metadata").write_text(json.dumps(meta))


def test_newest_or_named_step_and_its_metadata(tmp_path):
    _commit(tmp_path, 4, {"step": 4})
    _commit(tmp_path, 12, {"step": 12})
    (tmp_path / "13.orbax-checkpoint-tmp-1").mkdir()  # not committed: never chosen
    assert checkpoint_metadata(str(tmp_path)) == (12, {"step": 12})
    assert checkpoint_metadata(str(tmp_path), 4) == (4, {"step": 4})


def test_missing_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="train with --workdir W"):
        checkpoint_metadata(str(tmp_path / "none"), workdir="W")
    _commit(tmp_path, 4, {})
    with pytest.raises(ValueError, match=r"no checkpoint for step 5 .* there are \[4\]"):
        checkpoint_metadata(str(tmp_path), 5)
