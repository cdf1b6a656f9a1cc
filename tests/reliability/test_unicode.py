"""Unicode whitespace and junk never reach the model (issue 9, finding 4): through the batch job on real Spark +
MariaDB, the echo engine's own call records show what the model was handed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.pipeline import run_batch
from tests.spark.conftest import echo_records, query, recording, reset_tables

pytestmark = pytest.mark.spark

# Each was stored `neutral` with invented aspects before (Spark's \s is ASCII-only), one with the blank as summary.
BLANK = {
    "U+2003 em spaces": "\u2003\u2003",
    "U+2028 line separator": "\u2028",
    "U+205F medium math space": "\u205f\u205f\u205f",
    "U+1680 ogham space": "\u1680",
    "U+2009 thin spaces": "\u2009\u2009",
    "U+3000 and U+00A0": "\u3000\u00a0",
    "U+0085 and U+2029": "\u0085\u2029",
    "control characters": "\x01\x02\x07\x1b\x7f\x9f",
    "NUL bytes": "\x00\x00",
    "format characters": "\u200b\ufeff\u2060\u202e",
    "hangul fillers": "\u3164\u3164",
    "blank braille": "\u2800\u2800",
    "all of them": "\u2003\x00\u2028\u200b\t\u3164\n\u1680",
}
NO_CONTENT = {"punctuation": "?!?! ...", "combining marks": "\u0301\u0301", "currency and math": "$$ += <>"}
# Content, and the text the model must be handed for it.
CONTENT = {
    "a review": ("Lovely room, kind staff.", "Lovely room, kind staff."),
    "a review in blanks": ("\u2003\u2028Great stay\x00 here\u205f\u3000", "Great stay here"),
    "emoji only": ("👍👍", "👍👍"),
    "stars only": ("★★★★☆", "★★★★☆"),
    "chinese": ("\u3000房间很干净\u3000", "房间很干净"),
}


def _insert(cfg: QwenSparkConfig, texts: list[str]) -> None:
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
            " VALUES (%s, 'H1', '2026-03-01 10:00:00', NULL, NULL, %s)",
            list(enumerate(texts, start=1)),
        )


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def test_blank_and_junk_reviews_get_empty_without_the_model(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    records = tmp_path / "echo"
    cfg = recording(echo_cfg, records)
    reset_tables(cfg)
    cases = [*BLANK.items(), *NO_CONTENT.items(), *((name, raw) for name, (raw, _) in CONTENT.items())]
    _insert(cfg, [text for _, text in cases])

    summary = run_batch(spark, cfg)
    assert (summary.status, summary.rows_analysed) == ("succeeded", len(cases))
    got = {r[0]: r[1:] for r in query(cfg, "SELECT review_id, error, sentiment, summary FROM review_sentiment")}
    assert sorted(got) == list(range(1, len(cases) + 1)), "exactly one result row per review"
    for review_id, (name, _) in enumerate(cases, start=1):
        error, sentiment, text = got[review_id]
        if name in BLANK:
            assert (error, sentiment) == ("empty: text is blank", None), name
        elif name in NO_CONTENT:
            assert (error, sentiment) == ("empty: no letters, digits or symbols", None), name
        else:
            assert error is None and sentiment is not None, name
            assert text == CONTENT[name][1], f"{name}: the echo engine's summary is the text it was handed"
    # The engine's own record: it was handed exactly the reviews with content, cleaned, each once.
    calls = echo_records(records)
    assert sum(c["rows"] for c in calls) == len(CONTENT)
    assert sorted(k for c in calls for k in c["keys"]) == sorted(_key(seen) for _, seen in CONTENT.values())
