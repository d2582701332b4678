"""The KV-connector contract: what the engine tells KV transfer, and what it offers it.

A prompt/token split moves a request's KV cache from the engine that ran its prompt to the engine
that decodes it. The engine knows nothing of how (sockets, shared memory, one process); the
transfer code knows nothing of the engine's layers, blocks or batches. Between them stand two
small interfaces, in the spirit of vLLM v1's KV connector
(vllm/distributed/kv_transfer/kv_connector/v1/base.py):

* `KVConnector`: what the engine calls, as `engine.connector` (None: no transfer). Prompt side,
  inside a step: `start_step` (returns the prompts to stream), `save_layer` after each layer,
  `request_finished` / `request_dropped`, `end_step` (also after a failed step). Token side,
  between steps: `get_finished` (reservations whose KV is all in, and those to free), answered by
  `load_started`. KV arrives between steps, so vLLM's load side has no counterpart here.
* `KVHost`: what a connector may call on its engine (`bind` hands it over): reserve room before
  any byte is sent, write a layer into it, the cache's layout, slot ids for a one-sided writer.

docs/architecture.md ("KV connector") has the call order as a table and the tp > 1 case.
`InMemoryConnector` (kv_memory.py) is the reference implementation; serve/kv/ implements the
contract over ZeroMQ and shared memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # importing this module imports no torch (echo workers use the contract too)
    import torch

    from .kv_cache import KVExport


# ---- what crosses the contract ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KVLayout:
    """An engine's KV cache as transfer sees it: a request's layer is a (2, tokens, num_kv_heads,
    head_dim) tensor of `dtype`; blocks hold `block_size` tokens."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype | None  # None: no KV at all (an engine stand-in)
    block_size: int

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token in every layer."""
        item = self.dtype.itemsize if self.dtype is not None else 0
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * item

    def layer_shape(self, tokens: int) -> tuple[int, int, int, int]:
        return (2, tokens, self.num_kv_heads, self.head_dim)


@dataclass(frozen=True, slots=True)
class PromptChunk:
    """A prompt chunk in the step that starts: `num_tokens` positions of request `request_id`'s
    `prompt_len`-token prompt (a recomputation after preemption counts its outputs too); `last`:
    the chunk completes the prompt, so its KV is whole at the step's end."""

    request_id: str
    num_tokens: int
    prompt_len: int
    last: bool


@dataclass(slots=True)
class KVFinished:
    """The token side's news for the engine (`get_finished`)."""

    loaded: list[tuple[str, int]] = field(default_factory=list)  # (request id, first token): every layer in
    freed: list[str] = field(default_factory=list)                # reservations whose blocks may go now

    def __bool__(self) -> bool:
        return bool(self.loaded or self.freed)


class KVHost(Protocol):
    """What an engine offers its connector (LLMEngine implements it). A connector touches the
    engine through these and nothing else."""

    @property
    def kv_layout(self) -> KVLayout: ...

    def reserve_kv(self, prompt_ids: list[int], params, request_id: str, isolated: bool = False,
                   resumed: int = 0) -> list[int]:
        """Reserve room for a request prefilled elsewhere (what the scheduler's policy takes for
        it: its whole decode's, or on demand its prompt's and first token's blocks) and allocate
        the blocks of its prompt and next token; their ids. `resumed`: the last ids of `prompt_ids`
        are outputs it made before a preemption (their KV comes too). With prefix caching its
        longest cached prefix is attached first (`kv_cached` tokens: whole blocks, fewer than the
        prompt), and only the rest needs writing. UserError when it does not fit (NoRoom: not
        now). Applies the connector's `get_finished` first."""

    def kv_cached(self, request_id: str) -> int:
        """A reservation's leading prompt tokens whose K/V this engine already holds (its prefix
        cache): a writer sends positions from there on."""

    def write_kv_layer(self, request_id: str, layer: int, data: torch.Tensor, start: int = 0) -> None:
        """Write layer `layer`'s K/V (2, tokens, kv_heads, head_dim) of positions start.. into a
        reservation. UserError for no reservation, a layer or shape that does not fit."""

    def kv_slot_ids(self, block_ids: list[int], num_tokens: int) -> torch.Tensor:
        """Slot ids (block * block_size + offset; a long tensor) of positions 0..num_tokens of a
        sequence holding `block_ids`, in a cache of this engine's layout: where a one-sided writer
        puts a token's K/V in a peer's cache."""


