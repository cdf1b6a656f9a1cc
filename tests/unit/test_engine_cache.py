"""The per-worker engine cache: one engine at most, keyed by config and GPUs, never on the wrong device."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from qwenspark.config import EngineConfig, load_config
from qwenspark.engines import cache
from qwenspark.errors import EngineError

ROOT = Path(__file__).resolve().parents[2]


class Fake:
    def __init__(self, cfg: EngineConfig, log: list[str]) -> None:
        self.model_name, self.log = cfg.model, log
        log.append(f"load {cfg.model}")

    def close(self) -> None:
        self.log.append(f"close {self.model_name}")


@pytest.fixture
def events() -> Iterator[list[str]]:
    cache.clear()
    log: list[str] = []
    yield log
    cache.clear()


def engine(model: str = "m") -> EngineConfig:
    return load_config(ROOT / "conf" / "local.yaml").engine.model_copy(update={"model": model})


def test_same_config_and_gpus_reuse_the_engine(events: list[str]) -> None:
    first, loaded = cache.get_engine(engine(), lambda c: Fake(c, events), ["0"])  # type: ignore[arg-type,return-value]
    again, loaded_again = cache.get_engine(engine(), lambda c: Fake(c, events), ["0"])  # type: ignore[arg-type,return-value]
    assert loaded and not loaded_again and first is again
    assert events == ["load m"] and cache.cached_engines() == 1


def test_other_gpus_or_config_evict_the_old_engine_first(events: list[str]) -> None:
    factory = lambda c: Fake(c, events)  # noqa: E731
    cache.get_engine(engine("a"), factory, ["0"])  # type: ignore[arg-type]
    cache.get_engine(engine("a"), factory, ["1"])  # type: ignore[arg-type]  # a reused worker handed GPU 1
    cache.get_engine(engine("b"), factory, ["1"])  # type: ignore[arg-type]
    # At most one engine per worker: each load comes after the previous engine closed (its memory freed).
    assert events == ["load a", "close a", "load a", "close a", "load b"]
    assert cache.cached_engines() == 1


def test_a_cuda_context_bound_to_other_gpus_fails_loudly(events: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(cache, "_state", cache._State())
    factory = lambda c: Fake(c, events)  # noqa: E731
    cache.get_engine(engine(), factory, ["0"])  # type: ignore[arg-type]
    with pytest.raises(EngineError, match=r"initialised CUDA on GPU\(s\) 0; the task holds 1"):
        cache.get_engine(engine(), factory, ["1"])  # type: ignore[arg-type]
    assert events == ["load m"]  # nothing ran on GPU 1 from a context bound to GPU 0
