#!/usr/bin/env bash
# issue 9 on the H200: the architecture suites (discovery matrix, capture equivalence of the ci
# subset on real CUDA graphs, MoE grad mode, per-layer divergence), the capture matrix of the whole
# zoo printed as a table, and the runner suites with the new discovery rule. Logs go to $OUT.
set -u
OUT=${OUT:-/tmp/issue9-out}; mkdir -p "$OUT"
declare -A RC
run() { local name=$1; shift; timeout 200 "$@" >"$OUT/$name.log" 2>&1; RC[$name]=$?; }
run architectures python -m pytest -p no:cacheprovider suites/architectures -q --device cuda --graph-backend cuda
run runner_discovery python -m pytest -p no:cacheprovider suites/runner/test_discovery.py -q --device cuda --graph-backend cuda
run capture_matrix python - <<'PY'
import json, os, warnings, torch
warnings.simplefilter("ignore")
from harness.graphs import GraphCapturer, get_backend
from harness.models.transformers_zoo import ARCHITECTURES, ArchitectureUnavailable
from harness.runner.matrices import capture_row
graphs = GraphCapturer(get_backend("cuda", device=torch.device("cuda")))
rows = {}
for arch in ARCHITECTURES:
    try:
        rows[arch.name] = capture_row(arch.name, graphs=graphs, device="cuda")
    except ArchitectureUnavailable as error:
        rows[arch.name] = {"unavailable": str(error)}
    except Exception as error:  # report, do not stop the matrix
        rows[arch.name] = {"error": f"{type(error).__name__}: {error}"[:200]}
    print(arch.name, rows[arch.name], flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "capture_matrix_cuda.json"), "w"), indent=1)
ok = sum(1 for r in rows.values() if r.get("replay_matches_eager"))
print(f"SUMMARY {ok}/{len(rows)} stacks capture and replay == eager on cuda")
PY
echo "== issue9 results (logs in $OUT)"
for name in architectures runner_discovery capture_matrix; do
  printf '%-18s rc=%-3s %s\n' "$name" "${RC[$name]}" "$(grep -E 'passed|failed|SUMMARY' "$OUT/$name.log" | tail -1)"
done
