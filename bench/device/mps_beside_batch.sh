# Stop 39's queue, call B (bench/device/README.md): the 7B at 100/s v13 optimistic beside the batch under MPS, then the
# batch alone under MPS.  bash bench/device/with_mps.sh bash bench/device/mps_beside_batch.sh   (carry .devrun)
L=bench/results/eval/v13-guided_qwen2.5-coder-0.5b_n600_s11.json
C="--config bench/device/serve-h200.yaml --set prompt.version=v13 --tokenizer .devrun/tok --data .devrun/reviews_dev.csv --clients= --lengths-from $L --requests 6000 --duration 15 --unguided-valid 0.95 --client-procs 4 --detail"
A="--shape qwen2.5-7b --strategies v13 --unguided-valid 0.95 --gpu-memory 0.45 --reviews 4000 --bare-reviews 128 --tokenizer .devrun/tok --data .devrun/reviews_dev.csv --lengths-from v13=$L"
timeout 330 bash bench/device/run_workload.sh bench/serve_latency.py $C --shape qwen2.5-7b --rate 100 \
  --alongside "python3 bench/workload_100k.py $A --json-out $OUT/mps_batch_beside.json" --json-out $OUT/mps_beside.json > $OUT/mps_beside.log 2>&1
echo "beside rc=$?"; python3 bench/device/summarize_loads.py $OUT/mps_beside.log
timeout 200 bash bench/device/run_workload.sh $A --json-out $OUT/mps_batch_alone.json > $OUT/mps_batch_alone.log 2>&1
echo "alone rc=$?"; for f in $OUT/mps_batch_beside.json $OUT/mps_batch_alone.json; do python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['strategies'][0]; print(sys.argv[1], r['exec_reviews_per_s'])" $f; done
