#!/usr/bin/env bash
# On the device (one line; carry .whl when it exists, timeout_s 600):
#     bash scripts/gpu_check.sh
#
# The one GPU check of issue 26 (item 7), for whoever has a GPU at hand: about 8-9 minutes on one
# H100/H200, every part independent (a part that fails or runs out of time is recorded and the
# check goes on), each under its own `timeout`, all of it under a total budget
# (GPU_CHECK_BUDGET_S, default 540 s: a part that would not fit is skipped and says so).
#
# Parts: 1 machine facts; 2 engine decode B=1,8,64 with CUDA graphs, prefill 2048 tokens
# (llama3-8b bf16) and a torch.profiler table of the B=1 decode step, graph and eager; 2d decode at
# serving batches (B=1,16,64,256, contexts 512-4096) with the Triton kernels and the torch ones,
# against the bound of weights + KV read (issue 46); 3 the CUDA tests (pytest -m gpu) and the Triton
# kernel tests compiled; 4c offline throughput, 512 ShareGPT-like requests, Triton kernels on and
# off (issue 46); 4 serve --cuda-graphs, 1 prompt + 1 token worker on the GPU, 4 streams:
# TPOT P50 against the engine's own step; 4b the engine's throughput with 200 requests of
# ShareGPT-like lengths at once, KV reserved and on demand (issue 41); 5 KV exposed time,
# --transport local (CUDA IPC), and nccl only with 2+ GPUs; 6 splitserve profile + twin (small
# preset, short), P50 error.
#
# Results: a folder DIR (default benchmarks/gpu_check/<date>-<gpu>/): one log and one JSON per part,
# kernels.txt, summary.md (figures against the targets, the machine named) and results.json.
# With $OUT set (the device tool), DIR is /tmp/gpu_check/<date>-<gpu> and $OUT gets, after every
# part, summary.md, results.json, kernels.txt and gpu_check.tar.gz (all of DIR): keep the first three
# in benchmarks/gpu_check/<run>/ and the rest packed as run.tar.gz (benchmarks/gpu_check/README.md).
#
#     bash scripts/gpu_check.sh [--device cuda|cpu] [--quick] [--out DIR]
#
# --device cpu runs the CPU-possible parts with the small/tiny presets (tests/test_gpu_check.py
# runs `--device cpu --quick` in CI, so this script cannot rot). Python: $PYTHON (default python3);
# the package is run from src/ (PYTHONPATH), not installed. A .whl/ folder of wheels (pyzmq,
# fastapi, ... that the device image lacks) is installed into /tmp/site first.
set -u
ARGS="$*"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEVICE=cuda
QUICK=0
DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --device=*) DEVICE="${1#*=}"; shift ;;
    --quick) QUICK=1; shift ;;
    --out) DIR="$2"; shift 2 ;;
    --out=*) DIR="${1#*=}"; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
BUDGET="${GPU_CHECK_BUDGET_S:-540}"
START=$SECONDS
export PYTHONUNBUFFERED=1 GPU_CHECK_TAG="gpucheck$$"

# wheels carried to a machine without network
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      >/tmp/gpu_check_wheels.log 2>&1; then
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "gpu_check.sh: installing .whl/ failed (see /tmp/gpu_check_wheels.log); going on" >&2
  fi
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

GPU_NAME=cpu
NGPU=0
if [ "$DEVICE" = cuda ]; then
  GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  NGPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)"
  GPU_NAME="${GPU_NAME:-unknown-gpu}"
fi
SLUG="$(date -u +%Y-%m-%d-%H%M)-$(echo "$GPU_NAME" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')"
if [ -z "$DIR" ]; then
  if [ -n "${OUT:-}" ]; then DIR="/tmp/gpu_check/$SLUG"; else DIR="benchmarks/gpu_check/$SLUG"; fi
fi
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
: >"$DIR/parts.tsv"
echo "gpu_check: device $DEVICE ($GPU_NAME), results in $DIR, budget ${BUDGET}s"

