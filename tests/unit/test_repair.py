"""Answers that come back cut or looping are generated once more with the repair settings, on both engine paths."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pandas as pd
import pytest

from qwenspark import prompts
from qwenspark.analyze import AnalyzeSpec, analyze_chunk, make_analyze_fn
from qwenspark.config import EngineConfig
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Message
from qwenspark.parse import grammar_misfit, needs_repair, parse_completion
from qwenspark.schemas import CLEAN_SCHEMA
from tests.support.char_tokens import CharTokens


def _answer(summary: str) -> str:
    return json.dumps({"sentiment": "negative", "summary": summary, "aspects": []}, ensure_ascii=False)


def _mapped(summary: str) -> str:
    """An answer with its aspects as one object (prompt versions with aspect_map, v10's)."""
    return json.dumps({"sentiment": "positive", "summary": summary, "aspects": {"room": "positive"}},
                      ensure_ascii=False)


LOOP = "退房手续不及时，" * 6
FIXED = "退房手续不及时"


class Repairable(CharTokens):
    """Reviews with LOOP answer a looping summary, reviews with CUT are cut by max_tokens, unless retried; every call
    is recorded as (review, retry)."""

    model_name = "repairable"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.live: list[tuple[str, Completion]] = []
        self._next = 0

    def _answer(self, conversation: Sequence[Message], retry: str | None) -> Completion:
        review = conversation[-1]["content"]
        self.calls.append((review, retry))
        if "LOOP" in review and not retry:
            return Completion(_answer(LOOP), "stop", 10, 40)
        if "CUT" in review and not retry:
            return Completion('{"sentiment":"negative","summary":"aaa', "length", 10, 64)
        return Completion(_answer(FIXED if "LOOP" in review or "CUT" in review else "ok"), "stop", 10, 7)

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: str | None = None,
    ) -> list[Completion]:
        return [self._answer(c, retry) for c in conversations]

    def submit(self, conversation: Sequence[Message], lang: str | None = None, *, retry: str | None = None) -> str:
        rid = f"r{self._next}"
        self._next += 1
        self.live.append((rid, self._answer(conversation, retry)))
        return rid

    def step(self) -> list[tuple[str, Completion]]:
        done, self.live = self.live[:1], self.live[1:]
        return done

    def abort(self, request_ids: Sequence[str]) -> None:
        self.live = [(r, c) for r, c in self.live if r not in request_ids]

    def close(self) -> None:
        pass


def _review(prompt: str) -> str:
    """The review inside a user turn (<review>...</review>)."""
    return prompt.split("<review>\n", 1)[1].split("\n</review>", 1)[0]


TEXTS = ["fine stay", "LOOP review", "CUT review", "another fine stay"]


def _chunk(texts: list[str]) -> pd.DataFrame:
    n = len(texts)
    return pd.DataFrame(
        {"review_id": range(n), "hotel_id": ["h"] * n, "created_at": [None] * n, "lang": ["en"] * n, "text": texts,
         "input_key": [f"k{i}" for i in range(n)], "clean_error": [None] * n},
        columns=CLEAN_SCHEMA.fieldNames(),
    )


@pytest.fixture
def repairing(monkeypatch: pytest.MonkeyPatch) -> str:
    version = dataclasses.replace(prompts.TEMPLATES["v1"], version="vrepair", repair_penalty=0.5)
    monkeypatch.setitem(prompts.TEMPLATES, "vrepair", version)
    return "vrepair"


def _check(out: pd.DataFrame, engine: Repairable) -> None:
    assert out["summary"].tolist() == ["ok", FIXED, FIXED, "ok"]
    assert out["error"].isna().all()
    assert out["tokens_out"].tolist() == [7, 40 + 7, 64 + 7, 7], "the first answers' tokens count too"
    repaired = sorted((_review(prompt), retry) for prompt, retry in engine.calls if retry)
    assert repaired == [("CUT review", "penalty"), ("LOOP review", "penalty")]
    assert len(engine.calls) == 6


def test_the_sync_path_repairs_cut_and_looping_answers_once(repairing: str) -> None:
    engine = Repairable()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version=repairing, max_review_tokens=500)
    _check(analyze_chunk(engine, _chunk(TEXTS), spec), engine)


def test_the_continuous_path_repairs_them_and_keeps_row_order(repairing: str) -> None:
    engine = Repairable()
    cache.clear()
    spec = AnalyzeSpec(engine=EngineConfig(model="m", batch_size=2, max_in_flight=2), prompt_version=repairing,
                       max_review_tokens=500)
    fn = make_analyze_fn(spec, engine_factory=lambda cfg: engine)
    out = pd.concat(list(fn(iter([_chunk(TEXTS)]))), ignore_index=True)
    cache.clear()
    assert out["review_id"].tolist() == [0, 1, 2, 3]
    _check(out, engine)


