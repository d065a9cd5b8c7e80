#!/usr/bin/env bash
# One command for a lent GPU: the CUDA tests, then the benchmarks on cuda, in under 8 minutes.
#
#   tools/gpu_check.sh            # on the GPU machine, from anywhere in the repository
#   OUT=/some/dir tools/gpu_check.sh
#   DEVICE=cpu SMOKE=1 tools/gpu_check.sh   # a dry run of the script itself on a CPU (seconds)
#   ONLY="tests diffusion" tools/gpu_check.sh   # only the steps named (a rerun after a fix)
#
# Every step has its own time limit (seconds; the LIMIT_* variables below override them),
# streams its output to a file under $OUT (default: a new folder under /tmp) and the next step
# runs whether it passed or not; the summary at the end (also $OUT/summary.txt) lists each
# step's exit status and seconds (124: cut by its limit; the table rows printed so far are kept).
# Steps and default limits (sum 510 s, plus start-up):
#   tests             LIMIT_TESTS=40     pytest of the tests that run on CUDA (-k cuda or device)
#   user_oracles      LIMIT_USER=150     benchmarks/user_oracles.py --device cuda, 1 and 16 draws,
#                                        the oracles in order of interest, as far as time goes
#   user_oracles_256  LIMIT_USER_256=45  the same, 256 draws, five oracles, three methods
#   user_counts       LIMIT_COUNTS=45    engine calls and host reads per round, 16 draws
#   borrowing         LIMIT_BORROWING=40 sequential sampling and the default, 16 and 256 draws, of
#                                        oracles with fresh and with borrowed inputs (n = 4096)
#   engine_race       LIMIT_ENGINE=90    benchmarks/engine.py --parts overhead race (n = 4096,
#                                        Markov and HMM: the tree's sequential rows outrun it)
#   rounds            LIMIT_ROUNDS=60    benchmarks/rounds.py (Markov, HMM; n = 256, 1024, 4096)
#   diffusion         LIMIT_DIFFUSION=40 benchmarks/diffusion.py, d = 16, N = 1024: the default
#                                        rule against the block rule, sequential and Picard, then
#                                        its max_block at 64 (the default) and 128 (rounds-first),
#                                        the fastest of 3 runs each
#
# A GPU image without Pyro and ArviZ (the engine and the benchmarks need neither, the Pyro
# tests do) takes them as wheels, downloaded where pip reaches PyPI and installed there with
# `pip install --no-index --no-deps --target DIR WHEELS` and PYTHONPATH=DIR:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d wheels \
#       pyro-ppl pyro-api arviz h5netcdf xarray-einstats platformdirs
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
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        return 0
    fi
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
step tests "${LIMIT_TESTS:-40}" "$PY" -m pytest -q -p no:cacheprovider \
    tests/engine/test_devices.py tests/engine/test_errors.py \
    tests/infer/test_device.py tests/model/test_ffbs.py tests/oracles/test_dpp.py \
    -k "cuda or device or chunk_budget"

step user_oracles "${LIMIT_USER:-150}" "$PY" benchmarks/user_oracles.py --device "$DEVICE" \
    --draws 1 16 --no-count "${smoke[@]}" --variants autospec agr24 speculative sequential \
    --oracles nade:scale=2 nade:scale=2,chains=false nade:scale=0.5 mixture:K=64 \
    user_chain:n=4096 markov hmm guide:steps=0 mixture:K=8 tree_potts nade:scale=0.1

step user_oracles_256 "${LIMIT_USER_256:-45}" "$PY" benchmarks/user_oracles.py \
    --device "$DEVICE" --draws 256 --no-count "${smoke[@]}" --variants autospec agr24 sequential \
    --oracles mixture:K=8 markov hmm nade:scale=0.1 nade:scale=2

step user_counts "${LIMIT_COUNTS:-45}" "$PY" benchmarks/user_oracles.py --device "$DEVICE" \
    --draws 16 --oracles nade:scale=0.1 mixture:K=8 markov --variants autospec agr24 sequential \
    "${smoke[@]}"

step borrowing "${LIMIT_BORROWING:-40}" "$PY" benchmarks/user_oracles.py --device "$DEVICE" \
    --draws 16 256 --no-count --variants sequential autospec "${smoke[@]}" \
    --oracles user_chain:n=4096 user_chain:n=4096,borrows=true markov:n=4096 \
    markov:n=4096,borrows=false

step engine_race "${LIMIT_ENGINE:-90}" "$PY" benchmarks/engine.py --device "$DEVICE" \
    --parts overhead race --no-reference --families markov hmm "${smoke[@]}"

rounds_out="$OUT/rounds"
mkdir -p "$rounds_out"
step rounds "${LIMIT_ROUNDS:-60}" "$PY" benchmarks/rounds.py --device "$DEVICE" \
    --families markov hmm --sizes 256 1024 4096 --num-samples 16 --jobs 8 \
    --out "$rounds_out" "${smoke[@]}"

if [ -n "${SMOKE:-}" ]; then
    diffusion_sizes=(--steps 64)
else
    diffusion_sizes=(--steps 1024)
fi
step diffusion "${LIMIT_DIFFUSION:-40}" bash -c 'cd benchmarks && "$0" diffusion.py \
    --device "$1" --dims 16 --no-guide --num-samples 32 "${@:2}" \
    && "$0" diffusion.py --device "$1" --dims 16 --num-samples 32 --sweep 64 128 --repeats 3 "${@:2}"' \
    "$PY" "$DEVICE" "${diffusion_sizes[@]}"

echo "== done in $SECONDS s; outputs under $OUT" | tee -a "$OUT/summary.txt"
