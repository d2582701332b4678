"""How much KV memory a request holds on a machine, and when a machine admits one: the two rules.

- **reserve** (`--kv-allocation reserve`; the Splitwise authors' simulator): a request holds its
  prompt and every token it may generate from its admission, in whole blocks. A running batch
  never outgrows memory; only a starting prompt preempts decodes.
- **on demand** (`--kv-allocation on-demand`; vLLM v1, SGLang, TensorRT-LLM: what PagedAttention
  exists for): a request holds the blocks of the tokens it has. A prompt starts when its prefill's
  blocks and a watermark are free, and preempts nobody; a token machine reserves an arriving
  prompt's blocks (and its first token's) the same way. Each step a decode takes the block its
  next token needs; one that finds none preempts (policy/preemption.py), and the preempted one
  recomputes later: through the prompt pool when its prompt ran on another machine
  (`--recompute auto`, the default), else in place.

The simulator, the engine's view of itself (engine/scheduler.py) and the router's view of each
worker (serve/cluster_state.py) configure their machines here (`configure`) and the transitions of
policy/transitions.py ask these functions how much to take or free; nothing else sizes KV.
"""

from __future__ import annotations

from typing import Protocol

from .state import Machine, Phase, Request

RESERVE, ON_DEMAND = "reserve", "on-demand"
ALLOCATIONS = (RESERVE, ON_DEMAND)
AUTO, IN_PLACE, PROMPT_POOL = "auto", "in-place", "prompt-pool"
RECOMPUTES = (AUTO, IN_PLACE, PROMPT_POOL)   # auto: prompt-pool on demand (benchmarks/sim/README.md), in-place under reserve
WATERMARK = 0.01   # vLLM's default watermark (v0 BlockSpaceManager): 1% of the blocks stay free at admission


class AllocationSettings(Protocol):
    """The settings this rule reads (policy/machine.py BatchingConfig has them)."""

    @property
    def kv_allocation(self) -> str: ...

    @property
    def kv_watermark(self) -> float: ...

    @property
    def recompute(self) -> str: ...


def configure(m: Machine, cfg: AllocationSettings, block: int = 0) -> None:
    """Make `m` allocate KV as `cfg` says: on demand in blocks of `block` tokens (0: its own
    kv_block; the simulator's machines reserve by the token), its capacity whole blocks and the
    watermark `cfg.kv_watermark` of them."""
    m.kv_on_demand = cfg.kv_allocation == ON_DEMAND
    m.recompute_here = cfg.recompute == IN_PLACE or cfg.recompute == AUTO and not m.kv_on_demand
    if m.kv_on_demand:
        m.kv_block = block or m.kv_block
        blocks = m.kv_capacity // m.kv_block
        m.kv_capacity = blocks * m.kv_block
        m.kv_watermark = int(cfg.kv_watermark * blocks) * m.kv_block


class DoesNotFit(Exception):
    """The request's KV cannot fit the machine at all (not even alone)."""


def decode_reservation(m: Machine, r: Request) -> int:
    """KV tokens `r` holds on the machine `m` that decodes it: the prompt and every token it will
    generate, reserved up front (whole blocks) so a running decode batch never outgrows memory; or
    `r.kv_held` when set: what a scheduler sized (ecoserve's prompt, then predicted output), or on
    demand the blocks of the tokens it has."""
    return r.kv_held or m.kv_round(r.kv_need)


def prefill_reservation(m: Machine, r: Request) -> int:
    """KV tokens a prefill of `r` holds on `m`: everything if `m` will decode it too, else only the
    prompt's KV until it has been sent to the token machine. On demand: the blocks of the tokens
    the prefill computes (its prompt and the outputs made before it, a recompute's)."""
    if m.kv_on_demand:
        if r.token_machine == m.id:
            return r.kv_held or m.kv_round(r.prefill_len)
        made = 1 if r.phase is Phase.HANDOFF or r.phase is Phase.DONE else 0  # its prefill's token
        return m.kv_round(r.prefill_len - made)
    return decode_reservation(m, r) if r.token_machine == m.id else m.kv_round(r.prompt_tokens)


def admission_kv(m: Machine, r: Request) -> int:
    """KV tokens `r` takes when its token machine `m` admits it (reserve_decode): its whole decode's
    (reserve); on demand the blocks of its prompt and the outputs made so far, and of the token its
    prefill makes (a pulled request has made it: HANDOFF)."""
    if m.kv_on_demand:
        return m.kv_round(r.prefill_len + (0 if r.phase is Phase.HANDOFF else 1))
    return decode_reservation(m, r)


def fits(m: Machine, need: int) -> bool:
    """On demand: whether `m` admits something taking `need` KV tokens: they and the watermark are
    free (a machine holding nothing admits whatever fits: nothing could wait for it)."""
    return need + (m.kv_watermark if m.kv_used else 0) <= m.kv_free


def can_reserve(m: Machine, r: Request) -> bool:
    """Whether token machine `m` reserves for `r` now: its reservation is free (reserve); on demand,
    no prompt is queued there (a preempted decode recomputing in place comes first) and `fits`."""
    if m.kv_on_demand:
        return not m.prompt_queue and fits(m, admission_kv(m, r))
    return decode_reservation(m, r) <= m.kv_free


def check_fits(m: Machine, r: Request) -> None:
    """DoesNotFit when `r` could never be held by `m`, even with nothing else on it (a capacity is
    whole blocks, so the unrounded need decides)."""
    if r.kv_need > m.kv_capacity:
        raise DoesNotFit(f"request {r.id} ({r.prompt_tokens} prompt + {r.output_tokens} output tokens) needs "
                         f"{decode_reservation(m, r)} tokens of KV cache but a machine holds {m.kv_capacity}")
