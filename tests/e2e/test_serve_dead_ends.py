"""The service's engine with the real default model (the 0.5B through vLLM's AsyncLLM) and v13: an answer written
without the grammar ends at its first dead end (parse.lines_viable), vLLM drops it there, and the grammar's attempt
then writes an answer that fits. The 0.5B's unguided v13 answers to the demo's reviews mostly go astray (a Chinese
review's summary begun in English, an English one past its 100 characters)."""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd
import pytest

from qwenspark.config import load_config
from qwenspark.engines.vllm import answer_text
from qwenspark.parse import grammar_misfit, lines_viable, parse_completion
from qwenspark.pipeline import prepare_model
from qwenspark.prompts import get_template
from qwenspark.serve.app import serve_engine_config
from qwenspark.serve.engine import DEAD_END, AsyncVllm
from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.engine]


def test_the_default_models_unguided_answers_end_at_their_first_dead_end() -> None:
    cfg = prepare_model(load_config(ROOT / "conf" / "local.yaml", ["prompt.version=v13"]))
    engine_cfg = serve_engine_config(cfg)
    assert engine_cfg.optimistic and engine_cfg.answer_format == "lines" and engine_cfg.cut_dead_ends
    rules = (engine_cfg.summary_max_chars, engine_cfg.summary_script)

    demo = pd.read_csv(ROOT / "data" / "demo" / "hotel_reviews_demo.csv", dtype=str, keep_default_na=False).head(12)
    reviews = list(zip(demo.text, demo.lang, strict=True))

    async def go() -> tuple[list[Any], list[Any], int, Any]:
        engine = await AsyncVllm.start(engine_cfg)

        async def answer(text: str, lang: str, retry: Any) -> Any:
            async for step in engine.steps(engine.prompts.prompt(get_template("v13").messages(text, lang)), lang,
                                           retry):
                last = step
            return last

        try:
            first = await asyncio.gather(*(answer(text, lang, None) for text, lang in reviews))
            second = await asyncio.gather(*(answer(text, lang, "grammar") for text, lang in reviews))
            await asyncio.sleep(0.5)
            tokenizer = engine._tokenizer  # the answer's text as the service reads it (no end-of-turn token)
            return (first, second, engine._llm.output_processor.get_num_unfinished_requests(),
                    lambda ids: answer_text(tokenizer, ids))
        finally:
            await engine.close()

    first, second, unfinished, decode = asyncio.run(go())
    langs = [lang for _, lang in reviews]
    cut = [(step, lang) for step, lang in zip(first, langs, strict=True) if step.finish_reason == DEAD_END]
    assert len(cut) >= 4, [decode(s.ids) for s in first]
    for step, lang in cut:  # each ended at its first token past which no answer fits the grammar
        assert not lines_viable(decode(step.ids), lang, *rules)
        assert lines_viable(decode(step.ids[:-1]), lang, *rules), decode(step.ids)
    for step, lang in zip(first, langs, strict=True):  # the others never had one
        assert step.finish_reason == DEAD_END or lines_viable(decode(step.ids), lang, *rules), decode(step.ids)
    assert unfinished == 0, "vLLM still holds requests that ended at a dead end"
    for step, lang in zip(second, langs, strict=True):  # the grammar's attempts run to their end, and fit
        assert step.finish_reason == "stop", step
        record = parse_completion(decode(step.ids), "stop", answer_format="lines").record
        assert record is not None and grammar_misfit(record, lang, *rules) is None, decode(step.ids)
