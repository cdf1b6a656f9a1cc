"""The label head: its features, its numpy inference against scikit-learn's, its stacking, the packaged head."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qwenspark import prompts
from qwenspark.analyze import AnalyzeSpec, analyze_chunk, templated
from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message
from qwenspark.errors import ConfigError
from qwenspark.label_head import (
    LanguageHead,
    Stack,
    get_head,
    grams,
    read_head,
    save_head,
)
from qwenspark.schemas import CLEAN_SCHEMA
from tests.support.char_tokens import CharTokens

# Hand-written reviews, not from the dev corpus: the packaged head must read their polarity from words alone.
POSITIVE = {
    "zh": "房间干净整洁，服务员很热情，早餐丰富，下次还会再来住。",
    "en": "Spotless room, friendly staff and a great breakfast. We loved the stay and would definitely come back.",
}
NEGATIVE = {
    "zh": "房间又脏又吵，前台态度恶劣，空调坏了也没人修，再也不会住了。",
    "en": "Dirty room, rude staff, the air conditioning was broken and nobody fixed it. Never again, avoid this hotel.",
}


def test_grams_fold_width_and_case_and_split_zh_by_characters() -> None:
    assert grams("Ｇｏｏｄ ROOM!", "en") == ["good", "room", "good room"]
    assert grams("房 间好", "zh") == ["房", "间", "好", "房间", "间好", "房间好"]
    assert grams("", "zh") == [] and grams("!!!", "en") == []


def _corpus() -> tuple[list[str], list[str], list[str]]:
    good = ["great room", "lovely staff great view", "clean and great", "friendly helpful staff", "loved it"]
    bad = ["dirty room", "rude staff dirty bath", "noisy and dirty", "broken shower rude desk", "hated it"]
    middle = ["room was ok", "average stay ok breakfast", "fine but ok", "ok location ok price", "nothing special"]
    texts = good + bad + middle
    return texts, ["positive"] * 5 + ["negative"] * 5 + ["neutral"] * 5, ["room great", "dirty ok", "zzz unknown"]


@pytest.mark.parametrize("classes", [("negative", "positive"), ("negative", "neutral", "positive")])
def test_numpy_inference_equals_scikit_learn_on_the_same_features(classes: tuple[str, ...]) -> None:
    from sklearn.linear_model import LogisticRegression

    from bench.label_head import fit_lexical, matrix, weighted

    texts, gold, probes = _corpus()
    keep = [i for i, g in enumerate(gold) if g in classes]
    texts, gold = [texts[i] for i in keep], [gold[i] for i in keep]
    lexical = fit_lexical(texts, gold, "en", 4.0)
    x, idf = matrix(texts, "en")
    reference = LogisticRegression(C=4.0, max_iter=5000, class_weight="balanced").fit(weighted(x, idf), gold)
    probe_x, _ = matrix(probes, "en")
    expected = reference.predict_log_proba(weighted(probe_x, idf))
    got = np.array([[lexical.log_proba(t, "en")[c] for c in reference.classes_] for t in probes])
    # float16 storage of the weights: agreement to about 1e-3 in log-probability.
    np.testing.assert_allclose(got, expected, atol=5e-3)
    assert lexical.log_proba("great room", "en")["positive"] > lexical.log_proba("dirty room", "en")["positive"]


def _head(weight: float, bias: dict[str, float], margin: float = 2.0) -> LanguageHead:
    # A 1-bucket-wide lexical model would collide everything: use real features on a fitted toy model.
    from bench.label_head import fit_lexical

    texts, gold, _ = _corpus()
    lexical = fit_lexical(texts, gold, "en", 4.0)
    stack = Stack(weight=weight, bias=bias, margin=margin)
    return LanguageHead(lexical=lexical, with_logprobs=stack, without_logprobs=stack)


def test_lexical_evidence_overturns_a_close_answer_but_not_a_confident_one() -> None:
    close = {"positive": -0.6, "negative": -0.9, "neutral": -3.0, "mixed": -3.0}
    confident = {"positive": -0.01, "negative": -6.0, "neutral": -7.0, "mixed": -7.0}
    head = _head(weight=2.0, bias={})
    assert head.label("positive", close, "dirty room rude staff", "en") == "negative"
    assert head.label("positive", confident, "dirty room rude staff", "en") == "positive"
    assert _head(weight=0.0, bias={}).label("positive", close, "dirty room rude staff", "en") == "positive"


def test_without_logprobs_the_answer_is_a_one_hot_vote_with_its_margin() -> None:
    assert _head(weight=1.0, bias={}, margin=0.5).label("positive", None, "dirty room rude staff", "en") == "negative"
    assert _head(weight=1.0, bias={}, margin=20.0).label("positive", None, "dirty room rude staff", "en") == "positive"


def test_a_label_missing_from_the_reported_alternatives_can_still_win_on_strong_evidence() -> None:
    head = _head(weight=3.0, bias={})
    assert head.label("positive", {"positive": -0.2, "neutral": -1.8}, "dirty room rude staff", "en") == "negative"


def test_a_language_without_a_model_keeps_the_answer_and_the_file_round_trips(tmp_path: Path) -> None:
    head = _head(weight=2.0, bias={"negative": -0.5})
    save_head(tmp_path / "toy.npz", {"en": head}, {"fitted": "test"})
    loaded = read_head(tmp_path / "toy.npz")
    assert loaded.provenance == {"fitted": "test"} and loaded.name == "toy"
    assert loaded.languages["en"].with_logprobs == head.with_logprobs
    assert loaded.label("mixed", None, "dirty room", "fr") == "mixed"
    for text in ("dirty room rude staff", "great room lovely staff", "ok"):
        want = head.lexical.log_proba(text, "en")
        got = loaded.languages["en"].lexical.log_proba(text, "en")
        assert got == pytest.approx(want, abs=1e-3)


def test_an_unknown_head_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="not packaged"):
        get_head("no-such-head")


def test_the_packaged_default_head_reads_polarity_from_words_when_the_model_is_undecided() -> None:
    name = prompts.TEMPLATES["v10"].label_head
    assert name is not None
    head = get_head(name)
    assert set(head.languages) == {"zh", "en"}
    assert {"prompt", "model", "held_out", "fit"} <= set(head.provenance)
    undecided = {"positive": -1.0, "negative": -1.0, "neutral": -1.0, "mixed": -1.0}
    for lang in ("zh", "en"):
        assert head.label("neutral", undecided, POSITIVE[lang], lang) == "positive", lang
        assert head.label("neutral", undecided, NEGATIVE[lang], lang) == "negative", lang
        lexical = head.languages[lang].lexical
        assert lexical.log_proba(POSITIVE[lang], lang)["positive"] > lexical.log_proba(NEGATIVE[lang], lang)["positive"]


class _Undecided(CharTokens):
    """Answers positive for every review with every label equally likely; records the config it was built with."""

    model_name = "undecided"

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None
    ) -> list[Completion]:
        answer = '{"sentiment":"positive","summary":"ok","aspects":{}}'
        flat = {"positive": -1.0, "negative": -1.0, "neutral": -1.0, "mixed": -1.0}
        return [Completion(answer, "stop", 10, 10, flat) for _ in conversations]

    def close(self) -> None:
        pass


def test_a_head_prompt_version_stores_the_heads_label_and_asks_for_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert templated(EngineConfig(model="s"), "v10").label_logprobs
    no_lp = dataclasses.replace(prompts.TEMPLATES["v10"], version="vnolp", head_logprobs=False)
    monkeypatch.setitem(prompts.TEMPLATES, "vnolp", no_lp)
    assert not templated(EngineConfig(model="s"), "vnolp").label_logprobs
    texts = [POSITIVE["zh"], NEGATIVE["zh"], POSITIVE["en"], NEGATIVE["en"]]
    chunk = pd.DataFrame(
        {"review_id": range(4), "hotel_id": ["h"] * 4, "created_at": [None] * 4, "lang": ["zh", "zh", "en", "en"],
         "text": texts, "input_key": list("abcd"), "clean_error": [None] * 4},
        columns=CLEAN_SCHEMA.fieldNames(),
    )
    spec = AnalyzeSpec(engine=EngineConfig(model="s"), prompt_version="v10", max_review_tokens=500)
    out = analyze_chunk(_Undecided(), chunk, spec)
    assert out["sentiment"].tolist() == ["positive", "negative", "positive", "negative"]
    assert out["summary"].tolist() == ["ok"] * 4, "the summary stays as generated"



def test_the_fits_vectorised_objective_equals_the_scoring_rules() -> None:
    from bench.calibrate import objective
    from bench.label_head import fast_objective
    from qwenspark.schemas import SENTIMENTS

    rng = np.random.default_rng(0)
    for binary in (True, False):
        classes = ["negative", "positive"] if binary else ["negative", "neutral", "positive"]
        for _ in range(50):
            gold = rng.choice(classes, size=40).tolist()
            if not binary and "neutral" not in gold:
                gold[0] = "neutral"
            answers = rng.choice(SENTIMENTS, size=40).tolist()
            codes = np.array([SENTIMENTS.index(g) for g in gold])
            got = fast_objective(codes, np.array([SENTIMENTS.index(a) for a in answers]), binary)
            assert got == pytest.approx(objective(gold, answers), abs=1e-3)
