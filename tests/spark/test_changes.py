"""Changing data between nightly runs (issue 10, finding 2), on real Spark and MariaDB with the echo engine: the
window on hotel_reviews.updated_at (schema v004) catches edits and late inserts, and the purge of deleted reviews
takes their results and their share of the aggregates away; the upgrade to v004 of a table that holds reviews."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.errors import SourceError
from qwenspark.io import jdbc, migrate, mysql
from qwenspark.pipeline import run_batch
from tests.spark.conftest import ROOT, aggregates, load_reviews, query, recomputed, reset_tables, snapshot

pytestmark = pytest.mark.spark

NIGHT1 = ("2026-11-02 00:00:00", "2026-11-03 00:00:00")
STAMP1 = "2026-11-02 12:00:00"  # updated_at of every review before the first night's run
EDITED, RATED, MOVED, LATE, ALONE = 4, 7, 10, 13, 12
DELETED = (5, 6, 9, ALONE)  # with chunks of 2 rows the purge takes three transactions (5 6 | 9 12 | none)
NEGATIVE_TEXT = "Filthy bathroom and rude staff at night."


def _reviews() -> pd.DataFrame:
    """12 reviews of hotels H0-H2 over two days (review 12 alone in hotel H9: its aggregate rows must go)."""
    ids = range(1, 13)
    return pd.DataFrame(
        {
            "review_id": list(ids),
            "hotel_id": ["H9" if i == ALONE else f"H{i % 3}" for i in ids],
            "created_at": [f"2026-11-0{1 + i % 2} 10:00:00" for i in ids],
            "lang": "en",
            "rating": "",
            # the echo engine labels by keywords: these are positive, the edit below makes review 4 negative
            "text": [f"Quiet room and kind staff, stay number {i}." for i in ids],
        }
    )


def _nightly(cfg: QwenSparkConfig, start: object, end: object) -> QwenSparkConfig:
    """cfg as the nightly DAG runs it: the window on updated_at, deleted reviews purged; small commit chunks."""
    source = {**cfg.source.model_dump(), "window_column": "updated_at", "created_from": start, "created_until": end}
    return cfg.model_copy(update={
        "source": type(cfg.source).model_validate(source),
        "job": cfg.job.model_copy(update={"purge_deleted": True}),
        "sink": cfg.sink.model_copy(update={"commit_chunk_rows": 2}),
    })






def _daily(cfg: QwenSparkConfig) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(hotel, day) -> (reviews, positive, negative) of hotel_sentiment_daily."""
    rows = query(cfg, "SELECT hotel_id, day, reviews, positive, negative FROM hotel_sentiment_daily")
    return {(str(h), str(d)): (int(n), int(p), int(q)) for h, d, n, p, q in rows}


def _db_now(cfg: QwenSparkConfig) -> datetime:
    return query(cfg, "SELECT UTC_TIMESTAMP(3)")[0][0]  # type: ignore[return-value]


