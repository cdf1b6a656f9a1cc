# Stop 39's queue, call B (bench/device/README.md): the 7B at 100/s v13 optimistic beside the batch under MPS, then the
# batch alone under MPS (ALONE=0: not the batch alone). BATCH_ENV="NAME=VALUE ..." goes into the batch engine's
# environment (workload_100k.py --env), e.g. CUDA_MPS_CLIENT_PRIORITY=1 (the batch's kernels below the service's) or
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 (the batch on at most 60 % of the SMs); BATCH_ARGS="..." goes to
# workload_100k.py as it is, e.g. "--yield-to-service 0.8" (engine.yield_to_service: the batch stands still 80 % of
# the time while the service has answers in flight; needs no MPS); TAG names the files (default mps); SERVICE the
# service's load (default the 7B at 100/s: "--shape qwen2.5-7b --rate 100"), BATCH_SHAPE and BATCH_REVIEWS the batch's
# (loads.sh).
# bash bench/device/with_mps.sh bash bench/device/mps_beside_batch.sh   (carry .devrun)
. bench/device/loads.sh
tag=${TAG:-mps}
for kv in ${BATCH_ENV:-}; do A="$A --env $kv"; done
A="$A ${BATCH_ARGS:-}"
timeout ${BESIDE_TIMEOUT:-330} bash bench/device/run_workload.sh bench/serve_latency.py $C ${SERVICE:---shape qwen2.5-7b --rate 100} \
  --alongside "python3 bench/workload_100k.py $A --json-out $OUT/${tag}_batch_beside.json" --json-out $OUT/${tag}_beside.json > $OUT/${tag}_beside.log 2>&1
echo "beside rc=$? batch env: ${BATCH_ENV:-none}"; python3 bench/device/summarize_loads.py $OUT/${tag}_beside.log
[ "${ALONE:-1}" = 0 ] || timeout 200 bash bench/device/run_workload.sh $A --json-out $OUT/${tag}_batch_alone.json > $OUT/${tag}_batch_alone.log 2>&1
echo "alone rc=$?"; for f in $OUT/${tag}_batch_*.json; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['strategies'][0]; print(sys.argv[1], r['exec_reviews_per_s'])" $f; done
