"""The paper's Fig. 20, and Figs. 16-19, against SplitwiseSim's decode lookup (issue 42 item 3;
docs/splitwisesim.md "Fig. 20's question" and docs/reproduction/report.md's Fig. 20 section).

  requests   splitserve with each --decode-lookup against SplitwiseSim's own rows on the question of
             ../shared/reference/splitwisesim/ (Splitwise-HH 30P+10T, the Azure conversation trace
             at 90 req/s for 120 s, 11,308 requests), request by request: TTFT, per-request mean
             TBT and E2E P50 / P90, and how close each request's E2E comes to SplitwiseSim's
  steps      decode step time at batch 1, 64, 128, 256, 512 (mean context 1,000 tokens) of Llama2-70B
             on a DGX-H100 (tp 8): the profile's batch sweep, SplitwiseSim's lookup, the operator model
  fig20      throughput at SLO (30 s of conversation, the report's searches) of each design's
             clusters provisioned for coding and for conversation (the report's splits), under each
             lookup, and with a latency-aware full token machine (--token-full SECONDS)
  provision  the same with each design's clusters provisioned again under each lookup (iso-power,
             40 DGX-H100: the best split for coding and for conversation), as the paper's Fig. 20a
  sweep      Fig. 16: the highest load of the report's lattice meeting all SLOs, each iso-power
             cluster, under each lookup
  fig17      Fig. 17: each pool's busy time by tokens batched per iteration (median, P90, share at
             <= 15 tokens), conversation at 70 and 130 req/s on the report's clusters (120 s)
  fig18b     Fig. 18b: each design's iso-cost (40 DGX-H100) throughput-optimised cluster for
             conversation, provisioned under each lookup, and its throughput against Baseline-H100's
  fig19      Fig. 19: each design's least-power and least-cost cluster meeting all SLOs at
             Baseline-H100's (40 machines) conversation throughput at SLO under the same lookup

    python scripts/splitwisesim_fig20.py requests|steps|fig20|provision|sweep|fig17|fig18b|fig19
        [--token-full SECONDS] [--lookup LOOKUP,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REF = SHARED / "reference" / "splitwisesim"
PROFILE = str(SHARED / "profiles" / "splitwise_a100_h100_perf_model.csv")
LOOKUPS = ("batch-size", "batch-tokens")
# the report's clusters (docs/reproduction/report.md, Figs. 18a and 20): (coding split, conversation split)
FIG20 = {"splitwise-aa": ((59, 11), (31, 39)), "splitwise-hh": ((30, 10), (18, 22)),
         "splitwise-ha": ((32, 14), (15, 43)), "splitwise-hhcap": ((32, 11), (21, 27))}
FIG16 = {"coding": {"splitwise-aa": (55, 15), "splitwise-hh": (35, 5), "baseline-h100": (40,), "baseline-a100": (70,)},
         "conversation": {"splitwise-hh": (25, 15), "splitwise-ha": (25, 26)}}
LOADS = tuple(range(30, 311, 20))  # req/s: the report's lattice (30-150), carried on to 310 so that no cluster tops it
log = logging.getLogger("fig20")


def _policy(token_full: float):
    from splitserve.policy.cluster import RoutingConfig
    from splitserve.policy.config import PolicyConfig
    return PolicyConfig(routing=dataclasses.replace(RoutingConfig(), token_tbt_slo=token_full))


def _pcts(x) -> str:
    return f"{np.quantile(x, .5):.3f} / {np.quantile(x, .9):.3f}"


def _batches():
    """A trace hook keeping the token pool's decode batches, weighted by their time."""
    from splitserve.sim.chrome_trace import ChromeTrace

    class Batches(ChromeTrace):
        def __init__(self) -> None:
            super().__init__(max_events=1)
            self.token: set[int] = set()
            self.seen: list[tuple[int, float]] = []

        def name_machines(self, machines) -> None:
            self.token = {m.id for m in machines if m.home.name == "TOKEN"}

        def batch(self, machine, start, dur, prompt_tokens, decodes, context, preempted) -> None:
            if machine in self.token and decodes:
                self.seen.append((decodes, dur))
    return Batches()


def _weighted(seen: list[tuple[int, float]], q: float) -> int:
    b = np.array(sorted(seen))
    cum = np.cumsum(b[:, 1])
    return int(b[np.searchsorted(cum, q * cum[-1]), 0])


