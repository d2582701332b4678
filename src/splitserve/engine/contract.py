"""What a serving worker needs from an engine (serve/worker.py): the `Engine` protocol, which
LLMEngine and the echo stand-in (serve/echo.py) both implement, and `StepFailed`, the error of a
step that failed. Importing this module imports no torch (echo workers use it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .kv_connector import KVConnector, KVHost

if TYPE_CHECKING:
    from ..policy.machine import BatchReport


class StepFailed(Exception):
    """A step raised after its batch was scheduled: its requests were aborted (blocks freed), every
    other request is untouched."""

    def __init__(self, request_ids: list[str], cause: BaseException) -> None:
        super().__init__(f"step failed, requests {', '.join(request_ids)} aborted: "
                         f"{type(cause).__name__}: {cause}")
        self.request_ids = request_ids
        self.cause = cause


class BlockCounts(Protocol):
    """An engine's KV blocks as its worker reports them."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def num_free(self) -> int: ...


class WorkerKVHost(KVHost, Protocol):
    """An engine's KV host (kv_connector.py KVHost) and how many reservations await their KV."""

    @property
    def num_reserved(self) -> int: ...


class StepOutput(Protocol):
    """One request's output of a step (outputs.py RequestOutput)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]       # every token made so far
    new_token_ids: list[int]   # made by this step
    finished: bool
    finish_reason: str | None  # "prefill": a prefill-only request's prompt is done, its KV handed over
    logprobs: list | None
    prompt_logprobs: list | None


@runtime_checkable
class Engine(Protocol):
    """Requests in, one step at a time, tokens out; a KV connector attached by the worker
    (`connector`), told of each step's batch before it runs (`on_schedule`)."""

    connector: KVConnector | None
    on_schedule: Callable[[BatchReport], None] | None

    @property
    def max_model_len(self) -> int: ...

    @property
    def device(self) -> object:
        """Where its KV lives (a torch.device; None: it holds none)."""

    @property
    def blocks(self) -> BlockCounts: ...

    @property
    def kv_host(self) -> WorkerKVHost: ...

    @property
    def last_shape(self) -> list[tuple[int, int]]:
        """The last step's (KV tokens before, tokens) per sequence; [] if none."""

    @property
    def num_preemptions(self) -> int:
        """Decodes it preempted since it started."""

    def add_request(self, prompt_ids: list[int], params, request_id: str | None = None,
                    prefill_only: bool = False, isolated: bool = False, predicted: int = 0,
                    resumed: int = 0) -> str: ...

    def abort(self, request_id: str) -> None: ...

    def has_unfinished(self) -> bool: ...

    def step(self) -> Sequence[StepOutput]:
        """One batch; StepFailed if it failed (its requests dropped, the engine usable)."""

    def check_alive(self) -> None:
        """Raise if the engine can go on no more (a dead tensor-parallel rank)."""
