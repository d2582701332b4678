"""Ids of responses, messages and tool calls: unique, not secret (uuid4 costs a getrandom call
each), from one generator seeded by the OS at start-up."""

from __future__ import annotations

import random

_ids = random.Random()


def unique_hex() -> str:
    """96 random bits as 24 hex digits."""
    return f"{_ids.getrandbits(96):024x}"
