"""The continuous feed with a fake streaming engine: order kept, in-flight bounded, refusals per row."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from qwenspark.analyze import AnalyzeSpec, make_analyze_fn
from qwenspark.config import EngineConfig
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Message
from qwenspark.errors import RequestError
from tests.unit.test_analyze import _frame

ANSWER = json.dumps({"sentiment": "neutral", "summary": "s", "aspects": []})


class FakeStreamingEngine:
    """A request needs len(review) % 5 + 1 steps; reviews containing REFUSE are refused at submit."""

    model_name = "fake-stream"

    def __init__(self) -> None:
        self.live: dict[str, int] = {}
        self.max_live = 0
        self.steps = 0
        self.aborted: list[str] = []
        self._next = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None
    ) -> list[Completion]:
        raise AssertionError("the continuous path must not call generate")

    def submit(self, conversation: Sequence[Message], lang: str | None = None) -> str:
        review = conversation[-1]["content"]
        if "REFUSE" in review:
            raise RequestError("too long")  # the engines' per-request refusal
        rid = f"r{self._next}"
        self._next += 1
        self.live[rid] = len(review) % 5 + 1
        self.max_live = max(self.max_live, len(self.live))
        return rid

    def step(self) -> list[tuple[str, Completion]]:
        self.steps += 1
        done = []
        for rid in list(self.live):
            self.live[rid] -= 1
            if self.live[rid] == 0:
                del self.live[rid]
                done.append((rid, Completion(ANSWER, "stop", 10, 5)))
        return done

    def abort(self, request_ids: Sequence[str]) -> None:
        self.aborted.extend(request_ids)
        for rid in request_ids:
            self.live.pop(rid, None)

    def close(self) -> None:
        pass


def _run(texts: list[str | None], batch: int, in_flight: int, engine: FakeStreamingEngine) -> list[pd.DataFrame]:
    cache.clear()
    spec = AnalyzeSpec(
        engine=EngineConfig(model="fake", batch_size=batch, max_in_flight=in_flight),
        prompt_version="v1",
        max_review_tokens=10_000,
    )
    fn = make_analyze_fn(spec, engine_factory=lambda cfg: engine)
    frames = [_frame(texts[i : i + 7]) for i in range(0, len(texts), 7)]
    return list(fn(iter(frames)))


def test_rows_come_back_in_order_with_bounded_in_flight() -> None:
    engine = FakeStreamingEngine()
    texts = [("x" * (i * 7 % 13)) + f"review {i}" for i in range(50)]
    texts[17] = "REFUSE this one"
    outs = _run(texts, batch=4, in_flight=6, engine=engine)
    out = pd.concat(outs)
    # _frame numbers rows 1..7 per frame: order is kept if the texts come back in input order
    assert [len(o) for o in outs[:-1]] == [4] * (len(outs) - 1)
    assert out["error"].notna().sum() == 1
    assert out["error"].dropna().iloc[0] == "engine refused the request: too long"
    assert out["sentiment"].notna().sum() == 49
    assert engine.max_live <= 6 + 4, "at most max_in_flight plus one batch being admitted"
    assert not engine.live and not engine.aborted
    cache.clear()


def test_stopping_early_aborts_what_is_in_flight() -> None:
    engine = FakeStreamingEngine()
    cache.clear()
    spec = AnalyzeSpec(
        engine=EngineConfig(model="fake", batch_size=4, max_in_flight=8), prompt_version="v1", max_review_tokens=99
    )
    gen = make_analyze_fn(spec, engine_factory=lambda cfg: engine)(iter([_frame(["ab" * i for i in range(1, 8)])] * 5))
    first = next(gen)
    assert len(first) == 4 and engine.live
    gen.close()
    assert engine.aborted and not engine.live
    cache.clear()
