#!/bin/bash
# The twin's accuracy table: profile this machine, then 2 designs x 3 loads, 60 s each (~14 min).
#   bash benchmarks/twin/run_table.sh [OUT_DIR [PROFILE OPTIONS...]]
# The profile is measured again every time, into OUT_DIR/profile, right before the runs: this
# machine's speed drifts by several percent over hours, as much as the errors the table measures.
# PROFILE OPTIONS go to `splitserve profile` (e.g. --device cuda --model llama3-8b --num-blocks 4096).
set -euo pipefail
out=${1:-benchmarks/twin/results}
shift || true
prof="$out/profile"
rm -rf "$prof"
python -m splitserve.cli profile --out "$prof" "$@"
for load in 0.3 0.6 0.9; do
  python -m splitserve.cli twin --profile-dir "$prof" --design splitwise -p 1 -t 1 --load $load \
    --duration 60 --out "$out/splitwise-1p1t-load$load"
  python -m splitserve.cli twin --profile-dir "$prof" --design baseline -m 2 --load $load \
    --duration 60 --out "$out/baseline-2m-load$load"
done
bash benchmarks/twin/pack_logs.sh "$out"   # the raw logs, one logs.tar.gz per run (committed so)
python benchmarks/twin/table.py "$out" > "$out/table.md"
cat "$out/table.md"
