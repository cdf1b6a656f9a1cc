"""An answer whose summary repeats a few-shot example's summary (a claim its review never made) is generated once more
from a prompt without that example, on both batch paths and in the service; engine.borrowed_retry=false stores it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Sequence

import pandas as pd
import pytest

from qwenspark import prompts
from qwenspark.analyze import AnalyzeSpec, analyze_chunk, make_analyze_fn
from qwenspark.config import EngineConfig, validate_config
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Message, Retry
from qwenspark.prompts import get_template
from qwenspark.serve.app import Service
from qwenspark.serve.engine import Partial
from tests.unit.test_repair import Repairable, _chunk, _review
from tests.unit.test_serve import _streamed_once

# v10 as the model labels it (no label head): the stored label is the model's, so which answer's label a row keeps shows
V10 = dataclasses.replace(get_template("v10"), version="v10-bare", label_head=None)
EN_EXAMPLE, ZH_EXAMPLE = V10.examples[1][0], V10.examples[0][0]
LOAN = V10.example_summaries()[1]  # "Overpriced, smelly room, ...; only the location is good."
TEXTS = ["Lovely room, BORROW me.", "fine stay", f"{LOAN.lower()} BORROW me.", "ok stay"]


def _shows(conversation: Sequence[Message], review: str) -> bool:
    return any(m["role"] == "user" and f"<review>\n{review}\n</review>" in m["content"] for m in conversation)


class Borrowing(Repairable):
    """v10's JSON answers: a review with BORROW answers the English example's summary whole (negative) while that
    example is in its prompt, and its own summary (positive) once it is not. Records (review, retry) and, for each
    retry, whether the prompt still showed each example."""

    model_name = "borrowing"

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[tuple[bool, bool]] = []

    def _answer(self, conversation: Sequence[Message], retry: str | None) -> Completion:
        review = _review(conversation[-1]["content"])
        self.calls.append((review, retry))
        if retry is not None:
            self.shown.append((_shows(conversation, EN_EXAMPLE), _shows(conversation, ZH_EXAMPLE)))
        if "BORROW" in review and _shows(conversation, EN_EXAMPLE):
            answer = {"sentiment": "negative", "summary": LOAN, "aspects": {"location": "positive"}}
        else:
            answer = {"sentiment": "positive", "summary": f"Said: {review[:12]}", "aspects": {"room": "positive"}}
        return Completion(json.dumps(answer), "stop", 10, 30 if "BORROW" in review and retry is None else 7)


def _check(out: pd.DataFrame, engine: Borrowing) -> None:
    assert out["review_id"].tolist() == [0, 1, 2, 3], "one row a review, in order"
    assert out["error"].isna().all()
    # the loan generated again without the English example (the Chinese one kept)
    assert [c for c in engine.calls if c[1]] == [(TEXTS[0], "borrowed")]
    assert engine.shown == [(False, True)]
    # the summary and aspects the second answer's; the label the first's (the service has sent it already)
    assert out["summary"].iat[0] == "Said: Lovely room,"
    assert json.loads(out["aspects"].iat[0]) == [{"aspect": "room", "sentiment": "positive"}]
    assert out["sentiment"].iat[0] == "negative"
    assert out["tokens_out"].iat[0] == 30 + 7, "the first answer's tokens count too"
    # a review that says the example's words itself keeps its answer: no claim was borrowed
    assert out["summary"].iat[2] == LOAN
    assert out["summary"].iat[1] == "Said: fine stay" and len(engine.calls) == 5


@pytest.fixture(autouse=True)
def _bare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(prompts.TEMPLATES, V10.version, V10)


@pytest.mark.parametrize("continuous", [False, True])
def test_both_batch_paths_generate_a_borrowed_summary_again_without_the_example(continuous: bool) -> None:
    engine = Borrowing()
    spec = AnalyzeSpec(engine=EngineConfig(model="m", batch_size=2, max_in_flight=2), prompt_version=V10.version,
                       max_review_tokens=500)
    if not continuous:
        _check(analyze_chunk(engine, _chunk(TEXTS), spec), engine)
        return
    cache.clear()
    try:
        out = pd.concat(list(make_analyze_fn(spec, engine_factory=lambda cfg: engine)(iter([_chunk(TEXTS)]))),
                        ignore_index=True)
    finally:
        cache.clear()
    _check(out, engine)


def test_off_the_borrowed_summary_is_stored_as_it_came() -> None:
    engine = Borrowing()
    spec = AnalyzeSpec(engine=EngineConfig(model="m", borrowed_retry=False), prompt_version=V10.version,
                       max_review_tokens=500)
    out = analyze_chunk(engine, _chunk(TEXTS), spec)
    assert out["summary"].iat[0] == LOAN and not any(retry for _, retry in engine.calls)


class Lines(Borrowing):
    """The same in the service, with v14's lines streamed: the label first, then the rest. Records each attempt's
    (retry, pin)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[tuple[Retry | None, str | None]] = []

    async def stream(self, conversation: Sequence[Message], lang: str | None, retry: Retry | None = None,
                     pin: str | None = None) -> AsyncIterator[Partial]:
        self.attempts.append((retry, pin))
        loan = _shows(conversation, get_template("v14").examples[1][0])
        label = pin or ("negative" if loan else "positive")
        yield Partial(f"{label}\n")
        summary = get_template("v14").example_summaries()[1] if loan else "Filthy room, rude staff."
        final = f'{label}\n"{summary}"\nroom:negative'
        yield Partial(final, None, Completion(final, "stop", 100, 20))

    def alive(self) -> bool:
        return True

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("on", [True, False])
def test_the_service_generates_it_again_pinned_to_the_label_it_sent(on: bool) -> None:
    cfg = validate_config({"engine": {"kind": "custom", "factory": "tests.support.echo_engine:build", "model": "m",
                                      "borrowed_retry": on},
                           "prompt": {"version": "v14"}, "serve": {"optimistic": False}})
    engine = Lines()
    label, result, metrics = _streamed_once(service=Service(cfg, engine))
    assert label["sentiment"] == "negative"
    if not on:
        assert engine.attempts == [(None, None)] and result["result"]["summary"].startswith("Overpriced, smelly")
        return
    assert engine.attempts == [(None, None), ("borrowed", "negative")]
    assert result["result"]["summary"] == "Filthy room, rude staff." and result["result"]["sentiment"] == "negative"
    assert 'qwenspark_serve_retries_total{kind="borrowed"} 1.0' in metrics


def test_a_loan_only_in_the_clause_the_bound_cut_is_not_generated_again() -> None:
    tail = "; only the location is goo"  # the grammar stopped the summary at its 100th character, mid-clause
    own = "Dirty room, rude staff, noisy street, thin walls"
    summary = (own + ", slow lifts" * 10)[:100 - len(tail)] + tail
    assert len(summary) == 100

    class CutLoan(Borrowing):
        def _answer(self, conversation: Sequence[Message], retry: str | None) -> Completion:
            self.calls.append((_review(conversation[-1]["content"]), retry))
            answer = {"sentiment": "negative", "summary": summary, "aspects": {"room": "negative"}}
            return Completion(json.dumps(answer), "stop", 10, 30)

    engine = CutLoan()
    spec = AnalyzeSpec(engine=EngineConfig(model="m"), prompt_version=V10.version, max_review_tokens=500)
    out = analyze_chunk(engine, _chunk([f"{own}, slow lifts."]), spec)
    assert engine.calls == [(f"{own}, slow lifts.", None)]  # stored as ended: the loan is not in it
    assert out["summary"].iat[0].endswith("…") and "location" not in out["summary"].iat[0]
