"""Committing a run's staged rows (issues 8 and 16): duplicate staged copies, chunked transactions, a crash
between chunks, the aggregates kept equal to the recompute of earlier releases, the per-language summaries of schema
v006 kept equal to sql/recompute_aggregates.sql and to the totals, and the old staging layout.

Real MariaDB (the `mariadb` fixture); rows are staged with mysql-connector directly, as Spark's JDBC append
would, except in the one test that drives jdbc.write_stage.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from qwenspark.config import QwenSparkConfig
from qwenspark.errors import SinkError
from qwenspark.io import migrate, mysql
from qwenspark.pipeline import RunSummary, _commit, _mark_failed
from qwenspark.schemas import ASPECT_SENTIMENTS, ASPECTS, SENTIMENTS, STAGE_SCHEMA
from tests.spark.conftest import assert_consistent, query, reset_tables, snapshot

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
STAGE_COLUMNS = STAGE_SCHEMA.fieldNames()
JOB = "sink-test"

# sql/upsert.sql as released before chunked commits (one transaction, aggregates recomputed for the touched keys):
# the reference the new commit must match, table for table (PREVIOUS_TABLES) and in rows changed.
PREVIOUS_UPSERT_SQL = """\
-- The (hotel, day) keys this run touches: where its reviews are now and where they were before.
CREATE TEMPORARY TABLE IF NOT EXISTS tmp_touched_keys (hotel_id VARCHAR(64) NOT NULL, day DATE NOT NULL,
  PRIMARY KEY (hotel_id, day));
DELETE FROM tmp_touched_keys;
INSERT IGNORE INTO tmp_touched_keys
SELECT DISTINCT hotel_id, DATE(review_created_at) FROM review_sentiment_stage
WHERE run_id = %(run_id)s AND hotel_id IS NOT NULL AND review_created_at IS NOT NULL;
INSERT IGNORE INTO tmp_touched_keys
SELECT DISTINCT r.hotel_id, DATE(r.review_created_at) FROM review_sentiment r
JOIN review_sentiment_stage s ON s.review_id = r.review_id AND s.run_id = %(run_id)s
WHERE r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL;

-- The upsert: VALUES() works on MySQL 8 and MariaDB alike. Identical values count as 0 changed rows.
INSERT INTO review_sentiment (
  review_id, hotel_id, review_created_at, lang, input_key, sentiment, summary, aspects, truncated, error,
  model, prompt_version, tokens_in, tokens_out, latency_ms, analysed_at, run_id)
SELECT review_id, hotel_id, review_created_at, lang, input_key, sentiment, summary, aspects, truncated, error,
  model, prompt_version, tokens_in, tokens_out, latency_ms, analysed_at, run_id
FROM review_sentiment_stage WHERE run_id = %(run_id)s
ON DUPLICATE KEY UPDATE
  hotel_id = VALUES(hotel_id), review_created_at = VALUES(review_created_at), lang = VALUES(lang),
  input_key = VALUES(input_key), sentiment = VALUES(sentiment), summary = VALUES(summary),
  aspects = VALUES(aspects), truncated = VALUES(truncated), error = VALUES(error), model = VALUES(model),
  prompt_version = VALUES(prompt_version), tokens_in = VALUES(tokens_in), tokens_out = VALUES(tokens_out),
  latency_ms = VALUES(latency_ms), analysed_at = VALUES(analysed_at), run_id = VALUES(run_id);

-- Per hotel and day: recomputed from review_sentiment for the touched keys only.
INSERT INTO hotel_sentiment_daily (hotel_id, day, reviews, analysed, positive, negative, neutral, mixed, errors,
  share_positive, share_negative, share_neutral, share_mixed)
SELECT hotel_id, day, reviews, analysed, positive, negative, neutral, mixed, errors,
  positive / NULLIF(analysed, 0), negative / NULLIF(analysed, 0), neutral / NULLIF(analysed, 0),
  mixed / NULLIF(analysed, 0)
FROM (
  SELECT r.hotel_id, DATE(r.review_created_at) AS day, COUNT(*) AS reviews, SUM(r.error IS NULL) AS analysed,
    SUM(r.sentiment <=> 'positive') AS positive, SUM(r.sentiment <=> 'negative') AS negative,
    SUM(r.sentiment <=> 'neutral') AS neutral, SUM(r.sentiment <=> 'mixed') AS mixed, SUM(r.error IS NOT NULL) AS errors
  FROM review_sentiment r
  JOIN tmp_touched_keys k ON k.hotel_id = r.hotel_id AND r.review_created_at >= k.day
    AND r.review_created_at < k.day + INTERVAL 1 DAY
  GROUP BY r.hotel_id, DATE(r.review_created_at)
) agg
ON DUPLICATE KEY UPDATE reviews = VALUES(reviews), analysed = VALUES(analysed), positive = VALUES(positive),
  negative = VALUES(negative), neutral = VALUES(neutral), mixed = VALUES(mixed), errors = VALUES(errors),
  share_positive = VALUES(share_positive), share_negative = VALUES(share_negative),
  share_neutral = VALUES(share_neutral), share_mixed = VALUES(share_mixed);

