set -u
s=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $s .whl/*.whl; export PYTHONPATH=$PWD:$s CI=1
nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import torch;print(torch.__version__)"
T="suites/graphs/test_side_streams.py suites/graphs/test_capture_order.py suites/graphs/test_pool_lifetime.py suites/graphs/test_hazard_amplifiers.py suites/graphs/test_frozen_semantics.py suites/runner/test_pad_rows.py suites/gather/test_graph_capture.py"
timeout 240 python3 -m pytest $T -q -n 8 -p no:cacheprovider -rfE > $OUT/quick.log 2>&1; echo "suites rc=$?"; grep -E "passed|failed|FAILED|ERROR" $OUT/quick.log | tail -25
for m in graphs:wait-on-outside-stream-dropped:suites/graphs/test_side_streams.py graphs:capture-steps-carried:suites/graphs/test_capture_order.py graphs:break-output-held-weakly:suites/graphs/test_pool_lifetime.py graphs:output-held-weakly:suites/graphs/test_pool_lifetime.py graphs:keeps-every-graph:suites/graphs/test_pool_lifetime.py runner:pads-hidden-inputs-unwritten:suites/runner/test_pad_rows.py gather:workspace-regrown:suites/gather/test_graph_capture.py; do
 IFS=: read c name f <<< "$m"; timeout 90 python3 -m pytest $f -q -x -p no:cacheprovider --impl $c=mutant:$name > $OUT/m-$name.log 2>&1; echo "$name rc=$? $(tail -1 $OUT/m-$name.log)"; done