# ---- the connector ---------------------------------------------------------------------------
class KVConnector(ABC):
    """What the engine calls (see the module docstring for when). Single-threaded: every call
    comes from the engine's thread. `PromptSideOnly` / `TokenSideOnly` fill in the other side of
    a connector that only sends / only receives."""

    host: KVHost | None = None

    def bound(self) -> KVHost:
        """The host this connector is bound to (RuntimeError before the engine binds it)."""
        if self.host is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to an engine (engine.connector = c)")
        return self.host

    def bind(self, host: KVHost) -> None:
        """The engine attaching this connector (`engine.connector = c`): the host to reserve and
        write through. Called once, before any other method."""
        self.host = host

    # ---- worker role: inside a step ----------------------------------------------------------
    @abstractmethod
    def start_step(self, prompts: list[PromptChunk]) -> Collection[str]:
        """A step that runs `prompts` (every prompt chunk in it; decodes are not listed) starts,
        before the model. Returns the ids of the `last` chunks whose K/V it takes layer by layer
        (`save_layer`); the others' come whole in `request_finished`. A prompt side tells its peer
        that the request made progress, and picks the mode here (the step's prompt tokens are
        known: the policy's `choose_mode`)."""

    @abstractmethod
    def save_layer(self, layer: int, kv: Mapping[str, torch.Tensor]) -> None:
        """Layer `layer` of the step has run: its K/V of every prompt position of each streamed
        request, request id -> a (2, prompt_len, kv_heads, head_dim) tensor the engine gathered
        from its cache. Valid during this call only (copy or ship it now). Called for every layer,
        in order, in a step where `start_step` returned any request."""

    @abstractmethod
    def end_step(self) -> None:
        """The step that `start_step` opened is over: its outputs are made, or it failed. Nothing
        more of it comes (vLLM's wait_for_save: whatever must be out before the engine reuses
        the step's memory is out when this returns)."""

    # ---- scheduler role: whole requests ------------------------------------------------------
    @abstractmethod
    def request_finished(self, request_id: str, first_token: int, export: KVExport | None,
                         logprobs: list | None = None) -> None:
        """A prefill-only request's prompt completed in this step and made `first_token` (the
        decode goes on elsewhere): close its transfer. `export`: the prompt's whole K/V when it
        was not streamed, None when it was. `logprobs`: where the request asks for them,
        [the first token's records, the prompt's records] (logprobs.py `handed`), to go with
        the first token. The engine has freed the request's blocks."""

    @abstractmethod
    def request_dropped(self, request_id: str) -> None:
        """A request left the engine without its KV handed over: aborted, its step failed, or a
        prefill-only request that ended at its first token. Drop whatever was planned for it
        (ids the connector does not know: nothing to do)."""

    @abstractmethod
    def get_finished(self) -> KVFinished:
        """Token side, polled by the engine between steps: the reservations complete since the
        last call (the engine starts them, then calls `load_started`) and those whose blocks may
        be freed now (the engine releases them). Each id is reported once."""

    @abstractmethod
    def load_started(self, request_id: str, error: str | None) -> None:
        """The engine's answer for a `loaded` request: it decodes from its first token on (error
        None), or it could not start (`error`, e.g. the first token already ended it) and its
        reservation is released."""


class PromptSideOnly(KVConnector):
    """A connector that only sends: nothing ever arrives."""

    def get_finished(self) -> KVFinished:
        return KVFinished()

    def load_started(self, request_id: str, error: str | None) -> None:
        pass


class TokenSideOnly(KVConnector):
    """A connector that only receives: nothing is streamed or sent."""

    def start_step(self, prompts: list[PromptChunk]) -> Collection[str]:
        return ()

    def save_layer(self, layer: int, kv: Mapping[str, torch.Tensor]) -> None:
        pass

    def end_step(self) -> None:
        pass

    def request_finished(self, request_id: str, first_token: int, export: KVExport | None,
                         logprobs: list | None = None) -> None:
        pass

    def request_dropped(self, request_id: str) -> None:
        pass


class BothSides(KVConnector):
    """One engine's connector made of a sending half and a receiving half: prompt-side calls go to
    `prompt`, token-side calls to `token`."""

    def __init__(self, prompt: KVConnector, token: KVConnector) -> None:
        self.prompt, self.token = prompt, token

    def bind(self, host: KVHost) -> None:
        self.host = host
        self.prompt.bind(host)
        self.token.bind(host)

    def start_step(self, prompts: list[PromptChunk]) -> Collection[str]:
        return self.prompt.start_step(prompts)

    def save_layer(self, layer: int, kv: Mapping[str, torch.Tensor]) -> None:
        self.prompt.save_layer(layer, kv)

    def end_step(self) -> None:
        self.prompt.end_step()

    def request_finished(self, request_id: str, first_token: int, export: KVExport | None,
                         logprobs: list | None = None) -> None:
        self.prompt.request_finished(request_id, first_token, export, logprobs)

    def request_dropped(self, request_id: str) -> None:
        self.prompt.request_dropped(request_id)

    def get_finished(self) -> KVFinished:
        return self.token.get_finished()

    def load_started(self, request_id: str, error: str | None) -> None:
        self.token.load_started(request_id, error)