# presets per device
if [ "$DEVICE" = cuda ]; then
  MODEL=llama3-8b; DTYPE=bfloat16; THREADS=""
  DEC=(--batch-sizes 1,8,64 --steps 32); PRE=(--tokens 2048 --reps 10); KER=(--steps 20)
  SERVE=(--model llama3-8b --device cuda --dtype bfloat16 --cuda-graphs --num-blocks 1024 --max-num-seqs 8
         --prompt-len 128 --output-tokens 128 --rounds 2 --vocab 128000)
  KV=(--model llama3-8b --device cuda --dtype bfloat16 --requests 3 --num-blocks 256 --startup-timeout 120)
  TWIN_MODEL="${GPU_CHECK_TWIN_MODEL:-small}"; TWIN_DUR=20
  ALLOC=(--model llama3-8b --device cuda --dtype bfloat16 --requests 200)
  BAT=(--grid 64x1024,1x512,1x4096,16x1024,16x4096,256x512,64x4096,256x1024 --kernels triton,torch --steps 16)
  THR=(--requests 512 --kernels triton,torch)
  KTESTS="tests/engine/test_triton_attention.py tests/engine/test_triton_fused.py"  # compiled on the GPU
  PROF=(--num-blocks 4096)  # twin's two workers share the GPU: each gets this many KV blocks, not 90% of it
else
  MODEL=small; DTYPE=float32; THREADS="--threads 1"
  DEC=(--batch-sizes 1,4 --steps 8); PRE=(--tokens 256 --reps 3); KER=(--steps 8)
  SERVE=(--model small --device cpu --dtype float32 --prompt-len 64 --output-tokens 96 --rounds 3)
  KV=(--model tiny --device cpu --dtype float32 --requests 2 --prompt-tokens 64 --num-blocks 64 --startup-timeout 60)
  TWIN_MODEL=small; TWIN_DUR=15
  ALLOC=(--model tiny --device cpu --requests 40 --num-blocks 256)
  BAT=(--grid 1x64,4x128 --kernels torch --steps 4)  # the Triton kernels need CUDA (the interpreter is for tests)
  THR=(--requests 24 --kernels torch)
  KTESTS=""  # in the interpreter they are CI's own tests (tests/engine), not this check's
  PROF=()
  if [ $QUICK = 1 ]; then  # CI's smoke run of the whole script: the smallest model everywhere
    MODEL=tiny
    SERVE=(--model tiny --device cpu --dtype float32 --prompt-len 32 --output-tokens 48 --rounds 1)
    ALLOC=(--model tiny --device cpu --requests 6 --num-blocks 48)
  fi
fi
ENG=(--dir "$DIR" --device "$DEVICE" --model "$MODEL" --dtype "$DTYPE" $THREADS)

