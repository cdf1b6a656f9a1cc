"""engine.cut_dead_ends in the batch and stream's vLLM engine (the tiny random Qwen3, v13): an answer written without
the grammar ends at its first token past which no answer can fit it, vLLM drops the request there, and the executor's
batch writes it again with the grammar; through both feeds (the engine core in this process, as on CPUs, and in its
own, as on GPUs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qwenspark.analyze import AnalyzeSpec, PreparedBatch, templated
from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine
from qwenspark.engines.dead_ends import DEAD_END
from qwenspark.parse import lines_viable
from qwenspark.prompts import get_template
from qwenspark.schemas import CLEAN_SCHEMA
from tests.conftest import SAMPLE_REVIEWS

pytestmark = pytest.mark.engine

MAX_TOKENS = 256  # a guided answer of the random model: its summary to the bound, every aspect


def _unfinished(feed: Any) -> int:
    """Requests vLLM itself still holds, from its own bookkeeping."""
    if type(feed).__name__ == "InProcess":
        return int(feed._engine.get_num_unfinished_requests())
    return int(feed._llm.output_processor.get_num_unfinished_requests())


@pytest.mark.parametrize("own_core", [False, True], ids=["core in this process", "core in its own process"])
def test_unguided_answers_end_at_their_first_dead_end_and_every_row_still_fits(
        own_core: bool, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    multiprocessing = "1" if own_core else "0"
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", multiprocessing)  # put back after the test
    spec = AnalyzeSpec(engine=EngineConfig(
        kind="vllm", model=str(tiny_model), dtype="auto", max_tokens=MAX_TOKENS, max_model_len=2048,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing, "VLLM_CPU_KVCACHE_SPACE": "1"}),
        prompt_version="v13", max_review_tokens=500)
    cfg = templated(spec.engine, "v13")
    assert cfg.optimistic and cfg.answer_format == "lines" and cfg.cut_dead_ends
    rules = (cfg.summary_max_chars, cfg.summary_script)
    reviews = SAMPLE_REVIEWS[:4]
    engine = build_engine(cfg)
    feed: Any = engine._feed  # type: ignore[attr-defined]
    template = get_template("v13")
    chunk = pd.DataFrame(
        {"review_id": range(len(reviews)), "hotel_id": "h", "created_at": None, "lang": [g for _, g in reviews],
         "text": [t for t, _ in reviews], "input_key": "k", "clean_error": None},
        columns=CLEAN_SCHEMA.fieldNames())
    try:
        assert type(feed).__name__ == ("EventLoop" if own_core else "InProcess")
        first = engine.generate([template.messages(t, g) for t, g in reviews], [g for _, g in reviews])
        unfinished = _unfinished(feed)
        batch = PreparedBatch(engine, chunk, spec)
        out = batch.run_sync(engine)
        guided = engine.generate([template.messages(t, g) for t, g in reviews], [g for _, g in reviews],
                                 retry="grammar")
    finally:
        engine.close()
    cut = [(d, g) for d, (_, g) in zip(first, reviews, strict=True) if d.finish_reason == DEAD_END]
    # The random model's unguided text is no answer from its first tokens: ended there, not at max_tokens.
    assert len(cut) >= 3, [(d.finish_reason, d.text) for d in first]
    for done, lang in cut:
        assert not lines_viable(done.text, lang, *rules), done.text
        assert 0 < done.tokens_out < MAX_TOKENS, done
    assert unfinished == 0, "vLLM still holds requests that ended at a dead end"
    # Written with the grammar from the first token, no answer is cut.
    assert all(d.finish_reason in ("stop", "length") for d in guided), [d.finish_reason for d in guided]
    # The executor's batch: every cut answer written again with the grammar, one valid row per review.
    assert len(out) == len(reviews) and out["error"].isna().all(), out["error"].tolist()
    assert out["sentiment"].notna().all()
    # written again with the grammar, a blank loop with the repair's penalty too (as max_tokens would have had it)
    assert len(batch.repaired) >= 3 and set(batch.repaired.values()) <= {"grammar", "penalty"}, batch.repaired
    assert engine.dead_ends >= 2 * len(cut) - 1  # type: ignore[attr-defined]
