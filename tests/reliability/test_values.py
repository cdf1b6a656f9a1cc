"""No value the source can hold fails a run (issue 9, finding 1): every hostile class of each input column through the
batch job, the MySQL stream and the files stream, on real Spark + MariaDB with the echo engine. Each review ends as
exactly one result row (or one stream reject), its created_at exact, its error as designed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from qwenspark.config import EngineConfig, QwenSparkConfig
from qwenspark.engines.base import Completion, Message
from qwenspark.io import mysql
from qwenspark.io.stream_source import as_input_row, reject_json
from qwenspark.pipeline import run_batch
from qwenspark.stream import run_stream
from tests.spark.conftest import echo_records, query, recording, reset_tables, source_table
from tests.support.echo_engine import EchoEngine

pytestmark = pytest.mark.spark

WILD = "reviews_wild"
# A user's review table with room for what hotel_reviews would refuse: long hotel ids and language tags, NULL and
# zero dates, ratings beyond TINYINT.
WILD_DDL = f"""CREATE TABLE {WILD} (
  review_id BIGINT NOT NULL PRIMARY KEY, hotel_id VARCHAR(255) NULL, created_at DATETIME NULL, lang VARCHAR(64) NULL,
  rating INT NULL, text MEDIUMTEXT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"""
MIN_ID, MAX_ID = -(2**63), 2**63 - 1
HUGE = "The room was big and quiet. " * 40_000  # 1.1 MB: bounded by clean.max_chars, cut by tokens
SAME = object()  # expected output column: the input value as it came


@dataclass(frozen=True)
class Case:
    """One hostile source row and what its result row must hold (hotel_id, lang, error; created_at is exact)."""

    review_id: int
    hotel_id: str | None
    created_at: str | None  # inserted as text, with sql_mode='' (zero dates allowed)
    lang: str | None
    rating: int | None
    text: str | None
    hotel_out: object = SAME
    lang_out: object = SAME
    error: str | None = None
    seen: str | None = None  # the text the model must get (None: the input text)


DAY = "2026-03-01 10:00:00"
CASES = [
    Case(MIN_ID, "H1", DAY, "en", 5, "Lovely quiet room."),
    Case(-1, "H1", "2026-03-01 11:00:00", "EN", None, "Friendly staff.", lang_out="en"),
    Case(0, None, "2026-03-02 00:00:00", None, None, "Breakfast was cold."),
    Case(1, "", "1000-01-01 00:00:00", " Zh ", -5, "房间很干净。", lang_out="zh"),
    Case(2, "H2", "9999-12-31 23:59:59", "zh-Hans-CN", 1000, "服务很好。", lang_out="zh"),
    Case(3, "H2", None, "notalanguage", 2**31 - 1, "Nice pool.", lang_out=None),
    Case(4, "H2", "0000-00-00 00:00:00", "", -(2**31), "Clean.", lang_out=None),
    Case(5, "h" * 65, DAY, "en", None, "Great.", hotel_out=None,
         error="invalid: hotel_id longer than 64 characters"),
    Case(6, "酒" * 64, DAY, "en-GB-oxendict", None, "Great view.", lang_out="en"),
    Case(7, "H3", DAY, "en", None, None, error="empty: text is NULL"),
    Case(8, "H3", DAY, "en", None, HUGE),
    Case(9, "H3", DAY, "en", None, "Great\x00 stay\x07 here\r\nreally.", seen="Great stay here\nreally."),
    Case(10, "H3", "1970-01-01 00:00:00", None, None, "الفندق رائع"),
    Case(11, "H4", "2262-04-11 23:47:17", "hi", None, "होटल बहुत अच्छा था"),  # past pandas' nanosecond range
    Case(12, "H4", "1677-09-21 00:12:43", "th", None, "โรงแรมดีมาก"),  # before it
    Case(13, "H4", DAY, None, None, "👍👍"),
    Case(14, "H4", DAY, "ru", None, "Отличный отель"),
    Case(15, "H4", DAY, "en", None, "\u2003\u2028", error="empty: text is blank"),
]


def _out(case: Case, column: str) -> object:
    want = getattr(case, f"{column}_out")
    return getattr(case, "hotel_id" if column == "hotel" else column) if want is SAME else want


def _wild_cfg(cfg: QwenSparkConfig, cases: list[Case]) -> QwenSparkConfig:
    """cfg reading WILD, which holds exactly `cases` (the qwenspark tables emptied)."""
    reset_tables(cfg)
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {WILD}")
        cur.execute(WILD_DDL)
        cur.execute("SET SESSION sql_mode = ''")  # a table filled by a lax writer: zero dates and all
        cur.executemany(
            f"INSERT INTO {WILD} (review_id, hotel_id, created_at, lang, rating, text) VALUES (%s, %s, %s, %s, %s, %s)",
            [(c.review_id, c.hotel_id, c.created_at, c.lang, c.rating, c.text) for c in cases],
        )
    return source_table(cfg, WILD)


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_results(cfg: QwenSparkConfig, cases: list[Case], records: Path) -> None:
    """One result row per case, as designed; created_at exact; the model saw exactly the analysable reviews."""
    rows = query(cfg, "SELECT review_id, hotel_id, review_created_at, lang, error, sentiment, truncated"
                      " FROM review_sentiment ORDER BY review_id")
    assert [r[0] for r in rows] == sorted(c.review_id for c in cases), "exactly one result row per review"
    got = {r[0]: r for r in rows}
    source = dict(query(cfg, f"SELECT review_id, created_at FROM {WILD}"))
    for case in cases:
        _, hotel, created, lang, error, sentiment, _ = got[case.review_id]
        assert (hotel, lang, error) == (_out(case, "hotel"), _out(case, "lang"), case.error), case
        assert (error is None) == (sentiment is not None), case
        want = source[case.review_id] if case.created_at != "0000-00-00 00:00:00" else None
        assert created == want and (want is None or isinstance(want, datetime)), (case, created)
    assert got[8][6] == 1, "the huge review is analysed, cut by tokens"
    seen = {k for c in echo_records(records) for k in c["keys"]}
    analysable = [c for c in cases if c.error is None]
    assert sum(c["rows"] for c in echo_records(records)) == len(analysable), "error rows never reach the model"
    assert {_key(c.seen) for c in analysable if c.seen} <= seen
    assert _key("Great.") not in seen, "the row with an unstorable hotel_id is not analysed"


def test_hostile_values_through_the_batch_job(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    records = tmp_path / "echo"
    cfg = _wild_cfg(recording(echo_cfg, records), CASES)
    first = run_batch(spark, cfg)
    assert (first.status, first.rows_selected, first.rows_analysed) == ("succeeded", len(CASES), len(CASES))
    _check_results(cfg, CASES, records)
    # The aggregates hold the far dates too (and skip the rows whose hotel_id is NULL).
    days = query(cfg, "SELECT hotel_id, day FROM hotel_sentiment_daily WHERE day < '1900-01-01' OR day > '2200-01-01'"
                      " ORDER BY day")
    assert [(h, str(d)) for h, d in days] == [
        ("", "1000-01-01"), ("H4", "1677-09-21"), ("H4", "2262-04-11"), ("H2", "9999-12-31")
    ]
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0
    # Content errors are current: a second run analyses nothing.
    second = run_batch(spark, cfg)
    assert (second.status, second.rows_analysed, second.rows_skipped) == ("succeeded", 0, len(CASES))


def test_review_id_bigint_max_through_the_batch_job(spark: SparkSession, echo_cfg: QwenSparkConfig) -> None:
    # The JDBC read's upperBound was hi + 1: 9223372036854775808 failed every run that selected this row.
    cases = [Case(MAX_ID, "H1", DAY, "en", 5, "Quiet room."), Case(MIN_ID, "H1", DAY, "en", 1, "Rude.")]
    cfg = _wild_cfg(echo_cfg, cases)
    summary = run_batch(spark, cfg)
    assert (summary.status, summary.rows_analysed) == ("succeeded", 2)
    assert [r[0] for r in query(cfg, "SELECT review_id FROM review_sentiment ORDER BY 1")] == [MIN_ID, MAX_ID]


def _stream_cfg(cfg: QwenSparkConfig, tmp_path: Path, **stream: object) -> QwenSparkConfig:
    settings = {"checkpoint_location": str(tmp_path / "checkpoint"), "trigger_seconds": 1.0, "available_now": True,
                "keepalive_seconds": 0.0, "gap_wait_seconds": 0.0, "max_rows_per_batch": 64, **stream}
    return cfg.model_copy(update={"stream": cfg.stream.model_copy(update=settings)})


def test_hostile_values_through_the_mysql_stream(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    # The stream reads rows itself (a Python data source): zero dates, BIGINT min (its start offset is below
    # it) and ratings beyond TINYINT must not stop it.
    records = tmp_path / "echo"
    cfg = _stream_cfg(_wild_cfg(recording(echo_cfg, records), CASES), tmp_path)
    report = run_stream(spark, cfg)
    assert report.rows_in == len(CASES) and report.rows_rejected == 0
    _check_results(cfg, CASES, records)


def test_files_stream_rejects_what_does_not_fit_and_never_stops(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    cfg = _stream_cfg(echo_cfg, tmp_path, source="files", files_path=str(landing))
    reset_tables(cfg)
    base = {"hotel_id": "H1", "created_at": "2026-03-01 10:00:00", "lang": "en", "rating": 4}
    lines = [
        {**base, "review_id": 1, "text": "Fine room."},
        {**base, "review_id": 2, "hotel_id": "h" * 65, "text": "Too long an id."},
        {**base, "review_id": 3, "lang": "zh-Hans-CN", "text": "很好"},
        {**base, "review_id": 4, "created_at": "9999-12-31 23:59:59", "text": "Far future."},
        {**base, "review_id": 5, "created_at": "1000-01-01 00:00:00", "text": "Far past."},
        {**base, "review_id": 6, "rating": 10**12, "text": "Rating beyond INT."},
        {**base, "review_id": MAX_ID + 1, "text": "Id beyond BIGINT."},
        {**base, "review_id": 8, "created_at": "0000-00-00 00:00:00", "text": "Zero date."},
        {**base, "review_id": 9, "text": "Bad \x00 byte \x1b and \u2028 separators."},
        {**base, "review_id": MIN_ID, "text": "Smallest id."},
    ]
    body = "\n".join(json.dumps(line, ensure_ascii=False) for line in lines)
    # json.dumps cannot write a lone surrogate; JSON text can ("\ud800"), and producers do.
    body += '\n{"review_id": 10, "hotel_id": "H1", "created_at": "2026-03-01 10:00:00", "text": "half \\ud800 pair"}\n'
    (landing / "a.json").write_text(body, encoding="utf-8")

    report = run_stream(spark, cfg)
    rejects = {json.loads(raw).get("review_id"): reason
               for reason, raw in query(cfg, "SELECT reason, raw FROM stream_rejects")}
    results = {r[0]: r[1:] for r in query(cfg, "SELECT review_id, lang, review_created_at, error, summary"
                                                 " FROM review_sentiment")}
    assert report.rows_in == len(lines) + 1 == len(results) + len(rejects), (results, rejects)
    # What JSON cannot type (a rating or an id beyond its column, a zero date) is a malformed record, kept whole
    # (an id beyond BIGINT is not even read: its reject has none); an unstorable hotel_id is rejected by name.
    assert rejects == {2: "hotel_id longer than 64 characters", 6: "malformed record", 8: "malformed record",
                       None: "malformed record"}
    assert sorted(results) == [MIN_ID, 1, 3, 4, 5, 9, 10]
    assert all(r[2] is None for r in results.values()), results
    assert results[3][0] == "zh", "a long language tag is cut to its primary subtag, not rejected"
    assert results[4][1] == datetime(9999, 12, 31, 23, 59, 59) and results[5][1] == datetime(1000, 1, 1)
    assert results[9][3] == "Bad  byte  and \u2028 separators."
    assert results[10][3] == "half ? pair", "Spark's JSON reader turns a lone surrogate into '?'"


class BuggyEngine(EchoEngine):
    """The echo engine with a bug: generate raises TypeError, as a slip in our own code would."""

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None
    ) -> list[Completion]:
        raise TypeError("'NoneType' object is not subscriptable")


def build_buggy(cfg: EngineConfig) -> BuggyEngine:
    """engine.factory entry point (Spark's Python workers import it from the repo root)."""
    return BuggyEngine(cfg)


def test_a_bug_fails_the_run_instead_of_storing_error_rows(spark: SparkSession, echo_cfg: QwenSparkConfig) -> None:
    engine = echo_cfg.engine.model_copy(update={"factory": f"{__name__}:build_buggy", "model": "buggy"})
    cfg = _wild_cfg(echo_cfg.model_copy(update={"engine": engine}), CASES[:3])
    with pytest.raises(Exception, match="TypeError"):
        run_batch(spark, cfg)
    assert query(cfg, "SELECT status FROM job_runs") == [("failed",)]
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0] == 0, "no error row stored for a bug"


def test_stream_values_that_fit_no_column_become_null_and_rejects_stay_storable() -> None:
    # What the mysql stream source's read task yields from a user's table (mysql-connector's values): a zero date,
    # an out-of-INT rating, bytes and numbers in text columns. Before, any of them failed the task (and the stream).
    row = as_input_row((MIN_ID, 17, "0000-00-00 00:00:00", bytearray(b"en\xff"), 10**12, b"caf\xc3\xa9"))
    assert row == (MIN_ID, "17", None, "en\ufffd", None, "café")
    raw = reject_json({"review_id": 1, "text": "half \ud800 pair", "lang": "中文"})
    raw.encode("utf-8")  # storable in utf8mb4; the lone surrogate kept as its JSON escape
    assert json.loads(raw)["text"] == "half \ud800 pair"
