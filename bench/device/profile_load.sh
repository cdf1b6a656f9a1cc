#!/usr/bin/env bash
# On the GPU machine: run bench/serve_latency.py (through run_workload.sh) with ARGS and, once its first load has
# started and its clients are sending, record vLLM's engine core for SECONDS with py-spy (each Python thread) and
# top -H (each thread, native ones too) into $OUT: where a load's CPU goes (bench/device/README.md).
#   bash bench/device/profile_load.sh SECONDS ARGS...
set -uo pipefail
secs=$1; shift
python3 -m pip install -q --no-index --target /tmp/pyspy .devrun/whl/py_spy-*.whl >/dev/null 2>&1
bash bench/device/run_workload.sh bench/serve_latency.py "$@" > "$OUT/load.log" 2>&1 &
bench=$!
until grep -q "^\[load\]" "$OUT/load.log" 2>/dev/null; do
  kill -0 $bench 2>/dev/null || { echo "bench ended before its load"; tail -20 "$OUT/load.log"; exit 1; }
  sleep 0.5
done
sleep 4  # the client processes' first request is due 3 s after the load starts
core=$(pgrep -f "EngineCor[e]" | head -1)
top -H -b -d 2 -n 3 -p "$core" > "$OUT/top_engine_core.txt" &
/tmp/pyspy/bin/py-spy record -p "$core" -d "$secs" -r 100 -f raw --threads --nonblocking \
  -o "$OUT/pyspy_engine_core.txt" > "$OUT/pyspy.log" 2>&1
wait $bench
echo "bench rc=$?"
grep -h "^{" "$OUT/load.log" | tail -3
