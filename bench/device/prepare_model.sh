#!/usr/bin/env bash
# Cut the default model's real weights (`make model`) into parts that each travel in one device call with the tracked
# tree (under 64 MiB together), into .vm/ (ignored by git): for the service's latency with a trained model's own
# answers on the GPU machine (bench/device/README.md, stop 48's queue), where a dummy model's would not do (its text
# is not a trained model's: speculative decoding's proposals, say, would never be taken).
#   bash bench/device/prepare_model.sh        then send .vm/part-NN one per call (as the vLLM kit's parts)
# On the machine, once every part is there: cat /tmp/mchunks/part-* | tar x -C /tmp   (/tmp/qwen2.5-coder-0.5b-instruct)
set -euo pipefail
cd "$(dirname "$0")/../.."
name=qwen2.5-coder-0.5b-instruct
[ -f .cache/models/$name/model.safetensors ] || { echo "no .cache/models/$name: run make model first" >&2; exit 1; }
rm -rf .vm && mkdir -p .vm
tar cf - -C .cache/models "$name" | split -b "${PART:-50M}" -d -a 2 - .vm/part-
ls .vm | wc -l | xargs echo "parts in .vm:"
