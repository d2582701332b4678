"""`splitserve reproduce distserve` end to end at the tiny scale: the report's structure, its
numbers agree with results.json, and the orderings that hold by construction. Which of DistServe
and vLLM wins is the reproduction's finding, not asserted here: under the roofline DistServe led at
this scale; under the operator model (the default since issue 27) vLLM does (7.45 against 6.06
req/s/GPU when this changed), see docs/reproduction/distserve/report.md."""

import json

from splitserve.reproduce.distserve import reproduce_distserve


def test_tiny_report(tmp_path):
    path = reproduce_distserve(tmp_path, scale="tiny", workers=2, log=lambda m: None)
    text = path.read_text()
    for title in ("## Setup", "## Goodput per GPU and gains over vLLM (Figures 8 and 9)",
                  "## Placements found (Alg. 2)", "## Ablation (Figure 11, OPT-13B ShareGPT)",
                  "## Known differences"):
        assert title in text
    assert (tmp_path / "chatbot-opt-13b.png").stat().st_size > 10_000
    assert "](chatbot-opt-13b.png)" in text
    res = json.loads((tmp_path / "results.json").read_text())
    (r,) = res["experiments"]
    pair, vllm = r["low_affinity"]["pair"], r["vllm"]
    assert pair["tp_p"] + pair["tp_d"] <= 8 and pair["gpus"] == (pair["tp_p"] + pair["tp_d"]) * pair["pp"]
    assert vllm["tp"] == 1                                  # §6.1: intra-op 1 for OPT-13B
    # the table row carries the paper's chatbot range beside our gain
    assert f"| {r['rate_gain']:.2f} | 2-3.41 |" in text
    # vLLM++ searches vLLM's own degree too, so it is never worse per GPU
    assert r["vllm_pp"]["best"]["per_gpu"] >= vllm["per_gpu"]
    # attainment falls with the rate (first point vs last) and rises with the SLO scale
    curve = r["rate_curve"]["attainment"]["DistServe"]
    assert curve[0] >= curve[-1]
    scale = r["scale_curve"]["attainment"]["DistServe"]
    assert scale == sorted(scale)
