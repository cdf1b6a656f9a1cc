"""Both engines on the tiny random Qwen3 (real Qwen tokenizer): guided output always parses, and a prompt version
with summary_script writes each summary in its review's script."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine
from qwenspark.parse import parse_completion
from qwenspark.prompts import get_template
from qwenspark.schemas import CLEAN_SCHEMA
from qwenspark.scoring import in_language
from tests.conftest import SAMPLE_REVIEWS

pytestmark = pytest.mark.engine

REVIEWS = [*SAMPLE_REVIEWS, ("", "en")]


def _cfg(kind: str, tiny_model: Path, **extra: object) -> EngineConfig:
    return EngineConfig(
        kind=kind,  # type: ignore[arg-type]
        model=str(tiny_model),
        # auto: bf16 where the CPU has it natively, else float32 (emulated bf16 took 2.4x as long on an AVX2 host)
        dtype="float32" if kind == "transformers" else "auto",
        max_tokens=384,
        max_model_len=2048,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"},
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("kind", ["vllm", "transformers"])
def test_guided_output_always_parses(kind: str, tiny_model: Path) -> None:
    cfg = _cfg(kind, tiny_model)
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
        if kind == "vllm":  # in-process core: vllm.LLMEngine with vllm.LLM's batch limits (the default would be 128)
            assert type(engine._feed).__name__ == "InProcess"  # type: ignore[attr-defined]
            assert engine.vllm_config.scheduler_config.max_num_seqs == 256  # type: ignore[attr-defined]
            _assert_decoded_as_vllm_would(engine, conversations)
        ids = engine.encode("你好 hotel")
        assert ids == [108386, 9500] and engine.decode(ids) == "你好 hotel"
    finally:
        engine.close()


def _assert_decoded_as_vllm_would(engine: object, conversations: list[object]) -> None:
    """The batch's answers come as token ids, decoded once by the engine; vLLM's own detokeniser (token by token, as
    the service's stream has them) writes the same ids as the same text, Chinese and special tokens included.

    Compared within one pass, each answer's ids against vLLM's text for them: a second generation need not repeat the
    first (its prompts hit the prefix cache, whose bf16 sums differ in the last bits, and a random model's near-ties
    then flip a token; CI saw it once)."""
    import copy

    params = engine._params  # type: ignore[attr-defined]
    assert params and not any(p.detokenize for p in params.values()), "the batch leaves detokenising to vLLM"
    texted = {}
    for key, p in params.items():
        texted[key] = copy.deepcopy(p)
        texted[key].detokenize = True
    engine._params = texted  # type: ignore[attr-defined]
    try:
        ids = [engine.submit(c) for c in conversations]  # type: ignore[attr-defined]
        raw: dict[str, object] = {}
        while len(raw) < len(ids):
            raw.update(engine._feed.finished())  # type: ignore[attr-defined]
    finally:
        engine._params = params  # type: ignore[attr-defined]
    answers = [raw[i].outputs[0] for i in ids]  # type: ignore[attr-defined]
    assert all(a.text for a in answers), "vLLM wrote no text: the comparison shows nothing"
    assert [a.text for a in answers] == [engine._answer_text(a.token_ids) for a in answers]  # type: ignore[attr-defined]
    chinese = [a for a in answers if any("\u4e00" <= c <= "\u9fff" for c in a.text)]
    assert chinese, "no Chinese answer: the check shows little"


@pytest.mark.parametrize(("kind", "version"),
                         [("vllm", "v7"), ("transformers", "v7"), ("vllm", "v9"), ("transformers", "v13-guided")])
def test_summary_script_writes_each_summary_in_its_reviews_language(kind: str, version: str, tiny_model: Path) -> None:
    # A random model left to itself writes any characters; the grammar of each request's language must not let it.
    # v9's aspects come as one object, which parse reads back into the list.
    template = get_template(version)
    cfg = _cfg(kind, tiny_model, summary_max_chars=template.summary_max_chars, summary_script=True,
               aspect_map=template.aspect_map, answer_format=template.answer_format)
    reviews = [(text, lang) for text, lang in SAMPLE_REVIEWS if lang in ("zh", "en")] * 2
    assert {lang for _, lang in reviews} == {"zh", "en"}
    engine = build_engine(cfg)
    try:
        completions = engine.generate([template.messages(t, lang) for t, lang in reviews], [g for _, g in reviews])
    finally:
        engine.close()
    for (_, lang), done in zip(reviews, completions, strict=True):
        parsed = parse_completion(done.text, done.finish_reason, template.aspect_map, template.answer_format)
        assert parsed.record is not None, parsed.error
        assert in_language(parsed.record.summary, lang), (lang, parsed.record.summary)


@pytest.mark.parametrize(("kind", "version"),
                         [("vllm", "v11"), ("transformers", "v11"), ("vllm", "v13"), ("transformers", "v13")])
def test_optimistic_decoding_ends_with_every_answer_fitting_the_grammar(kind: str, version: str,
                                                                        tiny_model: Path) -> None:
    # v11 (JSON) and v13 (lines) write each answer without the grammar first. A random model then writes no valid
    # answer at all, so every row is generated again with the grammar (the worst case of the fallback): still one
    # valid answer per row, each summary in its review's script, and the retry counted per row.
    from qwenspark.analyze import AnalyzeSpec, PreparedBatch, templated
    from tests.unit.test_label_head import POSITIVE

    reviews = [(text, lang) for text, lang in SAMPLE_REVIEWS if lang in ("zh", "en")] + [(POSITIVE["zh"], "zh")]
    spec = AnalyzeSpec(engine=_cfg(kind, tiny_model), prompt_version=version, max_review_tokens=500)
    engine = build_engine(templated(spec.engine, version))
    template = get_template(version)
    chunk = pd.DataFrame(
        {"review_id": range(len(reviews)), "hotel_id": "h", "created_at": None, "lang": [g for _, g in reviews],
         "text": [t for t, _ in reviews], "input_key": "k", "clean_error": None},
        columns=CLEAN_SCHEMA.fieldNames(),
    )
    try:
        first = engine.generate([template.messages(t, g) for t, g in reviews], [g for _, g in reviews])
        batch = PreparedBatch(engine, chunk, spec)
        out = batch.run_sync(engine)
    finally:
        engine.close()
    fits = [parse_completion(d.text, d.finish_reason, True, template.answer_format).record for d in first]
    assert sum(record is not None for record in fits) < len(reviews), \
        "unguided, the random model's answers do not all parse (else this test shows nothing)"
    assert len(out) == len(reviews) and out["review_id"].tolist() == list(range(len(reviews)))
    assert out["error"].isna().all() and out["sentiment"].notna().all(), out["error"].tolist()
    assert all(json.loads(a) is not None for a in out["aspects"])  # stored as the JSON list, whatever was written
    assert all(in_language(s, g) for s, (_, g) in zip(out["summary"], reviews, strict=True))
    # Retried with the grammar: "grammar" for answers that ended unfit, "penalty" (the grammar and the repair
    # penalty) for those that ran to max_tokens, as a random model's unguided text mostly does.
    assert len(batch.repaired) >= len(reviews) - 1 and set(batch.repaired.values()) <= {"grammar", "penalty"}
