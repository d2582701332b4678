"""Every serving system of policy/systems.py runs live (`serve --policy NAME`) on the tiny model and
is lossless: greedy tokens equal LLMEngine.generate token for token for concurrent requests of mixed
sizes, and every KV block comes back. A split system keeps its prompt and token workers; an unsplit
one runs all four workers mixed."""

from __future__ import annotations

import pytest

from splitserve.policy.systems import SYSTEMS

from .test_lossless import assert_serves_like_generate, workload


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_serve_policy_is_lossless(name, server_factory, reference_engine):
    # a small cache (4 workers x 48 blocks of 16 tokens) so that memory, not only order, matters
    srv = server_factory("--policy", name, "--prompt-workers", "2", "--token-workers", "2", "--num-blocks", "48")
    prompts, max_tokens = workload(n=40, seed=11)
    assert_serves_like_generate(srv, reference_engine, prompts, max_tokens, f"{name}: ")

    st = srv.wait_settled()
    for w in st["workers"]:
        assert w["free"] == w["start_free"] and w["reserved"] == 0, (name, w)
    assert st["policy_idle"], st["machines"]
    homes = sorted(w["home"] for w in st["workers"])
    assert homes == (["prompt"] * 2 + ["token"] * 2 if SYSTEMS[name].split else ["mixed"] * 4), homes
