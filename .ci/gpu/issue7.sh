#!/usr/bin/env bash
# GPU checks of the house (issue 7): every suite and the whole kill matrix on the cuda backend.
# Run from the repository root on a GPU machine, with $OUT an output folder and .whl/ holding the
# syrupy and pytest-timeout wheels where they are not installed.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
start=$(date +%s)
python3 -m pytest suites/ --device cuda --graph-backend cuda -q -p no:cacheprovider -n 4 > "$OUT/suites.log" 2>&1
suites_rc=$?
suites_s=$(( $(date +%s) - start ))
python3 -m harness selfcheck --graph-backend cuda --device cuda --json "$OUT/selfcheck.json" > "$OUT/selfcheck.log" 2>&1
selfcheck_rc=$?
cp golden/selfcheck/kill_matrix.json "$OUT/kill_matrix.json"
cat "$OUT/selfcheck.log"
echo "--- suites (cuda, -n 4): rc=$suites_rc in ${suites_s}s: $(tail -1 "$OUT/suites.log")"
echo "--- selfcheck (cuda): rc=$selfcheck_rc"
