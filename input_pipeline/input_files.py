"""How the input pipelines name, fingerprint and fetch their input files.

An input is a local path or an object-store URL (`gs://bucket/...`); every call here
goes through `input_pipeline.storage`, so a config's `data.data_dir` and file keys may
be either. What is built from the inputs (corpora, vocabularies, tfds data sets, TFRecord
offset indexes) stays in the local `data.cache_dir`, keyed by `files_key`: the resolved
path (a URL never equals a local path) and the file's size and version (a local mtime,
an object's generation).
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from input_pipeline import storage
from input_pipeline.input_errors import InputError

DEFAULT_CACHE_DIR = "~/.cache/multipod"
T = TypeVar("T")
R = TypeVar("R")

# Concurrent fetches of many small objects (COCO images): one request at a time would
# spend the run's start-up on round trips.
OBJECT_FETCH_THREADS = 16


def is_absolute(path: str) -> bool:
    """True for a URL or an absolute local path (used as given, not under data_dir)."""
    return storage.is_url(path) or os.path.isabs(path)


def resolve(path: str, data_dir: str = "") -> str:
    """A config's file path made whole: a relative one under `data_dir` (a folder or a
    URL), a local one absolute with `~` expanded, a URL as given."""
    if storage.is_url(path):
        return storage.resolve(path)
    path = os.path.expanduser(path)
    if data_dir and not os.path.isabs(path):
        if storage.is_url(data_dir):
            return storage.join(storage.resolve(data_dir), path)
        path = os.path.join(os.path.expanduser(data_dir), path)
    return os.path.abspath(path)


def local_cache_dir(value: str, default: str = DEFAULT_CACHE_DIR) -> str:
    """data.cache_dir made absolute (`default` when empty). The cache holds what is built
    from the inputs, with file locks and random reads: a URL is refused in one line."""
    if storage.is_url(value):
        raise InputError(
            f"data.cache_dir {value} is in an object store; the data cache must be a local "
            "folder (the inputs themselves may be gs:// URLs: data.data_dir)"
        )
    return os.path.abspath(os.path.expanduser(value or default))


def files_key(paths: Sequence[str], **extra: Any) -> str:
    """Short hash of the files (path, size, version) and extra settings: a cache key."""
    stats = {p: storage.file_version(p) for p in paths}
    blob = json.dumps({"files": stats, **extra}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def existing_files(folder: str) -> Callable[[str], bool]:
    """exists() for paths under `folder`: a stat per file locally; for a prefix in a
    bucket one listing up front (a request per file of COCO's 118k images would take
    longer than the run's data preparation)."""
    if not storage.is_url(folder):
        return storage.exists
    listed = {storage.join(folder, name) for name in storage.file_sizes(folder)}
    return listed.__contains__


def map_ahead(fn: Callable[[T], R], items: Iterable[T], remote: bool) -> Iterator[R]:
    """fn over items, in order. Local inputs one at a time; remote ones (`remote`) with
    OBJECT_FETCH_THREADS calls under way, at most twice that many results held."""
    if not remote:
        yield from map(fn, items)
        return
    window = 2 * OBJECT_FETCH_THREADS
    with concurrent.futures.ThreadPoolExecutor(OBJECT_FETCH_THREADS) as pool:
        pending: collections.deque = collections.deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
