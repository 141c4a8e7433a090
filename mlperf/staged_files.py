"""The files of a work directory that grow while a run goes (the MLPerf log,
metrics.jsonl, TensorBoard events, profiler traces), for work directories in a bucket.

An object cannot be appended to, so these files are written in a local staging folder
(input_pipeline.storage.staging_dir: ~/.cache/multipod/storage/workdirs/...) and each
changed file is uploaded whole at every progress line, eval and checkpoint and at exit:
a killed run loses at most the lines since its last progress line. A resumed run first
downloads them, so its lines follow on from the bucket's copy. A local work directory is
its own staging folder and nothing is uploaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from input_pipeline import storage

# Seconds a failed upload waits before progress lines try again.
RETRY_AFTER_S = 60.0


class StagedWorkdir:
    """Local copies of a remote work directory's growing files, uploaded when asked."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.remote = storage.is_url(workdir)
        self.local = storage.staging_dir(workdir)
        self._sent: dict[str, tuple[int, int]] = {}  # local path -> (size, mtime_ns) uploaded
        self._failing = False  # a failed upload is reported once until one succeeds
        # After a failure, progress lines skip their uploads until then: a store that is
        # away must not hold every step for its timeout.
        self._retry_at = 0.0

    def path(self, rel: str) -> str:
        """The local file (or folder) that stands for WORKDIR/`rel`."""
        return os.path.join(self.local, rel)

    def url(self, rel: str) -> str:
        """WORKDIR/`rel` itself (a URL for a remote work directory)."""
        return storage.join(self.workdir, rel)

    def pull(self, *rels: str) -> None:
        """Replaces the local copy of each file `rel` with the work directory's (removes it
        when the work directory has none). Local: nothing to do."""
        if not self.remote:
            return
        for rel in rels:
            local = self.path(rel)
            if storage.exists(self.url(rel)):
                storage.download(self.url(rel), local)
                self._sent[local] = self._stamp(local)
            else:
                self.discard(rel)

    def discard(self, *rels: str) -> None:
        """Removes stale local copies (a new run in a remote work directory starts empty);
        never touches a local work directory."""
        if not self.remote:
            return
        for rel in rels:
            local = self.path(rel)
            if os.path.isdir(local):
                shutil.rmtree(local, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(local)

    def push(self, *rels: str, force: bool = False) -> bool:
        """Uploads every file under each `rel` that changed since it was last uploaded.
        A failure is one warning line (once until an upload succeeds again) and False, and
        the next RETRY_AFTER_S seconds of pushes are skipped unless `force`d."""
        if not self.remote:
            return True
        if not force and time.monotonic() < self._retry_at:
            return False
        try:
            for rel in rels:
                for local in self._files(self.path(rel)):
                    stamp = self._stamp(local)
                    if self._sent.get(local) != stamp:
                        relpath = os.path.relpath(local, self.local)
                        storage.upload(local, storage.join(self.workdir, *relpath.split(os.sep)))
                        self._sent[local] = stamp
        except OSError as e:
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            if not self._failing:
                self._failing = True
                print(f"WARNING: logs not uploaded (retried at the next line): {e}", flush=True)
            return False
        self._failing = False
        self._retry_at = 0.0
        return True

    @staticmethod
    def _stamp(local: str) -> tuple[int, int]:
        st = os.stat(local)
        return st.st_size, st.st_mtime_ns

    @staticmethod
    def _files(path: str) -> list[str]:
        if os.path.isfile(path):
            return [path]
        found = []
        for root, _, files in os.walk(path):
            found += [os.path.join(root, f) for f in files]
        return sorted(found)
