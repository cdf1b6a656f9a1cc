# Sourced by the device queue scripts (bench/device/README.md; carry .devrun: tokenizer, dev reviews): the service
# latency flags of stops 31-38 (C), the 0.6B at 200 guided requests/s (SMALL), the batch bench beside it (A: the 7B
# and 4,000 reviews unless BATCH_SHAPE and BATCH_REVIEWS say otherwise), and
#   run NAME TIMEOUT ARGS...   one load of SMALL (or of LOAD where set) with ARGS, to $OUT/NAME.json and .log, nvidia-smi read 6 s into it
#                              ($OUT/smi_NAME.txt), then its rc, the mask plugin's line if it took over, and a summary.
# PV: the prompt version (v14 since stop 50: Chinese summaries bounded to 40 characters; PV=v13 for the runs before)
PV=${PV:-v14}
L=bench/results/eval/$PV-guided_qwen2.5-coder-0.5b_n600_s11.json
C="--config bench/device/serve-h200.yaml --set prompt.version=$PV --tokenizer .devrun/tok --data .devrun/reviews_dev.csv --clients= --lengths-from $L --requests 6000 --duration 15 --unguided-valid 0.95 --client-procs 4 --detail"
SMALL="--shape qwen3-0.6b --rate 200 --set serve.optimistic=false"
# the default 0.5B's real weights (bench/device/prepare_model.sh's parts in /tmp/mchunks), each answer the model's own:
# LOAD="$REAL" run NAME TIMEOUT [--set "$NGRAM"] (the service's CPU default proposals, SERVE_CPU_DEFAULTS)
REAL="--config bench/device/serve-h200.yaml --set prompt.version=$PV --set serve.optimistic=false --set engine.model=/tmp/qwen2.5-coder-0.5b-instruct --set engine.default_model=false --data .devrun/reviews_dev.csv --clients= --rate 200 --requests 6000 --duration 15 --client-procs 4 --detail"
NGRAM='engine.engine_kwargs.speculative_config={method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 4}'
[ -d /tmp/mchunks ] && [ ! -d /tmp/qwen2.5-coder-0.5b-instruct ] && cat /tmp/mchunks/part-* | tar x -C /tmp
A="--shape ${BATCH_SHAPE:-qwen2.5-7b} --strategies $PV --unguided-valid 0.95 --gpu-memory 0.45 --reviews ${BATCH_REVIEWS:-4000} --bare-reviews 128 --tokenizer .devrun/tok --data .devrun/reviews_dev.csv --lengths-from $PV=$L"
t0=$(date +%s)
# the host as this call found it (stop 44's machine was slower than stop 43's: the 0.6B's engine core is CPU-bound):
# its CPU model and clock, its load, the busiest processes (anything left over from an earlier call shows here)
[ -n "${OUT:-}" ] && [ ! -f "$OUT/host.txt" ] && { lscpu | grep -E "^Model name|MHz|^CPU\(s\)"; uptime
  top -b -n1 -o %CPU | head -20; } > "$OUT/host.txt" 2>&1
run() { name=$1; shift; timeout $1 bash bench/device/run_workload.sh bench/serve_latency.py ${LOAD:-$C $SMALL} "${@:2}" --json-out $OUT/$name.json > $OUT/$name.log 2>&1 & p=$!
  until grep -q "^\[load\]" $OUT/$name.log 2>/dev/null || ! kill -0 $p 2>/dev/null; do sleep 0.5; done
  sleep 6; nvidia-smi > $OUT/smi_$name.txt 2>&1
  wait $p; echo "== $name rc=$? at $(( $(date +%s) - t0 )) s"; grep -h "batch matcher" $OUT/$name.log | head -1
  python3 bench/device/summarize_loads.py $OUT/$name.log; }
