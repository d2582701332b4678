#!/bin/bash
# The twin's accuracy table: 2 designs x 3 loads on this machine, 60 s each (about 10 minutes).
#   bash benchmarks/twin/run_table.sh [PROFILE_DIR] [OUT_DIR]
# PROFILE_DIR is made by `splitserve profile --out PROFILE_DIR` when it does not exist yet.
set -euo pipefail
prof=${1:-benchmarks/twin/profile-cpu2}
out=${2:-benchmarks/twin/results}
[ -f "$prof/machine.json" ] || python -m splitserve.cli profile --out "$prof"
for load in 0.3 0.6 0.9; do
  python -m splitserve.cli twin --profile-dir "$prof" --design splitwise -p 1 -t 1 --load $load \
    --duration 60 --out "$out/splitwise-1p1t-load$load"
  python -m splitserve.cli twin --profile-dir "$prof" --design baseline -m 2 --load $load \
    --duration 60 --out "$out/baseline-2m-load$load"
done
python benchmarks/twin/table.py "$out" > "$out/table.md"
cat "$out/table.md"
