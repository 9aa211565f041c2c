#!/usr/bin/env bash
# issue 9 on the H200 (< 4 minutes): the architecture suites on real CUDA graphs (discovery matrix,
# capture equivalence of the dense/MoE/VLM/hybrid subset, MoE grad mode, per-layer divergence, the
# capture matrix golden of the whole zoo x both rules), the runner discovery suite, the bench's
# per-layer divergence table, and the capture matrix with its largest differences. Logs in $OUT.
set -u
OUT=${OUT:-/tmp/issue9-out}; mkdir -p "$OUT"
declare -A RC
# Each step has its own limit (rc 124: timed out); together at most 230 s.
run() { local name=$1 limit=$2; shift 2; timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; RC[$name]=$?; }
CUDA=(--device cuda --graph-backend cuda)
run architectures 60 python -m pytest -p no:cacheprovider suites/runner/architectures -q -rfs "${CUDA[@]}"
run runner_discovery 40 python -m pytest -p no:cacheprovider suites/runner/test_discovery.py -q -rfs "${CUDA[@]}"
run bench_divergence 40 python -m harness bench runner "${CUDA[@]}" --models dense --sizes tiny --compositions "3;2,2,2" \
    --repeat 3 --json "$OUT/bench_runner.json"
run capture_matrix 90 python - <<'PY'
import json, os, warnings, torch
torch.set_num_threads(1)  # tiny models: host threads only spin
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
        rows[arch.name] = {"unavailable": str(error)[:120]}
    except Exception as error:  # report, do not stop the matrix
        rows[arch.name] = {"error": f"{type(error).__name__}: {error}"[:200]}
    print(arch.name, json.dumps(rows[arch.name]), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "capture_matrix_cuda.json"), "w"), indent=1)
for rule in ("harness", "sglang"):
    cells = [r[rule] for r in rows.values() if rule in r]
    ok = sum(1 for c in cells if c["replay_matches_eager"])
    worst = max((c["max_abs_diff"] for c in cells if c["max_abs_diff"] is not None), default=float("nan"))
    stops = sorted({c["stopped_by"] for c in cells if c["stopped_by"]})
    print(f"SUMMARY {rule}: {sum(c['captures'] for c in cells)}/{len(cells)} capture, {ok} replay == eager, "
          f"max diff {worst:.2e}; stopped by {stops}")
PY
echo "== bench runner: per-layer divergence table (cuda)"; sed -n '/per-layer divergence/,$p' "$OUT/bench_divergence.log"
echo "== capture matrix summary (cuda)"; grep SUMMARY "$OUT/capture_matrix.log"
echo "== issue9 results (logs in $OUT)"
LAYERS="$(grep -c ' ok (atol' "$OUT/bench_divergence.log") layers within tolerance, $(grep -c 'FIRST DIVERGENT' "$OUT/bench_divergence.log") first-divergent"
for name in architectures runner_discovery bench_divergence capture_matrix; do
  line=$(grep -E 'passed|failed|error|SUMMARY harness' "$OUT/$name.log" | tail -1)
  [ "$name" = bench_divergence ] && line=$LAYERS
  printf '%-18s rc=%-3s %s\n' "$name" "${RC[$name]}" "$line"
done