export_out() {  # what the device tool brings back: at most 8 files
  "$PY" scripts/gpu_check_summary.py "$DIR" >/dev/null 2>>"$DIR/summary.err" || true
  if [ -n "${OUT:-}" ]; then
    cp -f "$DIR/summary.md" "$DIR/results.json" "$OUT/" 2>/dev/null
    [ -f "$DIR/kernels.txt" ] && cp -f "$DIR/kernels.txt" "$OUT/"
    tar -czf "$OUT/gpu_check.tar.gz" -C "$(dirname "$DIR")" "$(basename "$DIR")" 2>/dev/null
    if [ "$(stat -c %s "$OUT/gpu_check.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then  # 16 MiB a file comes back
      tar -czf "$OUT/gpu_check.tar.gz" --exclude='trace_*.json' -C "$(dirname "$DIR")" "$(basename "$DIR")" 2>/dev/null
    fi
  fi
}

reap() {  # processes this check started that outlived their part (servers, workers), by id
  local p pid
  for p in /proc/[0-9]*; do
    pid="${p#/proc/}"
    [ "$pid" = "$$" ] && continue
    if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "GPU_CHECK_TAG=$GPU_CHECK_TAG"; then
      kill -9 "$pid" 2>/dev/null
    fi
  done
}

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$DIR/parts.tsv"; }

# part NAME LIMIT_S CMD...: run CMD under timeout (the budget's remainder at most), log to NAME.log
part() {
  local name="$1" limit="$2"; shift 2
  local left=$(( BUDGET - (SECONDS - START) - 10 ))
  if [ "$left" -lt 20 ]; then
    record "$name" skipped "" "out of the check's time budget (${BUDGET}s; GPU_CHECK_BUDGET_S)"
    echo "[$name] skipped: out of time budget"; export_out; return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[$name] up to ${limit}s: $*"
  local t0=$SECONDS rc
  timeout -k 10 "$limit" "$@" >"$DIR/$name.log" 2>&1
  rc=$?
  reap
  local took=$(( SECONDS - t0 )) st=ok note=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then st=timeout; note="stopped at its ${limit}s limit"
  elif [ $rc -ne 0 ]; then st=failed; note="exit $rc: $(grep -v '^USDT' "$DIR/$name.log" | tail -1 | cut -c1-200 | tr '\t' ' ')"
  fi
  record "$name" "$st" "$took" "$note"
  echo "[$name] $st in ${took}s $note"
  export_out
}

skip() { record "$1" skipped "" "$2"; echo "[$1] skipped: $2"; export_out; }

# 1. machine facts
part machine 60 "$PY" - "$DIR" "$DEVICE" "$ARGS" <<'EOF'
import json, os, platform, subprocess, sys, time
d, device, args = sys.argv[1], sys.argv[2], sys.argv[3]
m = {"device": device, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
     "command": ("bash scripts/gpu_check.sh " + args).strip(), "python": platform.python_version(),
     "cores": os.cpu_count(), "platform": platform.platform()}
try:
    m["cpu"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
except Exception:
    m["cpu"] = platform.processor()
try:
    m["splitserve_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                            text=True, timeout=10).stdout.strip() or "unknown (no .git)"
except Exception:
    m["splitserve_commit"] = "unknown (no git)"
if device == "cuda":
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        m["gpu_count"] = len(q)
        name, driver, mem = [x.strip() for x in q[0].split(",")]
        m.update(gpu=name, driver=driver, gpu_memory=mem)
        full = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
        open(os.path.join(d, "nvidia-smi.txt"), "w").write(full)
    except Exception as e:
        m["gpu_error"] = repr(e)
try:
    import torch
    m.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m.update(torch_gpu=p.name, sm_count=p.multi_processor_count)
        sys.path.insert(0, "benchmarks/engine")
        from common import gpu_datasheet
        flops, bw = gpu_datasheet(torch.device("cuda"))
        m.update(datasheet_bf16_flops=flops, datasheet_hbm_Bps=bw)
except Exception as e:
    m["torch_error"] = repr(e)
for mod in ("zmq", "fastapi", "starlette", "pydantic", "uvicorn", "httpx", "tokenizers", "safetensors", "typer",
            "triton"):
    try:
        m.setdefault("packages", {})[mod] = getattr(__import__(mod), "__version__", "present")
    except Exception as e:
        m.setdefault("packages", {})[mod] = f"MISSING ({type(e).__name__})"
json.dump(m, open(os.path.join(d, "machine.json"), "w"), indent=1)
print(json.dumps(m, indent=1))
EOF

# 2. engine: decode, the profiler tables, prefill
part decode 150 "$PY" scripts/gpu_check_engine.py decode "${ENG[@]}" "${DEC[@]}"
# 2d. serving batches and long contexts, the Triton kernels against the torch ones (issue 46)
part batches 180 "$PY" scripts/gpu_check_engine.py batches "${ENG[@]}" "${BAT[@]}"
part kernels 120 "$PY" scripts/gpu_check_engine.py kernels "${ENG[@]}" "${KER[@]}"
part prefill 100 "$PY" scripts/gpu_check_engine.py prefill "${ENG[@]}" "${PRE[@]}"

# 3. the CUDA tests (on a CPU they skip, which the summary shows)
# (then the device checks of serve's start, which behave differently where a GPU exists); no
# plugin of the test extra is needed here, and loading schemathesis' and faker's takes ~2 s a run
# (the Triton kernel tests, run in the interpreter on CPU, run compiled here: issue 46)
part tests 150 env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 bash -c '"$0" -m pytest -m gpu -rs -p no:cacheprovider tests/engine/test_engine_cuda.py \
  tests/engine/test_kernels_cuda.py tests/serve/test_transports.py; a=$?; if [ -n "$1" ]; then \
  "$0" -m pytest -rs -p no:cacheprovider $1; c=$?; a=$(( a > c ? a : c )); fi; \
  "$0" -m pytest -rs -p no:cacheprovider tests/serve/test_startup_errors.py \
  -k "cuda or gpu or device"; b=$?; exit $(( a > b ? a : b ))' "$PY" "$KTESTS"

# 4c. offline throughput: 512 ShareGPT-like requests at once, the Triton kernels and the torch ones (issue 46)
part throughput 200 "$PY" scripts/gpu_check_engine.py throughput "${ENG[@]}" "${THR[@]}"

# 4. serve with CUDA graphs: TPOT against the engine's step at the same batch
part serve 200 "$PY" benchmarks/serve/tpot_vs_step.py "${SERVE[@]}" --out "$DIR/serve_tpot.json"

# 4b. KV reserved against on demand: offline throughput at the batch the memory allows
part kv_alloc 150 "$PY" benchmarks/serve/kv_on_demand.py offline "${ALLOC[@]}" --out "$DIR/kv_alloc.json"

# 5. KV exposed time
part kv_local 120 "$PY" benchmarks/serve/kv_transfer.py "${KV[@]}" --transports local --modes layerwise,serialized \
  --out "$DIR/kv_local.json"
if [ "$DEVICE" = cuda ] && [ "$NGPU" -ge 2 ]; then
  part kv_nccl 120 "$PY" benchmarks/serve/kv_transfer.py "${KV[@]}" --transports nccl --modes layerwise \
    --out "$DIR/kv_nccl.json"
elif [ "$DEVICE" = cuda ]; then
  skip kv_nccl "one GPU (nccl needs two)"
else
  skip kv_nccl "no GPU (nccl needs two)"
fi

# 6. profile + twin, short
if [ $QUICK = 1 ]; then
  skip profile "--quick (a profile of small takes about 80 s on a 2-core CPU)"
  skip twin "--quick (needs the profile)"
else
  part profile 150 "$PY" -m splitserve.cli profile --model "$TWIN_MODEL" --device "$DEVICE" --repeats 1 \
    "${PROF[@]}" --out "$DIR/profile"
  if [ -f "$DIR/profile/machine.json" ]; then
    part twin 200 "$PY" -m splitserve.cli twin --profile-dir "$DIR/profile" --duration "$TWIN_DUR" --load 0.5 \
      --max-prompt-tokens 256 --max-tokens-cap 32 --transport local --out "$DIR/twin"
  else
    skip twin "no profile (part profile did not finish)"
  fi
fi

# 7. experiment, when time is left: B=1 decode with each decoder layer compiled (torch.compile) before
# the CUDA graphs are captured: is the gap to the bandwidth bound the ~50 small kernels per layer?
if [ "$DEVICE" = cuda ]; then
  part decode_compiled 150 "$PY" benchmarks/engine/bench_decode.py --model "$MODEL" --dtype "$DTYPE" \
    --batch-sizes 1,8 --steps 32 --compile-layers --name "$DIR/decode_compiled"
fi

export_out
echo "gpu_check: done in $(( SECONDS - START ))s; summary: $DIR/summary.md"
cat "$DIR/summary.md"
