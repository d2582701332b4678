"""DistServe's SLO attainment (Zhong et al., OSDI 2024, §2.2 and §6): the fraction of requests whose
time to first token and time per output token (the mean gap after the first token) both meet
their SLOs. Goodput is the highest request rate at which the attainment stays at or above a
target (90% in the paper). One rule, used by the simulator per completed request."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError

TARGET = 0.9  # DistServe's attainment goal


@dataclass(frozen=True, slots=True)
class GoodputSLO:
    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tpot_s > 0):
            raise ValueError("goodput SLOs must be positive seconds")

    def meets(self, ttft_s: float, first_token_at: float, last_token_at: float, output_tokens: int) -> bool:
        """Whether one request meets both: TTFT, and TPOT = (last - first token) / (tokens - 1)
        (a one-token request has no TPOT to miss)."""
        if ttft_s > self.ttft_s:
            return False
        return output_tokens <= 1 or (last_token_at - first_token_at) / (output_tokens - 1) <= self.tpot_s


def from_options(ttft_s: float | None, tpot_s: float | None) -> GoodputSLO | None:
    """The SLOs of --goodput-ttft / --goodput-tpot (simulate, provision): both or neither."""
    if (ttft_s is None) != (tpot_s is None):
        raise UserError("give both --goodput-ttft and --goodput-tpot (seconds), or neither")
    if ttft_s is None or tpot_s is None:  # neither (both or neither, above)
        return None
    if not (ttft_s > 0 and tpot_s > 0):
        raise UserError("--goodput-ttft and --goodput-tpot must be positive seconds")
    return GoodputSLO(float(ttft_s), float(tpot_s))


def attainment_summary(slo: GoodputSLO, attained: int, completed: int, requests: int) -> dict:
    """The summary.json block: attainment over every request offered (a failed or unfinished one
    does not attain)."""
    return {"ttft_slo_s": slo.ttft_s, "tpot_slo_s": slo.tpot_s, "attained": attained, "completed": completed,
            "attainment": attained / requests if requests else None,
            "meets_target": (attained / requests >= TARGET) if requests else None, "target": TARGET}
