"""An answer the engine itself ended in an error (vLLM's finish_reason "error": its grammar refused a token it
sampled) is generated again, up to analyze.FAULT_RETRIES times, on both batch paths; one more fault is stored as an
engine error, one row a review."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd
import pytest

from qwenspark import prompts
from qwenspark.analyze import FAULT_RETRIES, AnalyzeSpec, analyze_chunk, make_analyze_fn
from qwenspark.config import EngineConfig
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Message
from qwenspark.parse import ENGINE_FAULT, parse_completion
from tests.unit.test_repair import LOOP, Repairable, _answer, _chunk, _review

TEXTS = ["fine stay", "FAULT 1", "another fine stay", "FAULT always", f"FAULT {FAULT_RETRIES}"]


class Faulty(Repairable):
    """Reviews with FAULT come back as vLLM ends an answer whose token its grammar refused ('!', "error"): "FAULT n"
    on its first n attempts, "FAULT always" on every attempt."""

    model_name = "faulty"

    def _answer(self, conversation: Sequence[Message], retry: str | None) -> Completion:
        review = _review(conversation[-1]["content"])
        self.calls.append((review, retry))
        faults = 10**6 if review == "FAULT always" else int(review[6:]) if review.startswith("FAULT ") else 0
        if sum(seen == review for seen, _ in self.calls) <= faults:
            return Completion("!", ENGINE_FAULT, 10, 1)
        return Completion(_answer(review), "stop", 10, 7)


def _check(out: pd.DataFrame, engine: Faulty) -> None:
    assert out["review_id"].tolist() == [0, 1, 2, 3, 4], "one row a review, in order"
    valid = [0, 1, 2, 4]
    assert out["summary"].iloc[valid].tolist() == ["fine stay", "FAULT 1", "another fine stay", TEXTS[4]]
    assert out["error"].iloc[valid].isna().all()
    assert out["error"].iat[3].startswith("engine: the answer ended in an engine error"), out["error"].iat[3]
    assert pd.isna(out["sentiment"].iat[3])
    # each fault generated again with the grammar's settings, at most FAULT_RETRIES times
    retried = {"FAULT 1": 1, "FAULT always": FAULT_RETRIES, TEXTS[4]: FAULT_RETRIES}
    expected = [(t, None) for t in TEXTS] + [(t, "fault") for t, n in retried.items() for _ in range(n)]
    assert sorted(engine.calls, key=repr) == sorted(expected, key=repr)
    assert out["tokens_out"].tolist() == [7, 1 + 7, 7, 1 + FAULT_RETRIES, FAULT_RETRIES + 7], \
        "the faulted attempts' tokens count too"


@pytest.mark.parametrize("repairs", [False, True])
def test_the_sync_path_generates_a_faulted_answer_again(repairs: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    version = "v1"
    if repairs:  # a version that repairs cut answers too: the fault's retry is its own kind, not the repair's
        version = "vrepair"
        monkeypatch.setitem(prompts.TEMPLATES, version,
                            dataclasses.replace(prompts.TEMPLATES["v1"], version=version, repair_penalty=0.5))
    engine = Faulty()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version=version, max_review_tokens=500)
    _check(analyze_chunk(engine, _chunk(TEXTS), spec), engine)


def test_the_continuous_path_generates_it_again_and_keeps_row_order() -> None:
    engine = Faulty()
    cache.clear()
    spec = AnalyzeSpec(engine=EngineConfig(model="m", batch_size=2, max_in_flight=2), prompt_version="v1",
                       max_review_tokens=500)
    fn = make_analyze_fn(spec, engine_factory=lambda cfg: engine)
    out = pd.concat(list(fn(iter([_chunk(TEXTS)]))), ignore_index=True)
    cache.clear()
    _check(out, engine)


class LoopThenFault(Faulty):
    """LOOP reviews answer a looping summary first; their repair (the penalty's settings) then ends in a fault."""

    def _answer(self, conversation: Sequence[Message], retry: str | None) -> Completion:
        review = _review(conversation[-1]["content"])
        self.calls.append((review, retry))
        if "LOOP" in review and retry is None:
            return Completion(_answer(LOOP), "stop", 10, 40)
        if retry == "penalty":
            return Completion("!", ENGINE_FAULT, 10, 1)
        return Completion(_answer(review), "stop", 10, 7)


def test_a_repair_the_engine_ends_in_an_error_is_generated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    version = "vrepair"
    monkeypatch.setitem(prompts.TEMPLATES, version,
                        dataclasses.replace(prompts.TEMPLATES["v1"], version=version, repair_penalty=0.5))
    engine = LoopThenFault()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version=version, max_review_tokens=500)
    out = analyze_chunk(engine, _chunk(["LOOP here", "fine stay"]), spec)
    assert out["error"].isna().all(), out["error"].tolist()
    assert engine.calls == [("LOOP here", None), ("fine stay", None), ("LOOP here", "penalty"), ("LOOP here", "fault")]
    assert out["tokens_out"].tolist() == [40 + 1 + 7, 7]


def test_a_fault_is_an_engine_error_not_a_parse_error() -> None:
    parsed = parse_completion("positiv!", ENGINE_FAULT, answer_format="lines")
    assert parsed.record is None and parsed.error is not None
    assert parsed.error.startswith("engine: the answer ended in an engine error") and "'positiv!'" in parsed.error
    # a refusal for the content keeps its own reason ("error: <reason>", engines/openai.py)
    assert parse_completion("", "error: 400 too long").error == "engine: 400 too long"
