"""Latency of `qwenspark serve` under load: time to the label and to the whole answer, P50/P90/P99.

    .venv/bin/python bench/serve_latency.py [--clients 1,4] [--rate 2] [--requests 40] [--duration 120]
        [--config conf/local.yaml] [--set KEY=VALUE ...] [--json-out bench/results/serve_latency_cpu.json]
        [--shape qwen3-0.6b --tokenizer DIR --lengths-from EVAL.json] [--alongside "CMD"]

Starts the service as its own process (`qwenspark serve`, the configured engine; the embedded 0.5B on this CPU),
waits for /healthz, then sends real dev reviews (../shared/data/hotel_reviews, half zh, half en, seeded) as
`POST /v1/analyze?stream=true`, one review per request, and reads each response line by line: the first line is the
label, the last the answer. Two kinds of load, each bounded by --requests and --duration:
  --clients N  closed loop: N clients, each sending its next request when the last one ended;
  --rate R     open loop: request i is due at i / R seconds, sent then whatever is in flight, and its latency is
               measured from that intended time (so a server that falls behind shows it, instead of slowing the
               load down with it).
--client-procs K spreads an open loop over K client processes (request i goes to process i mod K, due at the same
i / R): one Python client streaming a few hundred requests/s is itself a bound, which would show as the server's
latency. Each process first opens its share of --warm-connections (default: half a second of the rate), as a caller's
pool would hold them. Each load also reports the CPU cores each side used over it (cpu_cores: the service's own process,
its child processes in all, vLLM's engine core among them, the busiest child, and the clients): a process near 1.0 of
its one Python thread is the bound (with serve.workers sharing one engine the service's own process is the engine's
host and the workers are children); and what stalled the service's event loop (stalls: late ticks, collector
pauses from its /metrics).
Prints one line per load and writes the JSON (latencies in ms, requests by status).

On the GPU machine (bench/device/README.md): --shape serves dummy weights of a published shape through
bench/device/serve_planned.py, each answer as long as a draw from a real CPU eval's output lengths (--lengths-from).
--alongside CMD starts CMD (a batch: bench/workload_100k.py on the same GPU) once the service is warm, begins the
loads when CMD prints a line starting with "exec phase", and waits for CMD at the end: the service's latency while a
batch shares the GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import queue
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"


def reviews(n: int, seed: int = 7, data: Path = DEV) -> list[dict[str, Any]]:
    """n dev reviews, half zh, half en, as request bodies."""
    rows = pd.read_csv(data, dtype=str, keep_default_na=False)
    rows = rows[rows["text"].str.strip() != ""]
    half = [rows[rows["lang"] == lang].sample(n, replace=True, random_state=seed) for lang in ("zh", "en")]
    mixed = pd.concat(half).sample(frac=1.0, random_state=seed).head(n)
    return [{"text": t, "lang": lang} for t, lang in zip(mixed["text"], mixed["lang"], strict=True)]


async def one(client: httpx.AsyncClient, body: dict[str, Any], due: float) -> dict[str, Any]:
    """One streamed request; latencies from `due` (the intended send time, on the monotonic clock all client
    processes share)."""
    label = full = None
    status, tokens_out, error = 0, None, None
    try:
        async with client.stream("POST", "/v1/analyze?stream=true", json=body) as response:
            status = response.status_code
            async for line in response.aiter_lines():
                if not line:
                    continue
                now = time.monotonic()
                event = json.loads(line)
                if "sentiment" in event and label is None:
                    label = now - due
                if "result" in event:
                    full = now - due
                    tokens_out = event["result"].get("tokens_out")
                    error = event["result"].get("error")
                    label = full if label is None else label
                if "error" in event:
                    status = 599
    except httpx.HTTPError:
        status = 598
    return {"status": status, "due": due, "label_s": label, "full_s": full, "tokens_out": tokens_out, "error": error}


async def closed_loop(client: httpx.AsyncClient, bodies: list[dict[str, Any]], clients: int,
                      duration: float) -> list[dict[str, Any]]:
    pending = list(reversed(bodies))
    end = time.monotonic() + duration
    results: list[dict[str, Any]] = []

    async def worker() -> None:
        while pending and time.monotonic() < end:
            body = pending.pop()
            results.append(await one(client, body, time.monotonic()))

    await asyncio.gather(*(worker() for _ in range(clients)))
    return results


async def open_loop(client: httpx.AsyncClient, bodies: list[dict[str, Any]], rate: float,
                    duration: float, until: Callable[[], bool] = lambda: False, *, start: float | None = None,
                    shard: tuple[int, int] = (0, 1)) -> list[dict[str, Any]]:
    """Request i sent at start + i / rate s, until duration, the bodies or until() ends it; shard (k, K): only the
    requests i with i mod K == k (the others are another client process's)."""
    start = time.monotonic() if start is None else start
    tasks = []
    k, procs = shard
    for i, body in enumerate(bodies):
        due = start + i / rate
        if due - start > duration or until():
            break
        if i % procs != k:
            continue
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.create_task(one(client, body, due)))
    return list(await asyncio.gather(*tasks))


