# Stop 39's queue, call B (bench/device/README.md): the 7B at 100/s v13 optimistic beside the batch under MPS, then the
# batch alone under MPS (ALONE=0: not the batch alone).
# bash bench/device/with_mps.sh bash bench/device/mps_beside_batch.sh   (carry .devrun)
. bench/device/loads.sh
timeout 330 bash bench/device/run_workload.sh bench/serve_latency.py $C --shape qwen2.5-7b --rate 100 \
  --alongside "python3 bench/workload_100k.py $A --json-out $OUT/mps_batch_beside.json" --json-out $OUT/mps_beside.json > $OUT/mps_beside.log 2>&1
echo "beside rc=$?"; python3 bench/device/summarize_loads.py $OUT/mps_beside.log
[ "${ALONE:-1}" = 0 ] || timeout 200 bash bench/device/run_workload.sh $A --json-out $OUT/mps_batch_alone.json > $OUT/mps_batch_alone.log 2>&1
echo "alone rc=$?"; for f in $OUT/mps_batch_*.json; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['strategies'][0]; print(sys.argv[1], r['exec_reviews_per_s'])" $f; done