def test_a_version_without_repair_stores_the_loop_and_the_cut_as_they_came() -> None:
    engine = Repairable()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version="v1", max_review_tokens=500)
    out = analyze_chunk(engine, _chunk(TEXTS), spec)
    assert out["summary"].tolist()[:2] == ["ok", LOOP] and out["error"].iat[2].startswith("parse: output hit")
    assert not any(retry for _, retry in engine.calls)


def test_an_answer_that_loops_again_is_stored_as_it_is(repairing: str) -> None:
    class Stubborn(Repairable):
        def _answer(self, conversation: Sequence[Message], retry: str | None) -> Completion:
            self.calls.append((conversation[-1]["content"], retry))
            return Completion(_answer(LOOP), "stop", 10, 40)

    engine = Stubborn()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version=repairing, max_review_tokens=500)
    out = analyze_chunk(engine, _chunk(["LOOP"]), spec)
    assert out["summary"].tolist() == [LOOP] and len(engine.calls) == 2


def test_what_needs_repair() -> None:
    assert needs_repair("length", parse_completion('{"sentiment":', "length"))
    assert needs_repair("stop", parse_completion(_answer(LOOP), "stop"))
    assert not needs_repair("stop", parse_completion(_answer(FIXED), "stop"))
    assert not needs_repair("stop", parse_completion("not json", "stop")), "a malformed answer would fail again"


class Unguided(CharTokens):
    """What a model writes without the grammar: prose for PROSE, an English summary for a Chinese review, a summary
    of 150 characters for LONG, extra keys for EXTRA; valid JSON for the rest and for every guided retry."""

    model_name = "unguided"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: str | None = None,
    ) -> list[Completion]:
        out = []
        for conversation in conversations:
            review = _review(conversation[-1]["content"])
            self.calls.append((review, retry))
            zh = review.startswith("房")
            text = _mapped("房间很好" if zh else "fine")
            if retry is None:
                if "PROSE" in review:
                    text = "Sure! The sentiment is positive."
                elif zh:
                    text = _mapped("The room was fine")
                elif "LONG" in review:
                    text = _mapped("a" * 150)
                elif "EXTRA" in review:
                    text = json.dumps({"sentiment": "positive", "summary": "ok", "aspects": {}, "note": "x"})
            out.append(Completion(text, "stop", 10, 9))
        return out

    def close(self) -> None:
        pass


def test_optimistic_answers_that_do_not_fit_the_grammar_are_generated_again_with_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # v10's rules: summary at most 100 characters, in the review's script.
    optimistic = dataclasses.replace(prompts.TEMPLATES["v10"], version="vopt", optimistic=True, repair_penalty=None)
    monkeypatch.setitem(prompts.TEMPLATES, "vopt", optimistic)
    texts = ["good stay", "PROSE", "房间干净", "LONG", "EXTRA"]
    chunk = _chunk(texts).assign(lang=["en", "en", "zh", "en", "en"])
    engine = Unguided()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version="vopt", max_review_tokens=500)
    out = analyze_chunk(engine, chunk, spec)
    assert out["error"].isna().all() and out["sentiment"].notna().all(), "every row valid in the end"
    assert out["summary"].tolist() == ["fine", "fine", "房间很好", "fine", "fine"]
    assert sorted(r for r, retry in engine.calls if retry == "grammar") == ["EXTRA", "LONG", "PROSE", "房间干净"]
    assert len(engine.calls) == 5 + 4, "the valid answer is not generated again"
    # Not optimistic: the same answers are errors or kept as they came, and nothing is generated twice.
    plain = dataclasses.replace(optimistic, version="vplain", optimistic=False)
    monkeypatch.setitem(prompts.TEMPLATES, "vplain", plain)
    engine = Unguided()
    out = analyze_chunk(engine, chunk, dataclasses.replace(spec, prompt_version="vplain"))
    assert out["error"].notna().tolist() == [False, True, False, False, True]
    assert out["summary"].tolist()[2:4] == ["The room was fine", "a" * 150]
    assert not any(retry for _, retry in engine.calls)


def test_grammar_misfit_checks_the_summary_bound_and_script() -> None:
    record = parse_completion(_answer("房间很好，WiFi快"), "stop").record
    assert record is not None
    assert grammar_misfit(record, "zh", 100, True) == "summary not in the zh script"
    assert grammar_misfit(record, "zh", 100, False) is None
    assert grammar_misfit(record, "zh", 5, False) == "summary over 5 characters"
    ok = parse_completion(_answer("房间很好"), "stop").record
    assert ok is not None and grammar_misfit(ok, "zh", 100, True) is None
    assert grammar_misfit(ok, "en", 100, True) == "summary not in the en script"
    assert grammar_misfit(ok, "fr", 100, True) is None, "a language without a script rule"
