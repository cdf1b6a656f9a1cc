# Stop 39's queue, call A (bench/device/README.md): the 0.6B at 200/s guided under MPS with 1, 2 and 3 engines.
# bash bench/device/with_mps.sh bash bench/device/mps_small_engines.sh   (carry .devrun: tokenizer, dev reviews)
. bench/device/loads.sh
run mps_eng1 150
run mps_eng2 170 --set serve.engines=2 --set engine.gpu_memory_utilization=0.5   # 0.25 each, as stop 38
run mps_eng3 200 --set serve.engines=3 --set engine.gpu_memory_utilization=0.75  # 0.25 each
