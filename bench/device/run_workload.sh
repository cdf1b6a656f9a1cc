#!/usr/bin/env bash
# On the GPU machine (bench/device/README.md): install the vLLM kit once from the parts the earlier calls left in
# /tmp/vchunks (../shared/tools/vllm-on-device/README.md), then run bench/workload_100k.py with the arguments given.
set -uo pipefail
if [ ! -f /tmp/site/vllm/__init__.py ]; then
  (cd /tmp/vchunks && cat part-* > all.tar && tar xf all.tar &&
   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site whl/*.whl) || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/bench/device VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
exec python3 bench/workload_100k.py "$@"
