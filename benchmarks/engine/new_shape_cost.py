"""What a prompt step of a length the engine has not seen costs, against one it has (small preset).

    python benchmarks/engine/new_shape_cost.py     # cuda when there is one, else cpu; ~20 s on an H200

Prints step times (ms) of ten new lengths, the same ten again, new two-request steps and lengths
in steps of 16, then torch.profiler tables of one new-length step and of the same length again.
Figures: benchmarks/engine/README.md ("A new prompt length on CUDA").
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
dev = "cuda" if torch.cuda.is_available() else "cpu"
e = LLMEngine("small", EngineConfig(device=dev, dtype="bfloat16" if dev == "cuda" else "float32", tokenizer=None,
                                    prefix_caching=False, num_blocks=2048))
P = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
def step(n, b=1):
    for i in range(b):
        e.add_request(list(range(3 + i, 3 + i + n)), P)
    t0 = time.perf_counter(); e.step(); dt = time.perf_counter() - t0
    while e.has_unfinished(): e.step()
    return dt * 1e3
for n in (64, 64, 64): step(n)
print("new lengths:", [round(step(n), 1) for n in range(100, 110)])
print("again:      ", [round(step(n), 1) for n in range(100, 110)])
print("new 2-batch:", [round(step(n, 2), 1) for n in range(120, 126)])
print("mult of 16: ", [round(step(n), 1) for n in range(160, 320, 16)])
from torch.profiler import profile, ProfilerActivity
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
with profile(activities=acts) as prof:
    print("profiled new", round(step(77), 1))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
if dev == "cuda":
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60))
with profile(activities=acts) as prof:
    print("profiled again", round(step(77), 1))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=60))
