"""The eval's scores on hand-made predictions (not model output): label semantics, confusion matrix, per-class
precision/recall/F1, cut and looping answers, summary language, and `eval --compare`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from qwenspark import scoring
from qwenspark.evaluate import answer_rows, load_labelled, score
from qwenspark.parse import CUT_ERROR
from qwenspark.prompts import TEMPLATES

ROOT = Path(__file__).resolve().parents[2]

# en (stars): 4 positive, 2 neutral, 2 negative gold rows; answers include mixed (scores as neutral) and an error.
EN_GOLD = ["positive", "positive", "positive", "positive", "neutral", "neutral", "negative", "negative"]
EN_ANSWERS = ["positive", "positive", "mixed", None, "mixed", "positive", "negative", "neutral"]
# zh (binary): neutral and mixed answers are wrong.
ZH_GOLD = ["positive", "positive", "negative", "negative"]
ZH_ANSWERS = ["positive", "neutral", "negative", "mixed"]


def test_mixed_scores_as_neutral_only_against_star_labels() -> None:
    assert scoring.scheme(EN_GOLD) == scoring.STARS and scoring.scheme(ZH_GOLD) == scoring.BINARY
    assert scoring.scored("mixed", scoring.STARS) == "neutral"
    assert scoring.scored("mixed", scoring.BINARY) == "mixed"
    assert scoring.scored(None, scoring.STARS) == scoring.ERROR
    assert scoring.accuracy(EN_GOLD, EN_ANSWERS) == 4 / 8  # rows 0, 1, 4 (mixed = neutral), 6
    assert scoring.accuracy(ZH_GOLD, ZH_ANSWERS) == 2 / 4


def test_the_confusion_matrix_keeps_every_raw_answer() -> None:
    m = scoring.confusion(EN_GOLD, EN_ANSWERS)
    assert m == {
        "negative": {"positive": 0, "negative": 1, "neutral": 1, "mixed": 0, "error": 0},
        "neutral": {"positive": 1, "negative": 0, "neutral": 0, "mixed": 1, "error": 0},
        "positive": {"positive": 2, "negative": 0, "neutral": 0, "mixed": 1, "error": 1},
    }
    assert sum(sum(r.values()) for r in m.values()) == len(EN_GOLD)


def test_per_class_precision_recall_f1_by_hand() -> None:
    c = scoring.per_class(EN_GOLD, EN_ANSWERS)
    # scored answers: positive, positive, neutral, error, neutral, positive, negative, neutral
    # positive: predicted 3 (rows 0, 1, 5), right 2 -> P 2/3; gold 4 -> R 1/2; F1 = 2PR/(P+R) = 4/7
    assert (c["positive"].precision, c["positive"].recall, c["positive"].f1, c["positive"].support) == (
        0.6667, 0.5, 0.5714, 4)
    # neutral: predicted 3 (rows 2, 4, 7), right 1 -> P 1/3; gold 2 -> R 1/2; F1 = 0.4
    assert (c["neutral"].precision, c["neutral"].recall, c["neutral"].f1) == (0.3333, 0.5, 0.4)
    # negative: predicted 1, right 1 -> P 1; gold 2 -> R 1/2; F1 2/3
    assert (c["negative"].precision, c["negative"].recall, c["negative"].f1) == (1.0, 0.5, 0.6667)
    assert scoring.macro_f1(c) == pytest.approx((0.5714 + 0.4 + 0.6667) / 3)
    zh = scoring.per_class(ZH_GOLD, ZH_ANSWERS)
    assert list(zh) == ["negative", "positive"]  # no class beyond the scheme's, none dropped from it
    assert (zh["positive"].precision, zh["positive"].recall) == (1.0, 0.5)


def test_a_class_never_predicted_counts_zero_in_macro_f1() -> None:
    c = scoring.per_class(["neutral", "positive", "negative"], ["positive", "positive", "negative"])
    assert c["neutral"].f1 == 0.0 and scoring.macro_f1(c) == pytest.approx((0.6667 + 1.0 + 0.0) / 3)


@pytest.mark.parametrize(("text", "loops"), [
    ("？？？？？？？？？？", True), ("good good good good good good good good ", True), ("哈哈哈哈哈哈哈哈", True),
    ("Clean room, friendly staff.", False), ("very very very very good", False), ("房间干净，服务好。", False),
    (None, False), ("!!!", False),
])
def test_looping(text: str | None, loops: bool) -> None:
    assert scoring.looping(text) is loops


@pytest.mark.parametrize(("summary", "lang", "ok"), [
    ("房间干净，服务好", "zh", True), ("WiFi很差", "zh", True), ("Clean room", "zh", False),
    ("Clean room", "en", True), ("房间干净", "en", False), ("Great 酒店", "en", False), (None, "en", None),
    ("ok", "fr", None),
])
def test_summary_language(summary: str | None, lang: str, ok: bool | None) -> None:
    assert scoring.in_language(summary, lang) is ok


REVIEW = "The room was clean and the staff were friendly, but the street outside was noisy all night long."


@pytest.mark.parametrize(("summary", "text", "copy"), [
    ("The room was clean and the staff were friendly", REVIEW, True),  # the review's first words
    ("Clean room and friendly staff; a noisy street at night.", REVIEW, False),  # its own words
    ("很好", "很好", False),  # a short review's summary may repeat it whole
    ("房间干净，服务热情，就是外面街道整晚都很吵闹", "房间干净，服务热情，就是外面街道整晚都很吵闹。下次还会再来。",
     True),
    ("The room was clean, the staff friendly; a noisy street.", REVIEW, False),  # a copied start, then its own
    (None, REVIEW, None), ("", REVIEW, None), ("Some summary of a review", None, False),
])
def test_copied_summary(summary: str | None, text: str | None, copy: bool | None) -> None:
    assert scoring.copied(summary, text) is copy


def test_the_report_counts_copied_summaries_among_those_written() -> None:
    labelled = pd.DataFrame({"source_id": ["a", "b", "c"], "lang": ["en"] * 3, "text": [REVIEW] * 3,
                             "label": ["positive"] * 3})
    copy = "The room was clean and the staff were friendly"
    out = pd.DataFrame({"sentiment": ["positive", "positive", None],
                        "summary": [copy, "Clean room, noisy street.", None],
                        "error": [None, None, "parse: x"], "tokens_out": [10, 10, 10], "latency_ms": [5, 5, 5]})
    r = score(labelled, out, seconds=1.0, engine_load_seconds=1.0, model="m", prompt_version="v1")
    assert r.summary_copied_rate == 1 / 2


EXAMPLES = ["Overpriced, smelly room, cold breakfast and indifferent staff; only the location is good.",
            "房间大而干净，隔音差，前台服务好，总体满意。"]


@pytest.mark.parametrize(("summary", "text", "borrows"), [
    # a claim the review never made, taken from the example
    ("Dirty room and rude staff; only the location is good.", "Dirty room, rude staff.", True),
    ("Dirty room and rude staff; Only The Location Is Good…", "Dirty room, rude staff.", True),  # case, ends
    # the same words where the review says them
    ("Noisy; only the location is good.", "Noisy rooms. Only the location is good.", False),
    ("Overpriced, smelly and noisy; rude staff.", "overpriced smelly noisy, staff rude", False),  # its punctuation
    ("Dirty room and rude staff.", "Dirty room, rude staff.", False),  # its own words
    ("Cold breakfast.", "The breakfast was cold.", False),  # a short shared stretch ("cold breakfast") is no loan
    ("房间小，隔音差，前台服务好，总体满意。", "房间太小了，前台不错。", True),  # eight Han characters and more
    ("房间大而干净，早餐一般。", "房间大，干净，早餐一般。", False),  # six: a common phrase, not a loan
    (None, "x", None), ("", "x", None), ("Dirty; only the location is good.", None, True),
])
def test_summary_borrowed_from_an_example(summary: str | None, text: str | None, borrows: bool | None) -> None:
    assert scoring.borrowed(summary, text, EXAMPLES) is borrows


def test_the_report_counts_summaries_borrowed_from_the_prompts_examples() -> None:
    labelled = pd.DataFrame({"source_id": ["a", "b", "c"], "lang": ["en"] * 3,
                             "text": ["Dirty room, rude staff."] * 3, "label": ["negative"] * 3})
    out = pd.DataFrame({"sentiment": ["negative", "negative", None],
                        "summary": ["Dirty room and rude staff; only the location is good.", "Dirty, rude.", None],
                        "error": [None, None, "parse: x"], "tokens_out": [10, 10, 10], "latency_ms": [5, 5, 5]})
    r = score(labelled, out, seconds=1.0, engine_load_seconds=1.0, model="m", prompt_version="v10")
    assert r.summary_borrowed_rate == 1 / 2
    assert r.summary_borrowed == [{"source_id": "a", "lang": "en",
                                   "summary": "Dirty room and rude staff; only the location is good."}]


def test_each_rows_answer_and_flags_for_eval_rows_out() -> None:
    labelled = pd.DataFrame({"source_id": ["a", "b", "c", "d"], "lang": ["en", "en", "zh", "zh"],
                             "text": [REVIEW, "Dirty room, rude staff.", "很好", "很差"],
                             "label": ["positive", "neutral", "positive", "negative"]})
    copy = "The room was clean and the staff were friendly"
    out = pd.DataFrame({"sentiment": ["positive", "mixed", "neutral", None],
                        "summary": [copy, "Dirty room and rude staff; only the location is good.", "房间很好，…", None],
                        "aspects": ['[{"aspect":"room","sentiment":"positive"}]', "[]", "[]", None],
                        "error": [None, None, None, "parse: x"], "tokens_out": [10, 11, 12, 13],
                        "latency_ms": [5, 5, 5, 5]})
    rows = answer_rows(labelled, out, "v10")
    assert rows["source_id"].tolist() == ["a", "b", "c", "d"]
    # mixed scores as neutral against star labels; neutral is wrong against binary ones; an error is wrong
    assert rows["correct"].tolist() == [True, True, False, False]
    assert rows["copied"].tolist() == [True, False, False, None]
    assert rows["borrowed"].tolist() == [False, True, False, None]
    assert rows["at_bound"].tolist() == [False, False, True, None]
    assert rows["error"].tolist() == [None, None, None, "parse: x"] and rows["tokens_out"].tolist() == [10, 11, 12, 13]
    report = score(labelled, out, seconds=1.0, engine_load_seconds=1.0, model="m", prompt_version="v10")
    assert report.summary_at_bound_rate == 1 / 3 and report.summary_copied_rate == 1 / 3
    assert report.summary_at_bound_by_lang == {"en": 0.0, "zh": 1.0}


def test_borrowed_from_names_the_example_whose_summary_was_repeated() -> None:
    assert scoring.borrowed_from("房间小，隔音差，前台服务好，总体满意。", "房间太小了，前台不错。", EXAMPLES) == 1
    assert scoring.borrowed_from("Dirty; only the location is good.", "Dirty.", EXAMPLES) == 0
    assert scoring.borrowed_from("Dirty room.", "Dirty room.", EXAMPLES) is None
    # "" (an example without a summary) matches nothing, and the index is the example's
    assert scoring.borrowed_from("房间小，隔音差，前台服务好，总体满意。", "x", ["", EXAMPLES[1]]) == 1


def test_the_examples_of_every_version_have_summaries_to_compare_with() -> None:
    for version, template in TEMPLATES.items():
        shown = template.example_summaries()
        assert len(shown) == len(template.examples), version  # one per example, in order: the retry leaves one out
        assert sum(bool(s) for s in shown) >= 2, version


def _report_of_hand_made_rows() -> dict[str, object]:
    labelled = pd.DataFrame({"source_id": [f"r{i}" for i in range(12)], "lang": ["en"] * 8 + ["zh"] * 4,
                             "text": ["t"] * 12, "label": EN_GOLD + ZH_GOLD})
    summaries = ["Nice", "Nice", "Ok", None, "Fine", "Good", "Bad", "Meh", "很好", "还行", "很差", "？？？？？？？？"]
    errors = [None, None, None, CUT_ERROR + ": '{\"sent'", *[None] * 8]
    out = pd.DataFrame({"sentiment": EN_ANSWERS + ZH_ANSWERS, "summary": summaries, "error": errors,
                        "tokens_out": [10, 20, 30, 128, 10, 10, 10, 10, 10, 10, 10, 62],
                        "latency_ms": [5, 6, 7, 900, 5, 5, 5, 5, 5, 5, 5, 800]})
    return score(labelled, out, seconds=2.0, engine_load_seconds=1.0, model="m", prompt_version="v1").as_dict()


def test_the_report_of_hand_made_rows() -> None:
    r = _report_of_hand_made_rows()
    assert r["rows"] == 12 and r["accuracy"] == 6 / 12
    assert r["accuracy_by_lang"] == {"en": 0.5, "zh": 0.5}
    assert r["macro_f1_by_lang"]["en"] == pytest.approx((0.5714 + 0.4 + 0.6667) / 3)  # type: ignore[index]
    assert r["confusion_by_lang"]["zh"]["positive"] == {  # type: ignore[index]
        "positive": 1, "negative": 0, "neutral": 1, "mixed": 0, "error": 0}
    assert r["cut_or_looping_rate"] == 2 / 12  # row 3 cut by max_tokens, row 11 loops
    assert r["summary_in_language_rate"] == 10 / 11  # 11 summaries; the looping "？？？…" is not Chinese
    assert r["schema_valid_rate"] == 11 / 12 and r["error_rate"] == 1 / 12
    assert r["mean_tokens_out"] == pytest.approx(320 / 12)
    # Sorted tokens_out: 10 x 8, 20, 30, 62, 128; percentile q sits at q x 11 in that list, linearly interpolated
    # (65th: 7.15 -> 11.5 -> 12; 95th: 10.45 -> 62 + 0.45 x 66 = 91.7 -> 92).
    table = r["tokens_out_percentiles"]
    assert isinstance(table, list) and len(table) == 101  # a point a percent
    assert table[::5] == [10] * 13 + [12, 17, 22, 28, 41, 59, 92, 128]
    # 99th: 10.89 -> 62 + 0.89 x 66 = 120.7 -> 121
    assert table[90:] == [59, 63, 70, 77, 84, 92, 99, 106, 113, 121, 128]
    assert [x["source_id"] for x in r["slowest"]][:2] == ["r3", "r11"]  # type: ignore[index]


def test_eval_compare_prints_two_runs_side_by_side(tmp_path: Path) -> None:
    a = _report_of_hand_made_rows()
    b = {**a, "accuracy": 0.75, "prompt_version": "v4"}
    (tmp_path / "A.json").write_text(json.dumps(a))
    (tmp_path / "B.json").write_text("some log line\n" + json.dumps(b) + "\n")  # an --json output: its last line
    out = subprocess.run([sys.executable, "-m", "qwenspark.cli", "eval", "--compare", str(tmp_path / "A.json"),
                          str(tmp_path / "B.json")], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["accuracy"] == ["0.500", "0.750", "+0.250"]
    assert lines["prompt"] == ["v1", "v4"]
    assert lines["F1[en:neutral]"] == ["0.400", "0.400", "+0.000"]


def test_a_held_out_sample_shares_no_row_with_the_excluded_ones(tmp_path: Path) -> None:
    csv = tmp_path / "dev.csv"
    rows = [{"source_id": f"{lang}-{i}", "lang": lang, "text": "t", "rating": "", "label": "positive"}
            for lang in ("en", "zh") for i in range(100)]
    pd.DataFrame(rows).to_csv(csv, index=False)
    chosen = load_labelled(csv, 40, seed=3)
    assert chosen["lang"].value_counts().to_dict() == {"en": 20, "zh": 20}
    held_out = load_labelled(csv, 60, seed=5, exclude=[(40, 3)])
    assert held_out["lang"].value_counts().to_dict() == {"en": 30, "zh": 30}
    assert not set(held_out["source_id"]) & set(chosen["source_id"])
    assert load_labelled(csv, 60, seed=5).equals(load_labelled(csv, 60, seed=5, exclude=[]))  # same draw as before
    rest = load_labelled(csv, None, exclude=[(40, 3)])  # every row but the chosen ones
    assert len(rest) == 160 and set(held_out["source_id"]) <= set(rest["source_id"])
    assert not set(rest["source_id"]) & set(chosen["source_id"])


def test_mentions_scores_review_item_pairs_and_a_failed_answer_names_none() -> None:
    marked = [{"room", "service"}, {"noise"}, {"location"}]
    named = [{"room", "price/value"}, {"noise"}, None]
    got = scoring.mentions(marked, named)
    assert (got.precision, got.recall, got.support) == (round(2 / 3, 4), 0.5, 4)
    assert got.f1 == round(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5), 4)
