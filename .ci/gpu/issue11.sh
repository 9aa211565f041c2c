#!/usr/bin/env bash
# Issue 11 on the H200: runner and gather benchmarks, and the baseline check passing and failing on purpose.
#
#   OUT=/some/folder .ci/gpu/issue11.sh        (from the repository root; about 3-4 minutes)
#
# Writes $OUT/baseline-h200-runner.json and $OUT/baseline-h200-gather.json (the first runs: commit them
# as harness/bench/baselines/h200-runner.json and h200-gather.json), one log and one JSON per step, and
# prints a result table last. Steps that must fail are the point: each must exit 1 (a regression),
# never 2 (a usage error) or a crash. Exits non-zero when any step's status is not the expected one.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
PY=${PYTHON:-python}
COMMON=(--device cuda --graph-backend cuda --repeat 15)  # 15 samples per figure keeps the script near 3.5 minutes
PLOT_RUNNER=() PLOT_GATHER=()
if "$PY" -c "import matplotlib" 2>/dev/null; then
  PLOT_RUNNER=(--plot "$OUT/runner-speedup.png") PLOT_GATHER=(--plot "$OUT/gather-speedup.png")
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" >> "$OUT/gpu.txt" 2>&1

declare -a ROWS=()
FAILURES=0
step() {  # step NAME EXPECTED_STATUS ARGS...
  local name=$1 expected=$2; shift 2
  local started=$SECONDS
  timeout 170 "$PY" -m harness bench "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  local verdict
  verdict=$(grep -E "^(REGRESSION|no regression)" "$OUT/$name.log" | tail -1)
  [ -z "$verdict" ] && verdict=$(grep -E "^error:|Error" "$OUT/$name.log" | tail -1 | cut -c1-70)
  local ok=PASS
  if [ "$status" != "$expected" ]; then ok=FAIL; FAILURES=$((FAILURES + 1)); fi
  ROWS+=("$(printf '%-22s %8s %6s %-5s %5ss  %s' "$name" "$expected" "$status" "$ok" "$((SECONDS - started))" "$verdict")")
}

RB="$OUT/baseline-h200-runner.json"
GB="$OUT/baseline-h200-gather.json"
step runner-baseline 0 runner "${COMMON[@]}" --json "$RB" ${PLOT_RUNNER[@]+"${PLOT_RUNNER[@]}"}
step gather-baseline 0 gather "${COMMON[@]}" --json "$GB" ${PLOT_GATHER[@]+"${PLOT_GATHER[@]}"}
step runner-rerun 0 runner "${COMMON[@]}" --baseline "$RB" --json "$OUT/runner-rerun.json"
step gather-rerun 0 gather "${COMMON[@]}" --baseline "$GB" --json "$OUT/gather-rerun.json"
step runner-slowed 1 runner "${COMMON[@]}" --baseline "$RB" --json "$OUT/runner-slowed.json" \
  --impl runner=harness.bench.variants:SlowedRunner
step runner-eager-fallback 1 runner "${COMMON[@]}" --baseline "$RB" --json "$OUT/runner-eager-fallback.json" \
  --impl runner=harness.bench.variants:EagerFallbackRunner
step gather-extra-kernel 1 gather "${COMMON[@]}" --baseline "$GB" --json "$OUT/gather-extra-kernel.json" \
  --impl gather=harness.bench.variants:gather_with_extra_kernel

echo
echo "=== runner table (first run) ==="
sed -n '/^model  /,/^times:/p' "$OUT/runner-baseline.log"
echo "=== gather table (first run) ==="
sed -n '/^implementation/,/^candidate:/p' "$OUT/gather-baseline.log"
echo
cat "$OUT/gpu.txt"
printf '%-22s %8s %6s %-5s %6s  %s\n' step expected status ok time verdict
printf '%s\n' "${ROWS[@]}"
echo "logs and JSON in $OUT; commit $RB and $GB as harness/bench/baselines/h200-{runner,gather}.json"
exit $(( FAILURES > 0 ))
