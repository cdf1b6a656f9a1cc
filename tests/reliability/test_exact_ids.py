"""Hotel ids are identifiers (issue 10, finding 3): ids that a case-, width- or pad-blind collation takes as one
('H01', 'h01', 'H01 ', full-width 'Ｈ０１', two different emoji) stay six hotels through a real batch run, in the
aggregate tables and in the dashboard's views."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.pipeline import run_batch
from tests.spark.conftest import as_owner, query, reset_tables

pytestmark = pytest.mark.spark

# Under utf8mb4_unicode_ci (the schema before v002) these are one key: case and width fold, trailing spaces pad,
# and every emoji (a supplementary character) weighs the same.
IDS = ["H01", "h01", "H01 ", "Ｈ０１", "🏨", "🏩"]
NEGATIVE_IDS = {"h01", "🏩"}  # one review each that the echo engine labels negative ("rude")


def test_ids_differing_by_case_width_trailing_space_or_emoji_stay_apart(
    spark: SparkSession, echo_cfg: QwenSparkConfig
) -> None:
    reset_tables(echo_cfg)
    rows = []
    for n, hotel in enumerate(IDS):
        rows.append((10 * n + 1, hotel, "Lovely quiet stay, great service."))
        rows.append((10 * n + 2, hotel, "Rude staff at the desk." if hotel in NEGATIVE_IDS else "Great service."))
    with mysql.connect(echo_cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
                        " VALUES (%s, %s, '2026-11-29 12:00:00', 'en', NULL, %s)", rows)
    summary = run_batch(spark, echo_cfg)
    assert (summary.status, summary.rows_analysed, summary.rows_error) == ("succeeded", 12, 0)

    stored = query(echo_cfg, "SELECT hotel_id, COUNT(*) FROM review_sentiment GROUP BY hotel_id")
    assert sorted(stored) == sorted((h, 2) for h in IDS), "each result keeps its id byte for byte"
    daily = query(echo_cfg, "SELECT hotel_id, day, reviews, positive, negative FROM hotel_sentiment_daily")
    assert len(daily) == 6, daily
    want = {h: (2, 1, 1) if h in NEGATIVE_IDS else (2, 2, 0) for h in IDS}
    assert {h: (int(r), int(p), int(n)) for h, _, r, p, n in daily} == want
    assert {str(d) for _, d, *_ in daily} == {"2026-11-29"}
    aspects = query(echo_cfg, "SELECT hotel_id, mentions FROM aspect_sentiment WHERE aspect = 'service'")
    assert sorted(aspects) == sorted((h, 2) for h in IDS)

    # The dashboard's views group by hotel_id too.
    dashboard = as_owner(echo_cfg)  # the views are the dashboard's: the job's account may not read them
    hotels = query(dashboard, "SELECT hotel_id, reviews, negative FROM v_hotel_sentiment")
    assert sorted((h, int(r), int(n)) for h, r, n in hotels) == sorted((h, 2, want[h][2]) for h in IDS)
    radar = query(dashboard, "SELECT hotel_id, mentions FROM v_aspect_sentiment WHERE aspect = 'service'")
    assert sorted((h, int(m)) for h, m in radar) == sorted((h, 2) for h in IDS)
    # Exact lookups: one id selects its own row only (no folding, no padding).
    with mysql.connect(echo_cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        for hotel in IDS:
            cur.execute("SELECT COUNT(*) FROM hotel_sentiment_daily WHERE hotel_id = %s", (hotel,))
            assert cur.fetchone() == (1,), hotel
    # A rerun changes nothing: every review is current under its own id.
    again = run_batch(spark, echo_cfg)
    assert (again.rows_analysed, again.rows_changed) == (0, 0)
    assert len(query(echo_cfg, "SELECT * FROM hotel_sentiment_daily")) == 6

