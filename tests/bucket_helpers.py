"""Putting test inputs into the fake bucket of the `gcs` fixture (tests/conftest.py)."""

from __future__ import annotations

import itertools
import os

from input_pipeline import storage

BUCKET = "gs://multipod-test"


def upload_tree(local_dir: str, url: str) -> str:
    """Every file under `local_dir` uploaded under `url`, same relative names; returns url."""
    for root, _, names in os.walk(local_dir):
        for name in names:
            path = os.path.join(root, name)
            parts = os.path.relpath(path, local_dir).split(os.sep)
            storage.upload(path, storage.join(url, *parts))
    return url


def head_lines(path: str, count: int) -> str:
    """The first `count` lines of a text file (a small slice of a real corpus)."""
    with open(path, encoding="utf-8") as f:
        return "".join(itertools.islice(f, count))
