"""Each service process's first request against its later ones, with the model taken out.

    .venv/bin/python bench/serve_first_request.py [--workers 3] [--requests 36] [--set KEY=VALUE ...] [--json-out F]

Starts `qwenspark serve` with serve.workers N through bench/device/serve_planned.py's instant engine (it answers at
once with a valid canned answer: what remains is the service's own path), then sends real dev reviews one at a time,
half zh half en, each on a new connection (the kernel spreads connections over the workers) and reads the worker that
answered from /healthz on that connection. Prints each worker's first request, the later ones' median and max, and
the ratio of the slowest first request to that median: work a process does at its first request (the label head's
load, a language's first prompt) holds its event loop, and every request sent to that worker meanwhile waits
(Service.warm does it before the first request: serve_history.md, stop 40).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_latency import DEV, ROOT, free_port, reviews

LENGTHS = ROOT / "bench" / "results" / "eval" / "v13-guided_qwen2.5-coder-0.5b_n600_s11.json"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "conf" / "local.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--requests", type=int, default=36)
    p.add_argument("--data", type=Path, default=DEV)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    port = free_port()
    sets = ["prompt.version=v13", "serve.optimistic=false", f"serve.workers={args.workers}", *args.overrides]
    cmd = [sys.executable, str(ROOT / "bench" / "device" / "serve_planned.py"), str(LENGTHS), "serve",
           "--config", args.config, "--port", str(port), *(f"--set={s}" for s in sets)]
    server = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "QWENSPARK_BENCH_INSTANT": "1"})
    try:
        sent = requests(port, args.requests, args.data, server)
    finally:
        server.terminate()
        server.wait(timeout=60)
    first: dict[int, float] = {}
    later: list[float] = []
    for worker, ms in sent:
        if worker in first:
            later.append(ms)
        else:
            first[worker] = ms
    later.sort()
    median = later[len(later) // 2] if later else float("nan")
    figures: dict[str, Any] = {
        "workers": args.workers, "overrides": sets, "first_request_ms_by_worker": first,
        "later_ms_p50": median, "later_ms_max": later[-1] if later else None,
        "slowest_first_vs_later_p50": round(max(first.values()) / median, 2) if later else None,
        "requests": [{"worker": w, "ms": ms} for w, ms in sent]}
    print(json.dumps({k: v for k, v in figures.items() if k != "requests"}))
    if len(first) < args.workers:
        print(f"only {len(first)} of {args.workers} workers answered: send more requests", file=sys.stderr)
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


def requests(port: int, n: int, data: Path, server: subprocess.Popen[bytes]) -> list[tuple[int, float]]:
    """(worker, milliseconds) of n requests, one after another, each on a connection of its own."""
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:  # the model loads first
        try:
            httpx.get(f"{base}/healthz", timeout=2)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise
            time.sleep(1)
    sent = []
    for i, body in enumerate(reviews(n, data=data)):
        with httpx.Client(base_url=base, timeout=60) as client:
            worker = int(client.get("/healthz").json()["worker"])
            started = time.perf_counter()
            got = client.post("/v1/analyze", json={**body, "review_id": i + 1})
            ms = (time.perf_counter() - started) * 1000
        got.raise_for_status()
        sent.append((worker, round(ms, 1)))
    return sent


if __name__ == "__main__":
    raise SystemExit(main())
