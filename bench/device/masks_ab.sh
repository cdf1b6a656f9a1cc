# Stop 39's queue, call C (bench/device/README.md): a step's grammar masks from xgrammar's batch matcher
# (engine.batch_grammar_masks) against vLLM's own serial fill, the 0.6B at 200/s guided, one engine and two.
# bash bench/device/masks_ab.sh   (carry .devrun: tokenizer, dev reviews)
L=bench/results/eval/v13-guided_qwen2.5-coder-0.5b_n600_s11.json
C="--config bench/device/serve-h200.yaml --set prompt.version=v13 --tokenizer .devrun/tok --data .devrun/reviews_dev.csv --clients= --lengths-from $L --requests 6000 --duration 15 --unguided-valid 0.95 --client-procs 4 --detail"
S="--shape qwen3-0.6b --rate 200 --set serve.optimistic=false"
t0=$(date +%s)
PYTHONPATH=/tmp/site python3 bench/grammar_masks.py --tokenizer .devrun/tok --threads 1,2,4,8 --json-out $OUT/grammar_masks_host.json
run() { name=$1; shift; timeout $1 bash bench/device/run_workload.sh bench/serve_latency.py $C $S "${@:2}" --json-out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - t0 )) s"; grep -h "batch matcher" $OUT/$name.log | head -1; python3 bench/device/summarize_loads.py $OUT/$name.log; }
run masks_own 140
run masks_batch8 140 --set engine.batch_grammar_masks=8
run eng2_own 160 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5
run eng2_batch8 160 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5 --set engine.batch_grammar_masks=8
