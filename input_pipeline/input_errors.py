"""The error of an input that cannot be used: a config value, or a file it names (a corpus,
a vocabulary, TFRecords, a pretrained checkpoint). It is raised where the input is
checked; `launch.train` ends the run with exit code 2 and its one-line message. Any other
ValueError out of a run is a bug (exit code 70, traceback printed)."""

from __future__ import annotations


class InputError(ValueError):
    """An input that cannot be used; the message names the file or config key and the fix."""
