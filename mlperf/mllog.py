"""MLPerf logging through the official `mlperf_logging.mllog`, 0.7.0 training ruleset.

Each run writes `<workdir>/mllog.txt` with `:::MLLOG` lines that
`python -m mlperf_logging.compliance_checker --usage training --ruleset 0.7.0` parses.
Only process 0 writes (one log per run, as MLPerf requires); the others log nothing.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np
from mlperf_logging.mllog import constants
from mlperf_logging.mllog import mllog as mllog_impl

RULESET = "0.7.0"


def _numpy_as_python(obj: Any) -> Any:
    """What mllog's own encoder makes of numpy values (it writes those)."""
    if isinstance(obj, np.generic | np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _check_encodable(key: str, value: Any, metadata: dict | None) -> None:
    """Raises TypeError for a value the log cannot hold: mllog itself writes a "Failed to
    encode" line instead of the event, which the compliance checker then reports as a
    missing key far from its cause."""
    try:
        json.dumps({"value": value, "metadata": metadata}, default=_numpy_as_python)
    except (TypeError, ValueError) as e:
        raise TypeError(f"MLPerf log event {key!r}: {value!r} is not JSON ({e})") from e


class MlLog:
    """A per-run MLPerf logger writing to one file (no stdout, no global handlers)."""

    def __init__(
        self, path: str, enabled: bool = True, append: bool = False, stack_offset: int = 2
    ):
        """`stack_offset`: how many frames above the mllog call the caller whose file and
        line each event records is (2: the caller of `event`; more through wrappers)."""
        self.path = path
        self.enabled = enabled
        self._logger = logging.getLogger(f"multipod.mllog.{os.path.abspath(path)}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        self._handler: logging.Handler | None = None
        if enabled:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            # A resumed run appends to the log its checkpoint cut back (one log per run).
            self._handler = logging.FileHandler(path, mode="a" if append else "w")
            self._logger.addHandler(self._handler)
        self._mllogger = mllog_impl.MLLogger(logger=self._logger, default_stack_offset=stack_offset)

    def event(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self.enabled:
            _check_encodable(key, value, metadata)
            self._mllogger.event(key=key, value=value, metadata=metadata)

    def start(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self.enabled:
            _check_encodable(key, value, metadata)
            self._mllogger.start(key=key, value=value, metadata=metadata)

    def end(self, key: str, value: Any = None, metadata: dict | None = None) -> None:
        if self.enabled:
            _check_encodable(key, value, metadata)
            self._mllogger.end(key=key, value=value, metadata=metadata)

    def submission_info(self, benchmark: str, platform: str, division: str = "open") -> None:
        """The submission_* keys every MLPerf log starts with."""
        self.event(constants.SUBMISSION_ORG, "multipod")
        self.event(constants.SUBMISSION_PLATFORM, platform)
        self.event(constants.SUBMISSION_DIVISION, division)
        self.event(constants.SUBMISSION_STATUS, "research")
        self.event(constants.SUBMISSION_BENCHMARK, benchmark)
        self.event(constants.SUBMISSION_POC_NAME, "multipod developers")
        self.event(constants.SUBMISSION_POC_EMAIL, "multipod@example.invalid")

    def hyperparameters(
        self, params: dict[str, Any], metadata: dict[str, dict] | None = None
    ) -> None:
        """One event per hyperparameter; `metadata` maps a key to its event metadata."""
        for key, value in params.items():
            self.event(key, value, metadata=(metadata or {}).get(key))

    def flush(self) -> None:
        """Writes buffered lines to the file (before it is uploaded or measured)."""
        if self._handler is not None:
            self._handler.flush()

    def close(self) -> None:
        if self._handler is not None:
            self._handler.flush()
            self._handler.close()
            self._logger.removeHandler(self._handler)
            self._handler = None


# Re-exported so the loop and tasks use the official key names.
keys = constants