def _limits() -> httpx.Limits:
    return httpx.Limits(max_connections=1000, max_keepalive_connections=1000)


def _shard(port: int, bodies: list[dict[str, Any]], *, rate: float, duration: float, start: float, k: int,
           procs: int, warm: int, stop: Any, out: Any) -> None:
    """One client process of an open loop (--client-procs): its share of the requests, then its results and CPU."""

    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=_limits()) as client:
            # a caller's steady pool of open connections, so that the load's first second is not the server
            # accepting a burst of new ones
            await asyncio.gather(*(client.get("/healthz") for _ in range(warm)))
            return await open_loop(client, bodies, rate, duration, stop.is_set, start=start, shard=(k, procs))

    cpu = time.process_time()
    results = asyncio.run(run())
    out.put((results, time.process_time() - cpu))


async def sharded_open_loop(port: int, bodies: list[dict[str, Any]], rate: float, duration: float, *, procs: int,
                            warm: int, until: Callable[[], bool]) -> tuple[list[dict[str, Any]], float]:
    """An open loop over procs client processes, each with warm connections opened first; their results and the CPU
    seconds they used."""
    context = multiprocessing.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    start = time.monotonic() + 3.0  # the processes start (spawn, imports) before the first request is due
    shards = [context.Process(target=_shard, args=(port, bodies),
                              kwargs={"rate": rate, "duration": duration, "start": start, "k": k, "procs": procs,
                                      "warm": warm, "stop": stop, "out": out}) for k in range(procs)]
    for proc in shards:
        proc.start()
    gathered: list[tuple[list[dict[str, Any]], float]] = []
    while len(gathered) < procs:
        if until():
            stop.set()
        try:
            gathered.append(await asyncio.to_thread(out.get, True, 0.5))
        except queue.Empty:  # look at until() again
            if not any(proc.is_alive() for proc in shards) and out.empty():
                raise RuntimeError("a client process died before reporting") from None
    for proc in shards:
        proc.join()
    return [r for results, _ in gathered for r in results], sum(cpu for _, cpu in gathered)


class CpuMeter:
    """CPU seconds used by the service's process, by its child processes (vLLM's engine core) and by this client."""

    def __init__(self, server_pid: int) -> None:
        import psutil

        self._server = psutil.Process(server_pid)

    def read(self) -> dict[str, float]:
        import psutil

        def used(proc: Any) -> float:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                return 0.0
            return float(times.user + times.system)

        children = {c: used(c) for c in self._server.children(recursive=True)}
        read = {"service": used(self._server), "children": sum(children.values()), "client": time.process_time(),
                "engine_core": sum(t for c, t in children.items() if "EngineCore" in _name(c))}
        read.update({f"child:{c.pid}": t for c, t in children.items()})
        return read


def _name(proc: Any) -> str:
    try:
        return str(proc.name())
    except Exception:  # gone meanwhile
        return ""


def cpu_cores(before: dict[str, float], after: dict[str, float], seconds: float, shards_cpu: float
              ) -> dict[str, float]:
    """Cores each side used over a load (a child process that ended within it is not counted); busiest_child: the
    most any one child process used (the engine core, or one of serve.workers' processes)."""
    cores = {k: round(max(0.0, after.get(k, before[k]) - before[k]) / seconds, 2) for k in before}
    cores["client"] = round(cores["client"] + shards_cpu / seconds, 2)
    each = [cores.pop(k) for k in list(cores) if k.startswith("child:")]
    cores["busiest_child"] = max(each, default=0.0)
    return cores


