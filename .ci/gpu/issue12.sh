#!/usr/bin/env bash
# GPU checks of issue 12 (one-line answers to bad input, reproducible failures), on a CUDA machine:
# the harness's own tests of it with --device auto = cuda (the reproduce lines then carry
# --device cuda --graph-backend cuda and must rerun the same failure on the GPU), and an external
# --impl of each smoke-called component in a CUDA session. Run from the repository root, $OUT an
# output folder, .whl/ holding the syrupy and pytest-timeout wheels where they are not installed.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, hypothesis; print('torch', torch.__version__, 'hypothesis', hypothesis.__version__)"
results=()
run() {  # run NAME COMMAND...: log to $OUT/NAME.log, remember rc, seconds and the last line
  local name=$1; shift
  local start=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  results+=("$(printf '%-22s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - start ))" "$(tail -1 "$OUT/$name.log")")")
}
run tests-issue12 python3 -m pytest tests/test_command_line.py tests/test_impls.py tests/test_reproduce.py \
  -q -p no:cacheprovider -rs
run external-impls-cuda python3 -m pytest suites/runner/test_lifecycle.py suites/graphs/test_breaks.py \
  --device cuda --graph-backend cuda -q -p no:cacheprovider -x \
  --impl runner=harness.runner:LayerStackRunner --impl graphs=harness.graphs:GraphCapturer
run list python3 -m harness list
run bench-gather-help python3 -m harness bench gather --help
echo "--- issue 12 on the GPU"
printf '%s\n' "${results[@]}"
