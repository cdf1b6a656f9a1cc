#!/usr/bin/env bash
# Run a command with NVIDIA MPS on (bench/device/README.md): start the MPS control daemon with pipe and log folders
# of its own, run the command with them in its environment, so that every CUDA process it starts (the service's
# engine cores, the batch's) shares the GPU's SMs through one MPS server instead of time-slicing the GPU between
# CUDA contexts; say which MPS servers served; stop the daemon. Needs the driver's nvidia-cuda-mps-control and the
# right to run it (root on the lent machine). An operator enables MPS the same way on a host whose GPU the service
# and Spark's executors share (the daemon before both; both with the same CUDA_MPS_PIPE_DIRECTORY).
#   bash bench/device/with_mps.sh bash bench/device/run_workload.sh bench/serve_latency.py ARGS...
set -uo pipefail
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "with_mps: nvidia-cuda-mps-control is not on PATH: no MPS here" >&2
  exit 3
fi
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/qwenspark-mps/pipe}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/qwenspark-mps/log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "with_mps: the MPS control daemon did not start" >&2; exit 3; }
servers() { echo get_server_list | nvidia-cuda-mps-control 2>/dev/null | tr '\n' ' '; }
# Read while the command runs too: a server exists once a CUDA process has connected through MPS.
( sleep 60; echo "with_mps: MPS servers after 60 s: $(servers)" ) & watcher=$!
stop() { kill "$watcher" 2>/dev/null; echo "with_mps: MPS servers: $(servers)"; echo quit | nvidia-cuda-mps-control; }
trap stop EXIT
# A CUDA client first: if it cannot reach the GPU through the daemon (a compute mode or a container that MPS cannot
# serve), say so and run nothing, rather than a queue of loads whose engines fail their start.
if ! timeout 120 python3 -c "import torch; torch.zeros(1, device='cuda'); print('with_mps: probe', torch.cuda.get_device_name())"; then
  echo "with_mps: a CUDA client failed under MPS" >&2; exit 3
fi
echo "with_mps: MPS servers after the probe: $(servers)"
"$@"