def summary(name: str, results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    ok = [r for r in results if r["status"] == 200 and r["full_s"] is not None]
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1

    def pct(values: list[float], q: float) -> float | None:
        if not values:
            return None
        values = sorted(values)
        return round(1000 * values[min(len(values) - 1, round(q * (len(values) - 1)))], 1)

    figures: dict[str, Any] = {"load": name, "requests": len(results), "ok": len(ok), "statuses": statuses,
                               "seconds": round(seconds, 1), "answers_per_s": round(len(ok) / seconds, 2)}
    # Answers whose row carries an error (unparseable, cut): a grammar's masks gone wrong show here, not in statuses.
    errors: dict[str, int] = {}
    for r in ok:
        if r.get("error"):
            key = str(r["error"])[:60]
            errors[key] = errors.get(key, 0) + 1
    figures["answer_errors"] = errors
    tokens = [r["tokens_out"] for r in ok if r["tokens_out"] is not None]
    figures["mean_tokens_out"] = round(statistics.fmean(tokens), 1) if tokens else None
    for key in ("label_s", "full_s"):
        values = [r[key] for r in ok]
        figures[key.replace("_s", "_ms")] = {f"p{int(q * 100)}": pct(values, q) for q in (0.5, 0.9, 0.99)} | {
            "mean": round(1000 * statistics.fmean(values), 1) if values else None}
    # The P99s without the requests due in the load's first second: a stall at a load's start (the engine's first
    # grammar, stop 33; several engines' first requests on a GPU, stop 38) sets a whole 15 s load's P99 by itself.
    first = min((r["due"] for r in results), default=0.0)
    steady = [r for r in ok if r["due"] - first >= 1.0]
    figures["from_1s_ms"] = {"label_p99": pct([r["label_s"] for r in steady], 0.99),
                             "full_p99": pct([r["full_s"] for r in steady], 0.99)}
    return figures


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "conf" / "local.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--clients", default="1,4", help="closed-loop client counts, comma separated ('' for none)")
    p.add_argument("--rate", type=float, action="append", default=[], help="open-loop requests/s (repeatable)")
    p.add_argument("--requests", type=int, default=40, help="requests per load at most")
    p.add_argument("--duration", type=float, default=120.0, help="seconds per load at most")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--data", type=Path, default=DEV, help="the labelled reviews the requests carry")
    p.add_argument("--shape", help="GPU machine: dummy weights of this published shape (bench/executor_throughput.py)")
    p.add_argument("--tokenizer", type=Path, help="tokenizer folder (with --shape)")
    p.add_argument("--lengths-from", type=Path, help="a real CPU eval whose output lengths the answers get")
    p.add_argument("--detail", action="store_true",
                   help="also write each request's [sent at s, label ms, answer ms, status] (when tails happen)")
    p.add_argument("--client-procs", type=int, default=1,
                   help="client processes an open loop is spread over (see above)")
    p.add_argument("--warm-connections", type=int,
                   help="connections the client processes open before an open loop (default: half a second of its "
                        "rate), as a caller's pool holds them")
    p.add_argument("--alongside", help="a batch command run on the same machine during the loads (see above)")
    p.add_argument("--unguided-valid", type=float,
                   help="with --lengths-from and an optimistic version: the share of first attempts (no grammar) that "
                        "fit, as a trained model's would (bench/device/serve_planned.py)")
    p.add_argument("--instant", action="store_true",
                   help="with --lengths-from: the engine answers each request at once with a valid canned answer "
                        "(the service's own capacity, every part of it but the model; bench/device/serve_planned.py)")
    args = p.parse_args()
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if args.unguided_valid is not None:
        env["QWENSPARK_BENCH_UNGUIDED_VALID"] = str(args.unguided_valid)
    if args.instant:
        env["QWENSPARK_BENCH_INSTANT"] = "1"
    serve = [sys.executable, "-m", "qwenspark.cli"]
    if args.shape:
        sys.path.insert(0, str(ROOT))
        from bench.executor_throughput import shaped_model

        model = shaped_model(args.shape, args.tokenizer, Path("/tmp") / f"qwenspark-{args.shape}")
        args.overrides += [f"engine.model={model}", "engine.default_model=false",
                           "engine.engine_kwargs.load_format=dummy"]
    if args.lengths_from:
        serve = [sys.executable, str(ROOT / "bench" / "device" / "serve_planned.py"), str(args.lengths_from)]
    cmd = [*serve, "serve", "--config", args.config, "--port", str(port), *(f"--set={s}" for s in args.overrides)]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env)
    figures: dict[str, Any] = {"config": args.config, "overrides": args.overrides, "shape": args.shape,
                               "alongside": args.alongside, "unguided_valid": args.unguided_valid, "loads": []}
    try:
        asyncio.run(run_loads(args, port, figures, server))
    finally:
        server.terminate()
        server.wait(timeout=60)
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


