"""The clean stage on real Spark (its regexes are Java's): Unicode blanks, invisible characters, ids, lang, skip."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from qwenspark.clean import clean, skip_done
from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.schemas import INPUT_SCHEMA

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg() -> QwenSparkConfig:
    """conf/local.yaml as shipped; clean and skip_done read only the engine model, prompt, clean and job keys."""
    return load_config(ROOT / "conf" / "local.yaml", ["engine.default_model=false", "engine.model=m"])


def _cleaned(spark: SparkSession, cfg: QwenSparkConfig, rows: list[tuple[object, ...]]) -> dict[int, dict[str, object]]:
    """clean() over INPUT_SCHEMA rows -> {review_id: cleaned row as a dict}."""
    out = clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg).collect()
    return {int(r["review_id"]): r.asDict() for r in out}


# Text made of nothing a reader (or the model) could take as a review.
BLANKS = {
    "em spaces U+2003": "\u2003\u2003\u2003",
    "line separator U+2028": "\u2028",
    "medium math space U+205F": "\u205f\u205f",
    "ogham space U+1680": "\u1680",
    "thin spaces U+2009": "\u2009 \u2009",
    "ideographic space U+3000": "\u3000\u3000",
    "no-break and next-line": "\u00a0\u0085\u00a0",
    "control characters": "\x00\x01\x07\x1b\x7f",
    "format characters": "\u200b\ufeff\u2060\u202e\u200e",
    "tag characters": "\U000e0041\U000e0042",
    "hangul filler": "\u3164\u3164",
    "blank braille": "\u2800",
    "mixed invisible": "\t\n\r\u2003\x00\u200b\u2029",
}
NO_CONTENT = {"punctuation": "... !!! ???", "dashes and stops": "—。，、"}
CONTENT = {
    "emoji": "👍👍",
    "stars": "★★★★★",
    "digit": "10",
    "thai": "โรงแรมดีมาก",
    "arabic": "الفندق رائع",
    "devanagari": "होटल अच्छा था",
}


def test_unicode_blanks_and_junk_are_flagged_empty_and_content_in_any_script_is_kept(
    spark: SparkSession, cfg: QwenSparkConfig
) -> None:
    texts = [*BLANKS.values(), *NO_CONTENT.values(), *CONTENT.values()]
    rows = [(i, "H1", None, None, None, t) for i, t in enumerate(texts)]
    out = _cleaned(spark, cfg, rows)
    errors = {t: out[i]["clean_error"] for i, t in enumerate(texts)}
    for name, text in BLANKS.items():
        assert errors[text] == "empty: text is blank", name
    for name, text in NO_CONTENT.items():
        assert errors[text] == "empty: no letters, digits or symbols", name
    for name, text in CONTENT.items():
        assert errors[text] is None, name
        assert out[texts.index(text)]["text"] == text, f"{name}: content is kept as is"
    # input_key is the sha256 of the RAW text (with the model's identity, prompt version and lang: here none).
    raw = "\u2003\u2003\u2003"
    want = hashlib.sha256("\u001f".join([cfg.engine.model, cfg.prompt.version, "", raw]).encode()).hexdigest()
    assert out[texts.index(raw)]["input_key"] == want


def _keys(spark: SparkSession, cfg: QwenSparkConfig, rows: list[tuple[object, ...]]) -> list[str]:
    return [str(r["input_key"]) for r in clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg).orderBy("review_id")
            .collect()]


def test_input_key_follows_the_models_content_not_its_path_and_the_language(
    spark: SparkSession, cfg: QwenSparkConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QWENSPARK_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "checkout" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights" * 1000)
    rows: list[tuple[object, ...]] = [(1, "H", None, "en", None, "Good."), (2, "H", None, "zh", None, "Good."),
                                      (3, "H", None, " ZH-Hans-CN ", None, "Good.")]

    def keyed(path: Path) -> list[str]:
        engine = cfg.engine.model_copy(update={"model": str(path)})
        return _keys(spark, cfg.model_copy(update={"engine": engine}), rows)

    first = keyed(model)
    en, zh, zh_tag = first
    assert en != zh, "the language is part of the prompt, so of the key"
    assert zh == zh_tag, "a tag that normalises to the same language is the same prompt"
    moved = tmp_path / "moved-checkout" / "model"
    model.parent.rename(moved.parent)
    assert keyed(moved) == first, "moving the checkout re-analyses nothing"
    weights = moved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"X")
    assert set(keyed(moved)).isdisjoint(first), "new weights behind the same path re-analyse everything"


def test_invisible_characters_are_stripped_inside_and_blanks_at_the_edges(
    spark: SparkSession, cfg: QwenSparkConfig
) -> None:
    text = "\u2003\ufeff Great\x00 stay\x07,\u202e here\r\nreally\rquiet\troom 👨\u200d👩\u200d👧\u2028\u3000"
    out = _cleaned(spark, cfg, [(1, "H1", None, "en", 5, text)])[1]
    # \t and \n stay (layout), CR and CRLF become \n, ZWJ stays (it joins the family emoji); the rest goes.
    assert out["text"] == "Great stay, here\nreally\nquiet\troom 👨\u200d👩\u200d👧"
    assert out["clean_error"] is None


def test_hotel_id_too_long_for_the_result_column_is_a_row_error_and_lang_is_normalised(
    spark: SparkSession, cfg: QwenSparkConfig
) -> None:
    rows = [
        (1, "h" * 65, None, "en", None, "fine"),
        (2, "酒" * 64, None, "EN", None, "fine"),  # 64 characters fit VARCHAR(64), whatever their bytes
        (3, "", None, " Zh-Hans-CN ", None, "fine"),
        (4, None, None, "zh_Hant_TW", None, "fine"),
        (5, "H", None, "notalanguage", None, "fine"),
        (6, "H", None, "   ", None, "fine"),
        (7, "H", None, "en-GB", None, "fine"),
        (8, "H", None, None, None, "fine"),
    ]
    out = _cleaned(spark, cfg, rows)
    assert out[1]["clean_error"] == "invalid: hotel_id longer than 64 characters" and out[1]["hotel_id"] is None
    assert out[2]["clean_error"] is None and out[2]["hotel_id"] == "酒" * 64
    assert out[3]["hotel_id"] == "" and out[4]["hotel_id"] is None
    assert {i: out[i]["lang"] for i in out} == {
        1: "en", 2: "en", 3: "zh", 4: "zh", 5: None, 6: None, 7: "en-gb", 8: None
    }


def test_invalid_utf8_never_reaches_arrow(spark: SparkSession, cfg: QwenSparkConfig) -> None:
    # A Spark string may hold bytes that are not UTF-8 (a Parquet landing file, a cast from binary); Arrow's
    # conversion to Python would fail the whole task on them.
    df = spark.createDataFrame([(1, "H1", None, "en", None, "x")], INPUT_SCHEMA).withColumn(
        "text", F.concat(F.lit("good "), F.unhex(F.lit("C328")).cast("string"), F.lit(" room"))
    )
    row = clean(df, cfg).select(F.is_valid_utf8("text").alias("ok"), "text", "clean_error").first()
    assert row is not None and row["ok"] and row["clean_error"] is None
    assert row["text"].startswith("good ") and row["text"].endswith(" room")


DONE_SCHEMA = "review_id long, input_key string, error string, hotel_id string, review_created_at timestamp"


def _done(spark: SparkSession, rows: list[tuple[int, str, str | None]]) -> DataFrame:
    """jdbc.read_done's columns: stored results of hotel H, created_at NULL (as the cleaned rows below)."""
    return spark.createDataFrame([(*r, "H", None) for r in rows], DONE_SCHEMA)


