# Stop 39's queue (bench/device/README.md): a step's grammar masks from xgrammar's batch matcher
# (engine.batch_grammar_masks) against vLLM's own serial fill, the 0.6B at 200/s guided, one engine; then a step's
# masks timed on the lent host's CPU (after the first load, which installs the kit), and two engines with the
# service's default (the batch matcher since stop 39): the same sitting's baseline for MPS (mps_small_engines.sh).
# bash bench/device/masks_ab.sh   (carry .devrun)
. bench/device/loads.sh
run masks_own 200 --set engine.batch_grammar_masks=0   # vLLM's own fill (since stop 39 the service's default on a GPU is the batch matcher)
run masks_batch8 150 --set engine.batch_grammar_masks=8
PYTHONPATH=/tmp/site:$PWD/bench/device:/tmp/site-extra timeout 90 python3 bench/grammar_masks.py --tokenizer .devrun/tok --threads 1,2,4,8 \
  --json-out $OUT/grammar_masks_host.json | tail -8
[ "${ENG2:-1}" = 0 ] || run eng2 160 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5   # ENG2=0: not this one
