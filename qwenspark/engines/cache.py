"""Per-Python-worker engine cache: at most one loaded engine (keyed by config and GPUs), reused across tasks.

It lives in an importable module on purpose: a global in the driver script would be pickled into every
task and the model reloaded per task. It survives between tasks only with spark.python.worker.reuse=true.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qwenspark.errors import EngineError

if TYPE_CHECKING:
    from qwenspark.config import EngineConfig
    from qwenspark.engines.base import Engine

log = logging.getLogger(__name__)

@dataclass
class _Slot:
    key: str
    devices: tuple[str, ...]
    engine: Engine


# At most one engine per Python worker (an LRU of one): a worker handed another engine config or other GPUs
# closes the old engine first, so that its GPU memory is free before the next one loads.
@dataclass
class _State:
    current: _Slot | None = None
    cuda_devices: tuple[str, ...] | None = None  # what CUDA_VISIBLE_DEVICES held when this process initialised CUDA


_state = _State()
_loads: dict[str, int] = {}
_lock = threading.Lock()


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except AttributeError:  # a partly imported or stub torch
        return False


def get_engine(
    cfg: EngineConfig, factory: Callable[[EngineConfig], Engine] | None = None, devices: Sequence[str] = ()
) -> tuple[Engine, bool]:
    """The cached engine for (cfg, devices), loading it on first use; returns (engine, loaded_now).

    devices: the CUDA_VISIBLE_DEVICES entries the task holds (empty on CPU). They are part of the key: a reused
    worker handed other GPUs reloads on them, or fails loudly when this process's CUDA context is already bound
    to other GPUs (CUDA reads CUDA_VISIBLE_DEVICES once per process): never the wrong device.
    """
    wanted = tuple(devices)
    key = f"{cfg.cache_key()}@{','.join(wanted)}"
    with _lock:
        current = _state.current
        if current is not None and current.key == key:
            return current.engine, False
        cuda = _state.cuda_devices
        if _cuda_initialised() and cuda is not None and wanted and wanted != cuda:
            raise EngineError(
                f"this Python worker (pid {os.getpid()}) initialised CUDA on GPU(s) {','.join(cuda)}; the "
                f"task holds {','.join(wanted)}: it cannot run there (give each executor one engine's GPUs)"
            )
        if current is not None:
            log.info("engine %s on GPU(s) [%s] evicted in pid %d", current.engine.model_name,
                     ",".join(current.devices), os.getpid())
            _state.current = None
            current.engine.close()
        if factory is None:
            from qwenspark.engines import build_engine

            factory = build_engine
        started = time.perf_counter()
        engine = factory(cfg)
        _state.current = _Slot(key, wanted, engine)
        if wanted and _state.cuda_devices is None and _cuda_initialised():
            _state.cuda_devices = wanted
        _loads[key] = _loads.get(key, 0) + 1
        log.info("engine %s loaded in pid %d on GPU(s) [%s] in %.1f s", cfg.model, os.getpid(), ",".join(wanted),
                 time.perf_counter() - started)
        return engine, True


def load_counts() -> dict[str, int]:
    """How many times each engine key was loaded in this process (1 each when caching works)."""
    return dict(_loads)


def cached_engines() -> int:
    """Engines this process holds now (0 or 1)."""
    return int(_state.current is not None)


def clear() -> None:
    """Close and forget the cached engine (tests; end of a local run)."""
    with _lock:
        current, _state.current = _state.current, None
        if current is not None:
            current.engine.close()


PROBE_SCHEMA = "pid long, engines int, threads int"


def probe_workers(frames: Iterator[Any]) -> Iterator[Any]:
    """mapInPandas body of the streaming keepalive: marks the Python worker busy; reports pid, engines, threads."""
    import pandas as pd

    for _ in frames:
        pass
    torch = sys.modules.get("torch")
    # Read from the runtime, not from our settings: what the engine in this worker really runs with.
    threads = int(torch.get_num_threads()) if torch is not None else -1
    yield pd.DataFrame({"pid": [os.getpid()], "engines": [cached_engines()], "threads": [threads]})
