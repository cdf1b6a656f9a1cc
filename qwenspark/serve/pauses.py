"""What stalls the service's one Python process: event-loop lag and garbage-collector pauses, as Prometheus figures.

Every request in flight waits on the one event loop, so a stall of it (a long collection of the millions of objects
torch and vLLM leave, a slow handler) lands on every latency at once: these figures tell such a tail from the
engine's own queueing. The heap loaded at start is frozen out of the collector's reach (freeze_heap); how much of it
shows as qwenspark_serve_gc_frozen_objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

log = logging.getLogger("qwenspark.serve")

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TICK_S = 0.01  # how often the loop is looked at: 100 wake-ups a second, a few microseconds each


def freeze_heap() -> None:
    """Freeze what is loaded by now out of the collector's reach: torch, vLLM and the tokenizer (millions of objects)
    live as long as the process, as vLLM's own server and workers treat them. Unfrozen, each full collection walked
    them for 0.4-0.5 s with every request in flight waiting (H200, 7B shape, 100 requests/s: 2 in 16 s,
    qwenspark_serve_gc_pause_seconds; bench/results/serve_latency_h200_stop31.json)."""
    gc.collect()
    gc.freeze()
    log.info("serve: %d objects frozen out of the garbage collector's reach", gc.get_freeze_count())


class Pauses:
    """Loop lag (a sleep's overshoot, every TICK_S) and collector pauses by generation, while started."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.loop_lag = Histogram("qwenspark_serve_loop_lag_seconds", "How late the event loop woke a sleep of "
                                  f"{TICK_S} s (every request in flight waits as long)", buckets=_BUCKETS,
                                  registry=registry)
        self.gc_pause = Histogram("qwenspark_serve_gc_pause_seconds", "Python garbage-collector pauses of the "
                                  "service's process, by generation", ["generation"], buckets=_BUCKETS,
                                  registry=registry)
        frozen = Gauge("qwenspark_serve_gc_frozen_objects", "Objects frozen out of the collector's reach (the heap "
                       "loaded with the engine, frozen once at start)", registry=registry)
        frozen.set_function(gc.get_freeze_count)
        self._gc_started = 0.0
        self._task: asyncio.Task[None] | None = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pause.labels(str(info["generation"])).observe(time.perf_counter() - self._gc_started)

    async def _watch(self) -> None:
        while True:
            asleep = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.loop_lag.observe(max(0.0, time.perf_counter() - asleep - TICK_S))

    def start(self) -> None:
        """Begin measuring (on the running loop)."""
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        """Stop measuring; the figures stay."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
