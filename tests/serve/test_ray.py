"""`--backend ray`: workers as Ray actors on a local Ray instance give the same tokens."""

import httpx
import pytest

from .conftest import reference

pytest.importorskip("ray", reason="Ray is not installed (pip install 'splitserve[ray]')")


def test_ray_backend_serves_the_same_tokens(server_factory, reference_engine):
    srv = server_factory("--backend", "ray", "--prompt-workers", "1", "--token-workers", "1",
                         timeout=120.0)
    prompts = [[1, 2, 3], list(range(5, 45)), list(range(7, 200))]
    want = reference(reference_engine, prompts, [8, 12, 6])
    for prompt, max_tokens, expect in zip(prompts, [8, 12, 6], want):
        r = httpx.post(srv.url + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == expect
    st = srv.wait_settled()
    assert st["in_flight"] == 0 and all(w["free"] == w["start_free"] for w in st["workers"] if w["up"])
