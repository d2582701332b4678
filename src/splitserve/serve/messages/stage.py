"""The router's `Stage` of a request: where in its life the router holds it."""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """A request's stage in the router (requests.py LiveRequest.stage). A StrEnum: each member is
    its string (Stage.DECODE == "decode", str() and f-strings give "decode"). `Stage.X.__doc__`
    says what X means."""

    def __new__(cls, value: str, doc: str) -> Stage:
        m = str.__new__(cls, value)
        m._value_ = value
        m.__doc__ = doc
        return m

    NEW = "new", "Admitted by submit, not routed yet (momentary: routing follows at once)."
    PARKED = "parked", "No live worker could take it; it waits (at most park_timeout_s) for one to come up."
    WAITING = "waiting", "Routed, but the policy has not admitted it yet (no room): queued until memory frees."
    RESERVING = "reserving", "Split: `expect` sent to its token worker; the router waits for `reserved`."
    PREFILL = "prefill", "`gen` sent to its prompt worker (kind full, or prefill after `reserved`); no first token yet."
    HANDOFF = "handoff", "Split: its first token came from the prompt worker; its KV is on the way (`kv_in` next)."
    DECODE = "decode", "Generating output tokens: after its first token (unsplit) or after `kv_in` (split)."
    DONE = "done", "Ended (completed, failed or cancelled); the router holds nothing of it any more."
