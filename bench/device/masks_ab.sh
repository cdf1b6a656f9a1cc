# Stop 39's queue, call C (bench/device/README.md): a step's grammar masks from xgrammar's batch matcher
# (engine.batch_grammar_masks) against vLLM's own serial fill, the 0.6B at 200/s guided, one engine and two.
# bash bench/device/masks_ab.sh   (carry .devrun: tokenizer, dev reviews)
. bench/device/loads.sh
PYTHONPATH=/tmp/site python3 bench/grammar_masks.py --tokenizer .devrun/tok --threads 1,2,4,8 --json-out $OUT/grammar_masks_host.json
run masks_own 140
run masks_batch8 140 --set engine.batch_grammar_masks=8
run eng2_own 160 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5
run eng2_batch8 160 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5 --set engine.batch_grammar_masks=8
