"""v006: per-language daily summaries for the dashboard, kept in step by the commit like the other aggregates."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 6
NAME = "dashboard summaries"

# The dashboard filters every chart by language over date ranges: the tables are clustered by day (primary key
# first column), with a secondary key for one hotel's history. lang is review_sentiment.lang, '' where it is NULL;
# hotel_id and lang compare exactly (the id collation, schema v002), as the commit's deltas group them (as bytes).
# No share columns: the dashboard sums counts over languages and days, and computes shares from the sums.
_LANG = ("VARCHAR(8) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
         " COMMENT 'review_sentiment.lang; empty = unknown (NULL)'")
_HOTEL = "VARCHAR(64) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
TABLES = {
    "sentiment_daily_lang": (
        "CREATE TABLE IF NOT EXISTS sentiment_daily_lang ("
        " day      DATE NOT NULL,"
        f" hotel_id {_HOTEL},"
        f" lang     {_LANG},"
        " reviews  INT  NOT NULL,"
        " analysed INT  NOT NULL COMMENT 'reviews with a result (reviews - errors)',"
        " positive INT  NOT NULL,"
        " negative INT  NOT NULL,"
        " neutral  INT  NOT NULL,"
        " mixed    INT  NOT NULL,"
        " errors   INT  NOT NULL,"
        " PRIMARY KEY (day, hotel_id, lang),"
        " KEY ix_sentiment_daily_lang_hotel (hotel_id, day)"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"
    ),
    "aspect_daily_lang": (
        "CREATE TABLE IF NOT EXISTS aspect_daily_lang ("
        " day      DATE        NOT NULL,"
        f" hotel_id {_HOTEL},"
        f" lang     {_LANG},"
        " aspect   VARCHAR(32) NOT NULL,"
        " mentions INT         NOT NULL,"
        " positive INT         NOT NULL,"
        " negative INT         NOT NULL,"
        " neutral  INT         NOT NULL,"
        " PRIMARY KEY (day, hotel_id, lang, aspect),"
        " KEY ix_aspect_daily_lang_hotel (hotel_id, day)"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"
    ),
}


def apply(m: Migrator) -> None:
    """Create the two tables and the index on review_created_at, then fill the tables from review_sentiment."""
    for ddl in TABLES.values():
        m.execute(ddl.format(collation=m.id_collation))
    # The dashboard lists the latest (negative) reviews by date.
    m.add_index("review_sentiment", "ix_review_sentiment_created", "review_created_at")
    # One transaction (as v002's recompute): the new tables hold every review or none. A migration that stopped
    # half-way runs this again: the section deletes what it filled before.
    m.execute("START TRANSACTION")
    m.script("recompute_aggregates.sql", "by_lang")
    m.execute("COMMIT")
