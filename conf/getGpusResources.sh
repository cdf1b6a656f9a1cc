#!/usr/bin/env bash
# Spark GPU discovery script (spark.worker/executor/driver.resource.gpu.discoveryScript), like spark-rapids'
# getGpusResources.sh: prints one ResourceInformation JSON object on stdout,
#   {"name": "gpu", "addresses": ["0","1"]}
# with the indices nvidia-smi reports (nvidia-smi ignores CUDA_VISIBLE_DEVICES: these are host indices).
#
# QWENSPARK_FAKE_GPUS="0,1" prints those addresses instead and never calls nvidia-smi: for tests and CPU
# demos of GPU scheduling (a standalone Worker started with it in its environment advertises fake GPUs).
# Set it to the empty string for a host with no GPUs.
#
# Without nvidia-smi (and without QWENSPARK_FAKE_GPUS) it fails with a message on stderr: Spark then refuses
# to start the executor/worker, which is better than a GPU job silently scheduled with no GPU.
set -euo pipefail

print_addresses() {
  # $@: addresses, already validated as plain integers
  local out="" a
  for a in "$@"; do
    out+="${out:+, }\"$a\""
  done
  printf '{"name": "gpu", "addresses": [%s]}\n' "$out"
}

check_addresses() {
  # $1: where the addresses came from (for the message); the rest: the addresses
  local source=$1 a
  shift
  for a in "$@"; do
    if ! [[ "$a" =~ ^[0-9]+$ ]]; then
      echo "getGpusResources.sh: GPU address '$a' from $source is not a non-negative integer" >&2
      exit 1
    fi
  done
}

if [[ -n "${QWENSPARK_FAKE_GPUS+set}" ]]; then
  IFS=',' read -r -a addrs <<< "${QWENSPARK_FAKE_GPUS// /}"
  check_addresses QWENSPARK_FAKE_GPUS "${addrs[@]+"${addrs[@]}"}"
  print_addresses "${addrs[@]+"${addrs[@]}"}"
  exit 0
fi

if ! command -v nvidia-smi > /dev/null 2>&1; then
  echo "getGpusResources.sh: nvidia-smi not found: no NVIDIA driver on $(hostname)?" \
       "(set QWENSPARK_FAKE_GPUS=0,1 to advertise fake GPUs for a CPU demo)" >&2
  exit 1
fi

if ! smi_out=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1); then
  echo "getGpusResources.sh: nvidia-smi failed: $smi_out" >&2
  exit 1
fi
mapfile -t addrs < <(printf '%s\n' "$smi_out" | tr -d ' \r' | grep -v '^$' || true)
check_addresses nvidia-smi "${addrs[@]+"${addrs[@]}"}"
print_addresses "${addrs[@]+"${addrs[@]}"}"
