#!/usr/bin/env bash
# issue 8 on an H200: the runner suites (lifecycle machine, paged-KV decode, the speculative-decode loop
# through the runner and the compiled gather) and the runner kill matrix, on the cuda graph backend.
# Run from the repo root with $OUT set. Under 5 minutes in all (the two timeouts sum to 300 s); writes
# three files to $OUT (pytest-runner.log, selfcheck-runner.log, selfcheck-runner.json); a table prints last.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export CI=1  # the ci hypothesis profile
start=$(date +%s)
timeout 150 python -m pytest suites/runner --graph-backend cuda --device cuda -p no:cacheprovider -q -rfE -n 4 \
    --durations=0 > "$OUT/pytest-runner.log" 2>&1
suite_rc=$?
suite_s=$(( $(date +%s) - start ))
start=$(date +%s)
timeout 150 python -m harness selfcheck --component runner --graph-backend cuda --device cuda \
    --json "$OUT/selfcheck-runner.json" --keep-hints > "$OUT/selfcheck-runner.log" 2>&1
self_rc=$?
self_s=$(( $(date +%s) - start ))
# The loop suite's own time: its test calls as pytest's --durations lists them.
loop_s=$(grep -E 'call +suites/runner/test_speculative.py' "$OUT/pytest-runner.log" | awk '{s += $1} END {printf "%.1f", s}')
echo "--- pytest suites/runner (tail)"; tail -n 12 "$OUT/pytest-runner.log"
echo "--- selfcheck runner (tail)"; tail -n 40 "$OUT/selfcheck-runner.log"
printf '\n%-46s %-6s %s\n' check rc seconds
printf '%-46s %-6s %s\n' "pytest suites/runner (cuda)" "$suite_rc" "$suite_s"
printf '%-46s %-6s %s\n' "  of which test_speculative.py (test calls)" "-" "$loop_s"
printf '%-46s %-6s %s\n' "selfcheck --component runner (cuda)" "$self_rc" "$self_s"
[ "$suite_rc" = 0 ] && [ "$self_rc" = 0 ]
