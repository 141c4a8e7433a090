"""The error of a config value that cannot work (checked before anything is built)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message says which and how to fix it."""
