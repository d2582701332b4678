"""A step that raises takes down only its own batch; isolated requests run in steps of their own."""

from __future__ import annotations

import pytest
import torch

from splitserve.policy.machine import BatchingConfig
from splitserve.engine.engine import EngineConfig, LLMEngine, StepFailed
from splitserve.engine.sampler import SamplingParams

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, 259, (n - 1,), generator=g).tolist() for n in lengths]


P = prompts([5, 9, 3, 12, 7])


def alone(prompt, params=PARAMS):
    return LLMEngine("tiny").generate([prompt], params)[0].token_ids


def run(eng, final):
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out.token_ids


def live_ids(eng):
    return {s.request_id for s in eng.scheduler.running} | {s.request_id for s in eng.scheduler.waiting}


def break_on(eng, monkeypatch, where, rid, num_output):
    """Make the `where` stage of the step raise once `rid` runs with `num_output` tokens."""
    def hit(seqs):
        return any(s.request_id == rid and len(s.output_ids) == num_output for s in seqs)

    if where == "model":
        real = eng.model.forward

        def forward(*args, **kwargs):
            if hit([s for s, _ in eng.current_batch]):
                raise RuntimeError("boom")
            return real(*args, **kwargs)
        monkeypatch.setattr(eng.model, "forward", forward)
    elif where == "sampler":
        real = eng.sampler

        def sampler(logits, rows):
            if hit(rows):
                raise RuntimeError("boom")
            return real(logits, rows)
        monkeypatch.setattr(eng, "sampler", sampler)
    else:
        real = eng._append_token

        def append(seq, tok):
            if hit([seq]):
                raise RuntimeError("boom")
            return real(seq, tok)
        monkeypatch.setattr(eng, "_append_token", append)


@pytest.mark.parametrize("where", ["model", "sampler", "append"])
def test_a_failing_step_aborts_only_its_batch(monkeypatch, where):
    eng = LLMEngine("tiny", EngineConfig(max_num_seqs=2, num_blocks=16, block_size=4))
    for rid, p in zip("abw", P):
        eng.add_request(p, PARAMS, rid)  # w waits: max_num_seqs
    break_on(eng, monkeypatch, where, "b", 2)
    final = {}
    for _ in range(2):
        assert {o.request_id for o in eng.step()} == {"a", "b"}
    with pytest.raises(StepFailed) as err:
        eng.step()
    assert sorted(err.value.request_ids) == ["a", "b"]
    assert isinstance(err.value.cause, RuntimeError) and "RuntimeError: boom" in str(err.value)
    assert eng.current_batch == [] and live_ids(eng) == {"w"}
    assert not eng.blocks.has("a") and not eng.blocks.has("b")
    eng.add_request(P[3], PARAMS, "late")
    run(eng, final)
    assert final == {"w": alone(P[2]), "late": alone(P[3])}
    assert eng.blocks.num_free == eng.blocks.num_blocks
    eng.blocks.check()


def test_outputs_waiting_for_the_next_step_survive_a_failed_step(monkeypatch):
    """prefill_only keeps other requests' outputs for the next step(); a failing step between
    does not lose them."""
    eng = LLMEngine("tiny")
    eng.add_request(P[0], SamplingParams(max_tokens=1), "x")  # finishes while `prefill_only` runs
    eng.prefill_only(P[1], PARAMS, "p")
    eng.add_request(P[2], PARAMS, "y")
    break_on(eng, monkeypatch, "model", "y", 0)
    with pytest.raises(StepFailed, match="requests y aborted"):
        eng.step()
    outs = eng.step()
    assert [(o.request_id, o.finished) for o in outs] == [("x", True)]
    assert not eng.has_unfinished() and eng.blocks.num_free == eng.blocks.num_blocks


def test_a_failing_prefill_only_drops_its_request(monkeypatch):
    eng = LLMEngine("tiny")
    break_on(eng, monkeypatch, "model", "p", 0)
    with pytest.raises(StepFailed):
        eng.prefill_only(P[1], PARAMS, "p")
    assert not eng.has_unfinished() and eng.blocks.num_free == eng.blocks.num_blocks


# ---- isolation ------------------------------------------------------------------------------------