def requests(token_full: float) -> None:
    from splitserve.sim.run import SimRequest, simulate
    ref = pd.read_csv(REF / "hh30p10t_conv90_120s_requests.csv").set_index("request_ids").sort_index()
    rows = {"SplitwiseSim": (ref.ttft_times.values, ref.tbt_times.values[ref.token_sizes.values > 1],
                             ref.response_times.values)}
    e2e = {}
    for lookup in LOOKUPS:
        req = SimRequest(design="splitwise-hh", prompt_machines=30, token_machines=10, model="llama2-70b",
                         workload=str(SHARED / "traces" / "azure_2023_conv.csv"), rps=90, duration=120, seed=0,
                         profile=PROFILE, decode_lookup=lookup, policy=_policy(token_full))
        rec = _batches()
        summary, res = simulate(req, record_requests=True, trace=rec)
        rs = sorted(res.requests, key=lambda r: r.id)
        assert [r.prompt_tokens for r in rs] == list(ref.prompt_sizes.astype(int)), "not SplitwiseSim's requests"
        ttft = np.array([r.token_times[0] - r.arrival for r in rs])
        tbt = np.array([(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
                        for r in rs if len(r.token_times) > 1])
        e2e[lookup] = np.array([r.token_times[-1] - r.arrival for r in rs])
        rows[f"splitserve {lookup}"] = (ttft, tbt, e2e[lookup])
        print(f"{lookup}: borrowings {res.borrowed}, ran whole {sum(r.prompt_machine == r.token_machine for r in rs)}, "
              f"SLO met {summary['slo']['met']} (worst {_worst(summary)}); token pool's decode batch, time-weighted "
              f"P50 / P90 / max: {_weighted(rec.seen, .5)} / {_weighted(rec.seen, .9)} / {max(b for b, _ in rec.seen)}")
    print("| run | TTFT P50 / P90 s | TBT (per-request mean) P50 / P90 s | E2E P50 / P90 s |\n|---|---|---|---|")
    for name, (a, b, c) in rows.items():
        print(f"| {name} | {_pcts(a)} | {_pcts(b)} | {_pcts(c)} |")
    sws = ref.response_times.values
    for lookup, ours in e2e.items():
        rel = ours / sws - 1
        print(f"{lookup}: per-request E2E / SplitwiseSim's: median {np.median(ours / sws):.3f}, "
              f"within 5%: {np.mean(np.abs(rel) <= .05):.1%}, within 10%: {np.mean(np.abs(rel) <= .10):.1%}")


def steps() -> None:
    from splitserve.catalog import load_hardware, load_model
    from splitserve.perf import make_perf_model
    model, hw = load_model("llama2-70b"), load_hardware("dgx-h100")
    perfs = {"profile, batch sweep (default)": make_perf_model(model, hw, 8, PROFILE)[0],
             "profile, SplitwiseSim's lookup": make_perf_model(model, hw, 8, PROFILE, decode_lookup="batch-tokens")[0],
             "operator model (Vidur H100)": make_perf_model(model, hw, 8, None, kind="operators")[0]}
    batches = (1, 64, 128, 256, 512)
    print("| model | " + " | ".join(f"batch {b}" for b in batches) + " |\n" + "|---" * (len(batches) + 1) + "|")
    for name, p in perfs.items():
        print(f"| {name} | " + " | ".join(f"{p.token_time(b, b * 1000) * 1e3:.1f}" for b in batches) + " |")
    ref = make_perf_model(model, load_hardware("dgx-a100"), 8, PROFILE)[0].token_time(1, 1085)
    print(f"TBT P50 SLO of a conversation request (1,020 + 129 / 2 context): 1.25 x {ref * 1e3:.1f} ms = "
          f"{1.25 * ref * 1e3:.1f} ms (the DGX-A100 reference, report/slo.py)")


def _evaluator(lookup: str, token_full: float):
    from splitserve.provision.evaluate import Evaluator, LocalBackend

    class Ev(Evaluator):
        def __call__(self, jobs):
            return super().__call__([dataclasses.replace(j, decode_lookup=lookup, token_tbt_slo=token_full)
                                     for j in jobs])
    return Ev(LocalBackend(1))


def _scenario(workload: str):
    from splitserve.provision import plan
    from splitserve.reproduce.experiments import FULL
    return plan.Scenario(workload, FULL.search_duration, 0, "llama2-70b", PROFILE)


def _throughput(design: str, counts: tuple[int, ...], lookup: str, token_full: float, workload: str = "conversation"):
    from splitserve.provision import plan
    from splitserve.reproduce.experiments import FULL
    from splitserve.reproduce.splitwise_figs import _rates

    ev, sc = _evaluator(lookup, token_full), _scenario(workload)
    rps = plan.throughput_at_slo(ev, plan.design(design), counts, sc, _rates(FULL))
    nxt = _rates(FULL).lattice.rate(_rates(FULL).lattice.index(rps) + 1) if rps else None
    (o,) = ev([sc.job(design, counts, nxt)]) if nxt else (None,)
    return rps, (f"{o.worst} at {nxt:.1f}" if o else "-")


def provision(token_full: float, lookups: tuple[str, ...]) -> None:
    """Fig. 20a with the clusters provisioned again under each lookup (iso-power, 40 DGX-H100, as
    the report's Fig. 18a): the best split for coding and for conversation, and conversation's
    throughput at SLO on each."""
    from splitserve.provision import plan
    from splitserve.reproduce.experiments import FULL
    from splitserve.reproduce.splitwise_figs import _rates

    budget = plan.budget_value(f"{FULL.budget_machines}*dgx-h100", "iso-power")
    print("| design | lookup | coding split | conversation split | conversation req/s on coding cluster "
          "| on conversation cluster | ratio |\n|---|---|---|---|---|---|---|")
    for lookup in lookups:
        ev = _evaluator(lookup, token_full)
        for d in FIG20:
            best = {wl: plan.best_within_budget(ev, plan.design(d), "iso-power", budget, _scenario(wl), plan.Limits(),
                                                _rates(FULL), stride=FULL.stride) for wl in ("coding", "conversation")}
            split = {wl: (r["prompt_machines"], r["token_machines"]) for wl, r in best.items()}
            a = plan.throughput_at_slo(ev, plan.design(d), split["coding"], _scenario("conversation"), _rates(FULL))
            b = best["conversation"]["throughput_at_slo"]
            print(f"| {d} | {lookup} | {split['coding']} | {split['conversation']} | {a} | {b} | "
                  f"{a / b if a and b else float('nan'):.2f} |", flush=True)


def fig20(token_full: float, lookups: tuple[str, ...]) -> None:
    print("| design | lookup | token full | coding split: req/s (first SLO missed above) | conversation split "
          "| ratio |\n|---|---|---|---|---|---|")
    for d, (coding, conv) in FIG20.items():
        for lookup in lookups:
            a, why = _throughput(d, coding, lookup, token_full)
            b, _ = _throughput(d, conv, lookup, token_full)
            ratio = f"{a / b:.2f}" if a and b else "-"
            print(f"| {d} | {lookup} | {token_full} | {a} ({why}) | {b} | {ratio} |", flush=True)


def sweep(token_full: float) -> None:
    from splitserve.sim.run import run_simulation
    print("| workload | design | lookup | highest load meeting all SLOs | first SLO missed |\n|---|---|---|---|---|")
    for wl, clusters in FIG16.items():
        for d, counts in clusters.items():
            for lookup in LOOKUPS:
                best, miss = None, "-"
                for rps in LOADS:
                    kw = ({"prompt_machines": counts[0], "token_machines": counts[1]} if len(counts) == 2
                          else {"machines": counts[0]})
                    s = run_simulation(design=d, model="llama2-70b", workload=wl, rps=rps, duration=120.0, seed=0,
                                       profile=PROFILE, decode_lookup=lookup, policy=_policy(token_full), **kw)
                    if not s["slo"]["met"]:
                        miss = f"{_worst(s)} at {rps}"
                        break
                    best = rps
                print(f"| {wl} | {d} | {lookup} | {best} | {miss} |", flush=True)


def fig17(lookups: tuple[str, ...]) -> None:
    from splitserve.reproduce import experiments as ex
    from splitserve.reproduce.splitwise_figs import FIG17_CLUSTERS, FIG17_LOADS, _busy, _cdf
    print("| design | req/s | lookup | pool | busy s | median tokens | P90 tokens | <= 15 tokens |\n"
          "|---|---|---|---|---|---|---|---|")
    for d, split in FIG17_CLUSTERS.items():
        for rps in FIG17_LOADS:
            for lookup in lookups:
                busy = _busy({"model": ex.MODEL, "seed": 0, "profile": PROFILE, "workload": "conversation", "rps": rps,
                              "duration": ex.FULL.duration, "decode_lookup": lookup, **ex.counts(d, split)})
                for pool, b in sorted(busy.items()):
                    c = _cdf(b)
                    print(f"| {d} | {rps:g} | {lookup} | {pool} | {c['busy_s']:,.0f} | {c['median']} | {c['p90']} "
                          f"| {c['le15']:.0%} |", flush=True)


def _runner(lookup: str):
    """The report's Runner (seed 0, the profile) whose searches run under `lookup`."""
    from splitserve.reproduce.experiments import Runner
    runner = Runner(profile=PROFILE, seed=0, workers=1)
    runner._ev = _evaluator(lookup, 0.0)
    return runner


def _split(r: dict) -> str:
    from splitserve.reproduce.splitwise_figs import _counts
    return "+".join(map(str, _counts(r))) if r.get("feasible") else "none"


def fig18b(lookups: tuple[str, ...]) -> None:
    from splitserve.reproduce import experiments as ex
    print("| design | lookup | split | power (kW) | cost ($/h) | req/s at SLO | vs baseline-h100 | simulations |\n"
          "|---|---|---|---|---|---|---|---|")
    for lookup in lookups:
        res = ex.throughput_optimised(_runner(lookup), ex.FULL, "conversation", "iso-cost")
        base = res["baseline-h100"].get("throughput_at_slo")
        for d, r in res.items():
            thr = r.get("throughput_at_slo")
            row = (f"{r['power_kw']:.0f} | {r['cost_per_hour']:,.0f} | {thr:.1f} | {thr / base:.2f}"
                   if thr and base else "- | - | - | -")
            print(f"| {d} | {lookup} | {_split(r)} | {row} | {r.get('simulations')} |", flush=True)


def fig19(lookups: tuple[str, ...]) -> None:
    from splitserve.provision import plan
    from splitserve.reproduce import experiments as ex
    from splitserve.reproduce.splitwise_figs import _rates
    print("| lookup | target req/s | design | power-optimised split | kW (vs baseline-h100) | cost-optimised split "
          "| $/h (vs baseline-h100) | simulations |\n|---|---|---|---|---|---|---|---|")
    for lookup in lookups:
        runner = _runner(lookup)
        target = plan.throughput_at_slo(runner.evaluator(), plan.design("baseline-h100"), (ex.POWER_BUDGET_MACHINES,),
                                        _scenario("conversation"), _rates(ex.FULL))
        power, cost = (ex.iso_throughput(runner, ex.FULL, "conversation", target, o) for o in ("power", "cost"))
        bp, bc = power["baseline-h100"].get("power_kw"), cost["baseline-h100"].get("cost_per_hour")
        for d in ex.DESIGNS:
            p, c = power[d], cost[d]
            kw = f"{p['power_kw']:.0f} ({p['power_kw'] / bp:.2f})" if p.get("feasible") and bp else "-"
            usd = f"{c['cost_per_hour']:,.0f} ({c['cost_per_hour'] / bc:.2f})" if c.get("feasible") and bc else "-"
            print(f"| {lookup} | {target or 0:.1f} | {d} | {_split(p)} | {kw} | {_split(c)} | {usd} "
                  f"| {p.get('simulations', 0) + c.get('simulations', 0)} |", flush=True)


def _worst(s: dict) -> str:
    checks = s["slo"]["checks"]
    return max(checks, key=lambda k: (checks[k]["slowdown"] or float("inf")) / checks[k]["limit"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("requests", "steps", "fig20", "provision", "sweep", "fig17", "fig18b", "fig19"))
    ap.add_argument("--token-full", type=float, default=0.0,
                    help="RoutingConfig.token_tbt_slo, seconds (0: a token machine is full only when its KV is)")
    ap.add_argument("--lookup", default=",".join(LOOKUPS), help="fig20, provision, fig17-19: the lookups to run")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    if a.what == "requests":
        requests(a.token_full)
    elif a.what == "steps":
        steps()
    elif a.what == "fig20":
        fig20(a.token_full, tuple(a.lookup.split(",")))
    elif a.what == "provision":
        provision(a.token_full, tuple(a.lookup.split(",")))
    elif a.what in ("fig17", "fig18b", "fig19"):
        {"fig17": fig17, "fig18b": fig18b, "fig19": fig19}[a.what](tuple(a.lookup.split(",")))
    else:
        sweep(a.token_full)


if __name__ == "__main__":
    main()
