#!/usr/bin/env bash
# issue 8 on an H200: the runner suites (lifecycle machine, paged-KV decode) and the runner kill matrix
# on the cuda graph backend. Run from the repo root with $OUT set; logs land in $OUT, a table prints last.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export CI=1  # the ci hypothesis profile
start=$(date +%s)
timeout 150 python -m pytest suites/runner --graph-backend cuda --device cuda -p no:cacheprovider -q \
    --durations=10 > "$OUT/pytest-runner.log" 2>&1
suite_rc=$?
suite_s=$(( $(date +%s) - start ))
start=$(date +%s)
timeout 200 python -m harness selfcheck --component runner --graph-backend cuda --device cuda \
    --json "$OUT/selfcheck-runner.json" --keep-hints > "$OUT/selfcheck-runner.log" 2>&1
self_rc=$?
self_s=$(( $(date +%s) - start ))
echo "--- pytest suites/runner (tail)"; tail -n 15 "$OUT/pytest-runner.log"
echo "--- selfcheck runner (tail)"; tail -n 30 "$OUT/selfcheck-runner.log"
printf '\n%-40s %-6s %s\n' check rc seconds
printf '%-40s %-6s %s\n' "pytest suites/runner (cuda)" "$suite_rc" "$suite_s"
printf '%-40s %-6s %s\n' "selfcheck --component runner (cuda)" "$self_rc" "$self_s"
[ "$suite_rc" = 0 ] && [ "$self_rc" = 0 ]
