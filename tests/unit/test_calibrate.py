"""Label calibration: the labels' log-probabilities are read where the sentiment starts, and a bias moves the label."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd
import pytest

from qwenspark import prompts
from qwenspark.analyze import AnalyzeSpec, analyze_chunk
from qwenspark.calibrate import calibrated, label_logprobs
from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message
from qwenspark.schemas import CLEAN_SCHEMA
from tests.support.char_tokens import CharTokens

ANSWER = '{"sentiment":"negative","summary":"x","aspects":[]}'


def test_the_labels_are_read_at_the_token_where_the_sentiment_starts() -> None:
    tokens = ['{"', "sentiment", '":"', "negative", '","', "summary"]
    alts = [{'{"': 0.0}, {"sentiment": 0.0}, {'":"': 0.0},
            {"negative": -0.5, "positive": -1.2, "neutral": -3.0, "mix": -4.0, "ne": -5.0},  # "ne": two labels
            {'","': 0.0}, {"summary": 0.0}]
    assert label_logprobs(ANSWER, tokens, alts) == {"negative": -0.5, "positive": -1.2, "neutral": -3.0, "mixed": -4.0}


def test_a_token_that_merges_the_quote_with_the_label_is_read_too() -> None:
    tokens = ['{"sentiment":', '"negative', '","summary":"x","aspects":[]}']
    alts = [{'{"sentiment":': 0.0}, {'"negative': -0.2, '"positive': -2.0, '"pos': -3.0, "pos": -9.0}, {}]
    got = label_logprobs(ANSWER, tokens, alts)
    assert got is not None and set(got) == {"negative", "positive"}
    assert got["positive"] == pytest.approx(-1.6867, abs=1e-3)  # log(e^-2 + e^-3): both start "positive"


def test_no_sentiment_or_tokens_that_do_not_line_up_give_none() -> None:
    assert label_logprobs('{"summary":"x"}', ['{"summary":"x"}'], [{}]) is None
    assert label_logprobs(ANSWER, ["\ufffd", "sentiment", '":"', "negative"], [{}, {}, {}, {"negative": 0.0}]) is None


def test_the_bias_moves_the_label_and_without_one_the_answer_stays() -> None:
    logprobs = {"negative": -0.5, "positive": -1.2, "neutral": -3.0}
    assert calibrated("negative", logprobs, None) == "negative"
    assert calibrated("negative", None, {"negative": -1.0}) == "negative"
    assert calibrated("negative", logprobs, {"negative": -1.0}) == "positive"
    assert calibrated("negative", logprobs, {"neutral": 2.6}) == "neutral"


class _Scripted(CharTokens):
    """Answers every conversation negative, with the labels' log-probabilities an engine would report."""

    model_name = "scripted"

    def __init__(self) -> None:
        self.cfgs: list[EngineConfig] = []

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None
    ) -> list[Completion]:
        return [Completion(ANSWER, "stop", 10, 10, {"negative": -0.5, "positive": -1.2}) for _ in conversations]

    def close(self) -> None:
        pass


def test_a_calibrated_prompt_version_stores_the_calibrated_label_per_language(monkeypatch: pytest.MonkeyPatch) -> None:
    calibrated_v1 = dataclasses.replace(prompts.TEMPLATES["v1"], version="vcal",
                                        label_bias={"zh": {"negative": -1.0}})
    monkeypatch.setitem(prompts.TEMPLATES, "vcal", calibrated_v1)
    chunk = pd.DataFrame(
        {"review_id": [1, 2], "hotel_id": ["h", "h"], "created_at": [None, None], "lang": ["zh", "en"],
         "text": ["房间还行", "room was ok"], "input_key": ["a", "b"], "clean_error": [None, None]},
        columns=CLEAN_SCHEMA.fieldNames(),
    )
    engine = _Scripted()
    out = analyze_chunk(engine, chunk, AnalyzeSpec(engine=EngineConfig(model="s"), prompt_version="vcal",
                                                   max_review_tokens=100))
    # zh has a bias that moves negative (-1.5) below positive (-1.2); en has none: the answer as generated.
    assert out["sentiment"].tolist() == ["positive", "negative"]
    plain = analyze_chunk(engine, chunk, AnalyzeSpec(engine=EngineConfig(model="s"), prompt_version="v1",
                                                     max_review_tokens=100))
    assert plain["sentiment"].tolist() == ["negative", "negative"]


def test_the_fit_lowers_mixed_under_binary_gold_but_never_past_its_floor() -> None:
    from bench.calibrate import MIXED_FLOOR, fit

    close = {"positive": -0.9, "mixed": -0.5, "negative": -4.0}  # a positive the model called mixed by 0.4
    clear = {"positive": -3.5, "mixed": -0.1, "negative": -4.0}  # mixed by 3.4: beyond any allowed bias
    rows = [{"gold": "positive", "answer": "mixed", "logprobs": close}] * 6
    rows += [{"gold": "positive", "answer": "mixed", "logprobs": clear}] * 3
    rows += [{"gold": "negative", "answer": "negative", "logprobs": {"negative": -0.1, "positive": -3.0}}] * 4
    bias, before, after = fit(rows)
    assert MIXED_FLOOR <= bias["mixed"] < 0 and "neutral" not in bias
    assert (before, after) == (4 / 13, 10 / 13), "the close ones move to positive, the clear ones stay mixed"
