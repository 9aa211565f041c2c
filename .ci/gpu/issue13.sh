#!/usr/bin/env bash
# Issue 13 on the H200: suites/graphs on real CUDA graphs (the warm-up tests run there, not skipped),
# then the graphs kill matrix on the cuda backend. Run from the repo root with $OUT set. Logs, a junit
# file, the selfcheck JSON and the cuda kill hints go to $OUT; a result table is printed last. Under 4 minutes
# (timeouts 90 s + 140 s).
set -uo pipefail
OUT=${OUT:-/tmp/issue13-out}
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python}
declare -A result summary

started=$(date +%s)
timeout 90 "$py" -m pytest suites/graphs --graph-backend cuda --device cuda -p no:cacheprovider -q -rs \
  --junitxml "$OUT/graphs-cuda.xml" > "$OUT/graphs-cuda.log" 2>&1; result[suite]=$?
summary[suite]=$(grep -E '^[0-9]+ (passed|failed)|[0-9]+ (passed|failed).* in ' "$OUT/graphs-cuda.log" | tail -1)
result[suite_seconds]=$(( $(date +%s) - started ))
# The warm-up tests must have run here (they skip only on backends that do not model warm-up).
if grep -q "test_warm_up.py.*SKIPPED\|SKIPPED.*test_warm_up.py" "$OUT/graphs-cuda.log"; then result[warm_up_ran]=1; else result[warm_up_ran]=0; fi

started=$(date +%s)
timeout 140 "$py" -m harness selfcheck --component graphs --graph-backend cuda --device cuda \
  --json "$OUT/selfcheck-graphs.json" > "$OUT/selfcheck-graphs.log" 2>&1; result[selfcheck]=$?
summary[selfcheck]=$(grep -E 'mutants killed' "$OUT/selfcheck-graphs.log" | tail -1)
result[selfcheck_seconds]=$(( $(date +%s) - started ))
cp golden/selfcheck/kill_matrix.json "$OUT/kill_matrix-after-cuda.json" 2>/dev/null

echo "--- kill matrix (cuda)"
sed -n '/^component/,/whole matrix/p' "$OUT/selfcheck-graphs.log"
echo "--- failures of the suite, if any"
grep -E '^(FAILED|ERROR)' "$OUT/graphs-cuda.log" | head -20
echo
echo "issue13 on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
printf '%-28s %-6s %-8s %s\n' "step" "exit" "seconds" "summary"
printf '%-28s %-6s %-8s %s\n' "pytest suites/graphs (cuda)" "${result[suite]}" "${result[suite_seconds]}" "${summary[suite]}"
printf '%-28s %-6s %-8s %s\n' "warm-up tests ran (0 = yes)" "${result[warm_up_ran]}" "-" "suites/graphs/test_warm_up.py"
printf '%-28s %-6s %-8s %s\n' "selfcheck graphs (cuda)" "${result[selfcheck]}" "${result[selfcheck_seconds]}" "${summary[selfcheck]}"
echo "logs, junit, selfcheck JSON: $OUT"
