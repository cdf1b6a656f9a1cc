"""Per-Python-worker engine registry: one loaded engine per engine config, reused across tasks.

It lives in an importable module on purpose: a global in the driver script would be pickled into every
task and the model reloaded per task. It survives between tasks only with spark.python.worker.reuse=true.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qwenspark.config import EngineConfig
    from qwenspark.engines.base import Engine

log = logging.getLogger(__name__)

_engines: dict[str, Engine] = {}
_loads: dict[str, int] = {}
_lock = threading.Lock()


def get_engine(cfg: EngineConfig, factory: Callable[[EngineConfig], Engine] | None = None) -> tuple[Engine, bool]:
    """The cached engine for cfg, loading it on first use; returns (engine, loaded_now)."""
    key = cfg.cache_key()
    with _lock:
        engine = _engines.get(key)
        if engine is not None:
            return engine, False
        if factory is None:
            from qwenspark.engines import build_engine

            factory = build_engine
        started = time.perf_counter()
        engine = factory(cfg)
        _engines[key] = engine
        _loads[key] = _loads.get(key, 0) + 1
        log.info("engine %s loaded in pid %d in %.1f s", cfg.model, os.getpid(), time.perf_counter() - started)
        return engine, True


def load_counts() -> dict[str, int]:
    """How many times each engine key was loaded in this process (1 each when caching works)."""
    return dict(_loads)


def clear() -> None:
    """Close and forget every cached engine (tests; end of a local run)."""
    with _lock:
        for engine in _engines.values():
            engine.close()
        _engines.clear()


def probe_workers(frames: Iterator[Any]) -> Iterator[Any]:
    """mapInPandas body of the streaming keepalive: marks the Python worker busy, reports its pid and engines."""
    import pandas as pd

    for _ in frames:
        pass
    yield pd.DataFrame({"pid": [os.getpid()], "engines": [len(_engines)]})
