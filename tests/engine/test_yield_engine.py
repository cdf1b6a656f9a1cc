"""engine.yield_to_service through real vLLM (the tiny random Qwen3, engine core in the process): while a service in
another process has answers in flight the batch's engine takes no step for its share of each period, and its answers
come all the same; with the service idle it never stands still."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine
from qwenspark.engines import yielding as y
from qwenspark.prompts import get_template
from tests.conftest import SAMPLE_REVIEWS
from tests.unit.test_yielding import _say, _service

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("own_core", [False, True], ids=["core in this process", "core in its own process"])
def test_the_batch_stands_still_while_a_service_answers_and_still_answers_every_review(
        own_core: bool, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In its own process (as on GPUs) the core is paused and resumed through vLLM's pause_generation, which vLLM
    # reports back (is_paused); in this one (as on CPUs) the feed takes no step, which the test counts itself.
    multiprocessing = "1" if own_core else "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)  # put back after the test
    monkeypatch.setenv(y.BOARD_ENV, str(tmp_path))
    service = _service(tmp_path)
    engine = build_engine(EngineConfig(
        kind="vllm", model=str(tiny_model), dtype="auto", max_tokens=32, max_model_len=2048, yield_to_service=0.8,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing, "VLLM_CPU_KVCACHE_SPACE": "1"}))
    feed: Any = engine._feed  # type: ignore[attr-defined]
    try:
        assert type(feed).__name__ == ("EventLoop" if own_core else "InProcess")
        seen: list[tuple[float, bool]] = []  # (when, vLLM paused) or (when a step began, False)
        if not own_core:
            step = feed._engine.step

            def counted() -> Any:
                seen.append((time.monotonic(), False))
                return step()

            feed._engine.step = counted
        template = get_template("v1")
        conversations = [template.messages(text, lang) for text, lang in SAMPLE_REVIEWS[:4]]

        def answer() -> tuple[float, list[tuple[float, bool]]]:
            """The batch answered, every review; (when it began, what was seen meanwhile)."""
            seen.clear()
            began = time.monotonic()
            asking = threading.Event()

            def ask() -> None:  # vLLM's own account of its scheduler, every 10 ms
                while not asking.wait(0.01):
                    seen.append((time.monotonic(), feed._call(feed._llm.is_paused())))

            watcher = threading.Thread(target=ask, daemon=True)
            if own_core:
                watcher.start()
            done = engine.generate(conversations)
            asking.set()
            if own_core:
                watcher.join()
            assert len(done) == len(conversations)
            assert all(d.tokens_out > 0 and d.text for d in done)
            return began, list(seen)

        answer()  # the grammar compiled, the prompts' prefix cached
        _say(service, +1)  # an answer in flight
        began, busy = answer()
        _say(service, -1)
        time.sleep(0.1)  # an engine core of its own: the duty cycle's loop sees the service idle
        held = engine._yielding.held_s  # type: ignore[attr-defined]
        idle_began, idle = answer()
        assert engine._yielding.held_s == held, "an idle service holds nothing"  # type: ignore[attr-defined]
        assert held > 0.3, held
        if own_core:
            paused = [p for _, p in busy]
            assert any(paused) and not all(paused), "paused and resumed while the service was busy"
            assert idle and not any(p for _, p in idle), "never paused while it was idle"
        else:
            starts = [t for t, _ in busy]
            gaps = [b - a for a, b in itertools.pairwise(starts)]
            assert starts[0] - began >= 0.15, "the batch stood still at once"
            assert sum(g >= 0.15 for g in gaps) >= 3, gaps
            assert idle[0][0] - idle_began < 0.15, "and ran at once when the service was idle"
    finally:
        engine.close()
        service.kill()
        service.wait()
