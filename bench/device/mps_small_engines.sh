# Stop 39's queue, call A (bench/device/README.md): the 0.6B at 200/s guided under MPS with 1, 2 and 3 engines.
# bash bench/device/with_mps.sh bash bench/device/mps_small_engines.sh   (carry .devrun: tokenizer, dev reviews)
L=bench/results/eval/v13-guided_qwen2.5-coder-0.5b_n600_s11.json
C="--config bench/device/serve-h200.yaml --set prompt.version=v13 --tokenizer .devrun/tok --data .devrun/reviews_dev.csv --clients= --lengths-from $L --requests 6000 --duration 15 --unguided-valid 0.95 --client-procs 4 --detail"
S="--shape qwen3-0.6b --rate 200 --set serve.optimistic=false"
t0=$(date +%s)
run() { name=$1; shift; timeout $1 bash bench/device/run_workload.sh bench/serve_latency.py $C $S "${@:2}" --json-out $OUT/$name.json > $OUT/$name.log 2>&1 & p=$!
  until grep -q "^\[load\]" $OUT/$name.log 2>/dev/null || ! kill -0 $p 2>/dev/null; do sleep 0.5; done
  sleep 6; nvidia-smi > $OUT/smi_$name.txt 2>&1
  wait $p; echo "== $name rc=$? at $(( $(date +%s) - t0 )) s"; python3 bench/device/summarize_loads.py $OUT/$name.log; }
run mps_eng1 150
run mps_eng2 170 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5   # 0.25 each, as stop 38
run mps_eng3 200 --set serve.engines=3 --set engine.gpu_memory_utilization=0.75  # 0.25 each
