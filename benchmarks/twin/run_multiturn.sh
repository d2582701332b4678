#!/bin/bash
# The twin on 10-turn conversations (issue 28): the live cluster and the simulator, both with
# prefix caches and prefix-aware routing, then both without, on the same conversations (~6 min).
#   bash benchmarks/twin/run_multiturn.sh [OUT_DIR [PROFILE_DIR]]
# Uses the table's profile (run_table.sh) unless PROFILE_DIR names another.
set -euo pipefail
out=${1:-benchmarks/twin/results}
prof=${2:-$out/profile}
shape="turns=10,user=32:64,reply=16:32,think=1"
for caching in prefix-caching no-prefix-caching; do
  python -m splitserve.cli twin --profile-dir "$prof" --design splitwise -p 1 -t 1 --workload multiturn \
    --conversation "$shape" --rps 2 --duration 60 --$caching --out "$out/multiturn-1p1t-$caching"
done
bash benchmarks/twin/pack_logs.sh "$out"
python - "$out" <<'PY' | tee "$out/multiturn.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {c: {k: json.loads((out / f"multiturn-1p1t-{c}" / k / "summary.json").read_text()) for k in ("live", "sim")}
        for c in ("prefix-caching", "no-prefix-caching")}
on, off = runs["prefix-caching"], runs["no-prefix-caching"]
for k in ("live", "sim"):
    print(f"{k}: TTFT P50 {on[k]['ttft_s']['p50']:.4f} s with caching, {off[k]['ttft_s']['p50']:.4f} s without: "
          f"{off[k]['ttft_s']['p50'] / on[k]['ttft_s']['p50']:.2f}x lower; hit rate {on[k]['prefix_cache']['hit_rate']:.3f}")
print(f"hit rate sim - live: {100 * (on['sim']['prefix_cache']['hit_rate'] - on['live']['prefix_cache']['hit_rate']):+.1f} points; "
      f"TTFT P50 sim vs live: {on['sim']['ttft_s']['p50'] / on['live']['ttft_s']['p50'] - 1:+.1%}")
PY
