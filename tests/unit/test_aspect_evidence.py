"""The aspects a review's words give evidence of (qwenspark.aspect_evidence), and its score on hand-marked reviews."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from qwenspark.aspect_evidence import evidenced, mentioned
from qwenspark.schemas import ASPECTS
from qwenspark.scoring import mentions

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"


@pytest.mark.parametrize(("text", "aspects"), [
    ("rooms clean spacious, staff helpful, perfect location near subway", {"room", "cleanliness", "service",
                                                                             "location"}),
    ("great value 89 night, free breakfast, quiet at night", {"price/value", "breakfast/food", "noise"}),
    ("pool closed, wifi slow, parking $30", {"facilities", "price/value"}),
    ("unclean carpets", {"cleanliness", "room"}),
    ("房间干净，前台热情，离地铁站很近", {"room", "cleanliness", "service", "location"}),
    ("早餐一般，价格偏贵，隔音差", {"breakfast/food", "price/value", "noise"}),
    ("总体比我想象的要好.不错,下次还会考虑入住", set()),
])
def test_cues_in_english_and_chinese(text: str, aspects: set[str]) -> None:
    assert mentioned(text) == aspects


@pytest.mark.parametrize(("text", "not_there"), [
    ("这家饭店不错", "breakfast/food"),  # 饭店 is a hotel
    ("卫生间很大", "cleanliness"),  # 卫生间 is a bathroom
    ("离开的时候下雨了", "location"),  # 离开 is leaving
    ("closed for renovation", "location"),  # not "close to"
])
def test_words_inside_other_words_are_no_cue(text: str, not_there: str) -> None:
    assert not_there not in mentioned(text)


def test_evidenced_keeps_the_answers_order_and_sentiments() -> None:
    answer = [{"aspect": "service", "sentiment": "negative"}, {"aspect": "price/value", "sentiment": "positive"},
              {"aspect": "room", "sentiment": "positive"}]
    assert evidenced(answer, "rude staff, but the room was nice") == [answer[0], answer[2]]
    assert evidenced(answer, "ok") == []


@pytest.mark.skipif(not DEV.is_file(), reason="the shared dev reviews are not beside this checkout")
@pytest.mark.parametrize("marks", ["aspects_gold.jsonl", "aspects_heldout.jsonl"])
def test_cues_find_the_marked_aspects(marks: str) -> None:
    """On the hand-marked dev reviews (bench/aspect_quality.py) the cues alone find most marked aspects and name few
    unmarked ones: F1 0.92 / 0.90 when written (the held-out 20 were marked after the cues were fixed); naming all
    eight scores 0.69 / 0.70, so a floor of 0.85 fails if the cues stop telling aspects apart."""
    rows = pd.read_json(ROOT / "bench" / "data" / marks, lines=True).merge(
        pd.read_csv(DEV, usecols=["source_id", "text"]), on="source_id")
    assert len(rows) in (20, 40) and set().union(*rows["aspects"]) <= set(ASPECTS)
    found = mentions(list(rows["aspects"]), [mentioned(text) for text in rows["text"]])
    assert found.f1 >= 0.85, found
