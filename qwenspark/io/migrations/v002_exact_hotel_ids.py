"""v002: hotel ids compare exactly (binary, no pad); the aggregates that case-blind keys merged are rebuilt."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 2
NAME = "exact hotel ids"

# (table, NULL or NOT NULL): every hotel_id column. Under utf8mb4_unicode_ci 'H01', 'h01', 'H01 ' and 'Ｈ０１' were one
# key; ids are identifiers, and a dashboard must not add two hotels together.
COLUMNS = [
    ("hotel_reviews", "NOT NULL"),
    ("review_sentiment", "NULL"),
    ("review_sentiment_stage", "NULL"),
    ("hotel_sentiment_daily", "NOT NULL"),
    ("aspect_sentiment", "NOT NULL"),
]


def apply(m: Migrator) -> None:
    """Change the collation of every hotel_id column, then recompute the aggregates from review_sentiment."""
    for table, null in COLUMNS:
        col = m.column(table, "hotel_id")
        if col is not None and col["COLLATION_NAME"] != m.id_collation:
            m.execute(f"ALTER TABLE {table} MODIFY hotel_id VARCHAR(64) CHARACTER SET utf8mb4 "
                      f"COLLATE {m.id_collation} {null}")
    # One transaction: a dashboard reads the old figures or the new ones, never an empty table. Only the section of
    # these two tables: the script's later sections recompute tables of later migrations (v006), not there yet.
    m.execute("START TRANSACTION")
    m.script("recompute_aggregates.sql", "by_hotel")
    m.execute("COMMIT")
