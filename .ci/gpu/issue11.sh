#!/usr/bin/env bash
# Issue 11 on the H200: the baseline check passing on a rerun and failing on purpose, in 7 steps.
#
#   OUT=/some/folder .ci/gpu/issue11.sh        (from the repository root; about 2.5-3 minutes)
#
# The runner steps measure the quick set (`bench runner --quick`: 1 token and 4 x ~8 tokens, both
# models and sizes); the gather steps the full gather table (cheap). The full runner table for the
# README is `python -m harness bench runner --device cuda --graph-backend cuda --repeat 15` (~65 s).
#
# Writes to $OUT exactly 4 files:
#   baseline-h200-runner.json, baseline-h200-gather.json  the first runs; commit them as
#                                                          harness/bench/baselines/h200-{runner,gather}.json
#   results.txt                                            the result table and every step's verdict block
#   issue11-logs.tar.gz                                    every log, the other JSON, plots, gpu.txt
# Steps that must fail are the point: each must exit 1 (a regression), never 2 (a usage error) or a
# crash. Exits non-zero when any step's status is not the expected one.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
WORK=$(mktemp -d)
PY=${PYTHON:-python}
COMMON=(--device cuda --graph-backend cuda --repeat 15)
PLOT_RUNNER=() PLOT_GATHER=()
if "$PY" -c "import matplotlib" 2>/dev/null; then
  PLOT_RUNNER=(--plot "$WORK/runner-speedup.png") PLOT_GATHER=(--plot "$WORK/gather-speedup.png")
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$WORK/gpu.txt" 2>&1 || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" >> "$WORK/gpu.txt" 2>&1

declare -a ROWS=()
FAILURES=0
STARTED=$SECONDS
step() {  # step NAME EXPECTED_STATUS ARGS...
  local name=$1 expected=$2; shift 2
  local started=$SECONDS
  timeout 90 "$PY" -m harness bench "$@" > "$WORK/$name.log" 2>&1
  local status=$?
  local verdict
  verdict=$(grep -E "^(REGRESSION|no regression)" "$WORK/$name.log" | tail -1)
  [ -z "$verdict" ] && verdict=$(grep -E "^error:|Error" "$WORK/$name.log" | tail -1 | cut -c1-70)
  local ok=PASS
  if [ "$status" != "$expected" ]; then ok=FAIL; FAILURES=$((FAILURES + 1)); fi
  ROWS+=("$(printf '%-22s %8s %6s %-5s %5ss  %s' "$name" "$expected" "$status" "$ok" "$((SECONDS - started))" "$verdict")")
}

RB="$OUT/baseline-h200-runner.json"
GB="$OUT/baseline-h200-gather.json"
step runner-baseline 0 runner --quick "${COMMON[@]}" --json "$RB" ${PLOT_RUNNER[@]+"${PLOT_RUNNER[@]}"}
step gather-baseline 0 gather "${COMMON[@]}" --json "$GB" ${PLOT_GATHER[@]+"${PLOT_GATHER[@]}"}
step runner-rerun 0 runner --quick "${COMMON[@]}" --baseline "$RB" --json "$WORK/runner-rerun.json"
step gather-rerun 0 gather "${COMMON[@]}" --baseline "$GB" --json "$WORK/gather-rerun.json"
step runner-slowed 1 runner --quick "${COMMON[@]}" --baseline "$RB" --json "$WORK/runner-slowed.json" \
  --impl runner=harness.bench.variants:SlowedRunner
step runner-eager-fallback 1 runner --quick "${COMMON[@]}" --baseline "$RB" --json "$WORK/runner-eager-fallback.json" \
  --impl runner=harness.bench.variants:EagerFallbackRunner
step gather-extra-kernel 1 gather "${COMMON[@]}" --baseline "$GB" --json "$WORK/gather-extra-kernel.json" \
  --impl gather=harness.bench.variants:gather_with_extra_kernel

{
  echo "=== runner table (quick set, first run) ==="
  sed -n '/^model  /,/^times:/p' "$WORK/runner-baseline.log"
  echo "=== gather table (first run) ==="
  sed -n '/^implementation/,/^candidate:/p' "$WORK/gather-baseline.log"
  for name in runner-rerun gather-rerun runner-slowed runner-eager-fallback gather-extra-kernel; do
    echo "=== verdicts: $name ==="
    sed -n '/^baseline /,$p' "$WORK/$name.log"
  done
  echo
  cat "$WORK/gpu.txt"
  printf '%-22s %8s %6s %-5s %6s  %s\n' step expected status ok time verdict
  printf '%s\n' "${ROWS[@]}"
  echo "total $((SECONDS - STARTED)) s; logs in issue11-logs.tar.gz"
} > "$OUT/results.txt"
tar -czf "$OUT/issue11-logs.tar.gz" -C "$WORK" .
rm -rf "$WORK"
# The short table last: steps, expected and actual status, time, and each verdict line.
tail -n $(( ${#ROWS[@]} + 2 )) "$OUT/results.txt"
echo "commit $RB and $GB as harness/bench/baselines/h200-{runner,gather}.json"
exit $(( FAILURES > 0 ))
