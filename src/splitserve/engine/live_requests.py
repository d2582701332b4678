"""An engine's live requests by id: a new one is encoded, checked against the model and the KV
cache, named (its own id, or the next number) and placed in admission order."""

from __future__ import annotations

import itertools

from ..errors import UserError
from .config import ModelConfig
from .request_checks import check_request
from .sampler import SamplingParams
from .sequence import Sequence
from .structured import Grammars
from .tokenizer import Tokenizer


class LiveRequests:
    """`by_id`: every request added and not yet finished, aborted or released."""

    def __init__(self, cfg: ModelConfig, max_model_len: int, max_seq_len: int, kv_tokens: int,
                 tokenizer: Tokenizer | None, grammars: Grammars) -> None:
        self.cfg, self.max_model_len, self.max_seq_len, self.kv_tokens = cfg, max_model_len, max_seq_len, kv_tokens
        self.tokenizer, self.grammars = tokenizer, grammars
        self.by_id: dict[str, Sequence] = {}
        self._ids, self._arrivals = itertools.count(), itertools.count()   # request ids; admission order

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError("this model has no tokenizer (no tokenizer.json); pass token ids")
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def new(self, prompt_ids: list[int] | str, params: SamplingParams | None, request_id: str | None,
            isolated: bool, resumed: int = 0) -> Sequence:
        """A new live request (UserError if the engine refuses it); the last `resumed` ids are
        outputs it made before (its grammar past them)."""
        ids = self.encode(prompt_ids)
        params = params or SamplingParams()
        check_request(ids, params, self.cfg.vocab_size, self.max_model_len, self.kv_tokens,
                      self.tokenizer is not None)
        rid = request_id if request_id is not None else str(next(self._ids))
        if rid in self.by_id:
            raise UserError(f"request id {rid!r} is already in use")
        cut = len(ids) - resumed
        seq = Sequence(rid, ids[:cut], params, next(self._arrivals), self.max_seq_len, ids[cut:], isolated=isolated,
                       resumed=resumed,
                       matcher=self.grammars.matcher(params.grammar, ids[cut:]) if params.grammar else None)
        self.by_id[rid] = seq
        return seq
