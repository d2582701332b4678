"""Both engines a worker runs, LLMEngine and the echo stand-in, are the Engine of
engine/contract.py, and behave as it says."""

from __future__ import annotations

from types import SimpleNamespace

from splitserve.engine.contract import Engine
from splitserve.engine.engine import LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.serve.echo import EchoEngine


def test_llm_engine_is_an_engine_and_runs_a_request():
    eng = LLMEngine("tiny")
    assert isinstance(eng, Engine)
    reports = []
    eng.on_schedule = reports.append
    rid = eng.add_request([1, 72, 105], SamplingParams(max_tokens=3, ignore_eos=True), "r")
    outs = eng.step()
    assert eng.last_shape == [(0, 3)] and [(o.request_id, len(o.new_token_ids)) for o in outs] == [(rid, 1)]
    assert len(reports) == 1 and reports[0].chunks == [("r", 3)]
    while eng.has_unfinished():
        outs = eng.step()
    assert outs[0].finished and len(outs[0].token_ids) == 3 and outs[0].finish_reason == "length"
    eng.check_alive()  # tp 1: nothing to check, nothing raised
    assert eng.num_preemptions == 0 and eng.kv_host.num_reserved == 0
    assert eng.blocks.num_free == eng.blocks.num_blocks and eng.device.type == "cpu"


def test_echo_engine_is_an_engine_and_echoes_a_request():
    eng = EchoEngine()
    assert isinstance(eng, Engine)
    eng.add_request([5, 6, 7], SimpleNamespace(max_tokens=3), "r")
    outs = eng.step()
    assert [(o.request_id, o.new_token_ids, o.finished, o.finish_reason) for o in outs] == [("r", [8, 9, 10], True,
                                                                                             "length")]
    eng.check_alive()
    assert eng.last_shape == [] and eng.num_preemptions == 0 and eng.kv_host.num_reserved == 0
    assert eng.kv_host.kv_layout.bytes_per_token == 0 and eng.device is None and not eng.has_unfinished()


def test_an_engine_without_a_member_of_the_contract_is_not_one():
    echo = EchoEngine()
    partial = SimpleNamespace(**{k: getattr(echo, k) for k in ("add_request", "abort", "step", "has_unfinished")})
    assert not isinstance(partial, Engine)  # no check_alive, kv_host, blocks, ...