@pytest.mark.parametrize("retry_errors", [False, True])
def test_skip_done_keeps_only_content_errors_as_current(
    spark: SparkSession, cfg: QwenSparkConfig, retry_errors: bool
) -> None:
    errors = {
        1: None,
        2: "empty: text is blank",
        3: "invalid: hotel_id longer than 64 characters",
        4: "prompt: RequestError: too long",
        5: "parse: not JSON (Expecting value at 0): 'I think'",
        6: "engine: connection: ConnectError: refused",  # an outage: never current
        7: "engine refused the request: the server was busy",
        8: "engine: HTTP 401 after 3 retries",
    }
    cleaned = clean(spark.createDataFrame([(i, "H", None, "en", None, "ok") for i in errors], INPUT_SCHEMA), cfg)
    keys = {int(r["review_id"]): r["input_key"] for r in cleaned.collect()}
    done = _done(spark, [(i, keys[i], e) for i, e in errors.items()] + [(9, "stale key", None)])
    job = cfg.job.model_copy(update={"retry_errors": retry_errors})
    todo = sorted(int(r["review_id"]) for r in skip_done(cleaned, done, cfg.model_copy(update={"job": job})).collect())
    assert todo == ([2, 3, 4, 5, 6, 7, 8] if retry_errors else [6, 7, 8])


def test_skip_done_analyses_a_review_moved_to_another_hotel_or_day(spark: SparkSession, cfg: QwenSparkConfig) -> None:
    """Same text, but the review was edited into another hotel (an exact id: case counts) or day: not current."""
    day = datetime(2026, 11, 2, 10, 0)
    hotels = {1: "H1", 2: "H1", 3: "H1", 4: "h1", 5: None}
    cleaned = clean(spark.createDataFrame([(i, h, day, "en", None, "ok") for i, h in hotels.items()], INPUT_SCHEMA),
                    cfg)
    keys = {int(r["review_id"]): r["input_key"] for r in cleaned.collect()}
    stored = {1: ("H1", day), 2: ("H2", day), 3: ("H1", day - timedelta(days=1)), 4: ("H1", day), 5: (None, day)}
    done = spark.createDataFrame([(i, keys[i], None, h, at) for i, (h, at) in stored.items()], DONE_SCHEMA)
    todo = sorted(int(r["review_id"]) for r in skip_done(cleaned, done, cfg).collect())
    assert todo == [2, 3, 4], "1 and 5 (a NULL hotel both sides) are current; 2, 3 and 4 moved"
