#!/usr/bin/env bash
# Issue 10 on the H200: the golden suites on CUDA graphs, --snapshot-update twice on an unchanged tree,
# the run report, and a workflow lint. Run from the repo root with $OUT set; needs syrupy>=7 installed.
# Prints a result table last. Expected: the first update only adds this class's digests (and the gather
# compile-accounting golden for this torch minor version); the second changes nothing.
set -uo pipefail
OUT=${OUT:-/tmp/issue10-out}
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python}
golden_tests=(suites/runner/test_goldens.py suites/runner/test_discovery.py::test_discovery_goldens
              suites/gather/test_compile.py)
common=(--device cuda --graph-backend cuda -p no:cacheprovider -q)
declare -A result

hash_goldens() { find golden -type f -name '*.json' -print0 | sort -z | xargs -0 sha256sum; }

timeout 120 "$py" -m pytest "${golden_tests[@]}" "${common[@]}" --harness-report "$OUT/check-report.json" \
  > "$OUT/check.log" 2>&1; result[check]=$?

hash_goldens > "$OUT/before-update.sha256"
timeout 120 "$py" -m pytest "${golden_tests[@]}" "${common[@]}" --snapshot-update \
  --harness-report "$OUT/update1-report.json" > "$OUT/update1.log" 2>&1; result[update1]=$?
hash_goldens > "$OUT/after-update1.sha256"
{ echo "--- git status --porcelain golden/ after the first --snapshot-update"; git status --porcelain golden/; } \
  | tee "$OUT/update1-status.txt"
git add -N golden/ 2>/dev/null; git diff golden/ > "$OUT/update1-golden.diff"; git reset -q golden/ 2>/dev/null
tar czf "$OUT/golden-after-update1.tgz" golden/

timeout 120 "$py" -m pytest "${golden_tests[@]}" "${common[@]}" --snapshot-update \
  --harness-report "$OUT/update2-report.json" > "$OUT/update2.log" 2>&1; result[update2]=$?
hash_goldens > "$OUT/after-update2.sha256"
{ echo "--- git status --porcelain golden/ after the second --snapshot-update"; git status --porcelain golden/;
  echo "--- files the second update changed (sha256 diff against after the first):";
  diff "$OUT/after-update1.sha256" "$OUT/after-update2.sha256" && echo "(none)"; } | tee "$OUT/update2-status.txt"
diff -q "$OUT/after-update1.sha256" "$OUT/after-update2.sha256" >/dev/null; result[update2_unchanged]=$?

timeout 60 "$py" -m pytest "${golden_tests[@]}" "${common[@]}" --harness-report "$OUT/recheck-report.json" \
  > "$OUT/recheck.log" 2>&1; result[recheck]=$?
sed -n '/harness run report/,/^[-=]* \(snapshot\|short\)/p' "$OUT/recheck.log" | head -20

echo
echo "issue10 on $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)"
printf '%-34s %s\n' "step" "exit (0 = ok)"
for step in check update1 update2 update2_unchanged recheck; do printf '%-34s %s\n' "$step" "${result[$step]}"; done
echo "logs, reports, the first update's diff and golden tarball: $OUT"
