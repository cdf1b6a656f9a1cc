#!/usr/bin/env bash
# On the GPU machine (bench/device/README.md): install the vLLM kit once from the parts the earlier calls left in
# /tmp/vchunks (../shared/tools/vllm-on-device/README.md), and the service's few wheels the image lacks from
# .devrun/whl when it lacks them; then run bench/workload_100k.py with the arguments given, or the bench script named
# first (bench/device/run_workload.sh bench/serve_latency.py ARGS...).
set -uo pipefail
if [ ! -f /tmp/site/vllm/__init__.py ]; then
  (cd /tmp/vchunks && cat part-* > all.tar && tar xf all.tar &&
   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site whl/*.whl) || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/bench/device VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
for need in prometheus_client:prometheus_client httpx:httpx mysql.connector:mysql_connector_python; do
  # only what the image lacks and .devrun/whl holds (the service's needs; the batch bench needs none of them)
  if ! python3 -c "import ${need%%:*}" 2>/dev/null && compgen -G ".devrun/whl/${need#*:}-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-extra .devrun/whl/"${need#*:}"-*.whl || exit 1
  fi
done
# qwenspark is not installed here: its vLLM plugin's entry point (pyproject.toml, engine.batch_grammar_masks) in a
# metadata folder of its own, and the checkout on the path, so that vLLM's plugin loader finds it in each process.
plugin=/tmp/site-extra/qwenspark_plugins-0.dist-info
if [ ! -f $plugin/entry_points.txt ]; then
  mkdir -p $plugin && printf 'Metadata-Version: 2.1\nName: qwenspark-plugins\nVersion: 0\n' > $plugin/METADATA &&
  printf '[vllm.general_plugins]\nqwenspark_batch_grammar_masks = qwenspark.engines.vllm_masks:register\n' \
    > $plugin/entry_points.txt || exit 1
fi
export PYTHONPATH=$PYTHONPATH:/tmp/site-extra:$PWD
script=bench/workload_100k.py
case "${1:-}" in *.py) script=$1; shift ;; esac
exec python3 "$script" "$@"
