"""v007: per-language monthly rollups of the dashboard summaries, kept in step by the commit like the daily ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qwenspark.io.migrations.v006_dashboard_summaries import summary_tables

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 7
NAME = "dashboard monthly rollups"

# A dashboard range of months or years sums a row per (day, hotel, lang) of the daily tables: a million reviews over
# three years are ~700k daily rows, read by every chart. The whole months of a range are read from these instead (a
# row per month, hotel and lang; qwenspark.dashboard.queries.split), only its edge days from the daily tables.
TABLES = summary_tables("month")


def apply(m: Migrator) -> None:
    """Create the two tables and fill them from review_sentiment, in one transaction (as v006)."""
    for ddl in TABLES.values():
        m.execute(ddl.format(collation=m.id_collation))
    m.execute("START TRANSACTION")
    m.script("recompute_aggregates.sql", "by_month")
    m.execute("COMMIT")
