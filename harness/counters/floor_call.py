"""The allocation floor's one call, alone in its file: the events made under this frame are the floor's."""

from __future__ import annotations

from collections.abc import Callable


def floor_call(call: Callable, ops, a0, a1, seq_ids, status_out, cow_out, slot_out, rows, tokens, blocks):
    """``call`` with a step kernel's arguments, from a Python frame, as a design's ``step()`` calls its kernel."""
    return call(ops, a0, a1, seq_ids, status_out, cow_out, slot_out, rows, tokens, blocks)