-- Keys whose reviews all moved elsewhere.
DELETE d FROM hotel_sentiment_daily d JOIN tmp_touched_keys k ON k.hotel_id = d.hotel_id AND k.day = d.day
WHERE NOT EXISTS (SELECT 1 FROM review_sentiment r WHERE r.hotel_id = d.hotel_id
  AND r.review_created_at >= d.day AND r.review_created_at < d.day + INTERVAL 1 DAY);

-- Per hotel, day and aspect, from the aspects JSON of each analysed review.
CREATE TEMPORARY TABLE IF NOT EXISTS tmp_aspects (hotel_id VARCHAR(64) NOT NULL, day DATE NOT NULL,
  aspect VARCHAR(32) NOT NULL, mentions INT NOT NULL, positive INT NOT NULL, negative INT NOT NULL,
  neutral INT NOT NULL, PRIMARY KEY (hotel_id, day, aspect));
DELETE FROM tmp_aspects;
INSERT INTO tmp_aspects
SELECT r.hotel_id, DATE(r.review_created_at), jt.aspect, COUNT(*), SUM(jt.sentiment <=> 'positive'),
  SUM(jt.sentiment <=> 'negative'), SUM(jt.sentiment <=> 'neutral')
FROM review_sentiment r
JOIN tmp_touched_keys k ON k.hotel_id = r.hotel_id AND r.review_created_at >= k.day
  AND r.review_created_at < k.day + INTERVAL 1 DAY
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), jt.aspect;
DELETE a FROM aspect_sentiment a JOIN tmp_touched_keys k ON k.hotel_id = a.hotel_id AND k.day = a.day
WHERE NOT EXISTS (SELECT 1 FROM tmp_aspects t WHERE t.hotel_id = a.hotel_id AND t.day = a.day AND t.aspect = a.aspect);
INSERT INTO aspect_sentiment (hotel_id, day, aspect, mentions, positive, negative, neutral, share_positive,
  share_negative)
SELECT hotel_id, day, aspect, mentions, positive, negative, neutral, positive / mentions, negative / mentions
FROM tmp_aspects
ON DUPLICATE KEY UPDATE mentions = VALUES(mentions), positive = VALUES(positive), negative = VALUES(negative),
  neutral = VALUES(neutral), share_positive = VALUES(share_positive), share_negative = VALUES(share_negative);

