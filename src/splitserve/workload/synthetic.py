"""Synthetic request sizes (data/<name>.json): `coding` and `conversation` fitted to the Azure 2023
traces (scripts/fit_workloads.py); `sharegpt`, `humaneval` and `longbench`, DistServe's chatbot,
code-completion and summarization workloads, from published means and stated assumptions
(scripts/distserve_workloads.py); `tetri-lpld`, `tetri-lphd`, `tetri-hpld`, `tetri-hphd` and
`tetri-mixed`, TetriInfer's light/heavy prefill x decode mixes of ShareGPT, and `alpaca` and
`bookcorpus`, EcoServe's Table 2 traces (scripts/neighbour_workloads.py). Inverse-CDF sampling of each size's quantile function."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from ..errors import UserError

SYNTHETIC = ("coding", "conversation", "sharegpt", "humaneval", "longbench", "tetri-lpld", "tetri-lphd",
             "tetri-hpld", "tetri-hphd", "tetri-mixed", "alpaca", "bookcorpus")


@dataclass(frozen=True, slots=True)
class SizeModel:
    name: str
    probs: np.ndarray
    prompt_q: np.ndarray
    output_q: np.ndarray
    mean_rps: float

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        u = rng.random((2, n))
        prompt = np.rint(np.interp(u[0], self.probs, self.prompt_q)).astype(np.int64)
        output = np.rint(np.interp(u[1], self.probs, self.output_q)).astype(np.int64)
        return np.maximum(prompt, 1), np.maximum(output, 1)


@cache
def size_model(name: str) -> SizeModel:
    if name not in SYNTHETIC:
        raise UserError(f"unknown workload {name!r}; choose one of: {', '.join(SYNTHETIC)}, multiturn, sysprompt, "
                        f"or give a path to an Azure trace CSV")
    d = json.loads(resources.files("splitserve.workload").joinpath(f"data/{name}.json").read_text())
    return SizeModel(name, np.asarray(d["probs"]), np.asarray(d["prompt_tokens"]),
                     np.asarray(d["output_tokens"]), float(d["mean_rps"]))
