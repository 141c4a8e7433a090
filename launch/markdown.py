"""Markdown tables for the benches' console output and the documentation."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    """A header row, its separator and one row per entry of `cells` (already formatted)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines)
