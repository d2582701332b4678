"""The simulator's prefix caches (sim/prefix.py) and conversations (workload/conversations.py):
hit and skipped-token counts computed by hand for one conversation, conversations closed-loop,
and caching's effect on TTFT."""

import pytest

from splitserve.sim.run import run_simulation
from splitserve.workload import make_workload

TWO_TURNS = "turns=2,system=0,user=40:40,reply=10:10,think=1"


def _one_conversation_seed() -> int:
    """A seed whose run starts exactly one conversation in 3 s at 0.5 turns/s (0.25 conversations/s)."""
    for seed in range(100):
        if len(list(make_workload("multiturn", rps=0.5, duration=3, seed=seed, conversation=TWO_TURNS))) == 1:
            return seed
    raise AssertionError("no seed starts one conversation")


def _run(design: str, **kw) -> dict:
    counts = {"prompt_machines": 1, "token_machines": 1} if design == "splitwise-hh" else {"machines": 1}
    return run_simulation(design=design, **counts, workload="multiturn", rps=0.5, duration=3,
                          seed=_one_conversation_seed(), conversation=TWO_TURNS, **kw)


def test_one_conversation_on_one_machine_by_hand():
    # turn 1: prompt 40 (2 full blocks of 16), reply 10; its machine then names prompt + reply less
    # its last token: 49 tokens, 3 blocks. Turn 2: prompt 40 + 10 + 40 = 90 tokens (5 full blocks),
    # the first 3 cached: 48 of 130 prompt tokens.
    s = _run("baseline-h100")
    assert s["requests"] == s["completed"] == 2
    assert s["prefix_cache"] == {"queries": 130, "hits": 48, "hit_rate": 48 / 130, "tokens_saved": 48}


def test_one_conversation_split_by_hand():
    # the prompt machine names turn 1's prompt (2 blocks): turn 2 prefills 90 - 32 tokens there; the
    # token machine named turn 1's 3 blocks (prompt + reply less its last token): 48 tokens not sent.
    s = _run("splitwise-hh")
    assert s["prefix_cache"]["hits"] == 32 and s["prefix_cache"]["queries"] == 130
    assert s["kv_transfer"]["skipped_tokens"] == 48
    assert s["kv_transfer"]["transfers"] == 2


def test_without_caching_nothing_is_cached_and_the_turns_are_the_same():
    on, off = _run("baseline-h100"), _run("baseline-h100", prefix_caching=False)
    assert "prefix_cache" not in off and off["requests"] == on["requests"] == 2
    assert off["tokens_generated"] == on["tokens_generated"] == 20


def test_turns_follow_their_replies_and_caching_cuts_ttft():
    kw = dict(design="splitwise-hh", prompt_machines=2, token_machines=1, model="llama2-70b",
              workload="multiturn", rps=4, duration=120, seed=3)
    on, off = run_simulation(**kw), run_simulation(**kw, prefix_caching=False)
    wl = make_workload("multiturn", rps=4, duration=120, seed=3)
    firsts = list(wl)
    assert on["requests"] == off["requests"] == on["completed"] == 10 * len(firsts)   # every turn ran
    hit = on["prefix_cache"]["hit_rate"]
    assert 0.5 < hit < 1.0                     # later turns carry their history
    assert on["ttft_s"]["p50"] * 1.5 < off["ttft_s"]["p50"]


@pytest.mark.parametrize("shape,error", [("turns=0", "turns >= 1"), ("user=9:3", "lo <= hi"),
                                         ("colour=3", "unknown field"), ("think=x", "not a number")])
def test_bad_shapes_say_what_to_fix(shape, error):
    from splitserve.errors import UserError

    with pytest.raises(UserError, match=error):
        make_workload("multiturn", rps=1, duration=1, conversation=shape)
