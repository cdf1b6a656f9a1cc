"""The service's stall figures: a blocked event loop and a full collection each show in /metrics' histograms."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry

from qwenspark.serve.pauses import Pauses


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_blocked_loop_and_a_full_collection_are_measured_and_stop_stops_both() -> None:
    registry = CollectorRegistry()
    pauses = Pauses(registry)

    async def go() -> None:
        pauses.start()
        await asyncio.sleep(0.1)  # ticks of a free loop
        time.sleep(0.3)  # a handler that holds the loop
        await asyncio.sleep(0.05)
        gc.collect()
        await pauses.stop()

    asyncio.run(go())
    ticks = _value(registry, "qwenspark_serve_loop_lag_seconds_count")
    assert ticks >= 3
    # exactly the one blocked tick is later than 0.25 s; the free ones are not
    assert ticks - _value(registry, "qwenspark_serve_loop_lag_seconds_bucket", le="0.25") == 1
    assert _value(registry, "qwenspark_serve_gc_pause_seconds_count", generation="2") >= 1
    collections = _value(registry, "qwenspark_serve_gc_pause_seconds_count", generation="2")
    gc.collect()  # after stop: neither figure moves
    assert _value(registry, "qwenspark_serve_gc_pause_seconds_count", generation="2") == collections
    assert _value(registry, "qwenspark_serve_loop_lag_seconds_count") == ticks
