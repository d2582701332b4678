"""The splitwise scheduler (the default): the machine-level rules of the Splitwise paper (§IV-B)
as policy/machine.py states them. Mixed continuous batching: every running decode in every
iteration, and FCFS prompts beside them, whole, up to `prompt_token_cap` prefill tokens (a longer
prompt runs alone); prompts take priority: a prompt that lacks KV preempts the youngest decodes
(recomputed later, at most `preemption_limit` times each). With `chunk_size` > 0 prompts run in
chunks after the decodes (Sarathi-style; see sarathi.py).

Where it differs from the paper: the paper's simulator is the authors'; this is our reading of
§IV-B (mixed batching with prompt priority and preemption on mixed machines), with KV reserved
for a request's whole output when it is admitted, as the authors' simulator does (the default of
`simulate`). Under `--kv-allocation on-demand` (`serve`'s default) a prompt waits for its blocks
instead of preempting, and decodes preempt the last joined for their next blocks
(policy/kv_allocation.py, policy/preemption.py).
"""

from __future__ import annotations

from ..machine import form_mixed
from .base import MachineScheduler

SCHEDULER = MachineScheduler("splitwise", form_mixed, "mixed continuous batching, prompts first, whole prompts "
                             "to a token cap (default)", chunked=True)
