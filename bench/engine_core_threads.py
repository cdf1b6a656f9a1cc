"""What torch's OpenMP pool costs a GPU engine core's process: one copy of a step's grammar masks every few ms.

vLLM's one-GPU engine core copies each step's grammar masks (vocabulary / 32 int32 words per guided answer: 19 kB
for Qwen) into pinned memory for the GPU, a copy large enough for torch to run on its OpenMP pool; between steps
(the GPU's turn) the pool's threads spin waiting for the next parallel region. This plays that on the CPU: a copy
every --step-ms, with the pool at one thread and at every core, and prints the process's CPU (all threads) against
the copying thread's own. Why the service caps the engine core's pool on a GPU (qwenspark/serve/engine.py,
SERVE_GPU_ENV; the H200 profile: bench/results/profiles/pyspy_h200_06b_200rps_guided_stop35.txt).

    python bench/engine_core_threads.py [--answers 190] [--vocab 151936] [--step-ms 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def play(threads: int, answers: int, vocab: int, step_s: float, seconds: float) -> dict[str, float]:
    """The copy loop in this process with torch at `threads` threads: cores used by the process and by this thread."""
    import torch

    torch.set_num_threads(threads)
    masks = torch.randint(0, 2**31 - 1, (answers, (vocab + 31) // 32), dtype=torch.int32)
    pinned = torch.empty_like(masks)
    start_cpu, start_thread, start = time.process_time(), time.thread_time(), time.perf_counter()
    steps = 0
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        pinned.copy_(masks)
        steps += 1
        while time.perf_counter() - began < step_s:  # the rest of the step happens on the GPU
            time.sleep(step_s / 10)
    wall = time.perf_counter() - start
    return {"threads": threads, "steps": steps,
            "process_cores": round((time.process_time() - start_cpu) / wall, 3),
            "copying_thread_cores": round((time.thread_time() - start_thread) / wall, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=190, help="guided answers in a step (200/s x ~0.95 s)")
    ap.add_argument("--vocab", type=int, default=151936, help="the model's vocabulary (Qwen: 151,936)")
    ap.add_argument("--step-ms", type=float, default=5.0, help="one engine step (the 0.6B's, stop 34)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json-out", help="write the figures here too")
    ap.add_argument("--play", type=int, help=argparse.SUPPRESS)  # one run, in a fresh process
    args = ap.parse_args()
    if args.play:
        print(json.dumps(play(args.play, args.answers, args.vocab, args.step_ms / 1000, args.seconds)))
        return 0
    cores = len(os.sched_getaffinity(0))
    runs = []
    for threads in sorted({1, cores}):  # each in its own process: a pool, once started, stays
        cmd = [sys.executable, __file__, "--play", str(threads), "--answers", str(args.answers), "--vocab",
               str(args.vocab), "--step-ms", str(args.step_ms), "--seconds", str(args.seconds)]
        runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        print(json.dumps(runs[-1]), flush=True)
    one, pool = runs[0], runs[-1]
    figures = {"cores": cores, "mask_bytes_per_step": args.answers * ((args.vocab + 31) // 32) * 4,
               "step_ms": args.step_ms, "runs": runs,
               "process_cores_pool_vs_one_thread": round(pool["process_cores"] / max(one["process_cores"], 1e-3), 1)}
    print(f"process CPU with torch's pool at {cores} threads / at 1: {figures['process_cores_pool_vs_one_thread']}x "
          f"({pool['process_cores']} against {one['process_cores']} cores; the copying thread itself "
          f"{pool['copying_thread_cores']} against {one['copying_thread_cores']})")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(figures, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
