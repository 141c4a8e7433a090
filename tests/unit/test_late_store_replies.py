"""A store reply that arrives after a failed save's event loop closed prints nothing;
every other unraisable error still does.

The scenario is tensorstore's own: a read from a GCS endpoint that refuses connections
(127.0.0.1, port 9) is awaited on an event loop that closes before tensorstore has
given up retrying; tensorstore then hands the failure to `loop.call_soon_threadsafe`
from its own thread, and the closed loop's "Event loop is closed" is reported through
`sys.unraisablehook`."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, cpu_env

LATE_REPLY = """
import asyncio, os, sys, time
os.environ["TENSORSTORE_GCS_HTTP_URL"] = "http://127.0.0.1:9"
os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "token"
import tensorstore as ts
from mlperf.checkpoint.process_settings import drop_late_store_replies
if sys.argv[1] == "hooked":
    drop_late_store_replies()
retries = {"max_retries": 1, "initial_delay": "0.5s", "max_delay": "0.5s"}
context = ts.Context({"gcs_request_retries": retries})

async def abandon_a_read():
    store = await ts.KvStore.open({"driver": "gcs", "bucket": "late-replies"}, context=context)
    read = asyncio.ensure_future(store.read("key"))
    await asyncio.sleep(0.2)  # the read is still retrying when the loop closes
    return read

loop = asyncio.new_event_loop()
pending = loop.run_until_complete(abandon_a_read())
loop.close()
time.sleep(2.5)  # the retries end and the reply finds the loop closed
class Finaliser:
    def __del__(self):
        raise ValueError("another error")  # unraisable too, and not a late reply

Finaliser()
print("finished", file=sys.stderr)
"""


def _run(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", LATE_REPLY, mode],
        cwd=REPO,
        env=cpu_env(1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_late_replies_to_a_closed_loop_print_nothing_and_other_errors_still_print():
    unhooked = _run("plain")
    assert "RuntimeError: Event loop is closed" in unhooked  # what the hook is for
    hooked = _run("hooked")
    assert "Event loop is closed" not in hooked and "finished" in hooked
    assert "ValueError: another error" in hooked  # any other error still reaches stderr


def test_the_hook_is_installed_once():
    from mlperf.checkpoint import configure_checkpointing

    configure_checkpointing()
    hook = sys.unraisablehook
    configure_checkpointing()
    assert sys.unraisablehook is hook and getattr(hook, "_drops_late_store_replies", False)
