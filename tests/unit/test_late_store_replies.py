"""A store reply that arrives after a failed save's event loop closed prints nothing;
every other error printed from native code still does.

tensorstore finishes a request on its own thread by calling `loop.call_soon_threadsafe`
and, when that raises, prints the error with PyErr_Print, which hands it to
`sys.excepthook`. The tests hand the hook the same three values: a traceback that starts
in `call_soon_threadsafe` (no Python caller) is the late reply."""

from __future__ import annotations

import asyncio
import sys
import types

import pytest

from mlperf.checkpoint import configure_checkpointing


def _print_from_native(error: BaseException, tb: types.TracebackType | None) -> None:
    """What PyErr_Print does with an error a native thread raised."""
    sys.excepthook(type(error), error, tb)


def _closed_loop_error() -> tuple[RuntimeError, types.TracebackType]:
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as e:
        return e, e.__traceback__
    raise AssertionError("a closed loop accepted a callback")


@pytest.fixture(autouse=True)
def _hook_installed():
    configure_checkpointing()  # installs the hook (once per process)


def test_a_late_reply_to_a_closed_loop_prints_nothing(capsys):
    error, tb = _closed_loop_error()
    _print_from_native(error, tb.tb_next)  # from call_soon_threadsafe down: no Python caller
    assert capsys.readouterr().err == ""


def test_the_same_error_from_python_code_is_printed(capsys):
    error, tb = _closed_loop_error()
    _print_from_native(error, tb)  # the caller's frame is this test's code
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: Event loop is closed" in err


def test_any_other_error_from_native_code_is_printed(capsys):
    try:
        raise RuntimeError("the store answered 500")
    except RuntimeError as e:
        _print_from_native(e, e.__traceback__)
    assert "RuntimeError: the store answered 500" in capsys.readouterr().err


def test_the_hook_is_installed_once():
    hook = sys.excepthook
    configure_checkpointing()
    assert sys.excepthook is hook and getattr(hook, "_drops_late_store_replies", False)
