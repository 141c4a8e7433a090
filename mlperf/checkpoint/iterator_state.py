"""The input iterator's checkpointable state, and the stand-in grain's handler saves.

The loop prefetches one batch ahead, so the state saved with a checkpoint is the one
taken before the next batch was read.
"""

from __future__ import annotations

import json


def iterator_state_of(iterator) -> bytes | None:
    """The grain iterator's checkpointable state; None for an iterator without one (its
    position is then restored by skipping the batches already taken)."""
    get_state = getattr(iterator, "get_state", None)
    if get_state is None:
        return None
    state = get_state()
    return state if isinstance(state, bytes) else json.dumps(state).encode()


class FrozenIteratorState:
    """An iterator stand-in for grain's checkpoint handler: it holds the state captured
    when the batch after the checkpointed step was still unread."""

    def __init__(self, state: bytes | None = None):
        self.state = state

    def get_state(self) -> bytes:
        return b"null" if self.state is None else self.state

    def set_state(self, state: bytes) -> None:
        self.state = state

    def start_prefetch(self) -> None:  # grain's handler calls this after set_state
        pass