def spy_on_steps(eng, monkeypatch):
    """The ids of each step's batch, and a check that a sequence left out of a step gets no
    blocks for it (nor is admitted)."""
    steps = []
    real = eng.scheduler.schedule

    def schedule():
        seqs = list(eng.scheduler.running) + list(eng.scheduler.waiting)
        held = {s.request_id: eng.blocks.num_tokens(s.request_id) if eng.blocks.has(s.request_id) else None
                for s in seqs}
        batch, copies = real()
        steps.append(sorted(s.request_id for s, _ in batch))
        for s in seqs:
            if s.request_id not in steps[-1] and s in eng.scheduler.running:  # it was running already
                assert held[s.request_id] == eng.blocks.num_tokens(s.request_id)
        return batch, copies
    monkeypatch.setattr(eng.scheduler, "schedule", schedule)
    return steps


def test_an_isolated_request_never_shares_a_step(monkeypatch):
    eng = LLMEngine("tiny", EngineConfig(block_size=4))
    steps = spy_on_steps(eng, monkeypatch)
    short = SamplingParams(max_tokens=2, ignore_eos=True)
    long = SamplingParams(max_tokens=4, ignore_eos=True)
    eng.add_request(P[0], short, "a")
    eng.add_request(P[1], short, "b")
    eng.add_request(P[2], long, "c", isolated=True)
    final = {}
    for out in eng.step():  # c alone: a and b stay waiting, without blocks
        final[out.request_id] = out
    assert steps == [["c"]] and live_ids(eng) == {"a", "b", "c"}
    assert not eng.blocks.has("a") and not eng.blocks.has("b")
    assert [s.request_id for s in eng.scheduler.waiting] == ["a", "b"]
    run(eng, final)
    # a mixed selection alternates: the isolated request alone, then the others; c finishes alone
    assert steps == [["c"], ["a", "b"], ["c"], ["a", "b"], ["c"], ["c"]]
    assert final == {"a": alone(P[0], short), "b": alone(P[1], short), "c": alone(P[2], long)}
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_the_oldest_isolated_request_goes_first():
    eng = LLMEngine("tiny")
    for rid, p in zip("xyz", P):
        eng.add_request(p, SamplingParams(max_tokens=2, ignore_eos=True), rid, isolated=rid != "z")
    batches = []
    while eng.has_unfinished():
        batches.append(sorted(o.request_id for o in eng.step()))
    assert batches == [["x"], ["z"], ["x"], ["z"], ["y"], ["y"]]


@pytest.mark.parametrize("chunk", [None, 4])
def test_isolation_under_kv_pressure_gives_the_same_tokens(monkeypatch, chunk):
    """With preemptions and chunked prefill, isolated requests still run alone and every request
    gets the tokens it gets alone."""
    ps = prompts([5, 17, 33, 3, 40, 9], seed=1)
    eng = LLMEngine("tiny", EngineConfig(num_blocks=10, block_size=8,
                                         batching=BatchingConfig(chunk_size=chunk or 0, prompt_token_cap=32)))
    steps = spy_on_steps(eng, monkeypatch)
    isolated = {"1", "4"}
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    for i, p in enumerate(ps):
        eng.add_request(p, params, str(i), isolated=str(i) in isolated)
    final = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                final[out.request_id] = out.token_ids
        eng.blocks.check()
    assert final == {str(i): alone(p, params) for i, p in enumerate(ps)}
    assert eng.scheduler.num_preemptions > 0
    assert all(len(ids) == 1 or not isolated & set(ids) for ids in steps)
    assert eng.blocks.num_free == eng.blocks.num_blocks


@pytest.mark.parametrize("handoff", ["import", "layerwise"])
def test_isolated_requests_from_a_prompt_worker(monkeypatch, handoff):
    """The token side's entry points take `isolated` too; an isolated request that breaks its
    step takes no one else with it."""
    a, b = LLMEngine("tiny"), LLMEngine("tiny")
    b.add_request(P[0], PARAMS, "n")
    b.step()
    first = a.prefill_only(P[1], PARAMS, "s")
    if handoff == "import":
        b.kv_host.add_request_with_kv(P[1], first.token, first.kv, PARAMS, "s", isolated=True)
    else:
        b.kv_host.reserve_kv(P[1], PARAMS, "s", isolated=True)
        for layer in range(first.kv.num_layers):
            b.kv_host.write_kv_layer("s", layer, first.kv.layer(layer))
        b.kv_host.start_reserved("s", first.token)
    break_on(b, monkeypatch, "model", "s", 3)
    steps = spy_on_steps(b, monkeypatch)
    final, failed = {}, []
    while b.has_unfinished():
        try:
            run(b, final)
        except StepFailed as e:
            failed.append(e.request_ids)
    assert failed == [["s"]] and final == {"n": alone(P[0])}
    assert steps[:4] == [["s"], ["n"], ["s"], ["n"]]  # s failed at its third step; n goes on alone
    assert b.blocks.num_free == b.blocks.num_blocks
