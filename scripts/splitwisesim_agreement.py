"""splitserve against SplitwiseSim request by request, on the one question of
../shared/reference/splitwisesim/ (Splitwise-HH 35P+5T, llama2-70b, Azure code trace at 70 req/s
for 120 s, 8,431 requests; docs/splitwisesim.md "Request by request").

Runs splitserve's equivalent command with every request kept, matches each request to
SplitwiseSim's row by arrival order (request id; prompt and output sizes and arrival times are
checked), and prints both simulators' TTFT and queue-time percentiles, the requests each ran
whole on one machine (SplitwiseSim: `nth_token_overheads` == 0, its token task chained on the
prompt's machine), where per-request queue times first part, and the TTFT gap by kind of request.

Counterfactuals (`--emulate`, comma-separated; for experiments only, patched into this process):
SplitwiseSim behaviours splitserve does not have, each switched on alone or together:

  jsq-count     its JSQ queue length (`sched_pending_tokens`): prompt tokens not yet prefilled,
                plus 1 per request it will decode (splitserve: every decode token still to make)
  long-wait     its `SplitwiseInstance.task_arrival`: a machine running decodes runs them as one
                contiguous stretch until the first of them finishes, and only a prompt of at most
                `max_batch_tokens` (2,048) arriving cuts it short; a longer prompt waits
  mixed-1.1     its mixed iteration's time: the prompt line at prompt tokens + decodes, x 1.1 (row
                5), the decodes counted only up to its 2,048-token cap (row 6: past it they sit out
                the iteration; a prompt past the cap runs alone, at the prompt time); time only,
                the decodes that sit out still make their token here
  perf-db       its step times (`performance_model.py` DatabasePerformanceModel): the profile's
                median prompt time and token time by batch tokens (prompt size x batch size), a
                line between points and beyond the ends; a prompt batch at its prompt tokens, a
                decode batch at its number of decodes (row 4), a mixed one as mixed-1.1 (which it
                replaces)
  token-memory  its token machine (row 10): the least KV-loaded of the token pool (else of the mixed
                pool), and the prompt machine lent to the token side the least KV-loaded too
  kv-all-heads  its KV memory: every attention head's K and V (row 3: 8x Llama-2-70B's GQA KV) in
                its GPUs' 80 GiB (85.9 GB; splitserve: 80 GB), so token machines hold about 8x fewer
                tokens and fill (KV transfers are 8x larger too); with --memory-utilization 1.0 a
                machine holds 209k tokens (SplitwiseSim: all HBM less 135 GB of weights, 211k)

    python scripts/splitwisesim_agreement.py [--borrow-rule authors|splitserve]
        [--overflow-rule authors|queued] [--emulate perf-db,long-wait,jsq-count,token-memory]
        [--memory-utilization F] [--rps R] [--decode-lookup batch-tokens] [--rows out.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
REF = SHARED / "reference" / "splitwisesim"
CAP = 2048          # SplitwiseSim's max_batch_tokens (configs/start_state/splitwise.yaml)
EMULATIONS = ("jsq-count", "long-wait", "mixed-1.1", "perf-db", "token-memory", "kv-all-heads")
PROFILE = SHARED / "profiles" / "splitwise_a100_h100_perf_model.csv"


# ---- counterfactual patches (this process only) --------------------------------------------------
def emulate_jsq_count() -> None:
    """JSQ by SplitwiseSim's sched_pending_tokens: prompt tokens queued or running, +1 per decode
    routed to the machine until it finishes."""
    from splitserve.policy import pools
    from splitserve.sim import metrics

    decodes: dict[int, int] = defaultdict(int)
    pools._pending = lambda m: m.queued_prompt_tokens + m.running_prompt_tokens + decodes[m.id]
    route = pools.SplitwiseScheduler.route

    def counted_route(self, r):
        p, t = route(self, r)
        decodes[t.id] += 1
        return p, t

    complete = metrics.Metrics.complete      # every request that ends passes here (sim/simulator.py _iter_end)

    def counted_complete(self, r, *args):
        decodes[r.token_machine] -= 1
        complete(self, r, *args)

    pools.SplitwiseScheduler.route = counted_route
    metrics.Metrics.complete = counted_complete


def emulate_long_wait() -> None:
    """A decode-only batch starts a contiguous stretch of iterations until its first decode ends;
    it goes on while every queued prompt is longer than CAP and no decode landed (a shorter prompt
    or a landed decode would have paused it at the next iteration)."""
    from splitserve.sim import simulator

    former = simulator.batch_former
    left: dict[int, int] = defaultdict(int)

    def make(cfg):
        form = former(cfg)

        def form_batch(m, cfg):
            if left[m.id] > 0 and not m.ready and m.running and all(r.prefill_len > CAP for r in m.prompt_queue):
                queue, m.prompt_queue = m.prompt_queue, deque()
                try:
                    batch = form(m, cfg)
                finally:
                    m.prompt_queue = queue
                left[m.id] -= 1
                return batch
            batch = form(m, cfg)
            if batch is not None and not batch.prompts and batch.decoding:
                left[m.id] = min(r.output_tokens - r.generated for r in batch.decoding) - 1
            else:
                left[m.id] = 0
            return batch
        return form_batch

    simulator.batch_former = make


def emulate_mixed_11() -> None:
    """A batch of prompts and decodes takes the prompt time of prompt tokens + the decodes under the
    cap, x 1.1 (alone when none fits)."""
    from splitserve.perf import step

    batch_time = step.PerfStep.batch_time

    def mixed(self, m, batch):
        if batch.prompt_tokens and batch.decodes:
            sq = sum(n * n for n in batch.chunks) if self._attention else 0
            riding = min(batch.decodes, max(CAP - batch.prompt_tokens, 0))
            alone = self._mixed(batch.prompt_tokens + riding, 0, 0, sq)
            return 1.1 * alone if riding else alone
        return batch_time(self, m, batch)

    step.PerfStep.batch_time = mixed


def emulate_perf_db(profile: Path = PROFILE) -> None:
    """Every batch timed as SplitwiseSim's DatabasePerformanceModel times it (Llama-2-70B, H100, TP 8):
    its lines by batch tokens (perf/decode_lookup.py, the owner of the decode lookup)."""
    from splitserve.perf import step
    from splitserve.perf.decode_lookup import batch_token_lines, extrapolating_line
    from splitserve.perf.profile_fit import read_profile_rows

    x, prompt_s, token_s = batch_token_lines(read_profile_rows(profile, "llama2-70b", "h100-80gb", 8, unique=False))
    prompt = lambda n: extrapolating_line(x, prompt_s, n)
    token = lambda n: extrapolating_line(x, token_s, n)

    def timed(self, m, batch):
        if not batch.prompt_tokens:
            return token(batch.decodes)
        riding = min(batch.decodes, max(CAP - batch.prompt_tokens, 0))
        return 1.1 * prompt(batch.prompt_tokens + riding) if riding else prompt(batch.prompt_tokens)

    step.PerfStep.batch_time = timed


def emulate_token_memory() -> None:
    """The token side by least KV reserved (SplitwiseSim's sched_memory), not by pending tokens."""
    from splitserve.policy import pools
    from splitserve.policy.state import Pool

    S = pools.SplitwiseScheduler
    side, borrow = S._side, S._borrow

    def by_memory(pool):
        return min(pool, key=lambda m: m.kv_used) if pool else None

    def token_side(self, own, r, full, exclude=-1):
        if own is not Pool.TOKEN:
            return side(self, own, r, full, exclude)
        for pool in (Pool.TOKEN, Pool.MIXED):
            m = by_memory([m for m in self.pools[pool] if m.id != exclude])
            if m is not None and not full(m, r):
                return m
        return None

    def lend(self, lender, exclude=-1):
        if lender is not Pool.PROMPT:
            return borrow(self, lender, exclude)
        m = by_memory([m for m in self.pools[lender] if m.id != exclude])
        if m is not None:
            self._move(m, Pool.MIXED)
            self.borrowed += 1
        return m

    S._side, S._borrow = token_side, lend


def kv_all_heads_catalog():
    """The built-in catalog with Llama-2-70B's KV as SplitwiseSim sizes it (kv_heads = heads)."""
    from splitserve.catalog import builtin_catalog

    cat = builtin_catalog()
    spec = cat.models["llama2-70b"]
    models = {**cat.models, "llama2-70b": dataclasses.replace(spec, kv_heads=spec.heads)}
    hardware = {**cat.hardware, "dgx-h100": dataclasses.replace(cat.hardware["dgx-h100"], hbm_gb=80 * 2**30 / 1e9)}
    return dataclasses.replace(cat, models=models, hardware=hardware, source="kv-all-heads",
                               fingerprint="kv-all-heads")


PATCHES = {"jsq-count": emulate_jsq_count, "long-wait": emulate_long_wait, "mixed-1.1": emulate_mixed_11,
           "perf-db": emulate_perf_db, "token-memory": emulate_token_memory, "kv-all-heads": lambda: None}


# ---- the run and the comparison ------------------------------------------------------------------
def run_splitserve(borrow_rule: str, overflow_rule: str, trace: str, profile: str, catalog=None,
                   memory_utilization: float = 0.9, rps: float = 70.0, decode_lookup: str = "batch-size"):
    from splitserve.policy.cluster import RoutingConfig
    from splitserve.policy.config import PolicyConfig
    from splitserve.sim.run import SimRequest, simulate

    routing = dataclasses.replace(RoutingConfig(), borrow_rule=borrow_rule, overflow_rule=overflow_rule)
    req = SimRequest(design="splitwise-hh", prompt_machines=35, token_machines=5, model="llama2-70b",
                     workload=trace, rps=rps, duration=120, seed=0, profile=profile,
                     policy=PolicyConfig(routing=routing), catalog=catalog,
                     memory_utilization=memory_utilization, decode_lookup=decode_lookup)
    summary, result = simulate(req, record_requests=True)
    return summary, result


def per_request(result, ref_dir: Path, prompt_machines: int = 35, same_times: bool = True) -> pd.DataFrame:
    """One row per request: arrival, sizes, each simulator's queue time, TTFT and whether it ran
    whole on one machine."""
    ref = pd.read_csv(ref_dir / "hh35p5t_code70_120s_requests.csv").set_index("request_ids").sort_index()
    trace = pd.read_csv(ref_dir / "azure_code_70_2min_trace.csv").set_index("request_id")
    rs = sorted(result.requests, key=lambda r: r.id)
    if len(rs) != len(ref):
        raise SystemExit(f"splitserve ran {len(rs)} requests, SplitwiseSim {len(ref)}")
    d = pd.DataFrame({
        "arrival": [r.arrival for r in rs], "prompt": [r.prompt_tokens for r in rs],
        "output": [r.output_tokens for r in rs],
        "queue_sws": ref.queue_times.values, "queue_ss": [r.prompt_started_at - r.arrival for r in rs],
        "ttft_sws": ref.ttft_times.values, "ttft_ss": [r.first_token_at - r.arrival for r in rs],
        "whole_sws": ref.nth_token_overheads.values == 0.0,
        "whole_ss": [r.prompt_machine == r.token_machine for r in rs],
        "prompt_machine_ss": [r.prompt_machine for r in rs], "token_machine_ss": [r.token_machine for r in rs]})
    if not ((d.prompt.values == trace.prompt_size.values).all() and (d.output.values == trace.token_size.values).all()
            and (not same_times or np.abs(d.arrival.values - trace.arrival_timestamp.values).max() < 1e-5)):
        raise SystemExit("the requests differ from SplitwiseSim's trace (sizes or arrival times)")
    d["prefill_sws"] = d.ttft_sws - d.queue_sws
    d["prefill_ss"] = d.ttft_ss - d.queue_ss
    d["decoded_on_prompt_machine_ss"] = d.token_machine_ss < prompt_machines
    return d


def report(d: pd.DataFrame, summary: dict, borrowed: int, tol: float = 0.002, first: int = 8) -> None:
    q = [0.5, 0.9, 0.99]
    print(f"{'':22s} {'SplitwiseSim':>22s} {'splitserve':>22s}")
    for name in ("ttft", "queue", "prefill"):
        a, b = d[f"{name}_sws"].quantile(q).values, d[f"{name}_ss"].quantile(q).values
        print(f"{name + ' P50/P90/P99 s':22s} {'/'.join(f'{x:.3f}' for x in a):>22s} {'/'.join(f'{x:.3f}' for x in b):>22s}")
    t50, t90 = d.ttft_ss.quantile(.5) / d.ttft_sws.quantile(.5) - 1, d.ttft_ss.quantile(.9) / d.ttft_sws.quantile(.9) - 1
    print(f"TTFT gap: P50 {t50:+.1%}, P90 {t90:+.1%}; borrowings {borrowed}")
    close = (np.abs(d.ttft_sws - d.ttft_ss) <= 0.010).mean()
    print(f"TTFT within 10 ms of SplitwiseSim's: {close:.1%} of requests; median |gap| "
          f"{np.abs(d.ttft_sws - d.ttft_ss).median() * 1000:.1f} ms")
    print(f"ran whole on one machine: SplitwiseSim {int(d.whole_sws.sum())}, splitserve {int(d.whole_ss.sum())}, "
          f"both {int((d.whole_sws & d.whole_ss).sum())}; splitserve decoded {int(d.decoded_on_prompt_machine_ss.sum())} "
          f"on machines of the prompt pool")
    first_whole = d.index[d.whole_sws].min() if d.whole_sws.any() else None
    if first_whole is not None:
        print(f"first request SplitwiseSim runs whole: #{first_whole} at {d.arrival[first_whole]:.3f} s")
    before = d[d.arrival < d.arrival[first_whole]] if first_whole is not None else d
    print(f"before it ({len(before)} requests): TTFT mean {before.ttft_sws.mean():.4f} / {before.ttft_ss.mean():.4f} s, "
          f"queue mean {before.queue_sws.mean():.4f} / {before.queue_ss.mean():.4f} s")
    for label, g in (("split in SplitwiseSim", d[~d.whole_sws]), ("whole in SplitwiseSim", d[d.whole_sws])):
        print(f"{label:24s} n={len(g):5d} TTFT P50 {g.ttft_sws.median():.3f} / {g.ttft_ss.median():.3f}  "
              f"queue P50 {g.queue_sws.median():.3f} / {g.queue_ss.median():.3f}  "
              f"prefill P50 {g.prefill_sws.median():.3f} / {g.prefill_ss.median():.3f}")
    short_whole = d[d.whole_sws & (d.prompt <= CAP)]
    print(f"prompts <= {CAP} SplitwiseSim runs whole ({len(short_whole)}): their prefill takes a median "
          f"{(short_whole.prefill_sws / short_whole.prefill_ss).median():.3f}x splitserve's")
    long_ = d.prompt > CAP
    for label, g in ((f"prompt > {CAP}", d[long_]), (f"prompt <= {CAP}", d[~long_])):
        print(f"{label:24s} n={len(g):5d} queue P50/P99 {g.queue_sws.median():.3f}/{g.queue_sws.quantile(.99):.3f} "
              f"/ {g.queue_ss.median():.3f}/{g.queue_ss.quantile(.99):.3f}")
    for label, col in (("SplitwiseSim", "queue_sws"), ("splitserve", "queue_ss")):
        slow = d[d[col] > 2.0]
        print(f"queued over 2 s in {label}: {len(slow)} requests, {int((slow.prompt > CAP).sum())} of them "
              f"prompts over {CAP} tokens; longest {d[col].max():.2f} s (request #{d[col].idxmax()}, "
              f"{d.prompt[d[col].idxmax()]} tokens)")
    diverged = d[np.abs(d.queue_sws - d.queue_ss) > tol]
    print(f"queue times part by more than {tol * 1000:.0f} ms at {len(diverged)} requests; the first:")
    cols = ["arrival", "prompt", "output", "queue_sws", "queue_ss", "prefill_sws", "prefill_ss", "whole_sws",
            "prompt_machine_ss"]
    print(diverged[cols].head(first).round(4).to_string())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--borrow-rule", default="authors", choices=("authors", "splitserve"))
    ap.add_argument("--overflow-rule", default="authors", choices=("authors", "queued"))
    ap.add_argument("--emulate", default="", help=f"comma-separated: {', '.join(EMULATIONS)}")
    ap.add_argument("--reference", default=str(REF))
    ap.add_argument("--trace", default=str(SHARED / "traces" / "azure_2023_code.csv"))
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--memory-utilization", type=float, default=0.9,
                    help="as simulate's (SplitwiseSim: all HBM less the weights)")
    ap.add_argument("--rps", type=float, default=70.0,
                    help="another rate (a probe of how chaotic the figure is: the same requests a little "
                         "sooner or later; the arrival times are then not checked)")
    ap.add_argument("--rows", help="write the per-request table here (CSV)")
    ap.add_argument("--decode-lookup", default="batch-size", choices=("batch-size", "batch-tokens"),
                    help="simulate's --decode-lookup (batch-tokens: SplitwiseSim's decode times only; perf-db "
                         "replaces it with all its step times)")
    a = ap.parse_args()
    names = list(filter(None, a.emulate.split(",")))
    for name in names:
        if name not in PATCHES:
            raise SystemExit(f"--emulate: unknown {name!r}; one of {', '.join(EMULATIONS)}")
    for name in sorted(names, key=lambda n: n == "perf-db"):   # perf-db last: it replaces mixed-1.1
        PATCHES[name](Path(a.profile)) if name == "perf-db" else PATCHES[name]()
    catalog = kv_all_heads_catalog() if "kv-all-heads" in a.emulate.split(",") else None
    summary, result = run_splitserve(a.borrow_rule, a.overflow_rule, a.trace, a.profile, catalog,
                                     a.memory_utilization, a.rps, a.decode_lookup)
    d = per_request(result, Path(a.reference), same_times=a.rps == 70.0)
    print(f"borrow rule {a.borrow_rule}, overflow rule {a.overflow_rule}, memory utilization "
          f"{a.memory_utilization}, {a.rps:g} req/s, decode lookup {a.decode_lookup}, emulating: {a.emulate or 'nothing'}")
    report(d, summary, result.borrowed)
    if a.rows:
        d.to_csv(a.rows, index_label="request_id")


if __name__ == "__main__":
    main()
