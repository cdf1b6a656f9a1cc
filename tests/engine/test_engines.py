"""Both engines on the tiny random Qwen3 (real Qwen tokenizer): guided output always parses."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine
from qwenspark.parse import parse_completion
from qwenspark.prompts import get_template
from tests.conftest import SAMPLE_REVIEWS

pytestmark = pytest.mark.engine

REVIEWS = [*SAMPLE_REVIEWS, ("", "en")]


@pytest.mark.parametrize("kind", ["vllm", "transformers"])
def test_guided_output_always_parses(kind: str, tiny_model: Path) -> None:
    cfg = EngineConfig(
        kind=kind,  # type: ignore[arg-type]
        model=str(tiny_model),
        dtype="float32" if kind == "transformers" else "bfloat16",
        max_tokens=384,
        max_model_len=2048,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    engine = build_engine(cfg)
    try:
        template = get_template("v1")
        conversations = [template.messages(text or "(empty)", lang) for text, lang in REVIEWS * 3]
        completions = engine.generate(conversations)
        assert len(completions) == len(conversations)
        for done in completions:
            parsed = parse_completion(done.text, done.finish_reason)
            assert parsed.error is None, parsed.error
            assert done.tokens_in > 300 and 0 < done.tokens_out <= cfg.max_tokens
        ids = engine.encode("你好 hotel")
        assert ids == [108386, 9500] and engine.decode(ids) == "你好 hotel"
    finally:
        engine.close()