async def run_loads(args: argparse.Namespace, port: int, figures: dict[str, Any],
                    server: subprocess.Popen[bytes]) -> None:
    meter = CpuMeter(server.pid)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=_limits()) as client:
        deadline = time.perf_counter() + 600
        while True:  # the model loads first
            try:
                health = (await client.get("/healthz")).json()
                break
            except httpx.HTTPError:
                if time.perf_counter() > deadline or server.poll() is not None:
                    raise
                await asyncio.sleep(1)
        figures["model"], figures["prompt_version"] = health["model"], health["prompt_version"]
        for body in reviews(8, seed=1, data=args.data):  # warm: prefix cache, grammar compile, both languages
            await one(client, body, time.monotonic())
        batch = await asyncio.to_thread(start_alongside, args.alongside) if args.alongside else None
        loads: list[tuple[str, Any]] = [(f"clients={c}", int(c)) for c in filter(None, args.clients.split(","))]
        loads += [(f"rate={r}/s", r) for r in args.rate]
        for name, value in loads:
            bodies = reviews(args.requests, data=args.data)
            print(f"[load] {name} starts", flush=True)  # a profiler started from outside waits for this line
            cpu, shards_cpu, row_extra = meter.read(), 0.0, {}
            metrics_before = (await client.get("/metrics")).text
            t0 = time.monotonic()
            # beside a batch, an open loop stops with it: the figures are those of a shared GPU only
            batch_ended = lambda: batch is not None and batch.poll() is not None  # noqa: E731
            if name.startswith("clients"):
                results = await closed_loop(client, bodies, value, args.duration)
            elif args.client_procs > 1:
                warm = warm_connections(args, value)
                results, shards_cpu = await sharded_open_loop(port, bodies, value, args.duration,
                                                              procs=args.client_procs, until=batch_ended, warm=warm)
                t0 += 3.0  # the shards' first request was due 3 s after t0
                row_extra = {"warm_connections": warm * args.client_procs}
            else:
                results = await open_loop(client, bodies, value, args.duration, until=batch_ended)
            seconds = time.monotonic() - t0
            row = summary(name, results, seconds)
            row["cpu_cores"] = cpu_cores(cpu, meter.read(), seconds, shards_cpu)
            if args.detail:
                first = min((r["due"] for r in results), default=0.0)
                row["detail"] = [[round(r["due"] - first, 3), _ms(r["label_s"]), _ms(r["full_s"]), r["status"]]
                                 for r in sorted(results, key=lambda r: r["due"])]
            row["client_procs"] = args.client_procs if name.startswith("rate") else 1
            row.update(row_extra)
            metrics_after = (await client.get("/metrics")).text
            row["stalls"] = stalls(metrics_before, metrics_after)
            row["retries_so_far"] = retries(metrics_after)
            figures["loads"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "detail"}), flush=True)
        if batch is not None:
            figures["alongside_rc"] = await asyncio.to_thread(batch.wait)


def warm_connections(args: argparse.Namespace, rate: float) -> int:
    """Connections each client process opens before its load: --warm-connections, or half a second of the rate."""
    total = args.warm_connections if args.warm_connections is not None else math.ceil(rate / 2)
    return math.ceil(total / args.client_procs)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(metrics: str) -> Samples:
    """The service's /metrics text as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics) for s in family.samples}


def stalls(before: str, after: str) -> dict[str, Any]:
    """What stalled the service's process over a load (qwenspark.serve.pauses): event-loop ticks later than 50 / 100 /
    250 ms, and collector pauses by generation (count, seconds)."""
    b, a = samples(before), samples(after)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return a.get(key, 0.0) - b.get(key, 0.0)

    ticks = grew("qwenspark_serve_loop_lag_seconds_count")
    out: dict[str, Any] = {"loop_ticks": int(ticks)}
    for le in ("0.05", "0.1", "0.25"):
        out[f"loop_late_over_{int(float(le) * 1000)}ms"] = int(ticks - grew("qwenspark_serve_loop_lag_seconds_bucket",
                                                                            le=le))
    out["gc"] = {g: [int(grew("qwenspark_serve_gc_pause_seconds_count", generation=g)),
                     round(grew("qwenspark_serve_gc_pause_seconds_sum", generation=g), 3)] for g in ("0", "1", "2")}
    return out


def retries(metrics: str) -> dict[str, float]:
    """The service's second attempts so far, by kind (qwenspark_serve_retries_total)."""
    return {dict(labels)["kind"]: value for (name, labels), value in samples(metrics).items()
            if name == "qwenspark_serve_retries_total"}


def start_alongside(command: str) -> subprocess.Popen[str]:
    """Start the batch command; return once it prints its "exec phase" line (its engine loaded and warm)."""
    batch = subprocess.Popen(shlex.split(command), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert batch.stdout is not None
    for line in batch.stdout:
        print(f"[alongside] {line}", end="", flush=True)
        if line.startswith("exec phase"):
            break
    else:
        raise RuntimeError(f"--alongside ended (rc {batch.wait()}) before its exec phase")

    def drain(stream: Any) -> None:  # the rest of its output, so that it never blocks on a full pipe
        for rest in stream:
            print(f"[alongside] {rest}", end="", flush=True)

    threading.Thread(target=drain, args=(batch.stdout,), daemon=True).start()
    return batch


if __name__ == "__main__":
    sys.exit(main())
