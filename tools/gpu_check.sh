#!/usr/bin/env bash
# One command for a lent GPU: the CUDA tests, then the benchmarks on cuda, in under 8 minutes.
#
#   tools/gpu_check.sh            # on the GPU machine, from anywhere in the repository
#   OUT=/some/dir tools/gpu_check.sh
#   DEVICE=cpu SMOKE=1 tools/gpu_check.sh   # a dry run of the script itself on a CPU (seconds)
#
# Every step has its own time limit (seconds; override with the variables below), streams its
# output to a file under $OUT (default: a new folder under /tmp) and the next step runs
# whether it passed or not; the summary at the end (also $OUT/summary.txt) lists each step's
# exit status and seconds (124: cut by its limit; the tables printed so far are kept).
# Steps and default limits (sum 450 s, plus start-up):
#   tests          60 s  pytest of every test that runs on CUDA (the files that use it, -k cuda)
#   user_oracles  180 s  benchmarks/user_oracles.py --device cuda, 1 / 16 / 256 draws (no counts)
#   user_counts    40 s  the same, 16 draws, with engine calls and host reads per round counted
#   engine_race    70 s  benchmarks/engine.py --device cuda --parts overhead race ops
#   rounds        100 s  benchmarks/rounds.py --device cuda (Markov, HMM, tree Potts)
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}"
DEVICE="${DEVICE:-cuda}"
SMOKE="${SMOKE:-}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
: > "$OUT/summary.txt"

step() {  # step NAME LIMIT COMMAND...: run with a time limit, output to $OUT/NAME.txt
    local name="$1" limit="$2"
    shift 2
    local start=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/summary.txt"
    timeout --signal=INT --kill-after=10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "   $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
    tail -n 5 "$OUT/$name.txt"
}

{
    date -u
    git rev-parse HEAD 2>/dev/null || echo "(no git)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available())"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

smoke=()
[ -n "$SMOKE" ] && smoke=(--smoke)

# The tests that run on CUDA when it is there (skipped or CPU-only otherwise).
step tests "${LIMIT_TESTS:-60}" "$PY" -m pytest -q -p no:cacheprovider \
    tests/engine/test_devices.py tests/engine/test_tables.py tests/engine/test_errors.py \
    tests/infer/test_device.py tests/oracles/test_dpp.py \
    -k "cuda or device or chunk_budget"

step user_oracles "${LIMIT_USER:-180}" "$PY" benchmarks/user_oracles.py --device "$DEVICE" \
    --draws 1 16 256 --no-count "${smoke[@]}"

step user_counts "${LIMIT_COUNTS:-40}" "$PY" benchmarks/user_oracles.py --device "$DEVICE" \
    --draws 16 --oracles nade:scale=2 nade:scale=0.5 mixture:K=8 user_chain:n=4096 markov \
    "${smoke[@]}"

step engine_race "${LIMIT_ENGINE:-70}" "$PY" benchmarks/engine.py --device "$DEVICE" \
    --parts overhead race ops --no-reference "${smoke[@]}"

rounds_out="$OUT/rounds"
mkdir -p "$rounds_out"
step rounds "${LIMIT_ROUNDS:-100}" "$PY" benchmarks/rounds.py --device "$DEVICE" \
    --families markov hmm tree_potts --num-samples 16 --jobs 8 --out "$rounds_out" "${smoke[@]}"

echo "== done in $SECONDS s; outputs under $OUT" | tee -a "$OUT/summary.txt"