def test_edits_late_inserts_and_deletes_between_nightly_runs(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    reset_tables(echo_cfg)
    load_reviews(echo_cfg, _reviews(), tmp_path)
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE hotel_reviews SET updated_at = '{STAMP1}'")  # explicit: the night's window holds them

    first = run_batch(spark, _nightly(echo_cfg, *NIGHT1))
    assert (first.status, first.rows_selected, first.rows_analysed, first.rows_changed, first.rows_purged) == (
        "succeeded", 12, 12, 12, 0)
    before = _daily(echo_cfg)
    assert before[("H9", "2026-11-01")] == (1, 1, 0)
    assert aggregates(echo_cfg) == recomputed(echo_cfg)
    key_before = query(echo_cfg, f"SELECT input_key FROM review_sentiment WHERE review_id = {EDITED}")[0][0]

    # Between the nights: an edit of the text, an edit of the rating only, a review moved to another hotel (same
    # text), a late insert with an old created_at, four deletes. Nobody sets updated_at: the DDL does.
    t0 = _db_now(echo_cfg)
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("UPDATE hotel_reviews SET text = %s WHERE review_id = %s", (NEGATIVE_TEXT, EDITED))
        cur.execute("UPDATE hotel_reviews SET rating = 2 WHERE review_id = %s", (RATED,))
        cur.execute("UPDATE hotel_reviews SET hotel_id = 'H2' WHERE review_id = %s", (MOVED,))
        cur.execute(
            "INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
            " VALUES (%s, 'H0', '2026-10-15 09:00:00', 'en', 1, 'Noisy street, no sleep.')", (LATE,))
        cur.execute(f"DELETE FROM hotel_reviews WHERE review_id IN ({', '.join(map(str, DELETED))})")
    stamps = dict(query(echo_cfg, "SELECT review_id, updated_at FROM hotel_reviews"))
    assert {r for r, at in stamps.items() if at >= t0} == {EDITED, RATED, MOVED, LATE}
    assert {str(at) for r, at in stamps.items() if r not in (EDITED, RATED, MOVED, LATE)} == {STAMP1}
    t1 = _db_now(echo_cfg) + timedelta(seconds=1)

    night2 = _nightly(echo_cfg, t0, t1)
    # The created_at window of earlier releases, over the same night, never sees the late insert (nor the edits).
    by_created = night2.model_copy(update={"source": night2.source.model_copy(update={"window_column": "created_at"})})
    assert jdbc.id_bounds(by_created)[2] == 0
    assert jdbc.id_bounds(night2) == (EDITED, LATE, 4)

    second = run_batch(spark, night2)
    assert (second.status, second.rows_selected, second.rows_skipped, second.rows_analysed) == ("succeeded", 4, 1, 3)
    assert (second.rows_changed, second.rows_purged) == (3, len(DELETED))
    stored = {int(r[0]): r[1:] for r in query(
        echo_cfg, "SELECT review_id, sentiment, summary, input_key, hotel_id, review_created_at FROM review_sentiment")}
    assert sorted(stored) == sorted({*range(1, 14)} - set(DELETED)), "deleted reviews' results are gone"
    assert stored[EDITED][:2] == ("negative", NEGATIVE_TEXT) and stored[EDITED][2] != key_before, "re-analysed"
    assert stored[LATE][0] == "negative" and str(stored[LATE][4]) == "2026-10-15 09:00:00"
    assert stored[MOVED][3] == "H2", "a review moved to another hotel is written again under it"
    runs = query(echo_cfg, "SELECT rows_changed, rows_purged FROM job_runs WHERE status = 'succeeded'"
                           " ORDER BY started_at")
    assert [tuple(r) for r in runs] == [(12, 0), (3, len(DELETED))]

    # The aggregates: what a full recompute gives, and these changes exactly.
    assert aggregates(echo_cfg) == recomputed(echo_cfg)
    after = _daily(echo_cfg)
    assert ("H9", "2026-11-01") not in after, "a key left without reviews is deleted"
    assert not query(echo_cfg, "SELECT 1 FROM aspect_sentiment WHERE hotel_id = 'H9'")
    assert after[("H0", "2026-10-15")] == (1, 0, 1), "the late review counts on its own (old) day"
    expected = dict(before)
    del expected[("H9", "2026-11-01")]
    for rid in DELETED[:-1]:  # 5, 6, 9: H2 11-02, H0 11-01, H0 11-02
        key = (f"H{rid % 3}", f"2026-11-0{1 + rid % 2}")
        n, p, q = expected[key]
        expected[key] = (n - 1, p - 1, q)
    n, p, q = expected[("H1", "2026-11-01")]  # review 4: positive -> negative; review 10: moved to H2
    expected[("H1", "2026-11-01")] = (n - 1, p - 2, q + 1)
    n, p, q = expected[("H2", "2026-11-01")]
    expected[("H2", "2026-11-01")] = (n + 1, p + 1, q)
    expected[("H0", "2026-10-15")] = (1, 0, 1)
    assert after == {k: v for k, v in expected.items() if v[0]}
    assert sum(v[0] for v in after.values()) == 13 - len(DELETED)

    # The same night again: nothing to analyse, nothing to purge, nothing changes.
    held = snapshot(echo_cfg)
    third = run_batch(spark, night2)
    assert (third.rows_selected, third.rows_analysed, third.rows_changed, third.rows_purged) == (4, 0, 0, 0)
    assert snapshot(echo_cfg) == held

    # `qwenspark purge-deleted`, bounded by source.max_id, then not: two more deletes, one purge each.
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM hotel_reviews WHERE review_id IN (1, 11)")
    config = tmp_path / "purge.yaml"
    config.write_text(yaml.safe_dump(echo_cfg.model_dump(mode="json")), encoding="utf-8")
    for bound, left in (("source.max_id=5", 8), ("source.max_id=null", 7)):  # 9 results: 1 goes, then 11
        out = subprocess.run([sys.executable, "-m", "qwenspark.cli", "purge-deleted", "--config", str(config),
                              "--set", bound], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stderr
        assert "1 result(s) of reviews no longer in hotel_reviews removed" in out.stdout
        assert query(echo_cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0] == left
    assert aggregates(echo_cfg) == recomputed(echo_cfg)
    assert sum(v[0] for v in _daily(echo_cfg).values()) == 13 - len(DELETED) - 2


def test_updated_at_window_is_half_open(echo_cfg: QwenSparkConfig, tmp_path: Path) -> None:
    """The window machinery of created_at (UTC literals, half-open, offsets converted) on updated_at."""
    reset_tables(echo_cfg)
    load_reviews(echo_cfg, _reviews().head(5), tmp_path)
    stamps = {1: "2026-11-01 23:59:59.999", 2: "2026-11-02 00:00:00", 3: "2026-11-02 15:59:59.999",
              4: "2026-11-02 16:00:00", 5: "2026-11-03 00:00:00"}
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        for rid, at in stamps.items():
            cur.execute("UPDATE hotel_reviews SET updated_at = %s WHERE review_id = %s", (at, rid))
    assert jdbc.id_bounds(_nightly(echo_cfg, "2026-11-02", "2026-11-03")) == (2, 4, 3)
    # 2026-11-03T00:00+08:00 is 2026-11-02 16:00 UTC
    assert jdbc.id_bounds(_nightly(echo_cfg, "2026-11-02", "2026-11-03T00:00:00+08:00")) == (2, 3, 2)


def test_upgrade_to_v004_keeps_reviews_and_selects_them_once(echo_cfg: QwenSparkConfig, tmp_path: Path) -> None:
    """A database at v002 with reviews in it: init-db adds updated_at (stamped with the upgrade's time, so the next
    nightly window re-checks every existing review), its index and job_runs.rows_purged; nothing is lost."""
    reset_tables(echo_cfg)
    load_reviews(echo_cfg, _reviews(), tmp_path)
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:  # back to v002's tables
        cur.execute("ALTER TABLE hotel_reviews DROP INDEX ix_hotel_reviews_updated, DROP COLUMN updated_at")
        cur.execute("ALTER TABLE job_runs DROP COLUMN rows_purged")
        cur.execute(f"DELETE FROM {migrate.SCHEMA_TABLE} WHERE version = 4")
    rows = "SELECT review_id, hotel_id, created_at, lang, rating, text FROM hotel_reviews ORDER BY review_id"
    held = query(echo_cfg, rows)
    assert len(held) == 12
    with pytest.raises(migrate.SchemaVersionError, match="init-db"):
        migrate.require_current(echo_cfg.db)
    night = _nightly(echo_cfg, "2026-11-02", "2026-11-03")
    with pytest.raises(SourceError, match=r"no column updated_at .*init-db"):
        jdbc.id_bounds(night)

    t0 = _db_now(echo_cfg)
    assert migrate.migrate(echo_cfg.db) == [4]
    t1 = _db_now(echo_cfg)
    migrate.require_current(echo_cfg.db)
    assert query(echo_cfg, rows) == held, "the upgrade keeps every review as it was"
    stamps = {at for (at,) in query(echo_cfg, "SELECT updated_at FROM hotel_reviews")}
    assert len(stamps) == 1 and t0 <= next(iter(stamps)) <= t1
    assert jdbc.id_bounds(_nightly(echo_cfg, t0, t1 + timedelta(seconds=1))) == (1, 12, 12)
    col = query(echo_cfg, "SELECT COLUMN_DEFAULT, EXTRA, IS_NULLABLE FROM information_schema.COLUMNS WHERE"
                          " TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'hotel_reviews' AND COLUMN_NAME = 'updated_at'")
    assert "current_timestamp(3)" in str(col[0][0]).lower() and "on update current_timestamp(3)" in str(
        col[0][1]).lower() and col[0][2] == "NO"
    assert query(echo_cfg, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()"
                           " AND TABLE_NAME = 'hotel_reviews' AND INDEX_NAME = 'ix_hotel_reviews_updated'")[0][0] == 1
    assert migrate.migrate(echo_cfg.db) == []  # idempotent


def test_purge_waits_for_the_commit_lock_and_chunks(echo_cfg: QwenSparkConfig) -> None:
    """A purge never runs inside another writer's commit: it waits for the commit lock (one chunk at a time)."""
    import threading

    reset_tables(echo_cfg)
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO review_sentiment (review_id, hotel_id, review_created_at, input_key, sentiment, aspects,"
            " truncated, model, prompt_version, tokens_in, tokens_out, latency_ms, analysed_at, run_id) VALUES"
            " (%s, 'H1', '2026-11-02 10:00:00', 'k', 'positive', %s, 0, 'echo', 'v1', 1, 1, 1, UTC_TIMESTAMP(3), 'r')",
            [(i, '[{"aspect": "room", "sentiment": "positive"}]') for i in range(1, 8)])
        cur.execute("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, text) VALUES (3, 'H1', NOW(), 'x')")
        mysql.run_script(conn, mysql.sql_text("recompute_aggregates.sql"))
    assert _daily(echo_cfg) == {("H1", "2026-11-02"): (7, 7, 0)}
    done: list[int] = []
    with mysql.connect(echo_cfg.db, autocommit=True) as holder, holder.cursor() as cur:
        cur.execute("SELECT GET_LOCK(%s, 0)", (mysql.commit_lock_name(echo_cfg.db),))
        assert cur.fetchone()[0] == 1
        purge = threading.Thread(target=lambda: done.append(
            mysql.purge_deleted(echo_cfg.db, echo_cfg.source, chunk_rows=2)))
        purge.start()
        purge.join(2.0)
        assert purge.is_alive() and not done, "the purge waits while another writer holds the commit lock"
        assert query(echo_cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0] == 7
        cur.execute("SELECT RELEASE_LOCK(%s)", (mysql.commit_lock_name(echo_cfg.db),))
        cur.fetchall()
    purge.join(60)
    assert done == [6], "every result but review 3's, in chunks of 2"
    assert [r[0] for r in query(echo_cfg, "SELECT review_id FROM review_sentiment")] == [3]
    assert _daily(echo_cfg) == {("H1", "2026-11-02"): (1, 1, 0)}
    assert query(echo_cfg, "SELECT aspect, mentions, positive FROM aspect_sentiment") == [("room", 1, 1)]
    assert aggregates(echo_cfg) == recomputed(echo_cfg)
