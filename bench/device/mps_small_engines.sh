# Stop 39's queue (bench/device/README.md): the 0.6B at 200/s guided under MPS with N engines each (default: 2 3), 0.25
# of the GPU's memory each, as stop 38. One engine is one CUDA client, which MPS does not change; masks_ab.sh's eng2 is
# the same sitting's two engines without MPS (both with the service's default masks: the batch matcher since stop 39).
# bash bench/device/with_mps.sh bash bench/device/mps_small_engines.sh [N ...]   (carry .devrun: tokenizer, dev reviews)
. bench/device/loads.sh
for n in ${@:-2 3}; do
  run mps_eng$n $((130 + 35 * n)) --set serve.engines=$n --set engine.gpu_memory_utilization=0.$((25 * n))
done