-- The staged rows are spent.
DELETE FROM review_sentiment_stage WHERE run_id = %(run_id)s;
"""

# The tables PREVIOUS_UPSERT_SQL writes (the per-language summaries of schema v006 came later).
PREVIOUS_TABLES = ("review_sentiment", "hotel_sentiment_daily", "aspect_sentiment")

# The layout of review_sentiment_stage before stage_seq: a retried Spark write task failed on its primary key.
OLD_STAGE_DDL = """\
CREATE TABLE review_sentiment_stage (
  run_id            CHAR(36)     NOT NULL,
  review_id         BIGINT       NOT NULL,
  hotel_id          VARCHAR(64)  NULL,
  review_created_at DATETIME     NULL,
  lang              VARCHAR(8)   NULL,
  input_key         CHAR(64)     NOT NULL,
  sentiment         VARCHAR(16)  NULL,
  summary           VARCHAR(400) NULL,
  aspects           TEXT         NULL,
  truncated         BOOLEAN      NOT NULL,
  error             TEXT         NULL,
  model             VARCHAR(255) NOT NULL,
  prompt_version    VARCHAR(32)  NOT NULL,
  tokens_in         INT          NOT NULL,
  tokens_out        INT          NOT NULL,
  latency_ms        INT          NOT NULL,
  analysed_at       DATETIME(3)  NOT NULL,
  PRIMARY KEY (run_id, review_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"""

Row = dict[str, object]


# ---------------------------------------------------------------------------------------------------- helpers


def _result(rng: random.Random, review_id: int, *, hotels: int = 6, days: int = 5) -> Row:
    """A plausible analysis result (sometimes an error, no hotel or no date; aspects of every shape)."""
    error = rng.random() < 0.08
    aspects: object
    if error:
        aspects = None if rng.random() < 0.7 else []
    else:
        picks = rng.sample(ASPECTS, rng.randint(0, 4))
        if picks and rng.random() < 0.1:
            picks.append(picks[0])  # the same aspect twice in one review counts twice
        aspects = [{"aspect": a, "sentiment": rng.choice(ASPECT_SENTIMENTS)} for a in picks]
    created = datetime(2026, 11, 1) + timedelta(days=rng.randrange(days), minutes=rng.randrange(1440))
    return {
        "review_id": review_id,
        "hotel_id": None if rng.random() < 0.03 else f"H{rng.randrange(hotels):02d}",
        "review_created_at": None if rng.random() < 0.03 else created,
        "lang": rng.choice(["zh", "en", None]),
        "input_key": f"{rng.getrandbits(256):064x}",
        "sentiment": None if error else rng.choice(SENTIMENTS),
        "summary": None if error else f"summary {rng.randrange(10**6)} ",  # trailing blank: a byte that counts
        "aspects": None if aspects is None else json.dumps(aspects, separators=(",", ":")),
        "truncated": rng.random() < 0.1,
        "error": "parse: not JSON" if error else None,
        "model": "tiny",
        "prompt_version": "v1",
        "tokens_in": rng.randrange(50, 900),
        "tokens_out": rng.randrange(5, 200),
        "latency_ms": rng.randrange(10, 5000),
        "analysed_at": datetime(2026, 11, 30, 12) + timedelta(milliseconds=rng.randrange(10**7)),
    }


def _changed(rng: random.Random, row: Row) -> Row:
    """row re-analysed: some fields change (label, aspects, error, even the hotel or the day)."""
    new = {**_result(rng, int(row["review_id"])), "hotel_id": row["hotel_id"]}  # type: ignore[call-overload]
    new["review_created_at"] = row["review_created_at"]
    if rng.random() < 0.3:
        new["hotel_id"] = f"H{rng.randrange(6):02d}"
    if rng.random() < 0.3 and row["review_created_at"] is not None:
        new["review_created_at"] = row["review_created_at"] + timedelta(days=1)  # type: ignore[operator]
    if rng.random() < 0.2:  # only the summary changes: the row changes, the aggregates do not
        new = {**row, "summary": f"{row['summary']}!"}
    return new


def _stage(cfg: QwenSparkConfig, run_id: str, rows: Iterable[Row]) -> None:
    """Append rows to review_sentiment_stage as Spark's JDBC writer does (one INSERT per batch, own columns)."""
    cols = ", ".join(STAGE_COLUMNS)
    marks = ", ".join(["%s"] * len(STAGE_COLUMNS))
    values = [tuple(run_id if c == "run_id" else row[c] for c in STAGE_COLUMNS) for row in rows]
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        sql = f"INSERT INTO review_sentiment_stage ({cols}) VALUES ({marks})"
        for start in range(0, len(values), 500):
            cur.executemany(sql, values[start : start + 500])


def _start_run(cfg: QwenSparkConfig, run_id: str) -> None:
    mysql.insert_run(
        cfg.db,
        {"run_id": run_id, "job": JOB, "status": "running", "config_hash": "0" * 16, "model": "tiny",
         "prompt_version": "v1", "started_at": datetime(2026, 11, 30)},
    )


def _commit_run(cfg: QwenSparkConfig, run_id: str, reviews: int, chunk_rows: int) -> RunSummary:
    """pipeline._commit for a run that analysed `reviews` reviews, committed in chunks of chunk_rows."""
    cfg = cfg.model_copy(update={"sink": cfg.sink.model_copy(update={"commit_chunk_rows": chunk_rows})})
    summary = RunSummary(run_id=run_id, rows_analysed=reviews)
    _commit(cfg, summary, time.perf_counter(), None)
    return summary


def _previous_commit(cfg: QwenSparkConfig, run_id: str) -> int:
    """The commit of earlier releases (PREVIOUS_UPSERT_SQL in one transaction); rows changed as it counted them."""
    with mysql.connect(cfg.db) as conn:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM review_sentiment_stage s LEFT JOIN review_sentiment r"
                " ON r.review_id = s.review_id WHERE s.run_id = %s AND r.review_id IS NULL",
                (run_id,),
            )
            (new_rows,) = cur.fetchone()
        script = PREVIOUS_UPSERT_SQL
        counts = dict(zip(mysql.statements(script), mysql.run_script(conn, script, {"run_id": run_id}), strict=True))
        conn.commit()
    affected = next(n for stmt, n in counts.items() if stmt.startswith("INSERT INTO review_sentiment ("))
    return int(new_rows) + (affected - int(new_rows)) // 2


def _recomputed(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    """The aggregates as PREVIOUS_UPSERT_SQL's statements compute them from review_sentiment, for every key
    (recomputed in a transaction that is rolled back)."""
    refresh = [s for s in mysql.statements(PREVIOUS_UPSERT_SQL)
               if not s.startswith(("INSERT INTO review_sentiment (", "DELETE FROM review_sentiment_stage",
                                    "INSERT IGNORE INTO tmp_touched_keys"))]
    with mysql.connect(cfg.db) as conn, conn.cursor() as cur:
        cur.execute(refresh[0])  # CREATE TEMPORARY TABLE tmp_touched_keys
        cur.execute("DELETE FROM tmp_touched_keys")
        for source in ("SELECT hotel_id, DATE(review_created_at) FROM review_sentiment"
                       " WHERE hotel_id IS NOT NULL AND review_created_at IS NOT NULL",
                       "SELECT hotel_id, day FROM hotel_sentiment_daily", "SELECT hotel_id, day FROM aspect_sentiment"):
            cur.execute(f"INSERT IGNORE INTO tmp_touched_keys {source}")
        for stmt in refresh[2:]:
            cur.execute(stmt)
        tables = {t: _rows(cur, t) for t in ("hotel_sentiment_daily", "aspect_sentiment")}
        conn.rollback()
    return tables


def _rows(cur: object, table: str) -> list[tuple[object, ...]]:
    cur.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3")  # type: ignore[attr-defined]
    return list(cur.fetchall())  # type: ignore[attr-defined]


def _aggregates(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    return {t: query(cfg, f"SELECT * FROM {t} ORDER BY 1, 2, 3") for t in ("hotel_sentiment_daily", "aspect_sentiment")}


def _assert_consistent(cfg: QwenSparkConfig) -> None:
    """The aggregates are what a full recompute from review_sentiment gives (and not empty): the two of earlier
    releases as those releases computed them, every aggregate (the per-language summaries too) as
    sql/recompute_aggregates.sql does."""
    got = _aggregates(cfg)
    assert got["hotel_sentiment_daily"], "no aggregates at all"
    assert got == _recomputed(cfg)
    assert_consistent(cfg)


def _stored(cfg: QwenSparkConfig) -> dict[int, tuple[object, ...]]:
    cols = ", ".join(c for c in STAGE_COLUMNS if c != "run_id")
    return {int(r[0]): tuple(r) for r in query(cfg, f"SELECT {cols} FROM review_sentiment ORDER BY review_id")}


def _expected(rows: Sequence[Row]) -> dict[int, tuple[object, ...]]:
    """review_id -> the row that must be stored (the last of rows for each review), as review_sentiment returns it."""
    cols = [c for c in STAGE_COLUMNS if c != "run_id"]
    out = {}
    for row in rows:
        out[int(row["review_id"])] = tuple(int(row[c]) if c == "truncated" else row[c] for c in cols)
    return out


def _run_status(cfg: QwenSparkConfig, run_id: str) -> tuple[object, ...]:
    return query(cfg, f"SELECT status, rows_changed, rows_analysed, message FROM job_runs WHERE run_id = '{run_id}'")[0]


def _staged(cfg: QwenSparkConfig, run_id: str | None = None) -> int:
    where = f" WHERE run_id = '{run_id}'" if run_id else ""
    return int(query(cfg, f"SELECT COUNT(*) FROM review_sentiment_stage{where}")[0][0])


# ---------------------------------------------------------------------------------------------------- tests


def test_duplicate_staged_copies_commit_each_review_once(
    tiny_cfg: QwenSparkConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A write task retried after a partial write staged some reviews twice: the latest copy of each is kept."""
    reset_tables(tiny_cfg)
    rng = random.Random(8)
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    first = [_result(rng, i) for i in range(1, 41)]
    retried = [_changed(rng, r) for r in first[10:25]]  # the retry re-analysed (and re-staged) 15 of them
    _stage(tiny_cfg, run_id, first)
    _stage(tiny_cfg, run_id, retried)  # today: IntegrityError on PRIMARY KEY (run_id, review_id)
    assert _staged(tiny_cfg, run_id) == 55

    with caplog.at_level(logging.INFO):
        summary = _commit_run(tiny_cfg, run_id, reviews=40, chunk_rows=50_000)

    latest = first[:10] + retried + first[25:]
    assert _stored(tiny_cfg) == _expected(latest)
    assert summary.status == "succeeded"
    assert summary.rows_changed == 40
    assert summary.rows_ok == sum(r["error"] is None for r in latest)
    assert summary.tokens_in == sum(int(r["tokens_in"]) for r in latest)  # type: ignore[call-overload]
    assert _run_status(tiny_cfg, run_id)[:3] == ("succeeded", 40, 40)
    assert _staged(tiny_cfg) == 0
    assert "15 staged rows are older copies" in caplog.text
    assert "15 duplicate staged rows dropped" in caplog.text
    _assert_consistent(tiny_cfg)


def test_reconciliation_counts_distinct_reviews(tiny_cfg: QwenSparkConfig) -> None:
    reset_tables(tiny_cfg)
    rng = random.Random(9)
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    rows = [_result(rng, i) for i in range(1, 11)]
    _stage(tiny_cfg, run_id, [*rows, *rows[:3]])  # 13 staged rows, 10 reviews
    with pytest.raises(SinkError, match="11 rows in, 10 reviews staged \\(13 rows, 3 duplicates\\)"):
        _commit_run(tiny_cfg, run_id, reviews=11, chunk_rows=50_000)
    assert query(tiny_cfg, "SELECT COUNT(*) FROM review_sentiment") == [(0,)]


def _scenario(rng: random.Random, n: int) -> tuple[list[Row], list[Row]]:
    """Two runs: n reviews, then a second run that re-analyses about half of them and adds n // 4 new ones."""
    first = [_result(rng, i) for i in range(1, n + 1)]
    second = [_changed(rng, r) for r in first if rng.random() < 0.5]
    second += [_result(rng, i) for i in range(n + 1, n + 1 + n // 4)]
    rng.shuffle(second)
    return first, second


@pytest.mark.parametrize("n, chunk_rows", [(3_000, 700)])
def test_aggregates_and_rows_changed_equal_the_previous_commit(
    tiny_cfg: QwenSparkConfig, n: int, chunk_rows: int
) -> None:
    """Same tables and rows changed as the one-transaction commit of earlier releases, run by run and on a replay."""
    first, second = _scenario(random.Random(16), n)
    runs = [(str(uuid.uuid4()), first), (str(uuid.uuid4()), second)]

    def play(commit: object) -> tuple[list[int], dict[str, list[tuple[object, ...]]]]:
        reset_tables(tiny_cfg)
        changed = []
        for i, (run_id, rows) in enumerate([*runs, runs[1]]):  # the last: a replay of the second run (same id)
            if i < 2:
                _start_run(tiny_cfg, run_id)
            else:  # the replayed run is running again (a committed run refuses a second 'succeeded')
                with mysql.connect(tiny_cfg.db, autocommit=True) as conn, conn.cursor() as cur:
                    cur.execute("UPDATE job_runs SET status = 'running' WHERE run_id = %s", (run_id,))
            _stage(tiny_cfg, run_id, rows)
            changed.append(commit(run_id, len(rows)))  # type: ignore[operator]
        return changed, snapshot(tiny_cfg)

    before_changed, before = play(lambda run_id, _: _previous_commit(tiny_cfg, run_id))
    after_changed, after = play(lambda run_id, k: _commit_run(tiny_cfg, run_id, k, chunk_rows).rows_changed)

    assert after_changed == before_changed
    assert after_changed[0] == n and after_changed[2] == 0  # the replay changes nothing
    assert after_changed[1] == len(second)  # every review of the second run has a new run_id at least
    for table in PREVIOUS_TABLES:
        assert after[table] == before[table], table
    _assert_consistent(tiny_cfg)


def test_chunked_commit_equals_one_chunk(tiny_cfg: QwenSparkConfig) -> None:
    """commit_chunk_rows=7 on ~50 rows (duplicates included) gives the tables and rows changed of one chunk."""
    rng = random.Random(3)
    first, second = _scenario(rng, 40)
    dupes = [_changed(rng, r) for r in second[:6]]  # staged again by a retried task: these copies are the latest

    def play(chunk_rows: int) -> tuple[list[int], dict[str, list[tuple[object, ...]]]]:
        reset_tables(tiny_cfg)
        changed = []
        for run_id, rows in ((f"run-1-{chunk_rows}", first), (f"run-2-{chunk_rows}", second + dupes)):
            _start_run(tiny_cfg, run_id)
            _stage(tiny_cfg, run_id, rows)
            reviews = len({int(r["review_id"]) for r in rows})  # type: ignore[call-overload]
            changed.append(_commit_run(tiny_cfg, run_id, reviews, chunk_rows).rows_changed)
            assert _run_status(tiny_cfg, run_id)[0] == "succeeded"
        _assert_consistent(tiny_cfg)
        tables = snapshot(tiny_cfg)
        # run_id, input_seq (schema v003) last: run ids differ by design
        tables["review_sentiment"] = [r[:-2] for r in tables["review_sentiment"]]
        return changed, tables

    assert len(second + dupes) > 7 * 5  # several chunks
    assert play(7) == play(50_000)
    assert _stored(tiny_cfg) == _expected(first + second + dupes)


DAY = datetime(2026, 11, 2, 9)
_COUNTS = "reviews, analysed, positive, negative, neutral, mixed, errors"
_MENTIONS = "mentions, positive, negative, neutral"


def _review(review_id: int, lang: str | None, sentiment: str | None, aspects: Sequence[tuple[str, str]] = (),
            hotel: str = "H01") -> Row:
    """One result of hotel on DAY: sentiment None is an error row (no aspects counted)."""
    row = _result(random.Random(review_id), review_id)
    return {**row, "hotel_id": hotel, "review_created_at": DAY + timedelta(minutes=review_id), "lang": lang,
            "sentiment": sentiment, "summary": None if sentiment is None else f"review {review_id}",
            "error": "parse: not JSON" if sentiment is None else None,
            "aspects": None if sentiment is None else json.dumps([{"aspect": a, "sentiment": s} for a, s in aspects])}


Counts = tuple[int, ...]


def _per_lang(cfg: QwenSparkConfig, hotel: str) -> tuple[dict[str, Counts], dict[tuple[str, str], Counts]]:
    """hotel's rows on DAY of sentiment_daily_lang (lang -> counts) and aspect_daily_lang ((lang, aspect) -> counts)."""
    where = f"WHERE day = '{DAY.date()}' AND hotel_id = '{hotel}'"
    daily = query(cfg, f"SELECT lang, {_COUNTS} FROM sentiment_daily_lang {where}")
    aspects = query(cfg, f"SELECT lang, aspect, {_MENTIONS} FROM aspect_daily_lang {where}")
    return ({str(r[0]): tuple(int(v) for v in r[1:]) for r in daily},  # type: ignore[call-overload]
            {(str(r[0]), str(r[1])): tuple(int(v) for v in r[2:]) for r in aspects})  # type: ignore[call-overload]


def _assert_lang_sums_equal_totals(cfg: QwenSparkConfig) -> None:
    """Summed over lang, the per-language summaries are hotel_sentiment_daily and aspect_sentiment, key for key."""
    for per_lang, total, keys, counts in (
        ("sentiment_daily_lang", "hotel_sentiment_daily", "day, hotel_id", _COUNTS),
        ("aspect_daily_lang", "aspect_sentiment", "day, hotel_id, aspect", _MENTIONS),
    ):
        sums = ", ".join(f"SUM({c})" for c in counts.split(", "))
        n = len(keys.split(", "))
        summed = query(cfg, f"SELECT {keys}, {sums} FROM {per_lang} GROUP BY {keys} ORDER BY {keys}")
        totals = query(cfg, f"SELECT {keys}, {counts} FROM {total} ORDER BY {keys}")
        assert [(*r[:n], *(int(v) for v in r[n:])) for r in summed] == totals, per_lang  # type: ignore[call-overload]
        assert totals, total


def test_per_language_summaries_follow_the_commit(tiny_cfg: QwenSparkConfig) -> None:
    """Schema v006: reviews of one hotel and day in two languages and one without: a row per language ('' for NULL)
    in sentiment_daily_lang and aspect_daily_lang, summing to hotel_sentiment_daily and aspect_sentiment; a later run
    that changes a review's language and sentiment moves its counts (the old language's row decremented, or
    deleted when nothing is left in it)."""
    reset_tables(tiny_cfg)
    first = [
        _review(1, "en", "positive", [("room", "positive"), ("service", "negative")]),
        _review(2, "en", "negative", [("room", "negative")]),
        _review(3, "zh", "positive", [("service", "positive")]),
        _review(4, None, "mixed", [("room", "neutral")]),
        _review(5, "zh", None),  # an error: counted in reviews and errors of its language
        _review(6, "en", "positive", [("room", "positive")], hotel="H02"),
    ]
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    _stage(tiny_cfg, run_id, first)
    assert _commit_run(tiny_cfg, run_id, len(first), chunk_rows=2).rows_changed == 6

    daily, aspects = _per_lang(tiny_cfg, "H01")
    #                 reviews analysed pos neg neu mix err
    assert daily == {"en": (2, 2, 1, 1, 0, 0, 0), "zh": (2, 1, 1, 0, 0, 0, 1), "": (1, 1, 0, 0, 0, 1, 0)}
    #                                       mentions pos neg neu
    assert aspects == {("en", "room"): (2, 1, 1, 0), ("en", "service"): (1, 0, 1, 0),
                       ("zh", "service"): (1, 1, 0, 0), ("", "room"): (1, 0, 0, 1)}
    assert _per_lang(tiny_cfg, "H02") == ({"en": (1, 1, 1, 0, 0, 0, 0)}, {("en", "room"): (1, 1, 0, 0)})
    assert query(tiny_cfg, f"SELECT {_COUNTS} FROM hotel_sentiment_daily WHERE hotel_id = 'H01'") == [
        (5, 4, 2, 1, 0, 1, 1)]
    _assert_lang_sums_equal_totals(tiny_cfg)
    _assert_consistent(tiny_cfg)

    # Review 1 turns out Chinese and negative, review 4 gets its language: 'en' loses one, '' loses its only one.
    second = [_review(1, "zh", "negative", [("room", "negative")]), _review(4, "en", "mixed", [("room", "neutral")])]
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    _stage(tiny_cfg, run_id, second)
    assert _commit_run(tiny_cfg, run_id, len(second), chunk_rows=50_000).rows_changed == 2

    daily, aspects = _per_lang(tiny_cfg, "H01")
    assert daily == {"en": (2, 2, 0, 1, 0, 1, 0), "zh": (3, 2, 1, 1, 0, 0, 1)}
    assert aspects == {("en", "room"): (2, 0, 1, 1), ("zh", "room"): (1, 0, 1, 0), ("zh", "service"): (1, 1, 0, 0)}
    assert query(tiny_cfg, f"SELECT {_COUNTS} FROM hotel_sentiment_daily WHERE hotel_id = 'H01'") == [
        (5, 4, 1, 2, 0, 1, 1)]
    _assert_lang_sums_equal_totals(tiny_cfg)
    _assert_consistent(tiny_cfg)


def test_plan_keeps_every_copy_of_a_review_in_one_chunk(tiny_cfg: QwenSparkConfig) -> None:
    reset_tables(tiny_cfg)
    rng = random.Random(5)
    run_id = str(uuid.uuid4())
    rows = [_result(rng, i) for i in (1, 2, 3, 4, 5, 6)]
    _stage(tiny_cfg, run_id, [*rows, *[rows[2]] * 4, rows[5]])  # review 3 five times, review 6 twice
    with mysql.connect(tiny_cfg.db) as conn:
        chunks = mysql.plan_chunks(conn, run_id, 3)
    lo, hi = mysql.MIN_REVIEW_ID, mysql.MAX_REVIEW_ID
    # staged in key order: 1 2 | 3 3 3 3 3 | 4 5 | 6 6: at most 3 rows a chunk, except review 3 alone (5 copies)
    assert chunks == [(lo, 2), (3, 3), (4, 5), (6, hi)]
    with mysql.connect(tiny_cfg.db) as conn:
        assert mysql.plan_chunks(conn, "no-such-run", 3) == [(lo, hi)]


def test_failure_between_chunks_then_rerun(tiny_cfg: QwenSparkConfig, tmp_path: Path) -> None:
    """The driver dies after two chunks committed: they stay, each review once, the aggregates match them; the
    run stays 'running' until abandoned; a rerun (the reviews that are not current) lands every review once."""
    reset_tables(tiny_cfg)
    rng = random.Random(21)
    rows = [_result(rng, i) for i in range(1, 51)]
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    _stage(tiny_cfg, run_id, rows)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(tiny_cfg.model_dump_json(), encoding="utf-8")
    code = (
        "import sys, time\n"
        "from qwenspark.config import QwenSparkConfig\n"
        "from qwenspark.pipeline import RunSummary, _commit\n"
        "cfg = QwenSparkConfig.model_validate_json(open(sys.argv[1]).read())\n"
        "cfg = cfg.model_copy(update={'sink': cfg.sink.model_copy(update={'commit_chunk_rows': 7})})\n"
        "_commit(cfg, RunSummary(run_id=sys.argv[2], rows_analysed=50), time.perf_counter(), None)\n"
    )
    env = {**os.environ, "QWENSPARK_FAILPOINT": "sink.between_chunks:2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code, str(cfg_file), run_id], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert "failpoint sink.between_chunks:2 reached" in proc.stderr

    stored = _stored(tiny_cfg)
    committed = sorted(stored)
    # Whole chunks of 7 reviews (2, or 3 when the other worker's commit came first), the rest still staged.
    assert len(committed) in (14, 21) and len(committed) + _staged(tiny_cfg, run_id) == 50
    assert stored == {k: v for k, v in _expected(rows).items() if k in stored}
    _assert_consistent(tiny_cfg)
    assert _run_status(tiny_cfg, run_id)[0] == "running"

    assert mysql.abandon_runs(tiny_cfg.db, JOB) == 1
    assert _run_status(tiny_cfg, run_id)[0] == "failed"
    assert _staged(tiny_cfg) == 0
    assert _stored(tiny_cfg) == stored  # abandoning keeps what committed

    rerun = str(uuid.uuid4())  # skip_done: the committed reviews are current, the rerun analyses the rest
    _start_run(tiny_cfg, rerun)
    rest = [r for r in rows if r["review_id"] not in stored]
    _stage(tiny_cfg, rerun, rest)
    summary = _commit_run(tiny_cfg, rerun, len(rest), chunk_rows=7)
    assert summary.rows_changed == len(rest)
    assert _stored(tiny_cfg) == _expected(rows)
    assert query(tiny_cfg, "SELECT COUNT(*), COUNT(DISTINCT review_id) FROM review_sentiment") == [(50, 50)]
    assert query(tiny_cfg, f"SELECT COUNT(*) FROM review_sentiment WHERE run_id = '{run_id}'") == [(len(stored),)]
    _assert_consistent(tiny_cfg)
    assert _staged(tiny_cfg) == 0


def test_error_in_a_later_chunk_marks_the_run_failed(
    tiny_cfg: QwenSparkConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in the 4th chunk: the 3 chunks before it stay committed, the run is failed, nothing stays staged."""
    reset_tables(tiny_cfg)
    rng = random.Random(22)
    rows = [_result(rng, i) for i in range(1, 51)]
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    _stage(tiny_cfg, run_id, rows)
    real = mysql.commit_chunk
    calls = {"n": 0}

    def flaky(*args: object, **kwargs: object) -> int:
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mysql, "commit_chunk", flaky)
    monkeypatch.setattr(mysql, "COMMIT_WORKERS", 1)  # one worker: exactly the 3 chunks before commit
    cfg = tiny_cfg.model_copy(update={"sink": tiny_cfg.sink.model_copy(update={"commit_chunk_rows": 7})})
    summary = RunSummary(run_id=run_id, rows_analysed=50)
    with pytest.raises(RuntimeError, match="disk full"):
        _commit(cfg, summary, time.perf_counter(), None)
    summary.status = "failed"
    _mark_failed(cfg, summary, RuntimeError("disk full"))

    assert sorted(_stored(tiny_cfg)) == list(range(1, 22))
    status, changed, _, message = _run_status(tiny_cfg, run_id)
    assert (status, changed) == ("failed", 21)
    assert "disk full" in str(message) and "21 rows" in str(message)
    assert _staged(tiny_cfg) == 0
    _assert_consistent(tiny_cfg)


def test_a_chunk_rolled_back_by_a_deadlock_is_tried_again(
    tiny_cfg: QwenSparkConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks committing side by side may deadlock on shared aggregate rows: InnoDB rolls one back, it runs again."""
    reset_tables(tiny_cfg)
    rng = random.Random(23)
    rows = [_result(rng, i) for i in range(1, 31)]
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    _stage(tiny_cfg, run_id, rows)
    real = mysql.commit_chunk
    calls = itertools.count(1)  # next() is atomic: two workers call this

    def deadlocked_once(conn: object, *args: object, **kwargs: object) -> int:
        call = next(calls)
        changed = real(conn, *args, **kwargs)  # type: ignore[arg-type]
        if call == 2:  # all its statements ran: the rollback must undo them
            raise mysql.mysql.connector.errors.DatabaseError(msg="Deadlock found (injected)", errno=1213)
        return changed

    monkeypatch.setattr(mysql, "commit_chunk", deadlocked_once)
    summary = _commit_run(tiny_cfg, run_id, 30, chunk_rows=7)
    assert next(calls) == 7  # 5 chunks, one of them twice
    assert summary.rows_changed == 30
    assert _stored(tiny_cfg) == _expected(rows)
    _assert_consistent(tiny_cfg)


def _stage_layout(cfg: QwenSparkConfig) -> tuple[list[str], list[str]]:
    cols = [r[0] for r in query(cfg, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
                                     " DATABASE() AND TABLE_NAME = 'review_sentiment_stage' ORDER BY ORDINAL_POSITION")]
    pk = [r[0] for r in query(cfg, "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA ="
                                   " DATABASE() AND TABLE_NAME = 'review_sentiment_stage' AND CONSTRAINT_NAME ="
                                   " 'PRIMARY' ORDER BY ORDINAL_POSITION")]
    return [str(c) for c in cols], [str(c) for c in pk]


@pytest.mark.parametrize("staged_before", [0, 12])
def test_old_stage_layout_is_migrated(tiny_cfg: QwenSparkConfig, staged_before: int) -> None:
    """init-db on a database of an unversioned release (schema v001) upgrades a stage table with the old primary
    key: recreated when empty, altered (rows kept) when it holds rows; then a review staged twice commits once."""
    reset_tables(tiny_cfg)
    rng = random.Random(staged_before)
    run_id = str(uuid.uuid4())
    rows = [_result(rng, i) for i in range(1, 13)]
    with mysql.connect(tiny_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("DROP TABLE review_sentiment_stage")
        cur.execute(OLD_STAGE_DDL)
        cur.execute(f"DROP TABLE {migrate.SCHEMA_TABLE}")  # as released before schema versions
    if staged_before:
        _stage(tiny_cfg, run_id, rows)
    assert _stage_layout(tiny_cfg)[1] == ["run_id", "review_id"]

    migrate.migrate(tiny_cfg.db)
    cols, pk = _stage_layout(tiny_cfg)
    assert cols == [*STAGE_COLUMNS, "stage_seq"]
    assert pk == ["run_id", "review_id", "stage_seq"]
    assert _staged(tiny_cfg, run_id) == staged_before
    migrate.migrate(tiny_cfg.db)  # idempotent
    assert _stage_layout(tiny_cfg) == (cols, pk)

    _start_run(tiny_cfg, run_id)
    if not staged_before:
        _stage(tiny_cfg, run_id, rows)
    again = _changed(rng, rows[0])
    _stage(tiny_cfg, run_id, [again])  # a duplicate (run_id, review_id): accepted now, and the latest copy
    summary = _commit_run(tiny_cfg, run_id, 12, chunk_rows=5)
    assert summary.rows_changed == 12
    assert _stored(tiny_cfg) == _expected([*rows, again])
    _assert_consistent(tiny_cfg)


def test_retried_stage_write_is_accepted(spark: object, tiny_cfg: QwenSparkConfig) -> None:
    """jdbc.write_stage appending a run's rows again (a retried write task) no longer fails; the commit keeps one."""
    from pyspark.sql import SparkSession

    from qwenspark.io import jdbc

    assert isinstance(spark, SparkSession)
    reset_tables(tiny_cfg)
    rng = random.Random(30)
    run_id = str(uuid.uuid4())
    _start_run(tiny_cfg, run_id)
    rows = [_result(rng, i) for i in range(1, 31)]
    df = spark.createDataFrame([tuple(run_id if c == "run_id" else r[c] for c in STAGE_COLUMNS) for r in rows],
                               STAGE_SCHEMA)
    cfg = tiny_cfg.model_copy(update={"sink": tiny_cfg.sink.model_copy(update={"isolation_level": "NONE"})})
    jdbc.write_stage(df, cfg)
    jdbc.write_stage(df.where("review_id <= 12"), cfg)  # the rows a failed attempt had committed, written again
    assert _staged(tiny_cfg, run_id) == 42
    summary = _commit_run(cfg, run_id, 30, chunk_rows=50_000)
    assert summary.rows_changed == 30
    assert _stored(tiny_cfg) == _expected(rows)
    _assert_consistent(tiny_cfg)
