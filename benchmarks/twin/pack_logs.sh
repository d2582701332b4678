#!/bin/bash
# Pack the raw logs of twin runs into one compressed file per run, the form they are committed in:
#   bash benchmarks/twin/pack_logs.sh [RESULTS_DIR]      (default benchmarks/twin/results)
# For each run (RESULTS_DIR/*/live, from `splitserve twin`) it writes live/logs.tar.gz holding
# requests.jsonl (bench, one line per request), serve.log and steps/worker-*.jsonl (each worker's
# engine steps, `serve --step-log`); for the profile, profile/path/logs.tar.gz (the serving-path
# probe's serve.log and steps). The summaries (summary.json, twin.json, report.md, cdf.png,
# profile.csv, machine.json) stay as they are; benchmarks/twin/.gitignore keeps the raw files out
# of git. Unpack with `tar xzf DIR/logs.tar.gz -C DIR`. The archive is byte-for-byte reproducible
# (sorted names, fixed owner and time, gzip without a time stamp).
set -euo pipefail
root=${1:-benchmarks/twin/results}
for dir in "$root"/*/live "$root"/profile/path; do
  [ -d "$dir" ] || continue
  files=$(cd "$dir" && ls requests.jsonl serve.log steps/worker-*.jsonl 2>/dev/null || true)
  [ -n "$files" ] || continue
  (cd "$dir" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - $files) \
    | gzip -n -9 > "$dir/logs.tar.gz"
  echo "$dir/logs.tar.gz: $(echo $files | wc -w) files, $(cd "$dir" && cat $files | wc -l) lines"
done
