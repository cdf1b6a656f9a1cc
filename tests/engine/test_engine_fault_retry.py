"""An answer vLLM itself ends in an error (its scheduler's "grammar rejected tokens", finish reason "error": seen on
an H100 at stops 52-53) is generated again by the executor's batch, its prompt computed afresh: the real vLLM engine
(core in this process, as on CPUs) with the tiny random Qwen3, its grammar made to refuse the first token of two
answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qwenspark.analyze import AnalyzeSpec, PreparedBatch, templated
from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine
from qwenspark.parse import ENGINE_FAULT
from qwenspark.prompts import get_template
from qwenspark.schemas import CLEAN_SCHEMA
from tests.conftest import SAMPLE_REVIEWS

pytestmark = pytest.mark.engine

VERSION = "v14-guided"  # guided from the first token, as the GPU service's loads: every answer has a grammar


def test_an_answer_vllm_ends_in_an_error_is_generated_again(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    spec = AnalyzeSpec(engine=EngineConfig(
        kind="vllm", model=str(tiny_model), dtype="auto", max_tokens=384, max_model_len=2048,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}),
        prompt_version=VERSION, max_review_tokens=500)
    reviews = SAMPLE_REVIEWS[:4]
    engine = build_engine(templated(spec.engine, VERSION))

    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    own = XgrammarGrammar.accept_tokens
    seen: set[str] = set()
    refused: list[str] = []
    budget = [0]  # first tokens still to refuse

    def accept_tokens(self: Any, request_id: str, tokens: list[int]) -> bool:
        first = request_id not in seen
        seen.add(request_id)
        if first and budget[0] > 0:  # as vLLM 0.26 on the H100: its sampler's token, refused by the grammar
            budget[0] -= 1
            refused.append(request_id)
            return False
        return bool(own(self, request_id, tokens))

    monkeypatch.setattr(XgrammarGrammar, "accept_tokens", accept_tokens)
    from vllm.v1.core.sched.scheduler import Scheduler

    own_add = Scheduler.add_request
    salts: dict[str, str | None] = {}  # each request's cache salt as vLLM's scheduler received it

    def add_request(self: Any, request: Any) -> None:
        salts[request.request_id] = request.cache_salt
        own_add(self, request)

    monkeypatch.setattr(Scheduler, "add_request", add_request)
    template = get_template(VERSION)
    chunk = pd.DataFrame(
        {"review_id": range(len(reviews)), "hotel_id": "h", "created_at": None, "lang": [g for _, g in reviews],
         "text": [t for t, _ in reviews], "input_key": "k", "clean_error": None},
        columns=CLEAN_SCHEMA.fieldNames())
    try:
        budget[0] = 2
        first = engine.generate([template.messages(t, g) for t, g in reviews], [g for _, g in reviews])
        first_salts = set(salts.values())
        budget[0] = 2
        salts.clear()
        batch = PreparedBatch(engine, chunk, spec)
        out = batch.run_sync(engine)
    finally:
        engine.close()
    # vLLM's own word for it, as the service and the executors read it
    assert [d.finish_reason for d in first].count(ENGINE_FAULT) == 2, [(d.finish_reason, d.text) for d in first]
    assert len(refused) == 4
    # The executor's batch: the two answers vLLM ended generated again, one valid row per review.
    # (the random model's other answers may loop: those are repaired with the penalty, as always)
    kinds = sorted(batch.repaired.values())
    assert kinds.count("fault") == 2 and set(kinds) <= {"fault", "penalty"}, batch.repaired
    assert len(out) == len(reviews) and out["error"].isna().all(), out["error"].tolist()
    assert out["sentiment"].notna().all() and out["review_id"].tolist() == list(range(len(reviews)))
    # Each second attempt's prompt is computed afresh (its own cache salt), not from the cached blocks of the attempt
    # the engine ended; first attempts share the prefix cache.
    assert first_salts == {None}
    assert sum(salt is not None for salt in salts.values()) == 2, salts
    assert len(salts) >= len(reviews) + 2
