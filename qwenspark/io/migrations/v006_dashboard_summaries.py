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


def summary_tables(period: str) -> dict[str, str]:
    """The DDL of the two summaries per `period` ('day': v006's daily tables; 'month': v007's rollups, month = its
    first day), keyed by table name."""
    per = {"day": "daily", "month": "monthly"}[period]
    return {
        f"sentiment_{per}_lang": (
            f"CREATE TABLE IF NOT EXISTS sentiment_{per}_lang ("
            f" {period} DATE NOT NULL,"
            f" hotel_id {_HOTEL},"
            f" lang     {_LANG},"
            " reviews  INT  NOT NULL,"
            " analysed INT  NOT NULL COMMENT 'reviews with a result (reviews - errors)',"
            " positive INT  NOT NULL,"
            " negative INT  NOT NULL,"
            " neutral  INT  NOT NULL,"
            " mixed    INT  NOT NULL,"
            " errors   INT  NOT NULL,"
            f" PRIMARY KEY ({period}, hotel_id, lang),"
            f" KEY ix_sentiment_{per}_lang_hotel (hotel_id, {period})"
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"
        ),
        f"aspect_{per}_lang": (
            f"CREATE TABLE IF NOT EXISTS aspect_{per}_lang ("
            f" {period} DATE        NOT NULL,"
            f" hotel_id {_HOTEL},"
            f" lang     {_LANG},"
            " aspect   VARCHAR(32) NOT NULL,"
            " mentions INT         NOT NULL,"
            " positive INT         NOT NULL,"
            " negative INT         NOT NULL,"
            " neutral  INT         NOT NULL,"
            f" PRIMARY KEY ({period}, hotel_id, lang, aspect),"
            f" KEY ix_aspect_{per}_lang_hotel (hotel_id, {period})"
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"
        ),
    }


TABLES = summary_tables("day")


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
