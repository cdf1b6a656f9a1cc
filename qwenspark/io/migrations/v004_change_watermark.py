"""v004: hotel_reviews.updated_at, a change watermark the nightly run selects on; job_runs.rows_purged."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 4
NAME = "change watermark"

# Maintained by the server on every INSERT and on every UPDATE that changes a value: edits and late inserts are
# selected by `source.window_column: updated_at` whoever writes the table. Stamped in the writer's session time
# zone (DATETIME has none): writers in UTC, as the job's own connections are, keep the window exact.
UPDATED_AT = (
    "DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)"
    " COMMENT 'last insert or change: the nightly window (source.window_column)'"
)


def apply(m: Migrator) -> None:
    """Add the column (existing rows get the time of this migration) and its index, and the purge count."""
    # Existing rows all get the ALTER's time, not their created_at: the next nightly window (the one holding this
    # moment) selects every one of them once, so an edit made before the upgrade is not lost; the unchanged ones
    # are skipped as current by their input_key at the cost of reading them.
    m.add_column("hotel_reviews", "updated_at", UPDATED_AT)
    m.add_index("hotel_reviews", "ix_hotel_reviews_updated", "updated_at")
    m.add_column(
        "job_runs", "rows_purged",
        "INT NULL COMMENT 'results of reviews gone from the source table, removed with their aggregate share'"
        " AFTER rows_changed")
