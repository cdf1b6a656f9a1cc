"""engine.yield_to_service through real vLLM (the tiny random Qwen3, engine core in the process): while a service in
another process has answers in flight the batch's engine takes no step for its share of each period, and its answers
come all the same; with the service idle it never stands still."""

from __future__ import annotations

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


def test_the_batch_stands_still_while_a_service_answers_and_still_answers_every_review(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(y.BOARD_ENV, str(tmp_path))
    service = _service(tmp_path)
    engine = build_engine(EngineConfig(
        kind="vllm", model=str(tiny_model), dtype="bfloat16", max_tokens=32, max_model_len=2048, yield_to_service=0.8,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}))
    try:
        core = engine._feed._engine  # type: ignore[attr-defined]
        steps: list[float] = []
        step = core.step

        def counted() -> Any:
            steps.append(time.monotonic())
            return step()

        core.step = counted
        template = get_template("v1")
        conversations = [template.messages(text, lang) for text, lang in SAMPLE_REVIEWS[:4]]

        def answer() -> float:
            """The batch answered, every review; its seconds."""
            steps.clear()
            started = time.monotonic()
            done = engine.generate(conversations)
            assert len(done) == len(conversations)
            assert all(d.tokens_out > 0 and d.text for d in done)
            return time.monotonic() - started

        answer()  # the grammar compiled, the prompts' prefix cached
        _say(service, +1)  # an answer in flight
        busy, busy_steps = answer(), len(steps)
        held = engine._yielding.held_s  # type: ignore[attr-defined]
        _say(service, -1)
        idle, idle_steps = answer(), len(steps)
        print(f"busy: {busy:.1f} s, {busy_steps} steps; idle: {idle:.1f} s, {idle_steps} steps; held {held:.1f} s")
        # Standing still 80 % of the time, the same work takes about five times as long; the steps are counted here.
        assert busy > 2 * idle and busy_steps > 0 and idle_steps > 0, (busy, idle)
        assert held >= 0.5 * busy, (held, busy)
        assert engine._yielding.held_s == held, "an idle service holds no step"  # type: ignore[attr-defined]
    finally:
        engine.close()
        service.kill()
        service.wait()
